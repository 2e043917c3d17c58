"""The trials joined to the recommendations: measured savings rank the advice, but only conclusive
ones (:mod:`gpudiag.trials.stats`: the interval excludes zero and the saving outsizes the
baselines' spread).

On each recommendation whose rule names a tried change (:data:`gpudiag.trials.plan.RULE_CHANGES`):

- ``trial_change``, ``trial_status`` ("measured", "changes results", "inconclusive", "failed",
  "not applicable", "over budget"), ``trial_reason`` (why inconclusive or failed), ``trial_saving_ns``
  and ``trial_saving_ci_ns`` (the point estimate and its 95 % interval, ns per step, whatever the
  verdict), ``trial_changes_results`` (bool);
- ``measured_saving_ns`` / ``measured_saving_percent``: set only when the saving is conclusive,
  else None; the recommendation then keeps its predicted rank.

A trial speaks for a recommendation only when it is credited to it (:func:`credited`): its change
acts on what the rule found, and its saving is no larger than the time the rule's evidence covers
(``covers_ns_per_step``). A CUDA-graph saving of 14 ms is not a grid-size rule's when that rule
found 3 ms of small-grid kernels (issue 45); the recommendation then says so in
``trial_not_credited`` and keeps its predicted rank.

A prediction its own trial contradicts (predicted over :data:`CONTRADICTED_PREDICTED` of the step,
measured under :data:`CONTRADICTED_MEASURED` of it, conclusive or not) gets ``trial_contradicts``
True and is ranked by the measurement.

A conclusive win no recommendation was credited with (a change no rule predicted, tried because it
applies to what the run does, :func:`gpudiag.trials.plan.generic_changes`, or asked with ``--try``;
or one that saved more than the rule that named it covers) becomes a recommendation of its own,
rule ``GD-MEASURED``, ranked by its measured saving, with ``predicted`` False and
``saving_ns_per_step`` 0 (no rule's estimate): rule authors find there what the rules missed.
"""

from __future__ import annotations

from gpudiag.trials import loader_changes

MEASURED_RULE = "GD-MEASURED"
# A prediction of more than 20 % of the step that its own trial measures under 5 % is contradicted
# (issue 45's threshold: the Lightning ResNet-50's fused-optimizer advice, predicted 59 %, measured +1.6 %).
CONTRADICTED_PREDICTED = 20.0
CONTRADICTED_MEASURED = 5.0

# How to make each change in the script (the form the trial measured: gpudiag.trials.changes).
HOW_TO = {
    "compile": "Compile the model: `model = torch.compile(model)` (the trial compiled its `forward` in place).",
    "compile-graphs": "Compile the model with CUDA graphs: `torch.compile(model, mode=\"reduce-overhead\")`, "
                      "with `torch.compiler.cudagraph_mark_step_begin()` at the start of each step.",
    "fused-optimizer": "Build the optimizer with `fused=True` (e.g. `torch.optim.AdamW(params, fused=True)`).",
    "channels-last": "Convert the model and its 4-D inputs: `model.to(memory_format=torch.channels_last)`, "
                     "`x = x.contiguous(memory_format=torch.channels_last)`.",
    "tf32": "Allow TF32: `torch.backends.cuda.matmul.allow_tf32 = True` and `torch.backends.cudnn.allow_tf32 = True`.",
    "bf16-autocast": "Run the forward under `torch.autocast(\"cuda\", dtype=torch.bfloat16)`.",
    "cudnn-benchmark": "Set `torch.backends.cudnn.benchmark = True` (input shapes should stay fixed).",
    "kernels": "Apply gpudiag's fused kernels: `gpudiag.fused.hf.apply(model)` (timm Swin: "
               "`gpudiag.fused.timm_swin.apply(model)`).",
    "half-weights": "Serve the model in bf16: `model.to(torch.bfloat16)`, with bf16 inputs.",
    "static-cache": "Use a static KV cache: `model.generation_config.cache_implementation = \"static\"`.",
    "static-cache-compile": "Use a static KV cache and let generate() compile the decoding step: "
                            "`model.generation_config.cache_implementation = \"static\"`.",
    **loader_changes.HOW_TO,
}


def conclusive(trial: dict) -> bool:
    """Whether ``trial`` measured its saving conclusively (verdict "measured"). A record written
    before verdicts existed counts when it has a saving not flagged as within the run-to-run spread."""
    if "verdict" not in trial:
        return trial.get("saving_ns") is not None and not trial.get("within_spread")
    return trial["verdict"] == "measured" and trial.get("saving_ns") is not None


