"""Per-kernel classification: compute-, bandwidth- or overhead-bound, with its evidence.

This is the first cut, kept behind one function (:func:`classify`) so the roofline issue can
replace it. Rules, in order:

1. overhead-bound (design.md: "kernels too small for either roof to matter (duration near the
   launch latency, grid under one wave)"): shorter than one eager op launch on the host
   (``DevicePeaks.launch_overhead_ns``, measured, docs/notes/measurements.md) with fewer blocks
   than SMs (under one wave at one block per SM, a lower bound that ignores occupancy), or shorter
   than half a launch whatever its grid (our choice: then launching costs the host twice the
   kernel's own time, so eager mode cannot keep the GPU busy).
2. with Nsight Compute measurements of the same kernel name and launch configuration (evidence
   ``ncu``): measured FLOPs (all precisions, tensor cores included) and DRAM bytes give the
   arithmetic intensity, held against the ridge of the math path the kernel used.
   With shapes (evidence ``shapes``): the FLOPs and bytes of the aten op that launched the kernel
   on the detail step (:mod:`gpudiag.analysis.costmodel`), shared among that op call's kernels in
   proportion to their durations, give the arithmetic intensity; at or above the ridge point of
   the op's math path it is compute-bound, below it bandwidth-bound. Other instances of the same
   kernel name and launch configuration inherit the detail step's numbers.
3. otherwise (evidence ``heuristic``): GEMM, convolution and attention kernels are compute-bound,
   everything else bandwidth-bound.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpudiag.analysis.costmodel import op_cost
from gpudiag.analysis.families import CONTRACTION_FAMILIES, families
from gpudiag.analysis.peaks import DevicePeaks

CONFIG_COLUMNS = ["name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]


def _config_key(kernels: pd.DataFrame) -> pd.Series:
    """One integer per distinct kernel name and launch configuration."""
    return kernels[CONFIG_COLUMNS].fillna(-1).groupby(CONFIG_COLUMNS, sort=False).ngroup()


def _shape_costs(kernels: pd.DataFrame, attribution: pd.DataFrame) -> pd.DataFrame:
    """flop, bytes and math_path per kernel instance that an op call with recorded shapes launched."""
    k = pd.DataFrame({"duration_ns": kernels["duration_ns"].to_numpy(), "op": attribution["op"].to_numpy(),
                      "op_args": attribution["op_args"].to_numpy(), "op_call": attribution["op_call"].to_numpy()})
    k = k[k["op_call"] >= 0]
    if k.empty:
        return pd.DataFrame(columns=["flop", "bytes", "math_path"])
    calls = k.drop_duplicates("op_call")[["op_call", "op", "op_args"]]
    texts = calls[["op", "op_args"]].drop_duplicates()
    costs = [op_cost(o, a) for o, a in texts.itertuples(index=False)]  # once per distinct call text
    texts = texts.assign(flop=[c.flop if c else np.nan for c in costs], bytes=[c.bytes if c else np.nan for c in costs],
                         math_path=[c.math_path if c else None for c in costs])
    per_call = calls.merge(texts, on=["op", "op_args"]).dropna(subset=["math_path"]).set_index("op_call")
    share = k["duration_ns"] / k.groupby("op_call")["duration_ns"].transform("sum").replace(0, np.nan)
    joined = per_call.reindex(k["op_call"].to_numpy())
    joined.index = k.index
    return pd.DataFrame({"flop": joined["flop"] * share.fillna(1.0), "bytes": joined["bytes"] * share.fillna(1.0),
                         "math_path": joined["math_path"]}).dropna(subset=["math_path"])


def _ncu_costs(kernels: pd.DataFrame, ncu: pd.DataFrame) -> pd.DataFrame:
    """flop, bytes and math_path per kernel instance from Nsight Compute measurements of kernels
    with the same name and launch configuration (median over the measured instances)."""
    from gpudiag.sources.ncu import math_path

    measured = ncu.assign(math_path=ncu.apply(math_path, axis=1))
    per_config = measured.groupby(CONFIG_COLUMNS).agg(flop=("flop", "median"), bytes=("dram_bytes", "median"),
                                                      math_path=("math_path", "first")).reset_index()
    keys = kernels[CONFIG_COLUMNS].astype({c: float for c in CONFIG_COLUMNS[1:]})
    joined = keys.merge(per_config.astype({c: float for c in CONFIG_COLUMNS[1:]}), on=CONFIG_COLUMNS, how="left")
    joined.index = kernels.index
    return joined.dropna(subset=["math_path"])[["flop", "bytes", "math_path"]]


def classify(kernels: pd.DataFrame, attribution: pd.DataFrame, peaks: DevicePeaks,
             ncu: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per kernel (same order): kernel_id, family, config_key, kernel_class
    (compute/bandwidth/overhead), evidence (ncu/shapes/heuristic), flop, bytes, math_path,
    intensity (FLOP/byte), ridge (FLOP/byte), achieved_flop_per_s, achieved_bytes_per_s,
    efficiency (roofline floor / duration; NaN without shapes)."""
    out = pd.DataFrame({"kernel_id": kernels["kernel_id"].to_numpy(), "family": families(kernels["name"]).to_numpy(),
                        "config_key": _config_key(kernels).to_numpy()})
    dur = kernels["duration_ns"].to_numpy(dtype=float)
    cost = _shape_costs(kernels, attribution)
    out["flop"], out["bytes"], out["math_path"] = np.nan, np.nan, None
    out.loc[cost.index, ["flop", "bytes"]] = cost[["flop", "bytes"]].to_numpy()
    out.loc[cost.index, "math_path"] = cost["math_path"].to_numpy()
    # Instances without shapes inherit the detail step's numbers for the same name + launch config.
    known = out.loc[cost.index].groupby("config_key").agg(flop=("flop", "median"), bytes=("bytes", "median"),
                                                            math_path=("math_path", "first"))
    missing = out["math_path"].isna() & out["config_key"].isin(known.index)
    inherit = known.reindex(out.loc[missing, "config_key"].to_numpy())
    out.loc[missing, ["flop", "bytes"]] = inherit[["flop", "bytes"]].to_numpy()
    out.loc[missing, "math_path"] = inherit["math_path"].to_numpy()

    evidence = np.where(out["math_path"].notna(), "shapes", "heuristic").astype(object)
    if ncu is not None and not ncu.empty:
        # Measured FLOPs and DRAM bytes win over estimates, for every instance of the same kernel
        # name and launch configuration.
        measured = _ncu_costs(kernels, ncu)
        out.loc[measured.index, ["flop", "bytes"]] = measured[["flop", "bytes"]].to_numpy()
        out.loc[measured.index, "math_path"] = measured["math_path"].to_numpy()
        evidence[measured.index.to_numpy()] = "ncu"
    has_shapes = out["math_path"].notna().to_numpy()
    out["intensity"] = out["flop"] / out["bytes"].replace(0, np.nan)
    ridges = {p: peaks.ridge(p) for p in out["math_path"].dropna().unique()}
    out["ridge"] = out["math_path"].map(ridges).astype(float)
    out["achieved_flop_per_s"] = out["flop"] / (dur * 1e-9)
    out["achieved_bytes_per_s"] = out["bytes"] / (dur * 1e-9)
    peak_flops = out["math_path"].map({p: peaks.flops.get(p, np.nan) for p in ridges}).astype(float)
    floor_s = np.fmax(out["flop"] / peak_flops, out["bytes"] / (peaks.bandwidth or np.nan))
    out["efficiency"] = floor_s / (dur * 1e-9)

    blocks = (kernels[["grid_x", "grid_y", "grid_z"]].fillna(1).prod(axis=1)).to_numpy()
    launch = peaks.launch_overhead_ns
    overhead = ((dur < launch) & (blocks < max(peaks.sm_count, 1))) | (dur < launch / 2)
    by_roofline = np.where(out["intensity"].to_numpy() >= out["ridge"].to_numpy(), "compute", "bandwidth")
    by_family = np.where(out["family"].isin(CONTRACTION_FAMILIES), "compute", "bandwidth")
    roofline_known = has_shapes & np.isfinite(out["ridge"].to_numpy()) & np.isfinite(out["intensity"].to_numpy())
    out["kernel_class"] = np.where(overhead, "overhead", np.where(roofline_known, by_roofline, by_family))
    out["evidence"] = np.where(roofline_known, evidence, "heuristic")
    return out
