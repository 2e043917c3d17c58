"""Rules an expert applies first (issue 11): memory layout, fp32 work under autocast, batch-size
headroom, torch.compile, cudnn.benchmark and attention off the flash kernels.

Each rule takes the :class:`~gpudiag.analysis.rules.base.RuleContext` of the measured steps and
returns at most one :class:`~gpudiag.analysis.rules.base.Recommendation` with a stable ``rule_id``,
the evidence (kernels, time per measured step), the estimated saving per step with the model
behind it, and the fix. :data:`EXPERT_RULES` is appended to ``registry.RULES``; the registry
silences any estimated saving under 0.5 % of the step. Thresholds are gpudiag's choices unless a
source is named. The registry imports this module; this one imports only ``base`` and the rules it builds on.
"""

from __future__ import annotations

import json
import re
import numpy as np
import pandas as pd

from gpudiag.analysis.roofline.costmodel import ITEMSIZE, _tensors
from gpudiag.analysis.attribution.families import CONTRACTION_FAMILIES, per_distinct
from gpudiag.analysis.rules.base import Recommendation, RuleContext, top_evidence
from gpudiag.analysis.rules.host import overhead_saving
from gpudiag.analysis.rules.kernels import small_grids


# cuDNN's NCHW<->NHWC conversions around its NHWC convolution kernels (cudnn::engines_precompiled::
# nchwToNhwcKernel / nhwcToNchwKernel; CUTLASS-style spellings too).
LAYOUT_CONVERSION = re.compile(r"nchw_?to_?nhwc|nhwc_?to_?nchw", re.IGNORECASE)
# BatchNorm kernels of PyTorch (batch_norm_*_kernel) and cuDNN (bn_fw_*/bn_bw_*) on NCHW tensors:
# the channels-last variants carry "channels_last" or "nhwc" in their names. Inductor's generated
# kernels (triton_*) say nothing of their layout and are left out.
BATCH_NORM = re.compile(r"batch_norm|batchnorm|\bbn_(?:fw|bw)", re.IGNORECASE)
CHANNELS_LAST_NAME = re.compile(r"channels_last|nhwc|^triton_", re.IGNORECASE)
# A model-wide memory-format change is worth advising above 5 % of the step (the bar GD-FP32-MATMUL
# sets for a precision change); cuDNN's layout conversions around a ViT's single patch-embedding
# convolution (2.6 % of the step, tests/fixtures/zoo/vit) stay under it.
LAYOUT_MIN_SHARE = 0.05
# Achieved DRAM bandwidth of PyTorch's channels-last BatchNorm kernels (collect statistics,
# transform input, backward reduce + element-wise), as a share of the datasheet peak: their op bytes
# (cost model: inputs read once, outputs written once) over their time, measured on
# tests/fixtures/zoo/resnet50_cl (ResNet-50 bf16 batch 64 training, H100 SXM: 7.0 GB/step in
# 7.1 ms/step = 0.98 TB/s of 3.35 TB/s). tests/analysis/rules/test_expert.py recomputes it from the export.
NHWC_BN_BANDWIDTH_SHARE = 0.29
# Without op bytes (no op ranges): NHWC BatchNorm time / NCHW BatchNorm time, same two captures
# (7.1 ms vs 15.1 ms per step).
NHWC_BN_TIME_RATIO = 0.47

# Loss kernels: autocast runs softmax/log_softmax/nll_loss/cross_entropy in fp32 on purpose
# (PyTorch AMP docs, "CUDA Ops that can autocast to float32"); they are not the waste meant here.
LOSS = re.compile(r"softmax|nll_loss|cross_entropy|SoftMax", re.IGNORECASE)
CASTS = {"aten::_to_copy", "aten::copy_", "aten::to"}
FP32_NAME = re.compile(r"\bfloat\b")
NARROW_NAME = re.compile(r"bfloat16|half|__nv_bfloat16|bf16|fp16|float16", re.IGNORECASE)
# GEMMs "run under autocast" when bf16/fp16 math paths hold most of the contraction time.
AUTOCAST_GEMM_SHARE = 0.5

