"""Rules for inference runs (steps are requests: ``RuleContext.inference`` is set), each with the
estimate of every change it names (``change_estimates``), costs included, so that the trials can
pick and the report can compare them.

- GD-HALF-WEIGHTS: fp32 weights at inference. Three changes, three estimates:
  * ``half-weights`` (weights and activations in bf16): compute-bound fp32 contractions at the
    bf16 tensor-core roof (× fp32 peak / bf16 peak), memory-bound contractions and other
    memory-bound kernels at half the bytes (× 0.5);
  * ``bf16-autocast``: the same contraction saving, minus the casts autocast adds on every call:
    each fp32 weight is read (4 bytes/element) and written in bf16 (2) once per call, and each
    is one more kernel launch; memory-bound elementwise kernels stay fp32 under autocast;
  * ``tf32``: compute-bound fp32 contractions at the TF32 roof only.
  This replaces GD-FP32-MATMUL at inference, where weights need no fp32 master copy.
- GD-STATIC-KV-CACHE: a ``generate()`` loop with Hugging Face's default dynamic KV cache. The
  static cache alone saves the cache's growth copies (``cat`` kernels, measured per step); with it,
  ``generate()`` compiles the decoding step into CUDA graphs by itself (transformers' automatic
  compilation), which can remove the host time between kernels: up to the step time without the
  profiler less its kernels and the token loop's own host time (``host_floor.loop_floor``:
  measured on three generate() loops, docs/inference.md). The trials measure both (``static-cache``, ``static-cache-compile``): compile on top
  may not help.

The registry imports this module; this one imports ``base``.
"""

from __future__ import annotations

from gpudiag.analysis.attribution.families import CONTRACTION_FAMILIES
from gpudiag.analysis.rules.base import Recommendation, RuleContext
from gpudiag.analysis.rules.host_floor import graph_floor_ns, loop_floor, untraced_factor
from gpudiag.analysis.roofline.kernel_precision import math_paths_from_names


MIN_SHARE = 0.05  # under 5 % of the step a precision change is not worth advising (GD-FP32-MATMUL's bar)


def _fp32_contractions(ctx: "RuleContext"):
    """Contraction kernels whose math path (op shapes, else the kernel name) is fp32 SIMT."""
    k = ctx.km[ctx.km["family"].isin(CONTRACTION_FAMILIES)]
    path = k["math_path"].where(k["math_path"].notna(), math_paths_from_names(k["name"]))
    return k[path == "fp32"]


def autocast_cast_cost_ns(params: dict | None, bandwidth: float, launch_ns: float) -> float:
    """Per call: each fp32 weight read (4 bytes per element) and written as bf16 (2 bytes) at the
    memory bandwidth (bytes/s), plus one kernel launch (``launch_ns``) per weight tensor. 0 without
    the weights' size (a foreign export)."""
    if not params or not params.get("bytes") or not bandwidth:
        return 0.0
    return params["bytes"] * 1.5 / bandwidth * 1e9 + params.get("tensors", 0) * launch_ns