def _rank_key(trial: dict) -> tuple:
    """Conclusive first, then any with a saving, then the rest; larger savings first within each."""
    saving = trial.get("saving_ns")
    return (conclusive(trial), saving is not None, saving if saving is not None else float("-inf"))


def credited(trial: dict, rec: dict) -> bool:
    """Whether ``trial`` may speak for ``rec``: its change is one the rule names
    (:data:`gpudiag.trials.plan.RULE_CHANGES`: it acts on what the rule found) and, where the
    saving is conclusive and the rule says what time its evidence covers (``covers_ns_per_step``),
    the saving is no larger than that time: the low end of its 95 % interval is at most the
    covered time (a saving surely larger than the time the rule found is not the rule's)."""
    from gpudiag.trials.plan import RULE_CHANGES

    if trial["change"] not in RULE_CHANGES.get(rec.get("rule_id"), ()):
        return False
    covers = rec.get("covers_ns_per_step")
    if covers is None or not conclusive(trial):
        return True
    low = (trial.get("saving_ci_ns") or [trial["saving_ns"]])[0]
    return low <= covers


def best_for(rec: dict, trials: list[dict]) -> dict | None:
    """The trial that speaks for ``rec``: of the trials credited to it (:func:`credited`), the
    conclusive one with the largest saving, else the one with the largest (inconclusive) saving,
    else a failed one; None without any."""
    mine = [t for t in trials if credited(t, rec)]
    return max(mine, key=_rank_key) if mine else None


def not_credited_note(rec: dict, trials: list[dict]) -> str | None:
    """Why a conclusive trial of a change the rule names does not speak for it: its saving is
    larger than the time the rule's evidence covers. None when there is no such trial."""
    from gpudiag.trials.plan import RULE_CHANGES

    for t in trials:
        if t["change"] in RULE_CHANGES.get(rec.get("rule_id"), ()) and conclusive(t) and not credited(t, rec):
            return (f"{t['change']} measured {_ms(t['saving_ns'])} ms/step, more than the "
                    f"{_ms(rec['covers_ns_per_step'])} ms/step this rule's evidence covers: shown as its own measured line")
    return None


def contradicted(rec: dict, trial: dict) -> bool:
    """Whether ``trial`` (credited to ``rec``) contradicts the rule's prediction: predicted over
    :data:`CONTRADICTED_PREDICTED` % of the step, measured under :data:`CONTRADICTED_MEASURED` % of
    the bare step (its point estimate, conclusive or not). Each share is of its own step: the
    prediction of the profiled step, the measurement of the bare one; the thresholds are four
    times apart, wider than the profiler's inflation of a step (1–79 % on the framework suite,
    docs/framework_suite.md, where the shares would differ most)."""
    predicted = rec.get("saving_percent_of_step")
    measured = trial.get("saving_percent")
    return (predicted is not None and measured is not None and trial.get("saving_ns") is not None
            and predicted > CONTRADICTED_PREDICTED and measured < CONTRADICTED_MEASURED)


TRIAL_FIELDS = ("trial_change", "trial_status", "trial_reason", "trial_saving_ns", "trial_saving_ci_ns",
                "trial_changes_results", "measured_saving_ns", "measured_saving_percent", "trial_contradicts",
                "trial_not_credited")
GRAPH_NOTE_START = " Measured: `torch.compile(mode="


def trial_fields(trial: dict) -> dict:
    """The trial fields of a recommendation (see the module docstring)."""
    sure = conclusive(trial)
    status = trial["status"] if sure or trial.get("saving_ns") is None else "inconclusive"
    return {"trial_change": trial["change"], "trial_status": status,
            "trial_reason": trial.get("verdict_reason") or trial.get("error"),
            "trial_saving_ns": trial.get("saving_ns"), "trial_saving_ci_ns": trial.get("saving_ci_ns"),
            "trial_changes_results": trial.get("status") == "changes results",
            "measured_saving_ns": trial["saving_ns"] if sure else None,
            "measured_saving_percent": trial.get("saving_percent") if sure else None}


