"""Which changes to try: the report's recommendations mapped to changes gpudiag can apply itself.

The map is gpudiag's: each rule names the changes that act on what it found, in the order an
expert tries them (GD-OVERHEAD-BOUND: CUDA graphs first, since only they remove the launches; then
compile, which fuses some). A change is tried once, for its largest predicted saving.
"""

from __future__ import annotations

from gpudiag.trials import loader_changes
from gpudiag.script_status import ScriptStatus

RULE_CHANGES = {
    "GD-OVERHEAD-BOUND": ("compile-graphs", "compile"),
    "GD-TORCH-COMPILE": ("compile",),
    "GD-UNFUSED-OPTIMIZER": ("fused-optimizer",),
    "GD-CHANNELS-LAST": ("channels-last",),
    "GD-FP32-MATMUL": ("tf32", "bf16-autocast"),
    "GD-CUDNN-BENCHMARK": ("cudnn-benchmark",),
    "GD-UNFUSED-NORM": ("kernels", "compile"),
    "GD-SMALL-GRID": ("compile-graphs",),
    "GD-HALF-WEIGHTS": ("half-weights", "tf32", "bf16-autocast"),
    "GD-STATIC-KV-CACHE": ("static-cache-compile", "static-cache"),
    "GD-INPUT-STALL": ("loader-workers",),
    "GD-PAGEABLE-COPY": ("pin-memory",),
}

# Model classes gpudiag.fused has fused kernels for (hf.apply, timm_swin.apply), as the report's
# module table names them (module_class).
KERNEL_MODELS = ("Llama", "Mistral", "Qwen2", "GPT2", "Bert", "SwinTransformer")

DEFAULT_COUNT = 3  # changes a rule predicted, largest predicted saving first
# Trials in all with ``--try auto``: after the predicted ones, changes no rule ranked that apply to
# what the run does (:func:`generic_changes`), so that a win no rule predicts is found. Six runs of
# changes and seven of the baseline take about the default --try-budget on a script whose runs
# take 20 s (gpudiag's choice).
TOTAL_COUNT = 6
# The generic changes in the order they are tried: the cheapest to run and most often large first
# (TF32 and bf16 speed fp32 GEMMs several-fold on tensor cores; compile fuses elementwise work),
# then the narrower ones (gpudiag's order).
GENERIC_ORDER = ("tf32", "compile", "bf16-autocast", "half-weights", "compile-graphs", "loader-workers",
                 "fused-optimizer", "cudnn-benchmark", "channels-last", "static-cache")
# Share of the step in fp32 GEMMs/convolutions (or in convolutions) from which tf32, bf16 and half
# weights (or channels-last, cudnn-benchmark) are worth a trial: a change cannot save more than the
# time it acts on, and a saving under 5 % of the step is below the run-to-run spread of most
# scripts (runs of the unchanged script: 0.1 % apart on the GNN, docs/trials_proof.md, 62 % on a
# host-bound server, docs/inference.md). gpudiag's choice.
MIN_SHARE = 0.05
CONTRACTIONS = ("gemm", "conv")
# Changes that compile before their first measured step: they run after the others, so that one
# compile does not spend the --try-budget of every change (a ResNet-50 under Lightning on the H200,
# 2026-11-28: its compile trial took 100 s of the 135 s budget and the five changes after it never
# ran; docs/framework_suite.md).
COMPILING = ("compile", "compile-graphs", "static-cache-compile")


def parse_try(value: str) -> list[str] | None:
    """``--try`` as given: "auto" -> None (choose from the report), "none" -> [], else the
    comma-separated changes, ending optionally with ``args:ARGS`` (the script run with ARGS
    instead of its own, e.g. ``args:--batch 64``, compared per sample). Raises ValueError naming an
    unknown change."""
    from gpudiag.trials.changes import CHANGES

    value = value.strip()
    if value == "auto":
        return None
    if value == "none":
        return []
    # args:"..." holds the script's own arguments, commas included: it is the last entry
    head, _, args = value.partition("args:")
    names = [v.strip() for v in head.split(",") if v.strip()] + (["args:" + args.strip()] if args.strip() else [])
    unknown = [n for n in names if n not in CHANGES and not n.startswith("args:")]
    if unknown:
        raise ValueError(f"--try {value!r}: unknown change {unknown[0]!r}; use auto, none or a comma-separated list "
                         f"of {', '.join(CHANGES)}")
    return list(dict.fromkeys(names))


