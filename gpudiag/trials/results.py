"""A trial's result, from the launcher statuses of the baseline bare run and of the trial run.

Step time of a run: the median of its measured steps (after its own warm-up) timed by CUDA events
at the step boundaries (``step_gpu_ns``), else host wall-clock time (``step_wall_ns``), as the
bare run's representativeness check times them (METHOD.md: CUDA events after warm-up, median).

Result check: the value ``backward()`` was called on (the loss) at the first step after step 0
that both runs recorded; for inference (no loss), a sample of the outermost forward's first
output at that step (:func:`output_difference`). By then every change has acted on a forward pass (a compiled root module
runs compiled from its second call) and the runs differ by at most one optimizer update. A
relative difference over the tolerance of the trial's math path marks it "changes results".
"""

from __future__ import annotations

import statistics

# Relative tolerance on a whole model's loss, by math path: gpudiag's choices, a whole forward pass
# looser than torch.testing's per-op defaults (fp32 1.3e-6, bf16 1.6e-2, fp16 1e-3) since errors
# add up over layers; TF32 keeps fp16's 10-bit mantissa.
TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2, "fp16": 1e-2, "bf16": 5e-2}


def step_times(status: dict) -> tuple[list[float], str]:
    """(measured step times in ns, method) of one launcher status: steps at or after its
    ``warmup_steps``, within its window when it had one."""
    warmup = int(status.get("warmup_steps") or 0)
    last = None if status.get("window_steps") is None else warmup + int(status["window_steps"]) - 1
    for key, method in zip(STEP_KEYS, ("CUDA events", "host wall-clock time")):
        times = [float(v) for k, v in (status.get(key) or {}).items()
                 if int(k) >= warmup and (last is None or int(k) <= last) and v and v > 0]
        if times:
            return times, method
    return [], ""


STEP_KEYS = ("step_gpu_ns", "step_wall_ns")


def job_view(status: dict) -> dict:
    """A launcher status read as one process's. Under a multi-process launcher (``torchrun``) the
    launcher's own process runs no steps; its ranks wrote theirs (``ranks``, gpudiag.capture.
    rank_hook). The job's step k then takes as long as its slowest rank's step k (a synchronous
    data-parallel step ends with a collective every rank waits at); the rest (warm-up, window,
    losses, outputs, the change applied) is the lowest rank's, and an exception is the launcher's
    or else the first rank's. A single-process status is returned as it is."""
    ranks = sorted((r for r in status.get("ranks") or [] if isinstance(r, dict)),
                   key=lambda r: (r.get("rank") is None, r.get("rank") or 0))
    if not ranks or any(status.get(k) for k in STEP_KEYS):
        return status
    view = {**status, **{k: v for k, v in ranks[0].items() if k not in ("pid", "exception")}}
    view["exception"] = status.get("exception") or next((r["exception"] for r in ranks if r.get("exception")), None)
    for key in STEP_KEYS:
        steps = set.intersection(*(set(r.get(key) or {}) for r in ranks))
        view[key] = {k: max(float(r[key][k] or 0) for r in ranks) for k in sorted(steps, key=int)}
    return view


def math_path(autocast_dtype: str | None, change: str) -> str:
    """The loosest math path the trial ran: the script's autocast (as the profiled run recorded
    it: the bare runs do not hook forwards), the change's own (tf32, bf16)."""
    paths = {"bfloat16": "bf16", "float16": "fp16"}
    path = paths.get(autocast_dtype or "off", "fp32")
    if change in ("bf16-autocast", "half-weights"):
        path = "bf16"
    elif change == "tf32" and path == "fp32":
        path = "tf32"
    return path


def _per_sample(baseline: dict, trial: dict, base_ns: float, trial_ns: float) -> tuple[float, float] | None:
    """(baseline, trial) time per sample in ns, from each run's ``samples_per_step``; None when
    either run has none."""
    a, b = baseline.get("samples_per_step"), trial.get("samples_per_step")
    return (base_ns / a, trial_ns / b) if a and b else None


def loss_difference(baseline: dict, trial: dict) -> dict | None:
    """{"step", "baseline", "trial", "relative"} at the first step ≥ 1 both runs recorded a loss
    for (step 0 when that is all they share); None when they share none."""
    a, b = baseline.get("losses") or {}, trial.get("losses") or {}
    common = sorted((int(k) for k in set(a) & set(b)), key=lambda k: (k < 1, k))
    if not common:
        return None
    step = common[0]
    x, y = float(a[str(step)]), float(b[str(step)])
    rel = abs(y - x) / max(abs(x), 1e-12) if x == x and y == y else float("inf")  # NaN: differs
    return {"step": step, "baseline": x, "trial": y, "relative": rel}


