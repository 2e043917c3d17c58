"""Recommendations: the classic optimizations, each detected from evidence in the capture.

Every rule returns at most one :class:`Recommendation` with a stable ``rule_id``, the evidence
(which kernels, ops or API calls, and how much time per measured step), the expected saving per
step with how it was estimated, and how to apply the fix. The report lists them by saving.
Thresholds are gpudiag's choices unless a source is named; each is stated in the rule.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pandas as pd

from gpudiag.analysis.costmodel import CONTRACTION_OPS, ITEMSIZE, _tensors, storage_ids
from gpudiag.analysis.expert_rules import EXPERT_RULES
from gpudiag.analysis.ncu_rules import NCU_RULES
from gpudiag.analysis.families import COMMUNICATION, CONTRACTION_FAMILIES, kernel_label
from gpudiag.analysis.host_floor import graph_floor_ns, loop_floor, phase_host_ns, untraced_factor
from gpudiag.analysis.distributed_rules import DISTRIBUTED_RULES
from gpudiag.analysis.inference_rules import INFERENCE_RULES
from gpudiag.analysis.kernel_precision import math_paths_from_names
from gpudiag.analysis.peaks import DevicePeaks
from gpudiag.reports.labels import distinct_labels

SYNC_APIS = re.compile(r"^(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|cudaMemcpy(_v\d+)?$|cudaMemcpy2D(_v\d+)?$)")


@dataclass
class Recommendation:
    rule_id: str
    title: str
    saving_ns_per_step: float
    estimate: str  # how the saving was estimated
    evidence: list[str]
    how_to_fix: str
    saving_percent_of_step: float | None = None
    saving_estimated: bool = True  # False: "not estimated" (0 ns), never silenced for its size
    throughput_gain: dict | None = None  # GD-BATCH-HEADROOM: batch factor -> samples/s factor
    change_estimates: dict | None = None  # trial change -> its own predicted saving (ns/step), costs included
    graph_floor: dict | None = None  # GD-OVERHEAD-BOUND in a loop of forwards: host_floor.graph_floor_ns's inputs


@dataclass
class RuleContext:
    """What the rules look at, all restricted to the measured steps of one process.

    km: kernels with attribution and class columns (duration_ns, name, short_name, family,
    kernel_class, evidence, math_path, efficiency, phase, module, op, op_args, step, grid_*);
    detail: the detail step's kernels (op and op_args set); api: runtime API calls with ``step``;
    memcpy: copies with ``step``; idle: GPU-idle intervals with ``step``, ``host_bound`` and
    ``at_step_start`` (idle before the step's first kernel); n_steps (steady-state steps);
    step_ns (their mean step time: outlier steps are left out, gpudiag.analysis.outliers);
    peaks; ncu (may be empty); measured_steps (their indices). From the launcher's status and the
    rest of the analysis (defaults: unknown): peak_memory_bytes (step -> bytes), device_memory_bytes,
    cudnn_benchmark, autocast_dtype, compiled (report["compiled"]), candidates (all fusion
    candidates), bare_inflation_ns (profiled - bare median step time)."""

    km: pd.DataFrame
    detail: pd.DataFrame
    api: pd.DataFrame
    memcpy: pd.DataFrame
    idle: pd.DataFrame
    n_steps: int
    step_ns: float
    peaks: DevicePeaks
    ncu: pd.DataFrame = field(default_factory=pd.DataFrame)
    measured_steps: list[int] = field(default_factory=list)
    peak_memory_bytes: dict[int, int] = field(default_factory=dict)
    device_memory_bytes: float | None = None
    cudnn_benchmark: bool | None = None
    autocast_dtype: str | None = None
    compiled: dict | None = None
    candidates: list[dict] = field(default_factory=list)
    bare_inflation_ns: float | None = None
    phase_host_ns: dict[str, float] = field(default_factory=dict)  # phase -> host time per step (gpudiag's ranges)
    outside_modules: dict | None = None  # host_floor.outside_modules: the step's time outside every forward
    inference: dict | None = None  # steps are requests: step_mode, root_parameters (gpudiag.analysis.serving)
    distributed: dict | None = None  # DDP settings and backward() calls per step (gpudiag.analysis.distributed_rules)
    communication_ns: float = 0.0  # collective kernel time per step (the rules see km without collectives)
    collectives: pd.DataFrame = field(default_factory=pd.DataFrame)  # the collective kernels taken out of km


def _top(df: pd.DataFrame, n_steps: int, k: int = 3) -> list[str]:
    """Evidence lines for the ``k`` kernels of ``df`` with most time: label, µs per step, launches
    per step (``n_steps`` measured steps)."""
    g = df.groupby("name").agg(ns=("duration_ns", "sum"), short=("short_name", "first"), launches=("duration_ns", "size"))
    g = g.sort_values("ns", ascending=False).head(k)
    # Listed kernels that share a label (CUTLASS calls every GEMM "Kernel2") get the tokens of their
    # names that tell them apart among these k, the rule the report's tables apply to theirs
    # (gpudiag.reports.labels).
    labels = distinct_labels({"top_kernels": [{"name": name, "label": kernel_label(name, row.short)}
                                              for name, row in g.iterrows()]})
    return [f"{labels[name]}: {row.ns / n_steps / 1e3:.0f} µs/step ({row.launches / n_steps:.0f} launches)"
            for name, row in g.iterrows()]


def fp32_matmul(ctx: RuleContext) -> Recommendation | None:
    """fp32 matrix math on the SIMT path (no tensor cores): compute-bound GEMM/conv kernels whose
    math path is fp32. Saving: their time x (1 - fp32 peak / bf16 peak), i.e. the same efficiency
    on the bf16 tensor-core roof; an upper bound, since the step may then become overhead-bound."""
    if ctx.inference is not None:  # weights need no fp32 master copy: GD-HALF-WEIGHTS says more
        return None
    k = ctx.km[ctx.km["family"].isin(CONTRACTION_FAMILIES)]
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
         + (" (math path read from the kernel names: no op shapes recorded)" if named else ""), *_top(k, ctx.n_steps)],
        "Run the model under bf16 autocast (`with torch.autocast('cuda', dtype=torch.bfloat16):`), or allow TF32 "
        "(`torch.backends.cuda.matmul.allow_tf32 = True`, `torch.backends.cudnn.allow_tf32 = True`).")


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
        [f"{len(configs)} kernel configurations, {k['duration_ns'].sum() / ctx.n_steps / 1e6:.2f} ms/step", *shapes, *_top(k, ctx.n_steps, 2)],
        "Pad the dimension to a multiple of 8 (e.g. a vocabulary of 50257 to 50304, a 7x7 window's 49 tokens to 56) "
        "and mask or slice the padding; NVIDIA's Matrix Multiplication guide: tensor cores need K and N multiples of 8 "
        "(16 for fp8).")


def overhead_bound(ctx: RuleContext) -> Recommendation | None:
    """The GPU waits for kernel launches: host-bound idle between kernels (not at step start,
    which :func:`input_stall` covers) above 15 % of the step. Saving: that idle time (what CUDA
    Graphs would remove if launches were the only cost); in an inference step that loops over the
    model (:func:`loop_floor`) at most the step less what graphs of the model leave."""
    idle = ctx.idle[ctx.idle["host_bound"] & ~ctx.idle["at_step_start"]]
    ns = idle["duration_ns"].sum() / ctx.n_steps
    if ns < 0.15 * ctx.step_ns:
        return None
    short = ctx.km[ctx.km["kernel_class"] == "overhead"]
    floor = loop_floor(ctx)
    rec = Recommendation(
        "GD-OVERHEAD-BOUND", "The GPU waits for the host to launch kernels",
        ns if floor is None else min(ns, max(ctx.step_ns - graph_floor_ns(floor, 1.0), 0.0)),
        "host-bound GPU idle time between kernels per step (removed if launches were free)" if floor is None else
        "host-bound GPU idle time between kernels per step, at most the step less what CUDA graphs of the model "
        "leave: the loop's own host time outside the forwards plus the kernels",
        [f"{ns / 1e6:.2f} ms/step of GPU idle with an empty launch queue ({100 * ns / ctx.step_ns:.0f} % of the step), "
         f"{len(idle) / ctx.n_steps:.0f} gaps/step",
         f"{len(ctx.km) / ctx.n_steps:.0f} kernel launches/step, {len(short) / ctx.n_steps:.0f} of them overhead-bound"],
        "Capture the step in a CUDA Graph (`torch.cuda.graphs`, or `torch.compile(model, mode=\"reduce-overhead\")`), "
        "fuse small ops (`torch.compile`), or raise the batch size so each kernel does more work.")
    if floor is not None:
        rec.graph_floor = floor | {"idle_ns": ns}  # the bare run's correction caps the uncapped idle again
        rec.evidence.append(f"{floor['forwards_per_step']:.0f} forward calls per step with {floor['outside_ns'] / 1e6:.2f} "
                            f"ms/step of host time outside them (the loop's own: CUDA graphs of the model keep it) "
                            f"and {floor['kernel_ns'] / 1e6:.2f} ms/step of kernels")
    return rec


def host_syncs(ctx: RuleContext) -> Recommendation | None:
    """Host synchronizations inside the step (cudaDeviceSynchronize, cudaStreamSynchronize,
    cudaEventSynchronize, synchronous cudaMemcpy — e.g. ``.item()``, ``.cpu()``, printing a tensor).
    Saving: the host-bound GPU idle that begins while a sync blocks the host (the launch queue
    drained behind it), excluding idle before the step's first kernel (counted by the input-stall
    rule). It fires on any sync, even with no saving: a sync in the step is worth knowing about."""
    s = ctx.api[ctx.api["name"].fillna("").str.match(SYNC_APIS)]
    if s.empty:
        return None
    blocked = float((s["end_ns"] - s["start_ns"]).sum()) / ctx.n_steps
    syncs = s.sort_values("start_ns")
    idle = ctx.idle[ctx.idle["host_bound"] & ~ctx.idle["at_step_start"]]
    i = np.searchsorted(syncs["start_ns"].to_numpy(), idle["start_ns"].to_numpy(), side="right") - 1
    during = (i >= 0) & (idle["start_ns"].to_numpy() <= syncs["end_ns"].to_numpy()[np.maximum(i, 0)])
    saving = float(idle.loc[during, "duration_ns"].sum()) / ctx.n_steps
    d2h = ctx.memcpy[ctx.memcpy["copy_kind"] == "Device-to-Host"]
    names = s["name"].str.replace(r"_v\d+$", "", regex=True).value_counts()
    return Recommendation(
        "GD-HOST-SYNC", "The step synchronizes the host with the GPU", saving,
        "host-bound GPU idle that begins during a sync (not counting idle before the step's first kernel)",
        [f"{len(s) / ctx.n_steps:.1f} synchronizing calls/step blocking the host {blocked / 1e6:.2f} ms/step: "
         + ", ".join(f"{n} x{c / ctx.n_steps:.1f}" for n, c in names.items()),
         f"{len(d2h) / ctx.n_steps:.1f} device-to-host copies/step ({d2h['bytes'].sum() / ctx.n_steps:.0f} bytes/step)"],
        "Remove per-step `.item()`, `.cpu()`, `print(tensor)` and `torch.cuda.synchronize()`; accumulate metrics on the "
        "GPU and read them every N steps; copy to the host with `non_blocking=True` into pinned memory.")


def pageable_copies(ctx: RuleContext) -> Recommendation | None:
    """Host<->device copies from or to pageable memory in the step (over 1 MB per step):
    they are staged through a driver buffer and block the host. Saving: their transfer time
    minus the same bytes at the pinned rate measured in this run (or the whole time if none)."""
    m = ctx.memcpy
    pageable = m[(m["src_kind"] == "Pageable") | (m["dst_kind"] == "Pageable")]
    if pageable.empty or pageable["bytes"].sum() / ctx.n_steps < 1e6:
        return None
    ns = float(pageable["duration_ns"].sum()) / ctx.n_steps
    pinned = m[((m["src_kind"] == "Pinned") | (m["dst_kind"] == "Pinned")) & (m["bytes"] >= 1e6)]  # not 4-byte .item() reads
    rate = pinned["bytes"].sum() / pinned["duration_ns"].sum() if len(pinned) else None
    saving = ns - (pageable["bytes"].sum() / ctx.n_steps) / rate if rate else ns
    return Recommendation(
        "GD-PAGEABLE-COPY", "Copies use pageable host memory", max(saving, 0.0),
        "pageable copy time minus the same bytes at this run's pinned rate (copies of 1 MB or more)" if rate
        else "pageable copy time per step",
        [f"{len(pageable) / ctx.n_steps:.1f} pageable copies/step, {pageable['bytes'].sum() / ctx.n_steps / 1e6:.1f} MB/step, "
         f"{ns / 1e6:.2f} ms/step ({pageable['bytes'].sum() / max(pageable['duration_ns'].sum(), 1):.1f} GB/s)"],
        "Allocate host batches in pinned memory (`DataLoader(pin_memory=True)`, `tensor.pin_memory()`) and copy with "
        "`.to('cuda', non_blocking=True)`.")


def input_stall(ctx: RuleContext) -> Recommendation | None:
    """The GPU sits idle at the start of steps waiting for input: host-bound idle between the
    previous step's last GPU work and this step's first kernel, median over the measured steps
    (steps without any count 0) above 10 % of the step. Saving: the mean of that idle time."""
    start = ctx.idle[ctx.idle["host_bound"] & ctx.idle["at_step_start"]]
    per_step = start.groupby("step")["duration_ns"].sum().reindex(ctx.measured_steps, fill_value=0)
    mean = float(per_step.mean()) if len(per_step) else 0.0
    if mean < 0.10 * ctx.step_ns:  # (recommend_split runs no rule on a step of zero length)
        return None
    return Recommendation(
        "GD-INPUT-STALL", "The GPU waits for input data at the start of each step", mean,
        "mean host-bound GPU idle before each step's first kernel",
        [f"{mean / 1e6:.2f} ms of GPU idle before each step's first kernel (mean over {len(per_step)} steps, median "
         f"{per_step.median() / 1e6:.2f} ms; {100 * mean / ctx.step_ns:.0f} % of the step)"],
        "Load and augment data in worker processes (`DataLoader(num_workers=N, persistent_workers=True, "
        "prefetch_factor=2)`), pin memory, and move per-sample work off the training loop's thread.")


def unfused_optimizer(ctx: RuleContext) -> Recommendation | None:
    """The optimizer step launches many multi-tensor or per-tensor kernels (10 or more per step)
    and no fused one. Saving: their GPU time minus one fused pass over the parameters (a fused
    AdamW reads parameter, gradient and both moments and writes parameter and moments: 7 fp32 values
    per parameter, at peak bandwidth; parameter count from the optimizer ops recorded on the detail
    step, else the GPU time is the estimate). Launch costs, when they bound the step, are part of
    the overhead-bound rule's saving."""
    opt = ctx.km[ctx.km["phase"] == "optimizer"]
    if opt.empty or opt["name"].str.contains("fused_adam|FusedAdam|fused_sgd", case=False).any():
        return None
    per_step = len(opt) / ctx.n_steps
    if per_step < 10:
        return None
    params = 0
    for args in ctx.detail.loc[ctx.detail["op"].str.startswith("aten::_foreach"), "op_args"].drop_duplicates():
        for value in json.loads(args).get("in", [])[:1]:  # the first argument is the parameter (or state) list
            if isinstance(value, dict) and "numel" in value:
                params = max(params, int(value["numel"]))
    gpu_ns = float(opt["duration_ns"].sum()) / ctx.n_steps
    floor = 7 * 4 * params / ctx.peaks.bandwidth * 1e9 if params and ctx.peaks.bandwidth else 0.0
    saving = max(gpu_ns - floor, 0.0)
    estimate = (f"optimizer GPU time minus one fused pass (7 x 4 bytes x {params / 1e6:.1f} M parameters at peak "
                "bandwidth)" if params else "optimizer GPU time per step (parameter count not recorded)")
    host = _optimizer_host_saving(ctx, opt)
    if host > saving:
        bare = "scaled to the run without the profiler" if ctx.bare_inflation_ns is not None else \
            "as traced (no bare run: an upper bound)"
        saving, estimate = host, (f"host-bound step: the optimizer step's host time ({bare}), less one "
                                  f"fused launch ({host / 1e6:.2f} ms/step); by GPU time alone: {estimate}, "
                                  f"{max(gpu_ns - floor, 0.0) / 1e6:.2f} ms")
    return Recommendation(
        "GD-UNFUSED-OPTIMIZER", "The optimizer is not fused", saving, estimate,
        [f"{per_step:.0f} optimizer kernels/step, {opt['duration_ns'].sum() / ctx.n_steps / 1e6:.2f} ms/step of GPU time",
         *_top(opt, ctx.n_steps, 2)],
        "Use the fused implementation: `torch.optim.AdamW(params, fused=True)` (also Adam, SGD).")


