"""The host's floor under the step: a GPU-time saving shortens the step only until the host, which
launches the step's work, becomes the limit.

ResNet-50 NCHW training on the H100 (docs/proof.md, 2026-11-23): channels_last removed 11.4 ms of
kernel time per step, yet the step went from 31.20 to 29.49 ms. The capture shows why: the
launching thread needed 29.5 ms per step to issue the step's 959 launches, with almost no time
blocked, so the GPU had been barely ahead of the host. The measured step after the change equals
that host time.

The host time per step is read from the runtime API trace of the measured steps: the span from the
step's first to its last launch call, over all threads of the process (autograd launches the
backward from its own thread while the training loop's thread waits in ``backward()``), minus the
time spent blocked (synchronizing calls, and launch calls longer than :data:`BLOCKED_FACTOR` x the
median launch call: a launch waits when the launch queue is full).
Under tracing every API call costs more, so this floor is an upper bound of the untraced host's.
"""

from __future__ import annotations

import re

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from gpudiag.analysis.attribution.families import per_distinct

if TYPE_CHECKING:
    from gpudiag.analysis.rules.base import RuleContext

LAUNCH_API = re.compile(r"^(cudaLaunchKernel|cuLaunchKernel|cudaLaunchKernelExC|cudaGraphLaunch|cuGraphLaunch|cudaLaunchCooperativeKernel)")
SYNC_API = re.compile(r"^(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|cudaStreamWaitEvent|cudaMemcpy(_v\d+)?$)")
# A launch call this many times longer than the median one was blocked (the launch queue was full):
# gpudiag's choice; launch calls under nsys take 4-8 us at the median on the H100 captures.
BLOCKED_FACTOR = 3.0

# Rules whose saving is GPU time only: the host launches the same work (or nearly) after the fix.
# The others cut host work too (torch.compile, a fused optimizer, CUDA graphs, a larger batch).
GPU_ONLY_RULES = {"GD-CHANNELS-LAST", "GD-FP32-UNDER-AUTOCAST", "GD-SMALL-GRID", "GD-GEMM-ALIGN", "GD-FP32-MATMUL",
                  "GD-UNFUSED-ATTENTION", "GD-ATTENTION-NOT-FLASH", "GD-UNFUSED-NORM", "GD-LOCAL-MEMORY",
                  "GD-UNCOALESCED", "GD-LOW-OCCUPANCY", "GD-MULTI-STREAM", "GD-INFERENCE-QUANTIZATION",
                  "GD-HALF-WEIGHTS"}


def host_ns_per_step(api: pd.DataFrame) -> float | None:
    """Median over the measured steps of the host's busy time per step, in ns.

    ``api``: the measured steps' runtime API calls of one process (start_ns, end_ns, name, step).
    None without launch calls; blocked time is subtracted as the module docstring says."""
    if api.empty or "step" not in api:
        return None
    # the patterns are matched once per distinct API name (a NULL name matches neither, as its
    # text "nan" did): no per-row text copy of the (categorical) names; steps walked as row positions
    names = api["name"]
    is_launch = per_distinct(names, lambda n: bool(LAUNCH_API.match(str(n))), False, bool)
    duration = (api["end_ns"] - api["start_ns"]).to_numpy(dtype=float)
    typical = float(pd.Series(duration[is_launch]).median())
    blocked = np.where(is_launch, np.clip(duration - BLOCKED_FACTOR * typical, 0, None),
                       np.where(per_distinct(names, lambda n: bool(SYNC_API.match(str(n))), False, bool), duration, 0.0))
    start = api["start_ns"].to_numpy()
    per_step = []
    for rows in api.groupby("step").indices.values():  # each step's rows, in the frame's order
        launches = start[rows][is_launch[rows]]
        if len(launches) >= 2:
            inside = (start[rows] >= launches.min()) & (start[rows] <= launches.max())
            per_step.append(float(launches.max() - launches.min()) - float(blocked[rows][inside].sum()))
    return float(np.median(per_step)) if per_step else None