def _kernel_model(report: dict) -> bool:
    classes = {str(m.get("module_class", "")) for m in report.get("modules") or [] if isinstance(m, dict)}
    return any(c.startswith(prefix) for c in classes for prefix in KERNEL_MODELS)


def blocked(change: str, report: dict, status: ScriptStatus | dict) -> str | None:
    """Why ``change`` cannot help this script (None when it can be tried): already compiled,
    already under autocast, or no model the kernels know."""
    status = ScriptStatus.of(status) or ScriptStatus()
    if change in ("compile", "compile-graphs") and report.get("compiled"):
        return "the script already runs torch.compile"
    if change == "bf16-autocast" and (status.autocast_dtype or "off") != "off":
        return f"the script already runs under {status.autocast_dtype} autocast"
    if change == "cudnn-benchmark" and status.cudnn_benchmark:
        return "the script already sets torch.backends.cudnn.benchmark"
    if change == "kernels" and not _kernel_model(report):
        return "no model gpudiag.fused has fused kernels for"
    inference = report.get("inference")
    if change == "half-weights" and not inference:
        return "a training run: bf16 weights would drop the optimizer's fp32 master weights (use bf16-autocast)"
    if change.startswith("static-cache") and (inference or {}).get("step_mode") != "generate":
        return "no generate() steps: a static KV cache is a generate() setting"
    if change in loader_changes.LOADER_CHANGES:
        return loader_changes.why_not(change, status.frameworks)
    return None


def predictions(report: dict) -> dict[str, dict]:
    """change -> {"predicted_saving_ns": the largest saving of a rule that names it (the rule's own
    estimate for that change, ``change_estimates``, where it gives one), "rule_id"}."""
    out: dict[str, dict] = {}
    for rec in report.get("recommendations") or []:
        own = rec.get("change_estimates") or {}
        for change in RULE_CHANGES.get(rec.get("rule_id"), ()):
            saving = float(own.get(change, rec.get("saving_ns_per_step")) or 0.0)
            if change not in out or saving > out[change]["predicted_saving_ns"]:
                out[change] = {"predicted_saving_ns": saving, "rule_id": rec["rule_id"]}
    kernel_saving = sum(float(c.get("saving_ns_per_step") or 0.0) for c in report.get("fusion_candidates") or []
                        if c.get("reference_kernel"))
    if kernel_saving > out.get("kernels", {}).get("predicted_saving_ns", 0.0):
        out["kernels"] = {"predicted_saving_ns": kernel_saving, "rule_id": "fusion candidates"}
    return out


def _step_ns(report: dict) -> float:
    return float((((report.get("steps") or {}).get("step_time_ns") or {}).get("median")) or 0.0)


def fp32_contraction_ns(report: dict) -> float:
    """GPU time per step (ns) of the top kernels that are GEMMs or convolutions on the fp32 path:
    the math path of the kernel's roofline point, else the one its name says
    (:func:`gpudiag.analysis.roofline.kernel_precision.math_path_from_name`)."""
    from gpudiag.analysis.roofline.kernel_precision import math_path_from_name

    paths = {p.get("name"): p.get("math_path") for p in report.get("roofline_points") or [] if isinstance(p, dict)}
    total = 0.0
    for kernel in report.get("top_kernels") or []:
        if kernel.get("family") in CONTRACTIONS:
            path = paths.get(kernel.get("name")) or math_path_from_name(kernel.get("name", ""))
            total += float(kernel.get("time_ns_per_step") or 0.0) if path == "fp32" else 0.0
    return total