def output_difference(baseline: dict, trial: dict) -> dict | None:
    """For inference runs (no loss): the kept output samples (``outputs``, gpudiag.capture.window)
    at the first step both runs kept: {"step", "max_abs", "relative"} with relative = max |a − b| ÷
    max |a| (scaled by the output's own magnitude: an element near zero does not blow it up);
    None when they share no step or the samples differ in size."""
    a, b = baseline.get("outputs") or {}, trial.get("outputs") or {}
    common = sorted(int(k) for k in set(a) & set(b))
    if not common:
        return None
    step = common[0]
    x, y = a[str(step)], b[str(step)]
    if len(x) != len(y) or not x:
        return None
    max_abs = max(abs(u - v) for u, v in zip(x, y))
    scale = max(abs(u) for u in x)
    if scale == 0 and max_abs == 0:  # e.g. a zero-initialised classifier head: nothing to compare
        return {"step": step, "max_abs": 0.0, "relative": 0.0, "compared": "outputs",
                "note": "the output sample is all zeros in both runs (a zero-initialised head?): results not checked"}
    rel = max_abs / max(scale, 1e-12) if max_abs == max_abs else float("inf")  # NaN: differs
    return {"step": step, "max_abs": max_abs, "relative": rel, "compared": "outputs"}


def deterministic(bare: dict, profiled: dict) -> bool | None:
    """Whether two plain runs of the script (the bare run and the profiled run) computed the same
    loss within fp32's tolerance; None when they share no step. An unseeded script does not: its
    trials cannot be checked for changed results."""
    diff = loss_difference(bare, profiled)
    return None if diff is None else diff["relative"] <= TOLERANCE["fp32"]


def _fail(entry: dict, status: str, error: str) -> dict:
    return entry | {"status": status, "error": error}


def trial_result(entry: dict, baseline: dict, trial: dict, code: int | None, elapsed_s: float,
                 timed_out: bool = False, comparable: bool | None = True, autocast_dtype: str | None = None) -> dict:
    """The report's record of one trial. ``entry``: change, predicted_saving_ns, rule_id (from
    :func:`gpudiag.trials.plan.choose`); ``baseline`` / ``trial``: launcher statuses; ``code``:
    the trial's exit code; ``comparable``: :func:`deterministic` of the script; ``autocast_dtype``:
    the script's autocast, from the profiled run's status.

    Fields: change, status ("measured", "changes results", "not applicable", "failed", "over
    budget"), baseline_step_ns, trial_step_ns (medians, ns), saving_ns, saving_percent (of the
    baseline bare step), predicted_saving_ns, steps, warmup_s, result_difference, error, form,
    applied, method, elapsed_s; for an ``args:`` trial ``per`` = "sample": the step fields are
    then ns per sample (step time / samples per step of each run)."""
    applied = trial.get("trial") or {}
    out = {"change": entry["change"], "rule_id": entry.get("rule_id"),
           "predicted_saving_ns": entry.get("predicted_saving_ns"), "baseline_step_ns": None,
           "trial_step_ns": None, "saving_ns": None, "saving_percent": None, "steps": 0, "warmup_s": None,
           "result_difference": None, "error": None, "form": applied.get("form"),
           "applied": applied.get("applied") or [], "method": None, "elapsed_s": round(elapsed_s, 1)}
    base_times, method = step_times(baseline)
    times, trial_method = step_times(trial)
    if timed_out:
        return _fail(out, "over budget", f"stopped after {elapsed_s:.0f} s, past the --try-budget")
    if trial.get("exception") or (code not in (0, None) and not times):
        return _fail(out, "failed", (trial.get("exception") or f"exit code {code}").splitlines()[0][:300])
    if applied.get("not_applicable") and not applied.get("applied"):
        return _fail(out, "not applicable", applied["not_applicable"])
    if not base_times or not times or method != trial_method:
        return _fail(out, "failed", "no measured steps to compare (the script ended before the window's steps)")
    base, value = statistics.median(base_times), statistics.median(times)
    if entry["change"].startswith("args:"):  # other arguments: compared per sample, not per step
        per_sample = _per_sample(baseline, trial, base, value)
        if per_sample is None:
            return _fail(out, "failed", "samples per step unknown (call gpudiag.step(samples=N) in the script)")
        base, value = per_sample
        out["per"] = "sample"
    out.update(baseline_step_ns=base, trial_step_ns=value, saving_ns=base - value,
               saving_percent=100.0 * (base - value) / base, steps=len(times), method=method)
    if trial.get("window_start_unix_s") and trial.get("started_unix_s"):
        out["warmup_s"] = round(trial["window_start_unix_s"] - trial["started_unix_s"], 1)
    # other arguments (a larger batch) compute another loss: nothing to compare
    diff = None if entry["change"].startswith("args:") else (loss_difference(baseline, trial)
                                                              or output_difference(baseline, trial))
    status = "measured"
    if diff is not None:
        tolerance = TOLERANCE[math_path(autocast_dtype, entry["change"])]
        diff["tolerance"] = tolerance
        out["result_difference"] = diff
        if comparable is False:
            diff["note"] = (f"the script's {'outputs differ' if diff.get('compared') == 'outputs' else 'loss differs'} "
                            "between two plain runs (unseeded?): not checked")
        elif diff["relative"] > tolerance:
            status = "changes results"
    return out | {"status": status}