def bound_by_host(recommendations: list[dict], step_ns: float, host_ns: float | None) -> list[dict]:
    """Adds ``step_saving_bound_ns`` (ns per step) to each GPU-time-only recommendation: the most the
    step can shorten before the host's launch time bounds it, min(saving, step - host); and
    ``host_ns_per_step``. Other rules are left as they are. Returns the same list."""
    if host_ns is None or not step_ns:
        return recommendations
    room = max(step_ns - host_ns, 0.0)
    for r in recommendations:
        if r["rule_id"] in GPU_ONLY_RULES:
            r["host_ns_per_step"] = host_ns
            r["step_saving_bound_ns"] = min(r["saving_ns_per_step"], room)
    return recommendations


def untraced_factor(step_ns: float, bare_inflation_ns: float | None) -> float:
    """bare step / profiled step (≤ 1): how much of the traced host time remains without the
    profiler (tracing slows every API call: shared/design.md, BERT 23.8 ms bare vs ~39 ms traced).
    1.0 without a bare run."""
    if not step_ns or bare_inflation_ns is None:
        return 1.0
    return min(max((step_ns - max(bare_inflation_ns, 0.0)) / step_ns, 0.0), 1.0)


def host_ns_per_launch(step_ns: float, launches_per_step: float, bare_inflation_ns: float | None) -> float:
    """Host time per kernel launch on an overhead-bound step, ns: the bare step (the host sets it)
    over the step's launches. Each eager op's Python, dispatcher and launch work is counted in its
    launches, which is what fusing or compiling removes. 0 without launches."""
    if not launches_per_step:
        return 0.0
    return step_ns * untraced_factor(step_ns, bare_inflation_ns) / launches_per_step


def phase_host_ns(km: pd.DataFrame, phase: str, bare_factor: float = 1.0) -> float:
    """Median over steps of the host span of one phase (from its first to its last kernel launch
    call), ns, times ``bare_factor`` (:func:`untraced_factor`). ``km``: kernels with step, phase
    and api_start_ns. 0 when the phase has fewer than two launches in every step."""
    if km.empty or "api_start_ns" not in km:
        return 0.0
    rows = km[(km["phase"] == phase) & km["api_start_ns"].notna()]
    spans = rows.groupby("step")["api_start_ns"].agg(lambda s: float(s.max() - s.min()))
    return float(spans.median()) * bare_factor if len(spans) else 0.0


def phase_ranges_ns(nvtx: pd.DataFrame, steps_table: pd.DataFrame, measured_ids: set) -> dict[str, float]:
    """Host time per measured step of each of gpudiag's phase ranges (``gpudiag:phase NAME``: the
    backward() call, optimizer.step()), ns: per step the sum of its ranges' durations, then the
    median over the steps that have one. {} without such ranges (exports made without gpudiag).
    An optimizer range holding a closure's work (an export made before gpudiag closed the range
    around closures: Lightning, LBFGS) counts without the backward() and module ranges inside it
    (:func:`closure_ns`), as the attribution does (``ranges.closure_phases``)."""
    from gpudiag import nvtx_names
    from gpudiag.analysis.steps.launches import in_measured_steps

    if nvtx.empty or "text" not in nvtx or steps_table.empty:
        return {}
    ranges = nvtx[_starts_with(nvtx["text"], nvtx_names.PHASE) & nvtx["end_ns"].notna()]
    if ranges.empty:
        return {}
    ranges = in_measured_steps(ranges, ranges["start_ns"].to_numpy(dtype=float), steps_table, measured_ids)
    per = ranges.assign(phase=ranges["text"].str[len(nvtx_names.PHASE):], ns=ranges["end_ns"] - ranges["start_ns"])
    optimizer = (per["phase"] == "optimizer").to_numpy()
    if optimizer.any():
        per.loc[optimizer, "ns"] = per.loc[optimizer, "ns"] - closure_ns(per[optimizer], nvtx)
    return {str(p): float(g.groupby("step")["ns"].sum().median()) for p, g in per.groupby("phase")}


