"""A trial's result, from the launcher statuses of the baseline runs (the unchanged script) and of
the trial runs (the script with the change).

Step times of a run: its measured steps (after its own warm-up) timed by CUDA events at the step
boundaries (``step_gpu_ns``), else host wall-clock time (``step_wall_ns``), as the bare run's
representativeness check times them (METHOD.md: CUDA events after warm-up, median). The steps of
every baseline run and of every trial run are compared by :mod:`gpudiag.trials.stats` (median
difference, bootstrap interval, Mann–Whitney p-value, the baselines' spread).

Result check: the value ``backward()`` was called on (the loss) at the first step after step 0
that both runs recorded; for inference (no loss), a sample of the outermost forward's first
output at that step (:func:`output_difference`). By then every change has acted on a forward pass (a compiled root module
runs compiled from its second call) and the runs differ by at most one optimizer update. A
relative difference over the tolerance of the trial's math path marks it "changes results".
"""

from __future__ import annotations

import statistics

from gpudiag.analysis.steps.representative import STEP_KEYS, step_times  # noqa: F401 - the trials' reading of a status
from gpudiag.script_status import ScriptStatus

# Relative tolerance on a whole model's loss, by the trial's tolerance class (its math path): gpudiag's choices, a whole forward pass
# looser than torch.testing's per-op defaults (fp32 1.3e-6, bf16 1.6e-2, fp16 1e-3) since errors
# add up over layers; TF32 keeps fp16's 10-bit mantissa.
TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2, "fp16": 1e-2, "bf16": 5e-2}
# Changes that keep the math (fp32 stays fp32) but may change the data: DataLoader workers draw
# random augmentations from per-worker seeds (torch.utils.data's worker seeding), not from the main
# process's stream, so a script with random augmentations computes another loss on the same
# samples in the same order. A difference past the tolerance is noted ("data stream"), not called
# "changes results": it says nothing of the change's math. pin-memory changes no value at all.
DATA_STREAM_CHANGES = ("loader-workers",)


def job_view(status: ScriptStatus | dict) -> ScriptStatus:
    """A launcher status read as one process's. Under a multi-process launcher (``torchrun``) the
    launcher's own process runs no steps; its ranks wrote theirs (``ranks``, gpudiag.capture.
    rank_hook). The job's step k then takes as long as its slowest rank's step k (a synchronous
    data-parallel step ends with a collective every rank waits at); the rest (warm-up, window,
    losses, outputs, the change applied) is the lowest rank's, and an exception is the launcher's
    or else the first rank's. A single-process status is returned as it is. Raises
    :class:`~gpudiag.errors.UserError` for a dict that is no status."""
    status = ScriptStatus.of(status)
    ranks = sorted(status.ranks or [], key=lambda r: (r.rank is None, r.rank or 0))
    if not ranks or any(getattr(status, k) for k in STEP_KEYS):
        return status
    view = {**status.to_json(), **{k: v for k, v in ranks[0].to_json().items() if k not in ("pid", "exception")}}
    view["exception"] = status.exception or next((r.exception for r in ranks if r.exception), None)
    for key in STEP_KEYS:
        steps = set.intersection(*(set(getattr(r, key) or {}) for r in ranks))
        view[key] = {k: max(float(getattr(r, key)[k] or 0) for r in ranks) for k in sorted(steps, key=int)}
    return ScriptStatus.from_json(view)


def tolerance_class(autocast_dtype: str | None, change: str) -> str:
    """The loosest math path the trial ran: the script's autocast (as the profiled run recorded
    it: the bare runs do not hook forwards), the change's own (tf32, bf16). The input-pipeline
    changes (loader-workers, pin-memory) keep the script's: see :data:`DATA_STREAM_CHANGES`."""
    paths = {"bfloat16": "bf16", "float16": "fp16"}
    path = paths.get(autocast_dtype or "off", "fp32")
    if change in ("bf16-autocast", "half-weights"):
        path = "bf16"
    elif change == "tf32" and path == "fp32":
        path = "tf32"
    return path


def loss_difference(baseline: ScriptStatus | dict, trial: ScriptStatus | dict) -> dict | None:
    """{"step", "baseline", "trial", "relative"} at the first step ≥ 1 both runs recorded a loss
    for (step 0 when that is all they share); None when they share none."""
    a, b = ScriptStatus.of(baseline).losses or {}, ScriptStatus.of(trial).losses or {}
    common = sorted((int(k) for k in set(a) & set(b)), key=lambda k: (k < 1, k))
    if not common:
        return None
    step = common[0]
    x, y = float(a[str(step)]), float(b[str(step)])
    rel = abs(y - x) / max(abs(x), 1e-12) if x == x and y == y else float("inf")  # NaN: differs
    return {"step": step, "baseline": x, "trial": y, "relative": rel}