# Batch headroom: a doubled batch at most doubles the peak (weights and optimizer state do not
# grow), so a peak under half the GPU's memory leaves room for at least 2x.
HEADROOM_SHARE = 0.5

# "Conv-heavy": cuDNN convolution kernels and their layout conversions take 10 % of the step or more.
CONV_HEAVY_SHARE = 0.10

# Memory-efficient attention (xFormers/CUTLASS kernels PyTorch ships as PyTorchMemEffAttention).
MEM_EFFICIENT = re.compile(r"fmha_cutlass|PyTorchMemEffAttention|efficient_attention|mem_eff", re.IGNORECASE)
# Kernels either side of a softmax searched for the two GEMMs of attention (bias, mask and scale
# kernels sit between them in hand-written attention).
ATTENTION_WINDOW = 8
# Log-softmax (the loss): by name, or PyTorch's softmax_warp_* kernels whose 5th template argument
# (is_log_softmax) is true.
LOG_SOFTMAX = re.compile(r"log_?softmax|LogSoftMax|softmax_warp_\w+<(?:[^,<>]+,){4}\s*\(bool\)1", re.IGNORECASE)
LAUNCH_CONFIG = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]


def _matches(names: pd.Series, pattern: re.Pattern) -> pd.Series:
    """Boolean mask of ``names`` matching ``pattern``, searched once per distinct name (a step has
    thousands of launches of a few hundred long demangled names)."""
    return pd.Series(per_distinct(names.fillna(""), lambda n: bool(pattern.search(n)), False, bool), index=names.index)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms"


def _per_step(df: pd.DataFrame, ctx: "RuleContext") -> float:
    return float(df["duration_ns"].sum()) / ctx.n_steps


# ---- layout --------------------------------------------------------------------------------------

def _layout_parts(ctx: "RuleContext") -> tuple[pd.DataFrame, pd.DataFrame, float] | None:
    """(layout-conversion kernels, NCHW BatchNorm kernels, BatchNorm saving per step in ns) of a
    step with convolutions whose channels-last saving reaches :data:`LAYOUT_MIN_SHARE`; else None."""
    km = ctx.km
    if not (km["family"] == "conv").any():
        return None
    layout = km[_matches(km["name"], LAYOUT_CONVERSION)]
    bn = km[_matches(km["name"], BATCH_NORM) & ~_matches(km["name"], CHANNELS_LAST_NAME)]
    known = bn["bytes"].notna() if "bytes" in bn else pd.Series(False, index=bn.index)
    bn_saving = 0.0
    if ctx.peaks.bandwidth and known.any():
        nhwc_ns = float(bn.loc[known, "bytes"].sum()) / (NHWC_BN_BANDWIDTH_SHARE * ctx.peaks.bandwidth) * 1e9
        bn_saving += max(float(bn.loc[known, "duration_ns"].sum()) - nhwc_ns, 0.0) / ctx.n_steps
    bn_saving += float(bn.loc[~known, "duration_ns"].sum()) * (1 - NHWC_BN_TIME_RATIO) / ctx.n_steps
    if _per_step(layout, ctx) + bn_saving < LAYOUT_MIN_SHARE * ctx.step_ns:
        return None
    return layout, bn, bn_saving


