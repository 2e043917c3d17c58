"""Rules on the GPU's kernels: fp32 matrix math, misaligned GEMM shapes, unfused attention and
normalization, small grids, independent kernels serialized on one stream, and FP8 for inference.

Each rule takes the :class:`~gpudiag.analysis.rules.base.RuleContext` of the measured steps and
returns at most one :class:`~gpudiag.analysis.rules.base.Recommendation` (see that module).
"""

from __future__ import annotations

import json
import re

import numpy as np

from gpudiag.analysis.attribution.families import CONTRACTION_FAMILIES, per_distinct
from gpudiag.analysis.roofline.costmodel import CONTRACTION_OPS, ITEMSIZE, _tensors, storage_ids
from gpudiag.analysis.roofline.kernel_precision import math_paths_from_names
from gpudiag.analysis.rules.base import Recommendation, RuleContext, top_evidence


# a normalization module's class name: RMSNorm, LayerNorm, BatchNorm2d
_NORM_CLASS = re.compile(r"Norm(?:\d*d)?$")


def fp32_matmul(ctx: RuleContext) -> Recommendation | None:
    """fp32 matrix math on the SIMT path (no tensor cores): compute-bound GEMM/conv kernels whose
    math path is fp32. Saving: their time x (1 - fp32 peak / bf16 peak), i.e. the same efficiency
    on the bf16 tensor-core roof; an upper bound, since the step may then become overhead-bound."""
    if ctx.inference is not None:  # weights need no fp32 master copy: GD-HALF-WEIGHTS says more
        return None
    # the columns read here and by top_evidence: a row filter of the kernel frame copies every column
    k = ctx.km.loc[ctx.km["family"].isin(CONTRACTION_FAMILIES),
                   ["name", "short_name", "math_path", "kernel_class", "duration_ns"]]
    # Without op shapes or ncu the math path comes from the kernel's name (kernel_precision), and
    # the class is a heuristic: such a kernel counts unless it is overhead-bound.
    by_name = k["math_path"].isna()
    path = k["math_path"].where(~by_name, math_paths_from_names(k["name"]))
    k = k[(path == "fp32") & ((k["kernel_class"] == "compute") | (by_name & (k["kernel_class"] != "overhead")))]
    if k.empty or not ctx.peaks.flops.get("bf16") or not ctx.peaks.flops.get("fp32"):
        return None
    named = bool(k["math_path"].isna().any())
    ns = k["duration_ns"].sum() / ctx.n_steps
    if ns < 0.05 * ctx.step_ns:  # under 5 % of the step: not worth a precision change
        return None
    ratio = ctx.peaks.flops["fp32"] / ctx.peaks.flops["bf16"]
    tf32 = ctx.peaks.flops.get("tf32")
    return Recommendation(
        "GD-FP32-MATMUL", "fp32 matrix math runs on SIMT cores, not tensor cores", ns * (1 - ratio),
        f"compute-bound fp32 GEMM/conv time x (1 - fp32 peak / bf16 peak = {ratio:.3f}); TF32 would give "
        f"{ns * (1 - ctx.peaks.flops['fp32'] / tf32) / 1e6:.2f} ms" if tf32 else "compute-bound fp32 GEMM/conv time x (1 - fp32/bf16 peak)",
        [f"{ns / 1e6:.2f} ms/step in compute-bound fp32 GEMM/conv kernels ({100 * ns / ctx.step_ns:.0f} % of the step)"
         + (" (math path read from the kernel names: no op shapes recorded)" if named else ""), *top_evidence(k, ctx.n_steps)],
        "Run the model under bf16 autocast (`with torch.autocast('cuda', dtype=torch.bfloat16):`), or allow TF32 "
        "(`torch.backends.cuda.matmul.allow_tf32 = True`, `torch.backends.cudnn.allow_tf32 = True`).",
        covers_ns_per_step=ns)