def half_weights(ctx: "RuleContext") -> "Recommendation | None":
    """GD-HALF-WEIGHTS (see the module docstring); None for training or without fp32 math."""
    info = ctx.inference
    if info is None or (info.get("root_parameters") or {}).get("dtype") not in (None, "float32"):
        return None
    if (ctx.km["phase"] == "backward").any():  # a backward pass after all: training
        return None
    flops = ctx.peaks.flops
    if not flops.get("bf16") or not flops.get("fp32"):
        return None
    fp32 = _fp32_contractions(ctx)
    compute = fp32[fp32["kernel_class"] == "compute"]["duration_ns"].sum() / ctx.n_steps
    memory_gemm = fp32[fp32["kernel_class"] != "compute"]["duration_ns"].sum() / ctx.n_steps
    others = ctx.km[~ctx.km.index.isin(fp32.index) & (ctx.km["kernel_class"] == "bandwidth")]
    memory_other = others["duration_ns"].sum() / ctx.n_steps
    if compute + memory_gemm < MIN_SHARE * ctx.step_ns:
        return None
    gemm_saving = compute * (1 - flops["fp32"] / flops["bf16"]) + memory_gemm * 0.5
    casts = autocast_cast_cost_ns(info.get("root_parameters"), ctx.peaks.bandwidth, ctx.peaks.launch_overhead_ns or 0.0)
    estimates = {"half-weights": gemm_saving + 0.5 * memory_other, "bf16-autocast": gemm_saving - casts,
                 "tf32": compute * (1 - flops["fp32"] / flops["tf32"]) if flops.get("tf32") else 0.0}
    params = info.get("root_parameters") or {}
    weights = (f"{params['bytes'] / 2**20:.0f} MiB of fp32 weights in {params['tensors']} tensors"
               if params.get("bytes") else "fp32 weights")
    rec = Recommendation(
        "GD-HALF-WEIGHTS", "Inference runs in fp32: weights in bf16 would use tensor cores and halve the bytes",
        estimates["half-weights"],
        "compute-bound fp32 contractions x (1 - fp32 peak / bf16 peak) + memory-bound contractions and other "
        "memory-bound kernels x 0.5 (half the bytes); bf16 autocast: the contraction part minus its casts per call "
        f"(weights read and written once, one launch each: {casts / 1e6:.2f} ms); TF32: compute-bound fp32 "
        "contractions x (1 - fp32 peak / tf32 peak)",
        [f"{(compute + memory_gemm) / 1e6:.2f} ms/step in fp32 GEMM/conv/attention kernels "
         f"({100 * (compute + memory_gemm) / ctx.step_ns:.0f} % of the step; {compute / 1e6:.2f} ms compute-bound)",
         f"{weights}; bf16 autocast would add a cast kernel per weight per call",
         "estimates: " + ", ".join(f"{c} {v / 1e6:.2f} ms" for c, v in estimates.items())],
        "At inference cast the model once: `model.to(torch.bfloat16)` (or `.half()`) and its float inputs; "
        "bf16 autocast re-casts fp32 weights on every call, which at small batch can cost more than it saves; "
        "TF32 (`torch.backends.cuda.matmul.allow_tf32 = True`) is the one-line change that keeps fp32 weights.")
    rec.change_estimates = {c: max(v, 0.0) for c, v in estimates.items()}
    return rec


def static_kv_cache(ctx: "RuleContext") -> "Recommendation | None":
    """GD-STATIC-KV-CACHE (see the module docstring); None outside generate() steps."""
    info = ctx.inference
    if info is None or info.get("step_mode") != "generate":
        return None
    cats = ctx.km[ctx.km["name"].str.contains("CatArrayBatchedCopy|cat_", regex=True)]
    cat_ns = cats["duration_ns"].sum() / ctx.n_steps
    kernel_ns = ctx.km["duration_ns"].sum() / ctx.n_steps
    # the host time CUDA graphs remove is the bare run's: tracing inflates a host-bound generate()
    # step (H100: BART 466 ms traced, 135 ms bare; the traced difference predicted 306 % of the step),
    # less the token loop's own host time, which graphs of the model keep (host_floor.loop_floor)
    factor = untraced_factor(ctx.step_ns, ctx.bare_inflation_ns)
    bare_step_ns = ctx.step_ns * factor
    floor = loop_floor(ctx)
    graphs_ns = max(bare_step_ns - (kernel_ns if floor is None else graph_floor_ns(floor, factor)), 0.0)
    if max(cat_ns, graphs_ns) < MIN_SHARE * bare_step_ns:
        return None
    rec = Recommendation(
        "GD-STATIC-KV-CACHE", "generate() grows its KV cache every token: a static cache lets it compile the decoding step",
        max(cat_ns, graphs_ns),
        f"static cache alone: the cache's growth copies (cat kernels, {cat_ns / 1e6:.2f} ms/step); with generate()'s "
        f"automatic compilation on top: the step time without the profiler minus its kernel time and the token "
        f"loop's own host time ({graphs_ns / 1e6:.2f} ms/step), what CUDA "
        "graphs of the decoding step can remove; the trials measure both",
        [f"{cat_ns / 1e6:.2f} ms/step in {len(cats) / ctx.n_steps:.0f} cat kernels per step",
         f"kernels {kernel_ns / 1e6:.2f} ms of a {bare_step_ns / 1e6:.2f} ms step (without the profiler): the rest "
         "is host time"],
        "Set `model.generation_config.cache_implementation = \"static\"` (or pass `cache_implementation=\"static\"` "
        "to generate()); on CUDA, transformers then compiles the decoding step itself (turn that off with "
        "`generation_config.disable_compile = True` if it does not pay). Compiling with `mode=\"reduce-overhead\"` "
        "yourself: call `torch.compiler.cudagraph_mark_step_begin()` before each step, or a later replay overwrites "
        "the outputs you kept (\"accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run\").")
    rec.change_estimates = {"static-cache": cat_ns, "static-cache-compile": graphs_ns}
    return rec


INFERENCE_RULES = (half_weights, static_kv_cache)