def channels_last(ctx: "RuleContext") -> "Recommendation | None":
    """GD-CHANNELS-LAST: a convolutional model in NCHW. cuDNN runs its tensor-core convolutions in
    NHWC and converts NCHW tensors around them (nchwToNhwcKernel / nhwcToNchwKernel), and PyTorch's
    NCHW BatchNorm kernels reduce over strided channels. Fires when the step has convolution kernels
    and the saving is 5 % of the step or more.

    Saving per step = layout-conversion kernel time (gone in channels_last: cuDNN reads NHWC
    directly, cuDNN developer guide "Tensor Layouts") + NCHW BatchNorm time - the same op bytes at
    the bandwidth channels-last BatchNorm kernels reach (:data:`NHWC_BN_BANDWIDTH_SHARE` of peak;
    without op bytes: BatchNorm time x (1 - :data:`NHWC_BN_TIME_RATIO`)). GPU time: if the step then
    waits for kernel launches it shrinks by less (ResNet-50 on the H100: 12.4 ms/step less kernel
    time, the bare step 31.0 -> 23.5 ms, tests/fixtures/zoo/zoo_runs.json)."""
    parts = _layout_parts(ctx)
    if parts is None:
        return None
    layout, bn, bn_saving = parts
    layout_ns, bn_ns = _per_step(layout, ctx), _per_step(bn, ctx)
    saving = layout_ns + bn_saving
    return Recommendation(
        "GD-CHANNELS-LAST", "The convolutions run in NCHW: cuDNN converts layouts and BatchNorm runs its slow NCHW kernels",
        saving,
        f"layout-conversion kernel time ({_ms(layout_ns)}) + NCHW BatchNorm time ({_ms(bn_ns)}) minus its op bytes at "
        f"{NHWC_BN_BANDWIDTH_SHARE:.0%} of peak bandwidth, what PyTorch's channels-last BatchNorm reaches (measured, "
        "ResNet-50 bf16 on the H100); GPU time: a step that then waits for launches shrinks by less",
        [f"{_ms(layout_ns)}/step in NCHW<->NHWC conversions ({len(layout) / ctx.n_steps:.0f} launches/step), "
         f"{_ms(bn_ns)}/step in NCHW BatchNorm kernels ({100 * (layout_ns + bn_ns) / ctx.step_ns:.0f} % of the step together)",
         *top_evidence(pd.concat([layout, bn]), ctx.n_steps)],
        "Convert the model and its inputs to channels-last: `model = model.to(memory_format=torch.channels_last)` and "
        "`x = x.to(memory_format=torch.channels_last)` (PyTorch tutorial \"Channels Last Memory Format\"); then "
        "`torch.compile(model)` fuses BatchNorm + ReLU (+ the residual add).",
        # channels-last also changes the convolutions' own kernels (NHWC tensor-core paths)
        covers_ns_per_step=_per_step(ctx.km[ctx.km["family"] == "conv"], ctx) + layout_ns + bn_ns)


# ---- fp32 under autocast ------------------------------------------------------------------------

def _fp32_fraction(args: str, op: str) -> float:
    """Share of an op call's bytes that bf16 would save: (fp32 bytes / 2) / all bytes, from the
    recorded tensors (inputs read once, outputs written once); 0 for casts and unparsable payloads."""
    if op in CASTS:
        return 0.0
    try:
        payload = json.loads(args)
        tensors = _tensors(payload.get("in", [])) + _tensors(payload.get("out") or [])
    except (ValueError, AttributeError):
        return 0.0
    sizes = [(d, float(np.prod(s)) * ITEMSIZE.get(d, 4)) for d, s in tensors]
    total = sum(b for _, b in sizes)
    fp32 = sum(b for d, b in sizes if d == "float32")
    return fp32 / 2 / total if total else 0.0


def _fractions_by_name(ctx: "RuleContext") -> dict[str, float]:
    """Kernel name -> duration-weighted bf16-saving fraction of its detail-step op calls."""
    d = ctx.detail[(ctx.detail["op"] != "") & ctx.detail["op_args"].notna()] if not ctx.detail.empty else ctx.detail
    if d.empty:
        return {}
    parsed = {key: _fp32_fraction(*key) for key in set(zip(d["op_args"], d["op"]))}
    frac = pd.Series([parsed[key] for key in zip(d["op_args"], d["op"])], index=d.index)
    weighted = (frac * d["duration_ns"]).groupby(d["name"]).sum() / d.groupby("name")["duration_ns"].sum()
    return weighted.fillna(0.0).to_dict()


def _name_fraction(name: str) -> float:
    """Without op shapes: an all-fp32 kernel (``float`` template arguments, no 16-bit type) saves
    half its bytes in bf16; copies and mixed kernels (casts) count 0."""
    if "copy" in name or not FP32_NAME.search(name) or NARROW_NAME.search(name):
        return 0.0
    return 0.5