def _misaligned(op: str, args: str) -> list[str]:
    """The leading dimensions (K, N) of a contraction that are not multiples of 8 (16 for fp8):
    NVIDIA's Matrix Multiplication Background User's Guide, "Tensor Core Requirements"."""
    try:
        tensors = _tensors(json.loads(args).get("in", []))
    except ValueError:
        return []
    if op in ("aten::addmm", "aten::baddbmm"):
        tensors = tensors[1:]
    if len(tensors) < 2 or len(tensors[0][1]) < 2 or len(tensors[1][1]) < 2:
        return []
    dtype = tensors[0][0]
    multiple = 16 if "float8" in dtype else 8
    if dtype not in ("bfloat16", "float16") and "float8" not in dtype:
        return []
    k = tensors[0][1][-1]
    n = tensors[1][1][-2] if op == "aten::linear" else tensors[1][1][-1]  # linear's weight is (N, K)
    return [f"{label}={v}" for label, v in (("K", k), ("N", n)) if v % multiple]


def gemm_alignment(ctx: RuleContext) -> Recommendation | None:
    """GEMMs whose K or N is not a multiple of 8 (16 for fp8), from the shapes recorded on the
    detail step. Saving: those kernels' time x (1 - their roofline efficiency / the median
    efficiency of aligned contraction kernels of the same run), i.e. padded GEMMs assumed to run
    as well as the aligned ones."""
    d = ctx.detail[ctx.detail["op"].isin(CONTRACTION_OPS - {"aten::convolution", "aten::_convolution",
                                                               "aten::cudnn_convolution", "aten::convolution_backward"})]
    if d.empty:
        return None
    bad = d.assign(misaligned=[_misaligned(o, a) for o, a in zip(d["op"], d["op_args"])])
    bad = bad[bad["misaligned"].str.len() > 0]
    if bad.empty:
        return None
    configs = set(bad["config_key"])
    k = ctx.km[ctx.km["config_key"].isin(configs)]
    aligned = ctx.km[ctx.km["family"].isin(CONTRACTION_FAMILIES) & ~ctx.km["config_key"].isin(configs)]
    reference = float(aligned["efficiency"].median()) if aligned["efficiency"].notna().any() else float("nan")
    eff = k.groupby("config_key").agg(ns=("duration_ns", "sum"), eff=("efficiency", "median"))
    if np.isfinite(reference):
        saving = float((eff["ns"] * (1 - (eff["eff"] / reference).clip(upper=1))).fillna(0).sum()) / ctx.n_steps
    else:
        saving = 0.0
    examples = bad.drop_duplicates("op_args").head(3)
    shapes = [f"{op} {json.loads(args).get('in', [])[:3]} ({', '.join(dims)})"
              for op, args, dims in zip(examples["op"], examples["op_args"], examples["misaligned"])]
    return Recommendation(
        "GD-GEMM-ALIGN", "GEMM dimensions are not multiples of 8", saving,
        f"their time x (1 - efficiency / {reference:.2f}, the median roofline efficiency of this run's aligned contractions)"
        if np.isfinite(reference) else "not estimated (no aligned contraction with a known efficiency)",
        [f"{len(configs)} kernel configurations, {k['duration_ns'].sum() / ctx.n_steps / 1e6:.2f} ms/step", *shapes, *top_evidence(k, ctx.n_steps, 2)],
        "Pad the dimension to a multiple of 8 (e.g. a vocabulary of 50257 to 50304, a 7x7 window's 49 tokens to 56) "
        "and mask or slice the padding; NVIDIA's Matrix Multiplication guide: tensor cores need K and N multiples of 8 "
        "(16 for fp8).")