def output_difference(baseline: ScriptStatus | dict, trial: ScriptStatus | dict) -> dict | None:
    """For inference runs (no loss): the kept output samples (``outputs``, gpudiag.capture.window)
    at the first step both runs kept: {"step", "max_abs", "relative"} with relative = max |a − b| ÷
    max |a| (scaled by the output's own magnitude: an element near zero does not blow it up);
    None when they share no step or the samples differ in size."""
    a, b = ScriptStatus.of(baseline).outputs or {}, ScriptStatus.of(trial).outputs or {}
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


def deterministic(bare: ScriptStatus | dict, profiled: ScriptStatus | dict) -> bool | None:
    """Whether two plain runs of the script (the bare run and the profiled run) computed the same
    loss within fp32's tolerance; None when they share no step. An unseeded script does not: its
    trials cannot be checked for changed results."""
    diff = loss_difference(bare, profiled)
    return None if diff is None else diff["relative"] <= TOLERANCE["fp32"]


def _fail(entry: dict, status: str, error: str) -> dict:
    return entry | {"status": status, "error": error}


def _runs(value: ScriptStatus | dict | list) -> list[ScriptStatus]:
    """One status or several (the runs of one side of a trial) as a list of statuses."""
    return [ScriptStatus.of(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def step_runs(statuses: list[dict], per_sample: bool) -> tuple[list[list[float]], str | None]:
    """(each run's measured step times in ns, the one method they were timed by), runs without
    steps left out; per sample (step time ÷ the run's ``samples_per_step``) when ``per_sample``,
    leaving out runs that do not say it. The method is None when the runs mix methods."""
    runs, methods = [], set()
    for status in statuses:
        times, method = step_times(status)
        per = ScriptStatus.of(status).samples_per_step if per_sample else 1
        if times and per:
            runs.append([t / per for t in times])
            methods.add(method)
    return runs, (methods.pop() if len(methods) == 1 else None)


def _warmup_s(status: ScriptStatus | dict) -> float | None:
    """Seconds from the process's start to its first measured step (start-up and warm-up steps)."""
    status = ScriptStatus.of(status)
    start, window = status.started_unix_s, status.window_start_unix_s
    return window - start if start and window else None


def one_time_cost(baselines: list[dict], trial: dict, saving_ns: float | None) -> float | None:
    """A change's one-time cost in seconds (compilation, CUDA graph capture, cuDNN autotuning):
    the trial's time to its first measured step minus the baselines' (their median), plus the
    warm-up steps' share of the saving, since the trial's warm-up steps already ran faster by
    about the saving each: cost = Δ(time to window) + warm-up steps × saving. None when either
    side has no timestamps."""
    own = _warmup_s(trial)
    base = [w for w in (_warmup_s(b) for b in baselines) if w is not None]
    if own is None or not base:
        return None
    steps = int(ScriptStatus.of(trial).warmup_steps or 0)
    return own - statistics.median(base) + steps * (saving_ns or 0.0) / 1e9


def _timing(out: dict, baselines: list[dict], trials: list[dict], per_sample: bool) -> str | None:
    """Fills the timing fields of ``out`` from the runs (:func:`gpudiag.trials.stats.compare`);
    returns why it could not (None when it did)."""
    from gpudiag.trials import stats

    base_runs, method = step_runs(baselines, per_sample)
    trial_runs, trial_method = step_runs(trials, per_sample)
    if per_sample and (not base_runs or not trial_runs):
        return "samples per step unknown (call gpudiag.step(samples=N) in the script)"
    if not base_runs or not trial_runs or method != trial_method:
        return "no measured steps to compare (the script ended before the window's steps)"
    base, value = stats.pooled_median(base_runs), stats.pooled_median(trial_runs)
    out.update(stats.compare(base_runs, trial_runs), baseline_step_ns=base, trial_step_ns=value,
               saving_percent=100.0 * (base - value) / base, steps=sum(map(len, trial_runs)),
               baseline_steps=sum(map(len, base_runs)), method=method)
    if per_sample:
        out["per"] = "sample"
    return None


def _check_results(out: dict, baseline: dict, trial: dict, change: str, comparable: bool | None,
                   autocast_dtype: str | None) -> str:
    """Compares the trial's loss (or output sample) with the baseline's; sets
    ``result_difference`` and returns "changes results" or "ok"."""
    if change.startswith("args:"):  # other arguments (a larger batch) compute another loss
        return "ok"
    diff = loss_difference(baseline, trial) or output_difference(baseline, trial)
    if diff is None:
        return "ok"
    tolerance = TOLERANCE[tolerance_class(autocast_dtype, change)]
    diff["tolerance"] = tolerance
    out["result_difference"] = diff
    if comparable is False:
        diff["note"] = (f"the script's {'outputs differ' if diff.get('compared') == 'outputs' else 'loss differs'} "
                        "between two plain runs (unseeded?): not checked")
        return "ok"
    if change in DATA_STREAM_CHANGES and diff["relative"] > tolerance:
        diff["note"] = ("data stream: DataLoader workers draw random augmentations from their own seeds, so the loss "
                        "may differ without the math changing; not counted as a change of results")
        return "ok"
    return "changes results" if diff["relative"] > tolerance else "ok"


def _empty(entry: dict, applied: dict, elapsed_s: float) -> dict:
    """A trial record with no measurement yet."""
    return {"change": entry["change"], "rule_id": entry.get("rule_id"), "origin": entry.get("origin"),
            "predicted_saving_ns": entry.get("predicted_saving_ns"), "baseline_step_ns": None,
            "trial_step_ns": None, "saving_ns": None, "saving_percent": None, "saving_ci_ns": None,
            "p_value": None, "verdict": None, "verdict_reason": None, "baseline_runs_ns": [], "trial_runs_ns": [],
            "baseline_spread_ns": None, "baseline_spread_percent": None, "steps": 0, "baseline_steps": 0,
            "warmup_s": None, "one_time_cost_s": None, "payback_steps": None, "result_difference": None,
            "error": None, "form": applied.get("form"), "applied": applied.get("applied") or [], "method": None,
            "framework": applied.get("framework"),
            "elapsed_s": round(elapsed_s, 1)}


def trial_result(entry: dict, baseline: dict | list[dict], trial: dict | list[dict], code: int | None,
                 elapsed_s: float, timed_out: bool = False, comparable: bool | None = True,
                 autocast_dtype: str | None = None) -> dict:
    """The report's record of one trial. ``entry``: change, predicted_saving_ns, rule_id, origin
    (from :func:`gpudiag.trials.plan.choose`); ``baseline`` / ``trial``: the launcher statuses of
    the unchanged script's runs and of the changed one's (one status or a list); ``code``: the
    (last) trial run's exit code; ``comparable``: whether two plain runs of the script compute the
    same loss (:func:`deterministic`); ``autocast_dtype``: the script's autocast, from the
    profiled run's status.

    Fields: change, rule_id, origin, status ("measured", "inconclusive", "changes results", "not
    applicable", "failed", "over budget"), the timing of :func:`gpudiag.trials.stats.compare`
    (saving_ns, saving_ci_ns, p_value, verdict, verdict_reason, baseline_runs_ns, trial_runs_ns,
    baseline_spread_ns / _percent), baseline_step_ns and trial_step_ns (pooled medians, ns),
    saving_percent (of the baseline step), predicted_saving_ns, steps / baseline_steps (measured
    steps pooled), warmup_s (the first trial run's start-up and warm-up), one_time_cost_s
    (:func:`one_time_cost`), payback_steps (:func:`gpudiag.trials.stats.payback`),
    result_difference, error, form, applied, method, elapsed_s; for an ``args:`` trial ``per`` =
    "sample": the step fields are then ns per sample, and there is no one-time cost."""
    from gpudiag.trials import stats

    baselines, trials = _runs(baseline), _runs(trial)
    first = trials[0]
    applied = first.trial or {}
    out = _empty(entry, applied, elapsed_s)
    exception = next((t.exception for t in trials if t.exception), None)
    if timed_out:
        return _fail(out, "over budget", f"stopped after {elapsed_s:.0f} s, past the --try-budget")
    if exception or (code not in (0, None) and not any(step_times(t)[0] for t in trials)):
        return _fail(out, "failed", (exception or f"exit code {code}").splitlines()[0][:300])
    if applied.get("not_applicable") and not applied.get("applied"):
        return _fail(out, "not applicable", applied["not_applicable"])
    per_sample = entry["change"].startswith("args:")
    error = _timing(out, baselines, trials, per_sample)
    if error:
        return _fail(out, "failed", error)
    out["warmup_s"] = None if _warmup_s(first) is None else round(_warmup_s(first), 1)
    if not per_sample:
        out["one_time_cost_s"] = one_time_cost(baselines, first, out["saving_ns"])
        out["payback_steps"] = stats.payback(out["one_time_cost_s"], out["saving_ns"], out["verdict"])
    checked = _check_results(out, baselines[0], first, entry["change"], comparable, autocast_dtype)
    return out | {"status": "changes results" if checked == "changes results" else out["verdict"]}


def attach(report: dict, trials: list[dict], left_out: list[dict]) -> dict:
    """The trials added to ``report`` and the recommendations ranked by them:
    :func:`gpudiag.trials.ranking.attach` (kept here: ``gpudiag report`` re-attaches a run's
    trials through this name). Returns ``report``."""
    from gpudiag.trials.ranking import attach as attach_trials

    return attach_trials(report, trials, left_out)