def unpredicted_win(trial: dict, credited_to: list[str]) -> dict | None:
    """The ``GD-MEASURED`` recommendation of a conclusive saving no recommendation could be
    credited with (``credited_to``: the rule ids :func:`credited` lets it speak for, whether or
    not another of their trials was chosen: tf32 and bf16-autocast both act on GD-FP32-MATMUL,
    and the one not shown there is not a win no rule saw). None for any other trial, and for
    ``args:`` trials (the user's own arguments, not a change)."""
    if (credited_to or trial["change"].startswith("args:")
            or not conclusive(trial) or trial.get("status") != "measured" or trial["saving_ns"] <= 0):
        return None
    low, high = trial.get("saving_ci_ns") or (None, None)
    interval = "" if low is None else f", 95 % interval {low / 1e6:.2f} to {high / 1e6:.2f} ms"
    runs = len(trial.get("baseline_runs_ns") or [])
    evidence = (f"trial {trial['change']}: {_ms(trial.get('baseline_step_ns'))} -> {_ms(trial.get('trial_step_ns'))} "
                f"ms/step over {trial.get('steps')} steps, against {runs} baseline runs{interval}")
    rule = trial.get("rule_id")
    named = f" (more than the time {rule}'s evidence covers)" if rule else ""
    estimate = (f"none of its own: {rule} predicted this change, and the saving is larger than the time its "
                "evidence covers; a trial measured it on the script" if rule
                else "none: no rule predicted this change; a trial measured it on the script")
    return {"rule_id": MEASURED_RULE, "title": f"Measured{'' if named else ', not predicted'}: {trial['change']} saves "
            f"{trial['saving_ns'] / 1e6:.2f} ms per step{named}", "predicted": False,
            "saving_ns_per_step": 0.0, "saving_percent_of_step": 0.0, "saving_estimated": False,
            "estimate": estimate,
            "evidence": [evidence], "how_to_fix": HOW_TO.get(trial["change"]) or "; ".join(trial.get("applied") or []),
            "overlaps": [], **trial_fields(trial)}


def _ms(ns) -> str:
    return "?" if ns is None else f"{ns / 1e6:.2f}"


def attach(report: dict, trials: list[dict], left_out: list[dict]) -> dict:
    """Adds ``trials`` and ``trials_left_out`` to ``report``, the trial fields to each
    recommendation a trial speaks for, a ``GD-MEASURED`` recommendation per unpredicted win, and
    ranks the recommendations by conclusive measured saving where one exists, else by predicted
    saving. Idempotent (earlier ``GD-MEASURED`` entries are replaced). Returns ``report``."""
    report["trials"] = trials
    report["trials_left_out"] = left_out
    recs = [r for r in report.get("recommendations") or [] if r.get("rule_id") != MEASURED_RULE]
    speaks_for = {id(t): [r["rule_id"] for r in recs if credited(t, r)] for t in trials}
    for rec in recs:
        for key in TRIAL_FIELDS:  # a report attached before: its trials' fields go
            rec.pop(key, None)
        trial = best_for(rec, trials)
        if trial is not None:
            rec.update(trial_fields(trial), trial_contradicts=contradicted(rec, trial))
        note = not_credited_note(rec, trials)
        if note:
            rec["trial_not_credited"] = note
        if rec.get("rule_id") == "GD-OVERHEAD-BOUND":
            advice = (rec.get("how_to_fix") or "").split(GRAPH_NOTE_START)[0]
            rec["how_to_fix"] = advice + graph_form_note(rec, trials)
    recs += [w for w in (unpredicted_win(t, speaks_for[id(t)]) for t in trials) if w is not None]
    recs.sort(key=lambda r: -rank_ns(r))
    if "recommendations" in report or recs:
        report["recommendations"] = recs
    return report


def rank_ns(rec: dict) -> float:
    """A recommendation's rank, ns per step: its conclusive measured saving; for a contradicted
    prediction its trial's measurement (none below 0); else its predicted saving."""
    if rec.get("measured_saving_ns") is not None:
        return float(rec["measured_saving_ns"])
    if rec.get("trial_contradicts"):
        return max(float(rec.get("trial_saving_ns") or 0.0), 0.0)
    return float(rec.get("saving_ns_per_step") or 0.0)


def graph_form_note(rec: dict, trials: list[dict]) -> str:
    """What the overhead-bound advice adds once the compile-graphs trial measured conclusively:
    whether reduce-overhead on the root modules reached the predicted saving, and if not, the form
    that can (measured by hand in issue 21 on an LSTM step: reduce-overhead +3 %, one
    torch.cuda.graph of the whole step with the optimizer -58 %). Empty for an inconclusive trial."""
    trial = next((t for t in trials if t["change"] == "compile-graphs" and conclusive(t)), None)
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