def unfused_attention(ctx: RuleContext) -> Recommendation | None:
    """Attention computed from separate kernels: a module whose forward runs bmm/matmul, softmax
    and bmm/matmul (detail-step ops) instead of scaled_dot_product_attention. Saving: the softmax
    and element-wise kernel time of those modules per step, forward and backward (what a fused
    attention kernel keeps on chip): the softmax configurations launched inside those modules on the
    detail step, plus the step's softmax-backward configurations (backward kernels carry no module)."""
    d = ctx.detail[ctx.detail["module"] != ""]
    ops = d.groupby("module")["op"].agg(set)  # one set per distinct module path

    def subtree_ops(path: str) -> set:
        return set().union(*(s for m, s in ops.items() if m == path or m.startswith(path + ".")))

    modules = set()
    for path in (m for m, s in ops.items() if "aten::_softmax" in s):
        parts = path.split(".")
        for depth in range(len(parts), max(len(parts) - 3, 0), -1):  # the softmax's module and up to 2 ancestors
            candidate = ".".join(parts[:depth])
            inside = subtree_ops(candidate)
            if inside & {"aten::bmm", "aten::mm", "aten::matmul", "aten::baddbmm"}:
                if not any(o.startswith("aten::_scaled_dot_product") for o in inside):
                    modules.add(candidate)
                break
    if not modules:
        return None
    inside = ctx.km["module"].isin(modules) | ctx.km["module"].str.startswith(tuple(m + "." for m in modules))
    in_modules = ctx.km[inside]
    detail_inside = ctx.detail["module"].isin(modules) | ctx.detail["module"].str.startswith(tuple(m + "." for m in modules))
    forward = detail_inside & (ctx.detail["op"] == "aten::_softmax")
    # Backward kernels carry no module: the step's softmax backward configurations stand for theirs.
    backward = ctx.detail["op"] == "aten::_softmax_backward_data"
    softmax_configs = set(ctx.detail.loc[forward | backward, "config_key"])
    memory = ctx.km[ctx.km["config_key"].isin(softmax_configs)]
    saving = float(memory["duration_ns"].sum()) / ctx.n_steps
    return Recommendation(
        "GD-UNFUSED-ATTENTION", "Attention is built from separate bmm, softmax and bmm kernels", saving,
        "softmax kernel time per step (forward and backward), which fused attention keeps on chip",
        [f"{len(modules)} modules, e.g. {', '.join(sorted(modules)[:3])}",
         f"{in_modules['duration_ns'].sum() / ctx.n_steps / 1e6:.2f} ms/step of forward kernels in them, "
         f"{saving / 1e6:.2f} ms/step in their softmax kernels"],
        "Call `torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)` (FlashAttention / "
        "memory-efficient kernels) instead of `softmax(q @ k.transpose(-2, -1) * scale + bias) @ v`.")


def unfused_norm(ctx: RuleContext) -> Recommendation | None:
    """A normalization module (class name with "Norm") whose forward launches 3 or more kernels per
    call and no normalization kernel: LayerNorm/RMSNorm written op by op. Saving: their forward
    kernel time minus, per call, one fused pass (read the largest input tensor once, write it once,
    at peak bandwidth); the backward is unfused too and not counted, so this is a lower bound."""
    # matched once per distinct class (a few dozen for 1 M kernels), not per row
    norm = per_distinct(ctx.km["module_class"], lambda c: isinstance(c, str) and bool(_NORM_CLASS.search(c)), False, bool)
    k = ctx.km[norm]
    if k.empty:
        return None
    per_module = k.groupby("module").agg(kernels=("duration_ns", "size"), ns=("duration_ns", "sum"),
                                         fused=("family", lambda f: (f == "norm").any()))
    unfused = per_module[(per_module["kernels"] / ctx.n_steps >= 3) & ~per_module["fused"]]
    if unfused.empty:
        return None
    largest = 0.0
    detail = ctx.detail[ctx.detail["module"].isin(unfused.index)]
    for args in detail["op_args"].drop_duplicates():  # one parse per distinct op text
        try:
            tensors = _tensors(json.loads(args).get("in", []))
        except ValueError:
            continue
        largest = max([largest] + [float(np.prod(s)) * ITEMSIZE.get(d, 4) for d, s in tensors])
    ns = float(unfused["ns"].sum()) / ctx.n_steps
    floor = len(unfused) * 2 * largest / ctx.peaks.bandwidth * 1e9 if ctx.peaks.bandwidth else 0.0
    classes = sorted(set(k.loc[k["module"].isin(unfused.index), "module_class"]))
    return Recommendation(
        "GD-UNFUSED-NORM", "Normalization is written op by op (several kernels per call)", max(ns - floor, 0.0),
        f"forward kernel time minus one fused pass per call ({len(unfused)} calls x 2 x {largest / 1e6:.1f} MB at peak "
        "bandwidth); backward not counted",
        [f"{len(unfused)} {', '.join(classes)} modules, {unfused['kernels'].sum() / ctx.n_steps / len(unfused):.0f} kernels "
         f"per call, {ns / 1e6:.2f} ms/step of forward kernel time", *top_evidence(k[k["module"].isin(unfused.index)], ctx.n_steps, 2)],
        "Use the fused kernels: `torch.nn.RMSNorm` / `torch.nn.functional.rms_norm`, `torch.nn.LayerNorm`, or "
        "`torch.compile` on the module.", covers_ns_per_step=ns)