def fp32_under_autocast(ctx: "RuleContext") -> "Recommendation | None":
    """GD-FP32-UNDER-AUTOCAST: element-wise, norm, reduction and copy kernels working in fp32
    while the GEMMs run in bf16/fp16 (autocast), e.g. HF Llama's RMSNorm upcasting the residual
    stream. Loss kernels (fp32 by autocast's policy) and the optimizer (fp32 master weights) are left
    out; casts are listed but not counted (some are autocast's weight casts, which stay).

    Saving per step = sum over those kernels of time x (fp32 bytes / 2) / bytes, bytes from the
    detail step's recorded dtypes and shapes (an all-fp32 kernel: half its time; bandwidth-bound
    kernels scale with bytes: roofline, Williams et al. 2009); kernels without op shapes count half
    their time when their name is all-fp32."""
    # the columns read below: the row filters then copy 7 columns, not the kernel frame's 44
    km = ctx.km[["family", "math_path", "duration_ns", "phase", "name", "short_name", "op"]]
    gemm = km["family"].isin(CONTRACTION_FAMILIES)  # a mask: copying the GEMM rows would copy their names
    if not gemm.any() or km["duration_ns"][gemm & km["math_path"].isin(["bf16", "fp16"])].sum() < (
            AUTOCAST_GEMM_SHARE * km["duration_ns"][gemm].sum()):
        return None
    # masks first, then one copy of the chosen rows: each row filter copies the rows' names
    pool = (km["family"].isin(["elementwise", "norm", "reduce", "copy"]) & (km["phase"] != "optimizer")
            & ~_matches(km["name"], LOSS) & ~_matches(km["op"], LOSS)).to_numpy()
    by_name = _fractions_by_name(ctx)
    frac = per_distinct(km["name"], lambda n: by_name[n] if n in by_name else _name_fraction(n), 0.0, float)
    chosen = pool & (frac > 0)
    fp32 = km[chosen]
    saving = float((fp32["duration_ns"] * frac[chosen]).sum()) / ctx.n_steps
    if fp32.empty:
        return None
    casts = ctx.detail[ctx.detail["op"].isin(CASTS)] if not ctx.detail.empty else ctx.detail
    cast_names = set(casts["name"]) if not casts.empty else set()
    cast_ns = float(km["duration_ns"][km["name"].isin(cast_names)].sum()) / ctx.n_steps
    return Recommendation(
        "GD-FP32-UNDER-AUTOCAST", "Element-wise and norm kernels run in fp32 while the GEMMs run in bf16/fp16", saving,
        "sum of those kernels' time x the share of their bytes that bf16 would save (fp32 bytes / 2 over all bytes, "
        "from the recorded dtypes; bandwidth-bound kernels scale with bytes)",
        [f"{_ms(_per_step(fp32, ctx))}/step in {len(fp32) / ctx.n_steps:.0f} fp32 element-wise/norm/reduction "
         f"launches/step ({100 * _per_step(fp32, ctx) / ctx.step_ns:.0f} % of the step); GEMMs in bf16/fp16",
         *top_evidence(fp32, ctx.n_steps),
         f"plus {_ms(cast_ns)}/step of casts between fp32 and 16-bit types (not counted: autocast's weight casts stay)"],
        "Keep the residual stream and the norms' inputs/outputs in bf16 (e.g. load the model in bf16, or cast the "
        "embedding output once) and upcast only inside fused kernels that compute in fp32 registers: "
        "`torch.nn.functional.rms_norm` / `torch.nn.RMSNorm`, a fused RMSNorm (Liger-Kernel), or `torch.compile`.")


# ---- batch headroom ---------------------------------------------------------------------------------

