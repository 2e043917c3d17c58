"""Per-step statistics of one run: the GPU-idle split per step, the per-step entries of report.json
(time per kernel class, host-bound idle), the mean breakdown of a measured step and the per-step
samples the CI gate tests. Times are ns throughout; "measured" steps are those the statistics
cover (:mod:`gpudiag.analysis.pipeline`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

CLASSES = ("compute", "bandwidth", "overhead", "communication")  # communication: collectives, outside the roofline


def per_step(values: pd.Series, n_steps: int) -> float:
    """The sum of ``values`` per step (NaN without steps)."""
    return float(values.sum()) / n_steps if n_steps else np.nan


def stats(values: pd.Series) -> dict:
    """Mean, median, min and max of ``values`` (all None when empty)."""
    if values.empty:
        return {"mean": None, "median": None, "min": None, "max": None}
    return {"mean": float(values.mean()), "median": float(values.median()),
            "min": float(values.min()), "max": float(values.max())}


def idle_steps(idle: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """``idle`` (GPU-idle intervals, start_ns/end_ns) with ``step``: the measured step whose window
    (``window_start_ns`` to ``gpu_end_ns``) holds the interval, else -1."""
    win = measured[["step", "window_start_ns", "gpu_end_ns"]].sort_values("window_start_ns")
    idle = idle.assign(step=-1)
    if not idle.empty and not win.empty:
        pos = np.searchsorted(win["window_start_ns"].to_numpy(), idle["start_ns"].to_numpy(), side="right") - 1
        ok = (pos >= 0) & (idle["end_ns"].to_numpy() <= win["gpu_end_ns"].to_numpy()[np.maximum(pos, 0)])
        idle["step"] = np.where(ok, win["step"].to_numpy()[np.maximum(pos, 0)], -1)
    return idle


def mark_step_start(idle: pd.DataFrame, km: pd.DataFrame) -> pd.DataFrame:
    """``idle`` (with ``step``) with ``at_step_start``: the interval ends at or before its step's
    first kernel (``km``: the measured kernels). That idle is the input stall (GD-INPUT-STALL):
    copies such as the previous step's ``.item()`` may run earlier in the window, so "before the
    first kernel", not "at the window start"."""
    first_kernel = km.groupby("step")["start_ns"].min()
    return idle.assign(at_step_start=idle["end_ns"].to_numpy() <= idle["step"].map(first_kernel).to_numpy())


def class_ns_per_step(km: pd.DataFrame, activities: pd.DataFrame, measured_ids: set) -> pd.DataFrame:
    """GPU time (ns) per measured step (rows) and kernel class (columns :data:`CLASSES`) of the
    measured kernels ``km`` and of the steps' copies and memsets (from ``activities``)."""
    # Copies and memsets are memory traffic: they count as bandwidth time.
    copies = activities[(activities["kind"] != "kernel") & activities["step"].isin(measured_ids)]
    # the kernels summed per (step, class) first: integer sums in any order are the same sums, and the
    # concat below copies a few rows per step, not every kernel's (5 M kernels: 0.16 GB, docs/scale.md)
    kernel_ns = km.groupby(["step", "kernel_class"])["duration_ns"].sum().reset_index()
    busy_parts = pd.concat([kernel_ns,
                            pd.DataFrame({"step": copies["step"], "kernel_class": "bandwidth",
                                          "duration_ns": copies["end_ns"] - copies["start_ns"]})])
    class_ns = busy_parts.groupby(["step", "kernel_class"])["duration_ns"].sum().unstack(fill_value=0)
    return class_ns.reindex(columns=list(CLASSES), fill_value=0)