def small_grids(ctx: RuleContext) -> Recommendation | None:
    """Kernels over 20 µs whose grid covers under half the SMs (fewer blocks than SMs / 2), taking
    over 2 % of the step in total: most SMs idle while they run. (Persistent and cluster GEMMs are
    sized just under the SM count on purpose, hence half.) Saving: their time x (1 - blocks / SMs)."""
    sms = max(ctx.peaks.sm_count, 1)
    blocks = ctx.km[["grid_x", "grid_y", "grid_z"]].fillna(1).prod(axis=1)
    k = ctx.km[(blocks < sms / 2) & (ctx.km["duration_ns"] > 20_000)]
    if k.empty or k["duration_ns"].sum() / ctx.n_steps < 0.02 * ctx.step_ns:
        return None
    saving = float((k["duration_ns"] * (1 - blocks[k.index] / sms)).sum()) / ctx.n_steps
    return Recommendation(
        "GD-SMALL-GRID", "Long kernels run on under half of the SMs", saving,
        "their time x (1 - blocks / SMs)",
        [f"{k['duration_ns'].sum() / ctx.n_steps / 1e6:.2f} ms/step in kernels over 20 µs with fewer than {sms // 2} blocks "
         f"({sms} SMs)",
         *top_evidence(k, ctx.n_steps)],
        "Batch the work (larger batch, or horizontal fusion of independent small ops), use split-K for skinny GEMMs, "
        "or pick a kernel with more parallelism.", covers_ns_per_step=float(k["duration_ns"].sum()) / ctx.n_steps)


def _access(args: str, op: str) -> tuple[set, set, set]:
    """(reads, fresh outputs, in-place writes) of an op call as storage addresses, from its payload;
    in-place ops (trailing underscore) write their first argument."""
    try:
        payload = json.loads(args)
    except ValueError:
        return set(), set(), set()
    inputs = payload.get("in", [])
    inplace = storage_ids(inputs[0]) if op.endswith("_") and inputs else set()
    return storage_ids(inputs), storage_ids(payload.get("out")) - inplace, inplace