def _launch_saving(ctx: "RuleContext", removed: float, launches: float, gpu_saving: float) -> float:
    """Host time saved per step on an overhead-bound step by removing ``removed`` of its
    ``launches`` launches, beyond ``gpu_saving`` (already counted): the step shortens by
    min(removed x the host time per launch, bare step - the GPU's kernel time left), the host time
    per launch being the bare step over its launches
    (:func:`gpudiag.analysis.rules.host_floor.host_ns_per_launch`) less the step's share of host
    compute (:mod:`gpudiag.analysis.steps.host_work`). Issue 21: on a GNN step the old
    estimate, idle time x the share of launches, missed most of what compile saved."""
    from gpudiag.analysis.rules.host_floor import host_ns_per_launch, untraced_factor

    # host compute (CPU work with no CUDA call, outside the model: making inputs) is no launch's cost,
    # and compiling the model leaves it (issue 34: predicted from the launch-bound part only)
    host_compute = float(ctx.idle["host_compute_ns"].sum()) / ctx.n_steps if "host_compute_ns" in ctx.idle else 0.0
    per_launch = host_ns_per_launch(ctx.step_ns, launches, ctx.bare_inflation_ns) * \
        max(1.0 - host_compute / ctx.step_ns, 0.0)
    bare_step = ctx.step_ns * untraced_factor(ctx.step_ns, ctx.bare_inflation_ns)
    gpu_left = float(ctx.km["duration_ns"].sum()) / ctx.n_steps - gpu_saving
    # the step after: max(host after, GPU after); the GPU saving is counted by the caller already
    return max(min(removed * per_launch, bare_step - gpu_left) - gpu_saving, 0.0)


def batch_headroom(ctx: "RuleContext") -> "Recommendation | None":
    """GD-BATCH-HEADROOM: the step's peak memory (PyTorch's max_memory_allocated per step, recorded
    by the launcher) is under half the GPU's memory while the step is overhead-bound or runs long
    kernels on few SMs: a larger batch gives each launch more work. Silent without a recorded peak
    (exports made without gpudiag) or without the GPU's memory size.

    Saving per step: the overhead-bound saving (corrected for the profiler, as ``representative``
    does) or else the small-grid saving, i.e. time per current batch's samples; it is the same time
    those rules count, so it overlaps them (not additive)."""
    measured = [ctx.peak_memory_bytes[s] for s in ctx.measured_steps if ctx.peak_memory_bytes.get(s)]
    peak = max(measured or list(ctx.peak_memory_bytes.values()) or [0])
    if not peak or not ctx.device_memory_bytes or peak >= HEADROOM_SHARE * ctx.device_memory_bytes:
        return None
    overhead = overhead_saving(ctx)
    grid = small_grids(ctx) if not overhead else None
    if not overhead and grid is None:
        return None
    source = "GD-OVERHEAD-BOUND" if overhead else "GD-SMALL-GRID"
    fits = ctx.device_memory_bytes / peak
    gains = {k: throughput_gain(ctx, k) for k in (2, 4) if k <= fits}
    if not gains:
        return None
    best = gains[max(gains)]
    bare_step = ctx.step_ns * _untraced(ctx)
    rec = Recommendation(
        "GD-BATCH-HEADROOM", f"Memory to spare while the GPU is underused: a larger batch, up to {best:.1f}x samples/s",
        bare_step * (1.0 - 1.0 / gains[min(gains)]),
        "a throughput gain, not a shorter step: samples/s x k x bare step / max(bare step, k x the step's kernel "
        f"time), the host's launch time per step staying as it is ({source}); per step: the time the current batch's "
        f"samples would save at {min(gains)}x; overlaps {source} (not additive)",
        [f"peak memory {peak / 1e9:.1f} GB of {ctx.device_memory_bytes / 1e9:.1f} GB "
         f"({100 * peak / ctx.device_memory_bytes:.0f} %) per step",
         "samples/s at " + ", ".join(f"{k}x batch: {g:.2f}x" for k, g in gains.items())],
        f"Raise the batch size (up to ~{fits:.0f}x fits by memory), scaling the learning rate "
        "or using gradient accumulation as your recipe requires; for inference, batch more requests per call.")
    rec.throughput_gain = {str(k): round(g, 2) for k, g in gains.items()}
    return rec


def _untraced(ctx: "RuleContext") -> float:
    from gpudiag.analysis.rules.host_floor import untraced_factor

    return untraced_factor(ctx.step_ns, ctx.bare_inflation_ns)