def _optimizer_host_saving(ctx: RuleContext, opt: pd.DataFrame) -> float:
    """On an overhead-bound step (GD-OVERHEAD-BOUND would fire, after the profiler's correction),
    the host time a fused optimizer removes: the optimizer phase's host span, scaled to the bare
    run, less one launch of the fused kernel. On the H100/H200 (issue 21): a host-bound encoder-
    decoder step lost 9 ms to AdamW(fused=True) where its GPU time predicted 1.27 ms."""
    from gpudiag.analysis.expert_rules import _overhead_saving

    if not _overhead_saving(ctx):
        return 0.0
    factor = untraced_factor(ctx.step_ns, ctx.bare_inflation_ns)
    # the whole optimizer.step() (its Python grouping of tensors before the first launch included)
    # where gpudiag's phase ranges recorded it, else the span of its launches
    host = ctx.phase_host_ns.get("optimizer", 0.0) * factor or phase_host_ns(opt, "optimizer", factor)
    return max(host - ctx.peaks.launch_overhead_ns, 0.0)


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
    k = ctx.km[ctx.km["module_class"].str.contains(r"Norm(?:\d*d)?$", na=False)]  # RMSNorm, LayerNorm, BatchNorm2d
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
         f"per call, {ns / 1e6:.2f} ms/step of forward kernel time", *_top(k[k["module"].isin(unfused.index)], ctx.n_steps, 2)],
        "Use the fused kernels: `torch.nn.RMSNorm` / `torch.nn.functional.rms_norm`, `torch.nn.LayerNorm`, or "
        "`torch.compile` on the module.")


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
         *_top(k, ctx.n_steps)],
        "Batch the work (larger batch, or horizontal fusion of independent small ops), use split-K for skinny GEMMs, "
        "or pick a kernel with more parallelism.")


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
        [f"{ns / 1e6:.2f} ms/step in bf16/fp16 contractions ({100 * ns / ctx.step_ns:.0f} % of the step)", *_top(gemm, ctx.n_steps)],
        "Quantize the linear layers to FP8 (e.g. torchao float8 or Transformer Engine) or INT8, and check accuracy.")