def closure_ns(optimizer: pd.DataFrame, nvtx: pd.DataFrame) -> np.ndarray:
    """Per optimizer range (start_ns, end_ns), the host time inside it of outermost ``backward()``
    and module ranges (a closure's forward and backward, ns); 0 where there are none, as in every
    export gpudiag makes now."""
    from gpudiag import nvtx_names
    from gpudiag.analysis.attribution.ranges import _outermost, window_index

    texts = nvtx["text"]
    inner = nvtx[(_starts_with(texts, nvtx_names.MODULE) | (texts == nvtx_names.PHASE + "backward").to_numpy())
                 & nvtx["end_ns"].notna()]
    out = np.zeros(len(optimizer))
    if inner.empty:
        return out
    inner = _outermost(inner[["start_ns", "end_ns"]])
    order = np.argsort(optimizer["start_ns"].to_numpy(), kind="stable")
    starts, ends = optimizer["start_ns"].to_numpy()[order], optimizer["end_ns"].to_numpy()[order]
    where = window_index(starts, ends, inner["start_ns"].to_numpy())
    inside = where >= 0
    sums = np.bincount(where[inside], weights=(inner["end_ns"] - inner["start_ns"]).to_numpy(dtype=float)[inside],
                       minlength=len(order))
    out[order] = sums
    return out


def outside_modules(nvtx: pd.DataFrame, steps_table: pd.DataFrame, measured_ids: set) -> dict | None:
    """Per measured step, the host time outside every module's forward (the step's time less the
    union of gpudiag's module ranges in it, ns) and the outermost forward calls (the union's
    intervals), medians over the steps: {"outside_ns", "forwards_per_step"}. In a ``generate()``
    step that is the token loop's own Python (logits processing, stopping criteria, the cache's
    bookkeeping) between one forward per token, which CUDA graphs of the model do not remove.
    None without module ranges (``--no-module-ranges``, exports made without gpudiag)."""
    from gpudiag import nvtx_names

    if nvtx.empty or "text" not in nvtx or steps_table.empty:
        return None
    mods = nvtx[_starts_with(nvtx["text"], nvtx_names.MODULE) & nvtx["end_ns"].notna()]
    steps = steps_table[steps_table["step"].isin(measured_ids)]
    if mods.empty or steps.empty:
        return None
    lo, hi = _union(mods["start_ns"].to_numpy(dtype=float), mods["end_ns"].to_numpy(dtype=float))
    outside, calls = [], []
    for s in steps.itertuples(index=False):
        a, b = float(s.start_ns), float(s.end_ns)
        keep = (hi > a) & (lo < b)
        outside.append((b - a) - float((np.minimum(hi[keep], b) - np.maximum(lo[keep], a)).sum()))
        calls.append(int(keep.sum()))
    return {"outside_ns": float(np.median(outside)), "forwards_per_step": float(np.median(calls))}


def _starts_with(texts: pd.Series, prefix: str) -> np.ndarray:
    """Whether each text starts with ``prefix`` (False for NULL), tested once per distinct text:
    NVTX texts repeat (a range per op or module call), and a per-row text copy of the categorical
    column took 0.5 s on a 1 M-kernel export."""
    return per_distinct(texts, lambda t: str(t).startswith(prefix), False, bool)


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint intervals (starts, ends) whose union is that of [starts, ends): sorted by start,
    an interval begins where a range starts after every earlier range ended."""
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    new = np.ones(len(starts), dtype=bool)
    new[1:] = starts[1:] > reach[:-1]
    return starts[new], np.maximum.reduceat(ends, np.nonzero(new)[0])


def loop_floor(ctx: "RuleContext") -> dict | None:
    """What CUDA graphs of the model cannot remove from an inference step that loops over it
    (``generate()``: one forward per token; two or more outermost forwards per step, no backward):
    {"outside_ns" (traced host time outside the forwards), "kernel_ns", "forwards_per_step",
    "profiled_step_ns"} per step; None otherwise (one forward per step, or training). Measured on
    the H100 (docs/inference.md): the steps of three generate() loops with CUDA graphs took their
    untraced outside time plus their kernel time within 10 points."""
    out = ctx.outside_modules
    if not out or out["forwards_per_step"] < 2 or (ctx.km["phase"] == "backward").any():
        return None
    return {**out, "kernel_ns": float(ctx.km["duration_ns"].sum()) / ctx.n_steps, "profiled_step_ns": ctx.step_ns}


def graph_floor_ns(floor: dict, untraced: float) -> float:
    """The step time left once the model runs as CUDA graphs (ns): the loop's host time outside
    the forwards, scaled to the run without the profiler (``untraced``: bare ÷ profiled step), then
    the forwards' kernels, one after the other (each token's forward needs the previous token)."""
    return floor["outside_ns"] * untraced + floor["kernel_ns"]
