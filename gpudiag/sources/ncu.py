"""Reader for Nsight Compute reports (``.ncu-rep``) through NVIDIA's ``ncu-report`` package.

gpudiag asks ncu for ``--set roofline`` plus the LaunchStats and Occupancy sections. That set
records *rates*, so totals are rate x duration (checked on ncu 2025.3 reports, tests/fixtures):

- duration: ``gpu__time_duration.sum`` (ns)
- DRAM bytes: ``dram__bytes.sum.per_second`` x duration (bytes read + written)
- SIMT FLOPs per precision, as in ncu's roofline charts: ``(add + mul + 2 x fma)`` thread
  instructions for fp32 and fp64 (``smsp__sass_thread_inst_executed_op_{f,d}{add,mul,fma}_pred_on
  .sum.per_cycle_elapsed``), ``(2 x add + 2 x mul + 4 x fma)`` for fp16 (paired ``HFMA2``), times
  the elapsed cycles (``smsp__cycles_elapsed.avg.per_second`` x duration)
- tensor-core FLOPs: ``sm__ops_path_tensor_src_<type>[...].sum``, dense paths only (names without
  ``sparsity_on``); one multiply-add counts 2, which we checked against 2·M·N·K of Swin-T's GEMMs.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

NCU_HINT = "install NVIDIA's reader with: pip install ncu-report"

# sm__ops_path_tensor_src_<src>[_dst_<dst>][_sparsity_off].sum -> gpudiag math path
_TENSOR = re.compile(r"^sm__ops_path_tensor_src_([a-z0-9]+)(?:_dst_[a-z0-9]+)?(?:_sparsity_off)?\.sum$")
_TENSOR_PATH = {"bf16": "bf16", "fp16": "fp16", "tf32": "tf32", "fp64": "fp64", "fp8": "fp8", "int8": "int8", "int1": "int8"}


class NcuError(ValueError):
    """The file cannot be read as an Nsight Compute report; the message says how to fix it."""


def _load(path: Path):
    try:
        import ncu_report
    except ImportError:
        raise NcuError(f"{path}: reading Nsight Compute reports needs the ncu-report package; {NCU_HINT}") from None
    if not path.is_file():
        raise NcuError(f"{path}: no such file; pass the .ncu-rep written by ncu (or gpudiag profile --ncu)")
    try:
        return ncu_report, ncu_report.load_report(str(path))
    except Exception as exc:  # noqa: BLE001 - the package raises plain exceptions for bad files
        raise NcuError(f"{path}: not a readable Nsight Compute report ({exc})") from None


def read_ncu(path: Path) -> pd.DataFrame:
    """One row per profiled kernel: name (demangled, as nsys writes it), grid_x/y/z, block_x/y/z,
    duration_ns, dram_bytes, flop_fp64, flop_fp32, flop_fp16, flop_tensor, tensor_path (the tensor
    path with most ops, or None), flop (all of them), registers_per_thread, waves_per_sm,
    achieved_occupancy_percent, theoretical_occupancy_percent, local_memory_bytes (local loads +
    stores: register spills), global_load_sectors_per_request (a coalesced warp load: 4 sectors for
    4-byte words, 16 for 16-byte vectors; 32 when every thread hits its own sector).
    The last three are NaN in reports recorded without gpudiag's extra metrics.
    Raises :class:`NcuError` for a missing package or an unreadable file."""
    module, ctx = _load(path)
    rows = []
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for i in range(rng.num_actions()):
            action = rng.action_by_idx(i)
            names = set(action.metric_names())

            def value(name: str, default=np.nan):
                if name not in names:
                    return default
                v = action.metric_by_name(name).value()
                return default if v is None else float(v)

            duration_s = value("gpu__time_duration.sum") * 1e-9
            cycles = value("smsp__cycles_elapsed.avg.per_second") * duration_s
            rate = "smsp__sass_thread_inst_executed_op_{}_pred_on.sum.per_cycle_elapsed"

            def simt(prefix: str, weights: tuple[float, float, float]) -> float:
                add, mul, fma = (value(rate.format(prefix + op), 0.0) for op in ("add", "mul", "fma"))
                return (weights[0] * add + weights[1] * mul + weights[2] * fma) * cycles

            tensor = {}
            for name in names:
                m = _TENSOR.match(name)
                if m and "sparsity_on" not in name:
                    path_name = _TENSOR_PATH.get(m.group(1), m.group(1))
                    tensor[path_name] = tensor.get(path_name, 0.0) + value(name, 0.0)
            flop_tensor = float(sum(tensor.values()))
            flops = {"flop_fp64": simt("d", (1, 1, 2)), "flop_fp32": simt("f", (1, 1, 2)), "flop_fp16": simt("h", (2, 2, 4))}
            rows.append({
                "name": action.name(module.IAction.NameBase_DEMANGLED),
                "grid_x": value("launch__grid_dim_x"), "grid_y": value("launch__grid_dim_y"), "grid_z": value("launch__grid_dim_z"),
                "block_x": value("launch__block_dim_x"), "block_y": value("launch__block_dim_y"), "block_z": value("launch__block_dim_z"),
                "duration_ns": duration_s * 1e9,
                "dram_bytes": value("dram__bytes.sum.per_second") * duration_s,
                **flops, "flop_tensor": flop_tensor,
                "tensor_path": max(tensor, key=tensor.get) if flop_tensor > 0 else None,
                "flop": float(np.nansum(list(flops.values()))) + flop_tensor,
                "registers_per_thread": value("launch__registers_per_thread"),
                "waves_per_sm": value("launch__waves_per_multiprocessor"),
                "achieved_occupancy_percent": value("sm__warps_active.avg.pct_of_peak_sustained_active"),
                "theoretical_occupancy_percent": value("sm__maximum_warps_per_active_cycle_pct"),
                "local_memory_bytes": value("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum")
                + value("l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"),
                "global_load_sectors_per_request": _per_request(value("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"),
                                                                value("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum")),
            })
    if not rows:
        raise NcuError(f"{path}: the report holds no profiled kernels")
    df = pd.DataFrame(rows)
    if not np.isfinite(df["dram_bytes"]).any():
        raise NcuError(f"{path}: no roofline counters in this report; record it with ncu --set roofline "
                       "(gpudiag profile --ncu does)")
    return df


def _per_request(sectors: float, requests: float) -> float:
    """Global-load sectors per request; NaN for a kernel that made no global load (0 requests:
    seen on EfficientNet-B0's kernels, tests/fixtures/roofline48/conv)."""
    return sectors / requests if requests > 0 else np.nan


def math_path(row: pd.Series) -> str:
    """The math path whose roof a measured kernel is held to: its dominant tensor path if it used
    tensor cores, else the SIMT precision with most FLOPs (fp32 when it did no floating point)."""
    if row["flop_tensor"] > 0 and row["flop_tensor"] >= max(row["flop_fp32"], row["flop_fp16"], row["flop_fp64"]):
        return row["tensor_path"]
    simt = {"fp64": row["flop_fp64"], "fp32": row["flop_fp32"], "fp16": row["flop_fp16"]}
    best = max(simt, key=lambda k: simt[k] or 0.0)
    # fp16 SIMT (HFMA2) runs at twice the fp32 rate on Hopper; held to the fp32 roof here (conservative)
    return "fp64" if best == "fp64" and simt["fp64"] > 0 else "fp32"