RULES = (fp32_matmul, gemm_alignment, overhead_bound, host_syncs, pageable_copies, input_stall, unfused_optimizer,
         unfused_attention, unfused_norm, small_grids, *NCU_RULES, multi_stream,
         inference_quantization, *INFERENCE_RULES, *DISTRIBUTED_RULES, *EXPERT_RULES)


# Issue 11: a recommendation whose estimated saving is under 0.5 % of the step is noise, not advice;
# it stays out of the terminal and HTML and is kept in report.json under ``suppressed``.
SILENT_SHARE = 0.005


def recommend_split(ctx: RuleContext) -> tuple[list[dict], list[dict]]:
    """(shown, suppressed): every rule's recommendation (those that fired) as plain dicts, by
    expected saving; those with an estimated saving under :data:`SILENT_SHARE` of the step go to
    ``suppressed`` with ``suppressed_because``. Rules whose saving is not estimated stay shown.
    Savings are per rule and can overlap (e.g. the same GEMMs in the FP8 and small-grid rules):
    they are not meant to be added up."""
    shown, suppressed = [], []
    if not ctx.step_ns or ctx.step_ns <= 0:  # no step length (a broken export): no share to judge by
        return shown, suppressed
    if "kernel_class" in ctx.km:  # no roofline rule applies to collectives (NCCL's small grids are deliberate)
        comm = ctx.km["kernel_class"] == COMMUNICATION
        ctx = replace(ctx, km=ctx.km[~comm], communication_ns=float(ctx.km.loc[comm, "duration_ns"].sum()) / ctx.n_steps,
                      collectives=ctx.km[comm])
    for rule in RULES:
        try:
            rec = rule(ctx)
        except Exception as exc:  # noqa: BLE001 - one rule failing on an odd export must not lose the report
            suppressed.append({"rule": rule.__name__, "rule_id": None, "saving_ns_per_step": 0.0,
                               "suppressed_because": f"the rule failed on this export: {type(exc).__name__}: {exc}"})
            continue
        if rec is None:
            continue
        rec.saving_percent_of_step = 100.0 * rec.saving_ns_per_step / ctx.step_ns if ctx.step_ns else None
        row = asdict(rec) | {"rule": rule.__name__}
        if rec.saving_estimated and rec.saving_ns_per_step < SILENT_SHARE * ctx.step_ns:
            row["suppressed_because"] = (f"estimated saving {rec.saving_ns_per_step / 1e6:.3f} ms/step, under "
                                         f"{SILENT_SHARE:.1%} of the step")
            suppressed.append(row)
        else:
            shown.append(row)
    order = {rule.__name__: i for i, rule in enumerate(RULES)}
    return rank(shown, order), rank(suppressed, order)


# Savings within this factor of each other rank in RULES order, not by their digits: two captures of
# one workload differ by a few % in every saving (three ResNet-50 captures on the H100, 2026-11-23:
# 11.38-11.40 ms channels_last, 3.16-3.20 ms compile), and rules that share one estimate (batch
# headroom re-uses the small-grid saving) must not swap places on noise.
RANK_RESOLUTION = 1.10


def rank(recs: list[dict], order: dict[str, int] | None = None) -> list[dict]:
    """``recs`` sorted by saving on a log scale in steps of :data:`RANK_RESOLUTION` (larger first),
    then by ``order`` (rule function name -> place in :data:`RULES`, via each row's ``rule``)."""
    def key(rec: dict) -> tuple[float, int]:
        saving = max(float(rec.get("saving_ns_per_step") or 0.0), 1.0)
        return -float(np.floor(np.log(saving) / np.log(RANK_RESOLUTION))), (order or {}).get(rec.get("rule", ""), 0)

    return sorted(recs, key=key)


def recommend(ctx: RuleContext) -> list[dict]:
    """The recommendations shown (see :func:`recommend_split`), by expected saving."""
    return recommend_split(ctx)[0]
