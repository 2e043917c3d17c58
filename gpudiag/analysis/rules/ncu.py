"""Rules from Nsight Compute's per-kernel metrics (``gpudiag profile --ncu``): local-memory
traffic, uncoalesced global loads and resource-capped occupancy. Each takes the
:class:`~gpudiag.analysis.rules.base.RuleContext` (its ``ncu`` frame: one row per profiled kernel
instance) and returns at most one recommendation; :data:`NCU_RULES` sits in ``registry.RULES`` at
the place these rules always had. The registry imports this module; this one imports ``base``.
"""

from __future__ import annotations

import pandas as pd

from gpudiag.analysis.attribution.families import CONTRACTION_FAMILIES, kernel_label
from gpudiag.analysis.rules.base import Recommendation, RuleContext, top_evidence



def _ncu_kernels(ctx: "RuleContext", mask: pd.Series) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the ncu rows selected by ``mask``, the measured-step kernels with the same names)."""
    rows = ctx.ncu[mask.fillna(False)] if not ctx.ncu.empty else ctx.ncu
    return rows, ctx.km[ctx.km["name"].isin(set(rows["name"]))] if not rows.empty else ctx.km.iloc[0:0]


def local_memory(ctx: "RuleContext") -> "Recommendation | None":
    """From Nsight Compute: kernels with local-memory traffic (register spills or stack arrays;
    ``l1tex__t_bytes_pipe_lsu_mem_local_op_{ld,st}``) taking 2 % of the step or more. Saving:
    not estimated (it depends on whether the spills hit L1)."""
    if ctx.ncu.empty or "local_memory_bytes" not in ctx.ncu:
        return None
    rows, k = _ncu_kernels(ctx, ctx.ncu["local_memory_bytes"] > 0)
    if k.empty or k["duration_ns"].sum() / ctx.n_steps < 0.02 * ctx.step_ns:
        return None
    worst = rows.sort_values("local_memory_bytes", ascending=False).iloc[0]
    return Recommendation(
        "GD-LOCAL-MEMORY", "Kernels spill registers to local memory (Nsight Compute)", 0.0, "not estimated",
        [f"{k['duration_ns'].sum() / ctx.n_steps / 1e6:.2f} ms/step in kernels with local-memory traffic; "
         f"{kernel_label(worst['name'], None)}: {worst['local_memory_bytes'] / 1e6:.1f} MB of local loads+stores per launch, "
         f"{worst['registers_per_thread']:.0f} registers/thread", *top_evidence(k, ctx.n_steps)],
        "Lower register pressure (smaller per-thread arrays, fewer live values, no dynamically indexed local arrays) "
        "or raise the register cap (`__launch_bounds__`, `--maxrregcount`); for library kernels try another algorithm.",
        saving_estimated=False)


def uncoalesced(ctx: "RuleContext") -> "Recommendation | None":
    """From Nsight Compute: kernels whose global loads need more than 16 sectors per request and
    take 5 % of the step or more. A warp's coalesced load touches 4 sectors for 4-byte words and 16
    for 16-byte vectors (measured: PyTorch's vectorized kernels and a float4 copy read 16), so above
    16 no access width is coalesced; a fully strided load reads 32. Saving: their time x
    (1 - 16 / sectors per request) (conservative: the ideal for narrow loads is lower)."""
    if ctx.ncu.empty or "global_load_sectors_per_request" not in ctx.ncu:
        return None
    rows, k = _ncu_kernels(ctx, ctx.ncu["global_load_sectors_per_request"] > 16)
    if k.empty or k["duration_ns"].sum() / ctx.n_steps < 0.05 * ctx.step_ns:
        return None
    spr = rows.groupby("name")["global_load_sectors_per_request"].median()
    saving = float((k["duration_ns"] * (1 - 16 / k["name"].map(spr).astype(float))).sum()) / ctx.n_steps
    return Recommendation(
        "GD-UNCOALESCED", "Global loads are uncoalesced (Nsight Compute)", saving,
        "their time x (1 - 16 / measured sectors per request)",
        [f"{k['duration_ns'].sum() / ctx.n_steps / 1e6:.2f} ms/step in kernels loading "
         f"{spr.max():.1f} sectors per request (coalesced: 4 for 4-byte, 16 for 16-byte loads)", *top_evidence(k, ctx.n_steps)],
        "Make neighbouring threads read neighbouring addresses (transpose through shared memory, change the "
        "data layout, or make the tensor contiguous before the kernel).")


def low_occupancy(ctx: "RuleContext") -> "Recommendation | None":
    """From Nsight Compute: non-GEMM kernels whose achieved occupancy is under 25 % because their
    resources cap it (theoretical occupancy under 50 %: registers, shared memory or block size),
    taking 5 % of the step or more. GEMM and attention kernels are left out: they run few large
    blocks by design. Saving: not estimated."""
    if ctx.ncu.empty or "theoretical_occupancy_percent" not in ctx.ncu:
        return None
    rows, k = _ncu_kernels(ctx, (ctx.ncu["achieved_occupancy_percent"] < 25)
                           & (ctx.ncu["theoretical_occupancy_percent"] < 50))
    k = k[~k["family"].isin(CONTRACTION_FAMILIES)]
    if k.empty or k["duration_ns"].sum() / ctx.n_steps < 0.05 * ctx.step_ns:
        return None
    worst = rows[rows["name"].isin(set(k["name"]))].sort_values("achieved_occupancy_percent").iloc[0]
    return Recommendation(
        "GD-LOW-OCCUPANCY", "Kernels run at low occupancy, capped by their resources (Nsight Compute)", 0.0,
        "not estimated",
        [f"{k['duration_ns'].sum() / ctx.n_steps / 1e6:.2f} ms/step; {kernel_label(worst['name'], None)}: achieved "
         f"{worst['achieved_occupancy_percent']:.0f} %, theoretical {worst['theoretical_occupancy_percent']:.0f} %",
         *top_evidence(k, ctx.n_steps)],
        "Use less shared memory or fewer registers per block, or larger blocks, so more warps fit on each SM "
        "(ncu's Occupancy section names the limiter).", saving_estimated=False)



NCU_RULES = (local_memory, uncoalesced, low_occupancy)