def throughput_gain(ctx: "RuleContext", k: int) -> float:
    """Samples/s gain of a batch ``k`` times larger: the host's time per step stays (launches do not
    grow with the batch), the GPU's kernel time per step grows k times, the step takes the longer
    of the two: k x bare step / max(bare step, k x kernel time per step). Measured on host-bound
    scripts (issue 21, H100): batch x2 gave 2.07x samples/s; x4 gave 3.0x and 3.5x."""
    bare_step = ctx.step_ns * _untraced(ctx)
    kernel_ns = float(ctx.km["duration_ns"].sum()) / ctx.n_steps if ctx.n_steps else 0.0
    return k * bare_step / max(bare_step, k * kernel_ns) if bare_step else 1.0


# ---- torch.compile ----------------------------------------------------------------------------------

def _fusable(ctx: "RuleContext") -> list[dict]:
    return [c for c in ctx.candidates if c.get("compile_fusable")]


def torch_compile(ctx: "RuleContext") -> "Recommendation | None":
    """GD-TORCH-COMPILE. Eager runs: Inductor would fuse the memory-bound chains that are
    compile-fusable (``fusion_candidates`` with ``compile_fusable``). Saving per step = their
    saving (chain time - fused floor, GPU time) + when the step is overhead-bound (corrected for
    the profiler), the host-bound idle x the share of the step's launches the fusion removes
    (each chain of k kernels becomes 1; idle assumed proportional to launches). When
    GD-CHANNELS-LAST fires, the estimate is for compile after it: its BatchNorm saving lies in the
    BatchNorm chains' time and is subtracted (measured on ResNet-50, H100: channels_last then
    compile took 4.5 ms/step more kernel time off, zoo resnet50_cl vs resnet50_cl_compile).

    Compiled runs (Inductor graphs in the step): what compile did not fuse, i.e. the eager chains
    that remain (op ranges are recorded only outside compiled graphs), the eager memory-bound
    kernel time left and Dynamo's graph breaks. Saving: those chains' saving only."""
    fusable = _fusable(ctx)
    compiled = bool(ctx.compiled and ctx.compiled.get("graphs"))
    gpu = float(sum(c["saving_ns_per_step"] for c in fusable))
    chains = float(sum(c["occurrences_per_step"] for c in fusable))
    if compiled:
        return _compiled_leftovers(ctx, fusable, gpu)
    if not fusable:
        return None
    # After GD-CHANNELS-LAST (the expert's first step), the NCHW BatchNorm excess it removes is no
    # longer in the BatchNorm chains' time: not counted twice.
    parts = _layout_parts(ctx)
    bn_chains = sum(c["saving_ns_per_step"] for c in fusable if any("batch_norm" in o for o in c["ops"]))
    overlap = min(parts[2], bn_chains) if parts is not None else 0.0
    gpu -= overlap
    removed = float(sum((c["kernels_per_occurrence"] - 1) * c["occurrences_per_step"] for c in fusable))
    launches = len(ctx.km) / ctx.n_steps
    overhead = overhead_saving(ctx)
    launch_part = _launch_saving(ctx, removed, launches, gpu) if overhead else 0.0
    top = sorted(fusable, key=lambda c: -c["saving_ns_per_step"])[:3]
    return Recommendation(
        "GD-TORCH-COMPILE", "torch.compile would fuse the memory-bound op chains", gpu + launch_part,
        f"compile-fusable fusion candidates' saving ({_ms(gpu)}: chain time - fused floor"
        + (f", less the {_ms(overlap)} GD-CHANNELS-LAST already takes out of their BatchNorm kernels" if overlap else "")
        + ")"
        + (f" + host time of the launches removed ({removed:.0f} of {launches:.0f} per step, x the bare step's host "
           f"time per launch, up to the GPU's own time: {_ms(launch_part)})" if overhead else "") + "; GPU time, overlaps the fusion candidates",
        [f"{len(fusable)} compile-fusable chains, {chains:.0f} occurrences/step, {removed:.0f} of {launches:.0f} "
         "kernel launches/step would go",
         *[f"{' -> '.join(o.removeprefix('aten::') for o in c['ops'][:6])} x{c['occurrences_per_step']}: "
           f"{_ms(c['saving_ns_per_step'])}/step" for c in top]],
        "`model = torch.compile(model)` (add `mode=\"max-autotune-no-cudagraphs\"` for GEMM autotuning, or "
        "`mode=\"reduce-overhead\"` to replay the step as a CUDA graph when launches bound it).")