def generic_changes(report: dict) -> list[tuple[str, str]]:
    """(change, why it applies) for the changes worth a trial whatever the rules found, in
    :data:`GENERIC_ORDER`: compile and compile-graphs always; tf32 where fp32 GEMMs/convolutions
    take at least :data:`MIN_SHARE` of the step, with bf16-autocast (training) or half-weights
    (inference); fused-optimizer where an ``optimizer.step()`` ran; channels-last and
    cudnn-benchmark where convolutions take that share; static-cache where steps are generate()
    calls; loader-workers where the GPU idles before the steps' first kernels (what GD-INPUT-STALL
    measures, without its 10 %) for that share and the script built a DataLoader. Whether each is
    blocked for this script is :func:`blocked`'s to say."""
    step = _step_ns(report)
    fp32 = fp32_contraction_ns(report)
    conv = float((report.get("families_ns_per_step") or {}).get("conv") or 0.0)
    inference = bool(report.get("inference"))
    why = {"compile": "applies to any model", "compile-graphs": "applies to any model"}
    if step and fp32 >= MIN_SHARE * step:
        share = f"fp32 GEMMs/convolutions take {100 * fp32 / step:.0f} % of the step"
        why.update({"tf32": share, ("half-weights" if inference else "bf16-autocast"): share})
    if "optimizer" in (report.get("phases_ns_per_step") or {}) and not inference:
        why["fused-optimizer"] = "the step runs optimizer.step()"
    if step and conv >= MIN_SHARE * step:
        share = f"convolutions take {100 * conv / step:.0f} % of the step"
        why.update({"channels-last": share, "cudnn-benchmark": share})
    if (report.get("inference") or {}).get("step_mode") == "generate":
        why["static-cache"] = "the steps are generate() calls"
    stall = float((report.get("idle") or {}).get("step_start_idle_ns_per_step") or 0.0)
    loaders = (((report.get("script") or {}).get("frameworks") or {}).get("dataloaders") or {}).get("built")
    if step and stall >= MIN_SHARE * step and loaders:
        why["loader-workers"] = (f"the GPU waits {100 * stall / step:.0f} % of the step for input before the step's "
                                 "first kernel, and the script builds a DataLoader")
    return [(c, why[c]) for c in GENERIC_ORDER if c in why]


def choose(report: dict, status: dict, asked: list[str] | None, count: int = DEFAULT_COUNT,
           total: int = TOTAL_COUNT) -> tuple[list[dict], list[dict]]:
    """(to try, left out). ``asked``: the user's ``--try`` list (tried in that order, none
    blocked, origin "asked"), or None: the ``count`` applicable changes with the largest predicted
    savings (origin "predicted"), then generic ones (:func:`generic_changes`, origin "generic")
    up to ``total`` in all (those a rule predicted first, by predicted saving), run in that order
    except that the :data:`COMPILING` changes come last. Each entry: change, predicted_saving_ns (None when no rule predicted
    one), rule_id (None likewise), origin; generic entries also ``why``; left-out entries
    ``reason``. A blocked generic change is not listed: nothing suggested it."""
    predicted = predictions(report)
    if asked is not None:
        return [{"change": c, **predicted.get(c, {"predicted_saving_ns": None, "rule_id": None}), "origin": "asked"}
                for c in asked], []
    ranked = sorted(predicted.items(), key=lambda kv: -kv[1]["predicted_saving_ns"])
    chosen, left = [], []
    for change, info in ranked:
        reason = blocked(change, report, status)
        entry = {"change": change, **info, "origin": "predicted"}
        if reason:
            left.append(entry | {"reason": reason})
        elif len(chosen) < count:
            chosen.append(entry)
        else:
            left.append(entry | {"reason": f"beyond the top {count} predicted (--try picks changes)"})
    # a rule's prediction first (largest first), then GENERIC_ORDER: channels-last, predicted 8 ms on
    # a Lightning ResNet-50, came after four changes no rule predicted and never ran (H200, 2026-11-28)
    generic = sorted(generic_changes(report), key=lambda cw: -predicted.get(cw[0], {}).get("predicted_saving_ns", -1.0))
    for change, why in generic:
        if any(e["change"] == change for e in chosen) or blocked(change, report, status):
            continue
        entry = {"change": change, **predicted.get(change, {"predicted_saving_ns": None, "rule_id": None}),
                 "origin": "generic", "why": why}
        left = [e for e in left if e["change"] != change]
        if len(chosen) < total:
            chosen.append(entry)
        else:
            left.append(entry | {"reason": f"beyond the {total} trials in all (--try picks changes)"})
    chosen.sort(key=lambda e: e["change"] in COMPILING)  # stable: the order within each part stays
    return chosen, left