def multi_stream(ctx: RuleContext) -> Recommendation | None:
    """Independent kernels serialized on one stream. On the detail step, op calls form a dependency
    graph from the storage addresses recorded with their shapes: a call depends on the last writer
    of every storage it reads (read-after-write), and an in-place call also on the readers since
    (write-after-read). Reuse of a freed address by the caching allocator is not a dependency, so
    fresh outputs add none. Kernels whose grid fills the GPU (at least one wave) are barriers: they
    could not overlap anything. Saving: the serialized GPU time minus the critical path (what
    unlimited streams could hide), capped at the step time minus the critical path; 2 % of the
    step or more to fire."""
    d = ctx.detail[ctx.detail["op_call"] >= 0]
    if d.empty or not d["op_args"].str.contains("@", regex=False).any():
        return None  # captured before gpudiag recorded storage addresses
    sms = max(ctx.peaks.sm_count, 1)
    per_call = d.assign(blocks=d[["grid_x", "grid_y", "grid_z"]].fillna(1).prod(axis=1)).groupby("op_call").agg(
        start=("start_ns", "min"), ns=("duration_ns", "sum"), blocks=("blocks", "max"), op=("op", "first"),
        args=("op_args", "first"), stream=("stream_id", "first")).sort_values("start")
    last_writer: dict[str, float] = {}  # storage -> finish time of its last writer on the critical path
    readers_since: dict[str, float] = {}
    barrier = finish_max = 0.0
    for row in per_call.itertuples():  # op calls of one step (thousands)
        reads, outputs, inplace = _access(row.args, row.op)
        ready = max([barrier] + [last_writer.get(s, 0.0) for s in reads | inplace]
                    + [readers_since.get(s, 0.0) for s in inplace])
        if row.blocks >= sms:  # fills the GPU: waits for everything before it
            ready = finish_max
        finish = ready + row.ns
        if row.blocks >= sms:
            barrier = finish
        for s in reads:
            readers_since[s] = max(readers_since.get(s, 0.0), finish)
        for s in outputs | inplace:
            last_writer[s] = finish
            readers_since.pop(s, None)
        finish_max = max(finish_max, finish)
    serialized = float(per_call["ns"].sum())
    # A step cannot get shorter than its dependency chain: the saving is at most the (steady-state)
    # step's time above it, never more than the step (issue 16: 56,943 % on a replicated capture).
    saving = min(serialized, ctx.step_ns) - finish_max
    if saving < 0.02 * ctx.step_ns or per_call["stream"].nunique() > 1 and saving < 0.05 * ctx.step_ns:
        return None
    return Recommendation(
        "GD-MULTI-STREAM", "Independent kernels run one after another on one stream", saving,
        "serialized GPU time of the detail step's op calls minus their critical path (dependencies from recorded "
        "storage addresses; kernels filling the GPU act as barriers)",
        [f"the detail step's kernels take {serialized / 1e6:.2f} ms serialized; their dependency chain needs "
         f"{finish_max / 1e6:.2f} ms", f"{len(per_call)} op calls on {per_call['stream'].nunique()} stream(s)"],
        "Run independent branches on separate CUDA streams (`torch.cuda.Stream()`, `wait_stream` before their "
        "consumers), batch them into one larger kernel (e.g. stack the towers' weights and use one bmm), or let "
        "`torch.compile` fuse them.")


def inference_quantization(ctx: RuleContext) -> Recommendation | None:
    """Inference steps (no backward phase) where tensor contractions take over half the step on a
    busy GPU: FP8 (or INT8) GEMMs are an option. Saving: contraction time x (1 - bf16 peak / fp8
    peak), an upper bound that ignores accuracy and scaling costs."""
    if (ctx.km["phase"] == "backward").any() or not ctx.peaks.flops.get("fp8") or not ctx.peaks.flops.get("bf16"):
        return None
    gemm = ctx.km[ctx.km["family"].isin(CONTRACTION_FAMILIES) & ctx.km["math_path"].isin(["bf16", "fp16"])]
    ns = gemm["duration_ns"].sum() / ctx.n_steps
    if ns < 0.5 * ctx.step_ns:
        return None
    ratio = ctx.peaks.flops["bf16"] / ctx.peaks.flops["fp8"]
    return Recommendation(
        "GD-FP8-INFERENCE", "Inference is dominated by bf16/fp16 GEMMs: FP8 or INT8 could speed them up", ns * (1 - ratio),
        f"bf16/fp16 contraction time x (1 - bf16 peak / fp8 peak = {ratio:.2f})",
        [f"{ns / 1e6:.2f} ms/step in bf16/fp16 contractions ({100 * ns / ctx.step_ns:.0f} % of the step)", *top_evidence(gemm, ctx.n_steps)],
        "Quantize the linear layers to FP8 (e.g. torchao float8 or Transformer Engine) or INT8, and check accuracy.")