def _compiled_leftovers(ctx: "RuleContext", fusable: list[dict], gpu: float) -> "Recommendation | None":
    km = ctx.km
    outside = km[(km["graph"] < 0) if "graph" in km else np.ones(len(km), bool)]
    eager = outside[~outside["family"].isin(CONTRACTION_FAMILIES) & (outside["phase"] != "optimizer")]
    dynamo = (ctx.compiled or {}).get("dynamo") or {}
    breaks = int(dynamo.get("graph_breaks") or 0)
    if not fusable and not breaks:
        return None
    reasons = [str(r)[:120] for r in (dynamo.get("graph_break_reasons") or [])[:3]]
    return Recommendation(
        "GD-TORCH-COMPILE", "torch.compile left memory-bound work unfused", gpu,
        "saving of the compile-fusable chains still run eagerly (chain time - fused floor); graph breaks not estimated",
        [f"{_ms(_per_step(eager, ctx))}/step of memory-bound kernels outside compiled graphs "
         f"({len(eager) / ctx.n_steps:.0f} launches/step), {len(fusable)} eager fusable chains",
         f"{breaks} graph break(s), {dynamo.get('recompiles', 0)} recompilation(s)" + (": " + "; ".join(reasons) if reasons else ""),
         *top_evidence(eager, ctx.n_steps, 2)],
        "Compile the code that still runs eagerly (the loss, pre/post-processing, or the whole training step), and "
        "remove graph breaks (`TORCH_LOGS=graph_breaks`, `torch._dynamo.explain(model)(x)`).")


# ---- cudnn.benchmark ----------------------------------------------------------------------------------

def cudnn_benchmark(ctx: "RuleContext") -> "Recommendation | None":
    """GD-CUDNN-BENCHMARK: ``torch.backends.cudnn.benchmark`` was off (recorded by the launcher)
    while cuDNN convolutions and their layout conversions take 10 % of the step or more: cuDNN then
    picks algorithms by heuristics instead of timing them (PyTorch docs, "Reproducibility" /
    ``torch.backends.cudnn.benchmark``). Silent when the flag was not recorded (exports made
    without gpudiag, or by an older launcher). Saving: not estimated (what autotuning finds depends
    on the shapes; gpudiag has no measurement to support a number), listed as a suggestion."""
    if ctx.cudnn_benchmark is not False:
        return None
    conv = ctx.km[(ctx.km["family"] == "conv") | _matches(ctx.km["name"], LAYOUT_CONVERSION)]
    conv_ns = _per_step(conv, ctx)
    if conv_ns < CONV_HEAVY_SHARE * ctx.step_ns:
        return None
    return Recommendation(
        "GD-CUDNN-BENCHMARK", "cudnn.benchmark is off in a convolution-heavy step", 0.0,
        "not estimated (depends on what cuDNN's autotuning finds for these shapes)",
        [f"torch.backends.cudnn.benchmark = False; {_ms(conv_ns)}/step in cuDNN convolution and layout kernels "
         f"({100 * conv_ns / ctx.step_ns:.0f} % of the step)", *top_evidence(conv, ctx.n_steps)],
        "Set `torch.backends.cudnn.benchmark = True` before the first step when input shapes are fixed (cuDNN times "
        "its algorithms once per shape; varying shapes re-tune each time).", saving_estimated=False,
        covers_ns_per_step=conv_ns)


# ---- attention ----------------------------------------------------------------------------------------

