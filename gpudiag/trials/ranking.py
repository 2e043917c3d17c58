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

A conclusive win of a change no rule predicted (tried because it applies to what the run does,
:func:`gpudiag.trials.plan.generic_changes`, or asked with ``--try``) becomes a recommendation of
its own, rule ``GD-MEASURED`` ("measured, not predicted"), ranked by its measured saving, with
``predicted`` False and ``saving_ns_per_step`` 0 (no rule's estimate): rule authors find there
what the rules missed.
"""

from __future__ import annotations

MEASURED_RULE = "GD-MEASURED"

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


def best_by_rule(trials: list[dict]) -> dict[str, dict]:
    """rule id -> the trial that speaks for it: its conclusive trial with the largest saving, else
    the one with the largest (inconclusive) saving, else a failed one."""
    from gpudiag.trials.plan import RULE_CHANGES

    out: dict[str, dict] = {}
    for rule, changes in RULE_CHANGES.items():
        mine = [t for t in trials if t["change"] in changes]
        if mine:
            out[rule] = max(mine, key=_rank_key)
    return out


TRIAL_FIELDS = ("trial_change", "trial_status", "trial_reason", "trial_saving_ns", "trial_saving_ci_ns",
                "trial_changes_results", "measured_saving_ns", "measured_saving_percent")
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


def _named_by(recs: list[dict]) -> set[str]:
    """The changes the rules of ``recs`` name (:data:`gpudiag.trials.plan.RULE_CHANGES`)."""
    from gpudiag.trials.plan import RULE_CHANGES

    return {c for rec in recs for c in RULE_CHANGES.get(rec.get("rule_id"), ())}


def unpredicted_win(trial: dict, named: set[str]) -> dict | None:
    """The ``GD-MEASURED`` recommendation of a conclusive saving that no rule predicted: no
    prediction on the trial and no recommendation whose rule names the change (``named``). None
    for any other trial, and for ``args:`` trials (the user's own arguments, not a change)."""
    if (trial.get("rule_id") is not None or trial["change"] in named or trial["change"].startswith("args:")
            or not conclusive(trial) or trial.get("status") != "measured" or trial["saving_ns"] <= 0):
        return None
    low, high = trial.get("saving_ci_ns") or (None, None)
    interval = "" if low is None else f", 95 % interval {low / 1e6:.2f} to {high / 1e6:.2f} ms"
    runs = len(trial.get("baseline_runs_ns") or [])
    evidence = (f"trial {trial['change']}: {_ms(trial.get('baseline_step_ns'))} -> {_ms(trial.get('trial_step_ns'))} "
                f"ms/step over {trial.get('steps')} steps, against {runs} baseline runs{interval}")
    return {"rule_id": MEASURED_RULE, "title": f"Measured, not predicted: {trial['change']} saves "
            f"{trial['saving_ns'] / 1e6:.2f} ms per step", "predicted": False,
            "saving_ns_per_step": 0.0, "saving_percent_of_step": 0.0, "saving_estimated": False,
            "estimate": "none: no rule predicted this change; a trial measured it on the script",
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
    by_rule = best_by_rule(trials)
    for rec in recs:
        for key in TRIAL_FIELDS:  # a report attached before: its trials' fields go
            rec.pop(key, None)
        trial = by_rule.get(rec.get("rule_id"))
        if trial is not None:
            rec.update(trial_fields(trial))
        if rec.get("rule_id") == "GD-OVERHEAD-BOUND":
            advice = (rec.get("how_to_fix") or "").split(GRAPH_NOTE_START)[0]
            rec["how_to_fix"] = advice + graph_form_note(rec, trials)
    named = _named_by(recs)
    recs += [w for w in (unpredicted_win(t, named) for t in trials) if w is not None]
    recs.sort(key=lambda r: -(r["measured_saving_ns"] if r.get("measured_saving_ns") is not None
                              else float(r.get("saving_ns_per_step") or 0.0)))
    if "recommendations" in report or recs:
        report["recommendations"] = recs
    return report


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
