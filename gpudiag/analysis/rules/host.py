"""Rules on the host's side of the step: the GPU waiting for kernel launches, the GPU waiting while
the host runs CPU work, host syncs, pageable copies, an input stall before the step's first kernel,
and the unfused optimizer.

Each rule takes the :class:`~gpudiag.analysis.rules.base.RuleContext` of the measured steps and
returns at most one :class:`~gpudiag.analysis.rules.base.Recommendation` (see that module).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from gpudiag.analysis.rules.base import Recommendation, RuleContext, top_evidence
from gpudiag.analysis.rules.host_floor import graph_floor_ns, loop_floor, phase_host_ns, untraced_factor
from gpudiag.analysis.steps.host_work import HOST_COMPUTE_STRETCH_NS
from gpudiag.analysis.steps.launches import SYNC_APIS


def overhead_bound(ctx: RuleContext) -> Recommendation | None:
    """The GPU waits for kernel launches: launch-bound idle between kernels (host-bound idle while
    the host issued work, :mod:`gpudiag.analysis.steps.host_work`; not at step start, which
    :func:`input_stall` covers) above 15 % of the step. Host compute (the launching thread's long
    stretches with no CUDA call) is :func:`host_compute`'s, not counted here. Saving: that idle
    time (what CUDA Graphs would remove if launches were the only cost); in an inference step that
    loops over the model (:func:`loop_floor`) at most the step less what graphs of the model leave."""
    idle = ctx.idle[ctx.idle["host_bound"] & ~ctx.idle["at_step_start"]]
    launch = idle["launch_bound_ns"] if "launch_bound_ns" in idle else idle["duration_ns"]
    ns = launch.sum() / ctx.n_steps
    if ns < 0.15 * ctx.step_ns:
        return None
    compute = float(idle["duration_ns"].sum()) / ctx.n_steps - ns
    short = ctx.km[ctx.km["kernel_class"] == "overhead"]
    floor = loop_floor(ctx)
    rec = Recommendation(
        "GD-OVERHEAD-BOUND", "The GPU waits for the host to launch kernels",
        ns if floor is None else min(ns, max(ctx.step_ns - graph_floor_ns(floor, 1.0), 0.0)),
        "launch-bound GPU idle time between kernels per step (removed if launches were free)" if floor is None else
        "launch-bound GPU idle time between kernels per step, at most the step less what CUDA graphs of the model "
        "leave: the loop's own host time outside the forwards plus the kernels",
        [f"{ns / 1e6:.2f} ms/step of GPU idle with an empty launch queue while the host issued work "
         f"({100 * ns / ctx.step_ns:.0f} % of the step), {int((launch > 0).sum()) / ctx.n_steps:.0f} gaps/step",
         f"{len(ctx.km) / ctx.n_steps:.0f} kernel launches/step, {len(short) / ctx.n_steps:.0f} of them overhead-bound"],
        "Capture the step in a CUDA Graph (`torch.cuda.graphs`, or `torch.compile(model, mode=\"reduce-overhead\")`), "
        "fuse small ops (`torch.compile`), or raise the batch size so each kernel does more work.")
    if floor is not None:
        rec.graph_floor = floor | {"idle_ns": ns}  # the bare run's correction caps the uncapped idle again
        rec.evidence.append(f"{floor['forwards_per_step']:.0f} forward calls per step with {floor['outside_ns'] / 1e6:.2f} "
                            f"ms/step of host time outside them (the loop's own: CUDA graphs of the model keep it) "
                            f"and {floor['kernel_ns'] / 1e6:.2f} ms/step of kernels")
    if compute > 0:
        rec.evidence.append(f"not counted: {compute / 1e6:.2f} ms/step of host-bound idle between kernels while the "
                            "launching thread ran CPU work with no CUDA call (host compute: GD-HOST-COMPUTE)")
    return rec


# GD-HOST-COMPUTE fires at the share of the step GD-OVERHEAD-BOUND fires at: the two halves of the
# host-bound idle the report once called overhead are judged alike (gpudiag's choice).
HOST_COMPUTE_SHARE = 0.15


def host_compute(ctx: RuleContext) -> Recommendation | None:
    """The GPU waits while the launching thread runs CPU work: host-bound idle during its stretches
    of over :data:`~gpudiag.analysis.steps.host_work.HOST_COMPUTE_STRETCH_NS` with no CUDA call
    (making inputs on the CPU, tokenizing, Python between model calls, handling ``.tolist()``
    results), before the step's first kernel included, at least :data:`HOST_COMPUTE_SHARE` of the
    step. Saving: that idle time (overlapping the CPU work with the GPU's removes it; CUDA graphs
    do not). Evidence: time and stretches per step, the longest stretch with the CUDA calls around
    it, and the NVTX ranges (modules, phases, the user's own) the stretches ran in."""
    if "host_compute_ns" not in ctx.idle:
        return None
    ns = float(ctx.idle["host_compute_ns"].sum()) / ctx.n_steps
    stretches = ctx.host_stretches
    if ns < HOST_COMPUTE_SHARE * ctx.step_ns or stretches.empty:
        return None
    longest = stretches.loc[stretches["ns"].idxmax()]
    at_start = float(stretches.loc[stretches["at_step_start"].astype(bool), "ns"].sum()) / ctx.n_steps
    labels = stretches["where"].astype(object).fillna("").to_numpy()
    where = stretches.groupby(labels)["ns"].sum().sort_values(ascending=False, kind="stable").head(3)
    return Recommendation(
        "GD-HOST-COMPUTE", "The GPU waits while the host runs CPU work", ns,
        f"GPU idle per step while the launching thread ran CPU work with no CUDA call for over "
        f"{HOST_COMPUTE_STRETCH_NS / 1e6:g} ms: overlapping that work with the GPU's removes it",
        [f"{ns / 1e6:.2f} ms/step of GPU idle with an empty launch queue while the launching thread ran CPU work "
         f"({100 * ns / ctx.step_ns:.0f} % of the step)"
         + (f", {at_start / 1e6:.2f} ms/step of it before the step's first kernel" if at_start else ""),
         f"{len(stretches) / ctx.n_steps:.1f} stretches/step with no CUDA call for over "
         f"{HOST_COMPUTE_STRETCH_NS / 1e6:g} ms; the longest left the GPU idle {longest['ns'] / 1e6:.2f} ms "
         f"(step {int(longest['step'])}), between {_call(longest['call_before'])} and {_call(longest['call_after'])}",
         "where (innermost NVTX range on the launching thread): "
         + ", ".join(f"{w or 'outside every range'} {v / ctx.n_steps / 1e6:.2f} ms/step" for w, v in where.items())],
        "Overlap the CPU work with the GPU's: make inputs on the GPU (`torch.randn(..., device=\"cuda\")`, GPU-side "
        "preprocessing), move per-sample or per-request CPU work (decoding, augmentation, tokenizing, post-processing "
        "of `.tolist()` results) to DataLoader workers (`num_workers=N`) or a background thread that prepares the next "
        "batch while the GPU runs this one, and copy from pinned memory with `non_blocking=True`. CUDA graphs and "
        "torch.compile do not remove this time.")


def _call(name) -> str:
    """A CUDA call's name for evidence (its ``_vN`` suffix dropped); "the capture's edge" for none."""
    return "`" + re.sub(r"_v\d+$", "", name) + "`" if isinstance(name, str) and name else "the capture's edge"


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
    """Host<->device copies from or to pageable memory in the step (1 MB or more per step):
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
        "`.to('cuda', non_blocking=True)`.", covers_ns_per_step=ns)


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
        "prefetch_factor=2)`), pin memory, and move per-sample work off the training loop's thread.", covers_ns_per_step=mean)


# PyTorch's fused optimizers (``fused=True``) run one multi-tensor kernel per chunk of parameters; its
# demangled name carries the functor of aten/src/ATen/native/cuda/: FusedAdamMathFunctor (Adam and
# AdamW: ADAM_MODE 0 and 1) and FusedSgdMathFunctor (SGD, with or without momentum), as captured on an
# H100 with torch 2.11 (tests/fixtures/fused_optimizers), e.g. "void at::native::<unnamed>::
# multi_tensor_apply_kernel<at::native::<unnamed>::TensorListMetadata<(int)2>, at::native::<unnamed>::
# FusedSgdMathFunctor<float, (int)2>, …>". Fused Adagrad runs on the CPU only (torch 2.11 refuses CUDA
# parameters). The foreach (unfused) kernels carry other functors (BinaryOpListAlphaFunctor, …).
FUSED_OPTIMIZER_KERNEL = re.compile(r"Fused(?:Adam|Sgd)MathFunctor")


def unfused_optimizer(ctx: RuleContext) -> Recommendation | None:
    """The optimizer step launches many multi-tensor or per-tensor kernels (10 or more per step)
    and no fused one. Saving: their GPU time minus one fused pass over the parameters (a fused
    AdamW reads parameter, gradient and both moments and writes parameter and moments: 7 fp32 values
    per parameter, at peak bandwidth; parameter count from the optimizer ops recorded on the detail
    step, else the GPU time is the estimate). Launch costs, when they bound the step, are part of
    the overhead-bound rule's saving."""
    opt = ctx.km[ctx.km["phase"] == "optimizer"]
    if opt.empty or opt["name"].str.contains(FUSED_OPTIMIZER_KERNEL).any():
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
         *top_evidence(opt, ctx.n_steps, 2)],
        "Use the fused implementation: `torch.optim.AdamW(params, fused=True)` (also Adam, SGD).",
        covers_ns_per_step=max(gpu_ns, ctx.phase_host_ns.get("optimizer", 0.0)))