def attach(report: dict, trials: list[dict], left_out: list[dict]) -> dict:
    """Adds ``trials`` (and ``trials_left_out``) to ``report`` and, on each recommendation a trial
    measured, ``measured_saving_ns`` / ``measured_saving_percent`` / ``trial_change`` / ``trial_status``
    (the best measured change of that rule). Recommendations are then ranked by measured saving
    where one exists, else by predicted saving. Returns ``report``."""
    report["trials"] = trials
    report["trials_left_out"] = left_out
    by_rule: dict[str, dict] = {}
    from gpudiag.trials.plan import RULE_CHANGES

    for trial in trials:
        if trial.get("saving_ns") is None:
            continue
        for rule, changes in RULE_CHANGES.items():
            best = by_rule.get(rule)
            if trial["change"] in changes and (best is None or trial["saving_ns"] > best["saving_ns"]):
                by_rule[rule] = trial
    for rec in report.get("recommendations") or []:
        trial = by_rule.get(rec.get("rule_id"))
        if trial is not None:
            rec.update(measured_saving_ns=trial["saving_ns"], measured_saving_percent=trial["saving_percent"],
                       trial_change=trial["change"], trial_status=trial["status"])
        if rec.get("rule_id") == "GD-OVERHEAD-BOUND":
            rec["how_to_fix"] = (rec.get("how_to_fix") or "") + graph_form_note(rec, trials)
    recs = report.get("recommendations") or []
    recs.sort(key=lambda r: -(r["measured_saving_ns"] if r.get("measured_saving_ns") is not None
                              else float(r.get("saving_ns_per_step") or 0.0)))
    return report


def graph_form_note(rec: dict, trials: list[dict]) -> str:
    """What the overhead-bound advice adds once the compile-graphs trial ran: whether
    reduce-overhead on the root modules reached the predicted saving, and if not, the form that
    can (measured by hand in issue 21 on an LSTM step: reduce-overhead +3 %, one torch.cuda.graph
    of the whole step with the optimizer -58 %)."""
    trial = next((t for t in trials if t["change"] == "compile-graphs" and t.get("saving_ns") is not None), None)
    predicted = float(rec.get("saving_ns_per_step") or 0.0)
    if trial is None or not predicted:
        return ""
    if trial["saving_ns"] >= 0.5 * predicted:
        return (f" Measured: `torch.compile(mode=\"reduce-overhead\")` of the model saved "
                f"{trial['saving_ns'] / 1e6:.2f} ms/step of the {predicted / 1e6:.2f} ms predicted.")
    return (f" Measured: `torch.compile(mode=\"reduce-overhead\")` of the model saved only "
            f"{trial['saving_ns'] / 1e6:.2f} ms/step of the {predicted / 1e6:.2f} ms predicted: the launches left are "
            "outside the model (loss, backward bookkeeping, optimizer). The form that removes them is one CUDA graph of "
            "the whole step: capture forward, backward and `optimizer.step()` (with `capturable=True`) in "
            "`torch.cuda.graph` on static inputs and replay it each step; this needs the training loop edited.")