def _sandwiched_softmax(ctx: "RuleContext") -> pd.DataFrame:
    """Forward softmax kernels (not log-softmax) with a GEMM among the :data:`ATTENTION_WINDOW`
    kernels before and after them on the same stream (attention written as bmm, softmax, bmm), and
    the softmax-backward kernels launched with the same grid and block (the same score shape; the
    backward's bias-gradient kernels put its GEMMs further apart)."""
    # the columns read here, with each row's position: the chosen rows are taken from the kernel
    # frame once at the end (sorting the kernel frame copied all its columns: 0.2 s on 1 M kernels)
    km = ctx.km[list(dict.fromkeys(["start_ns", "stream_id", "family", "name", *LAUNCH_CONFIG]))].assign(
        row=np.arange(len(ctx.km))).sort_values("start_ns")
    soft_all = (km["family"] == "softmax") & ~_matches(km["name"], LOG_SOFTMAX)
    backward = _matches(km["name"], re.compile("backward", re.IGNORECASE))
    hits = []
    for _, k in km[["stream_id", "family"]].assign(soft=soft_all & ~backward).groupby("stream_id"):
        gemm = (k["family"] == "gemm").to_numpy()
        for i in np.flatnonzero(k["soft"].to_numpy()):
            if gemm[max(i - ATTENTION_WINDOW, 0):i].any() and gemm[i + 1:i + 1 + ATTENTION_WINDOW].any():
                hits.append(k.index[i])
    forward = km.loc[hits]
    configs = set(map(tuple, forward[LAUNCH_CONFIG].fillna(1).to_numpy().tolist()))
    candidates = km[soft_all & backward]
    same = [tuple(c) in configs for c in candidates[LAUNCH_CONFIG].fillna(1).to_numpy().tolist()]
    return ctx.km.iloc[np.concatenate([forward["row"].to_numpy(), candidates["row"].to_numpy()[same]])]


def attention_not_flash(ctx: "RuleContext") -> "Recommendation | None":
    """GD-ATTENTION-NOT-FLASH, what GD-UNFUSED-ATTENTION (which needs op ranges) does not cover:

    - exports without op ranges (a plain ``nsys`` capture): softmax kernels between GEMM kernels
      on one stream (bmm, softmax, bmm: hand-written attention, or SDPA's math fallback). Saving:
      those softmax kernels' time (forward and backward), the GD-UNFUSED-ATTENTION model;
    - memory-efficient attention kernels (CUTLASS ``fmha_cutlass*``, PyTorchMemEffAttention) where
      flash kernels exist (SDPA picks them for fp32 inputs or an arbitrary mask). Saving: not
      estimated (no measured flash/efficient ratio in gpudiag's data)."""
    sandwiched = _sandwiched_softmax(ctx) if ctx.detail.empty else ctx.km.iloc[0:0]
    efficient = ctx.km[_matches(ctx.km["name"], MEM_EFFICIENT)]
    if sandwiched.empty and efficient.empty:
        return None
    saving = _per_step(sandwiched, ctx)
    evidence = []
    if not sandwiched.empty:
        evidence += [f"{len(sandwiched) / ctx.n_steps:.0f} softmax launches/step between GEMM kernels "
                     f"({_ms(saving)}/step; no op ranges in this export)", *top_evidence(sandwiched, ctx.n_steps, 2)]
    if not efficient.empty:
        evidence += [f"{_ms(_per_step(efficient, ctx))}/step in memory-efficient attention kernels",
                     *top_evidence(efficient, ctx.n_steps, 2)]
    return Recommendation(
        "GD-ATTENTION-NOT-FLASH", "Attention does not run on the flash kernels", saving,
        "softmax kernel time between the attention GEMMs (kept on chip by a fused kernel)"
        + ("; memory-efficient kernels: not estimated" if not efficient.empty else ""),
        evidence,
        "Call `torch.nn.functional.scaled_dot_product_attention` with bf16/fp16 q, k, v and `is_causal=True` instead "
        "of an explicit causal mask (flash kernels take no arbitrary mask; for a bias use cuDNN attention, "
        "`torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION)`, or FlexAttention).",
        saving_estimated=not sandwiched.empty)


EXPERT_RULES = (channels_last, fp32_under_autocast, batch_headroom, torch_compile, cudnn_benchmark, attention_not_flash)