def _optimizer_host_saving(ctx: RuleContext, opt: pd.DataFrame) -> float:
    """On an overhead-bound step (GD-OVERHEAD-BOUND would fire, after the profiler's correction),
    the host time a fused optimizer removes: the optimizer phase's host span, scaled to the bare
    run, less one launch of the fused kernel. On the H100/H200 (issue 21): a host-bound encoder-
    decoder step lost 9 ms to AdamW(fused=True) where its GPU time predicted 1.27 ms."""
    if not overhead_saving(ctx):
        return 0.0
    factor = untraced_factor(ctx.step_ns, ctx.bare_inflation_ns)
    # the whole optimizer.step() (its Python grouping of tensors before the first launch included)
    # where gpudiag's phase ranges recorded it, else the span of its launches
    host = ctx.phase_host_ns.get("optimizer", 0.0) * factor or phase_host_ns(opt, "optimizer", factor)
    return max(host - ctx.peaks.launch_overhead_ns, 0.0)


def overhead_saving(ctx: RuleContext) -> float:
    """GD-OVERHEAD-BOUND's saving, corrected for the host time the profiler added (bare run) the
    way ``report.bare_run`` corrects it; 0 when the rule does not fire or would not survive it."""
    rec = overhead_bound(ctx)
    if rec is None:
        return 0.0
    if ctx.bare_inflation_ns is None:
        return rec.saving_ns_per_step
    corrected = max(0.0, rec.saving_ns_per_step - max(0.0, ctx.bare_inflation_ns))
    bare_step = ctx.step_ns - max(0.0, ctx.bare_inflation_ns)
    return corrected if corrected >= 0.15 * bare_step else 0.0  # overhead_bound's 15 %
