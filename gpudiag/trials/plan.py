"""Which changes to try: the report's recommendations mapped to changes gpudiag can apply itself.

The map is gpudiag's: each rule names the changes that act on what it found, in the order an
expert tries them (GD-OVERHEAD-BOUND: CUDA graphs first, since only they remove the launches; then
compile, which fuses some). A change is tried once, for its largest predicted saving.
"""

from __future__ import annotations

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
}

# Model classes gpudiag.kernels has fused kernels for (hf.apply, timm_swin.apply), as the report's
# module table names them (module_class).
KERNEL_MODELS = ("Llama", "Mistral", "Qwen2", "GPT2", "Bert", "SwinTransformer")

DEFAULT_COUNT = 3


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


def blocked(change: str, report: dict, status: dict) -> str | None:
    """Why ``change`` cannot help this script (None when it can be tried): already compiled,
    already under autocast, or no model the kernels know."""
    if change in ("compile", "compile-graphs") and report.get("compiled"):
        return "the script already runs torch.compile"
    if change == "bf16-autocast" and (status.get("autocast_dtype") or "off") != "off":
        return f"the script already runs under {status['autocast_dtype']} autocast"
    if change == "cudnn-benchmark" and status.get("cudnn_benchmark"):
        return "the script already sets torch.backends.cudnn.benchmark"
    if change == "kernels" and not _kernel_model(report):
        return "no model gpudiag.kernels has fused kernels for"
    inference = report.get("inference")
    if change == "half-weights" and not inference:
        return "a training run: bf16 weights would drop the optimizer's fp32 master weights (use bf16-autocast)"
    if change.startswith("static-cache") and (inference or {}).get("step_mode") != "generate":
        return "no generate() steps: a static KV cache is a generate() setting"
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


def choose(report: dict, status: dict, asked: list[str] | None, count: int = DEFAULT_COUNT) -> tuple[list[dict], list[dict]]:
    """(to try, left out). ``asked``: the user's ``--try`` list (tried in that order, none
    blocked), or None: the ``count`` applicable changes with the largest predicted savings.
    Each entry: change, predicted_saving_ns (None when no rule predicted one), rule_id; left-out
    entries also have ``reason``."""
    predicted = predictions(report)
    if asked is not None:
        return [{"change": c, **predicted.get(c, {"predicted_saving_ns": None, "rule_id": None})} for c in asked], []
    ranked = sorted(predicted.items(), key=lambda kv: -kv[1]["predicted_saving_ns"])
    chosen, left = [], []
    for change, info in ranked:
        reason = blocked(change, report, status)
        entry = {"change": change, **info}
        if reason:
            left.append(entry | {"reason": reason})
        elif len(chosen) < count:
            chosen.append(entry)
        else:
            left.append(entry | {"reason": f"beyond the top {count} (--try picks changes)"})
    return chosen, left