def per_step_entries(st: pd.DataFrame, class_ns: pd.DataFrame, idle_m: pd.DataFrame) -> list[dict]:
    """report.json's ``steps.per_step``: one entry per row of the step table ``st``; a step with
    kernel time in ``class_ns`` (:func:`class_ns_per_step`) also gets ``<class>_ns`` (scaled to the
    busy time), ``host_bound_idle_ns`` (from ``idle_m``, the measured steps' idle intervals, counted
    as overhead), its parts ``launch_bound_idle_ns`` and ``host_compute_idle_ns`` (where ``idle_m``
    is split: :mod:`gpudiag.analysis.steps.host_work`) and ``other_idle_ns``."""
    host_idle = idle_m[idle_m["host_bound"]].groupby("step")["duration_ns"].sum()
    host_compute = (idle_m.groupby("step")["host_compute_ns"].sum() if "host_compute_ns" in idle_m
                    else None)
    entries = []
    for row in st.itertuples(index=False):
        entry = {"step": int(row.step), "step_time_ns": int(row.step_time_ns), "busy_ns": int(row.busy_ns),
                 "idle_ns": int(row.idle_ns), "kernels": int(row.kernels), "warmup": bool(row.warmup),
                 "detail": bool(row.detail), "measured": bool(row.measured), "outlier": bool(row.outlier)}
        if row.step in class_ns.index:
            kernel_total = float(class_ns.loc[row.step].sum())
            scale = row.busy_ns / kernel_total if kernel_total else 0.0  # concurrent work counts once
            host = float(host_idle.get(row.step, 0))
            entry.update({f"{c}_ns": float(class_ns.loc[row.step, c]) * scale for c in CLASSES})
            entry["overhead_ns"] += host
            entry["host_bound_idle_ns"] = host
            if host_compute is not None:
                entry["host_compute_idle_ns"] = float(host_compute.get(row.step, 0))
                entry["launch_bound_idle_ns"] = host - entry["host_compute_idle_ns"]
            entry["other_idle_ns"] = float(row.idle_ns) - host
        entries.append(entry)
    return entries


def breakdown(entries: list[dict], step_ns: float) -> tuple[dict, dict]:
    """The mean measured step's time per class and idle (ns) and the same as a percentage of the
    mean step time ``step_ns``, from the :func:`per_step_entries`."""
    ps = pd.DataFrame([e for e in entries if e["measured"] and "compute_ns" in e])
    ns = {}
    for key in ("compute_ns", "bandwidth_ns", "overhead_ns", "communication_ns", "other_idle_ns"):
        value = float(ps[key].mean()) if not ps.empty else 0.0
        ns[key.replace("other_idle", "idle")] = value
    percent = {k2.replace("_ns", ""): 100.0 * v / step_ns if step_ns else None for k2, v in ns.items()}
    return ns, percent


def overhead_split(entries: list[dict], step_ns: float) -> tuple[dict, dict]:
    """The mean measured step's overhead (:func:`breakdown`'s ``overhead_ns``) in two parts, ns and
    % of the mean step ``step_ns``: ``launch_bound`` (overhead-bound kernels and the host-bound idle
    while the host issued work) and ``host_compute`` (host-bound idle while the launching thread ran
    CPU work with no CUDA call, :mod:`gpudiag.analysis.steps.host_work`). The parts add up to the
    overhead. ({}, {}) where the entries carry no split."""
    ps = pd.DataFrame([e for e in entries if e["measured"] and "host_compute_idle_ns" in e])
    if ps.empty:
        return {}, {}
    host_compute = float(ps["host_compute_idle_ns"].mean())
    ns = {"launch_bound_ns": float((ps["overhead_ns"] - ps["host_compute_idle_ns"]).mean()), "host_compute_ns": host_compute}
    return ns, {k.replace("_ns", ""): 100.0 * v / step_ns if step_ns else None for k, v in ns.items()}


def per_step_metrics(km: pd.DataFrame, measured: pd.DataFrame, entries: list[dict], incl: pd.DataFrame,
                     modules: list[dict], peak_memory: dict) -> list[dict]:
    """Per measured step, the samples the CI gate tests: step time, GPU busy time, overhead share,
    kernel launches, GPU time per kernel family and per module of the module table (all ns), and
    the peak bytes allocated by PyTorch when the launcher recorded it (``peak_memory``: step -> bytes)."""
    families = km.groupby(["step", "family"])["duration_ns"].sum().unstack(fill_value=0)
    listed = [m["module"] for m in modules]
    mods = (incl[incl["module"].isin(listed)].groupby(["step", "module"])["duration_ns"].sum().unstack(fill_value=0)
            if not incl.empty else pd.DataFrame())
    by_step = {e["step"]: e for e in entries}
    rows = []
    for row in measured.itertuples(index=False):
        entry = by_step[row.step]
        rows.append({
            "step": int(row.step), "step_time_ns": float(row.step_time_ns), "busy_ns": float(row.busy_ns),
            "overhead_percent": 100.0 * entry.get("overhead_ns", 0.0) / row.step_time_ns if row.step_time_ns else None,
            "kernel_launches": int(row.kernels),
            "families_ns": {f: float(v) for f, v in families.loc[row.step].items()} if row.step in families.index else {},
            "modules_ns": {m: float(v) for m, v in mods.loc[row.step].items()} if row.step in mods.index else {},
            "peak_memory_bytes": peak_memory.get(str(int(row.step))),
        })
    return rows
