"""report.json's sections around the findings: the header (versions, source, script, device), the
steps, the classification, the kernel tables, the idle time, and the warnings about the capture.
"""

from __future__ import annotations

import pandas as pd

from gpudiag.version import __version__
from gpudiag.script_status import ScriptStatus
from gpudiag.analysis.attribution.ranges import Steps
from gpudiag.analysis.findings import tables
from gpudiag.analysis.steps import host_work, outliers, step_stats
from gpudiag.sources import row_checks


REPORT_SCHEMA_VERSION = 1


MIN_STEPS = 3  # issue 24: fewer steps than this give no median worth the name


def few_steps(found: int) -> list[str]:
    """A warning, saying what to pass, when fewer than :data:`MIN_STEPS` steps were found."""
    if found >= MIN_STEPS:
        return []
    return [f"only {found} step{'s' if found != 1 else ''} found: per-step numbers need at least {MIN_STEPS}. "
            "Pass --steps-from forward (one step per call of the outermost model), generate (one per generate() "
            "call) or nvtx:REGEX (your own ranges), or call gpudiag.step() at the end of each step; a short script "
            "needs more steps of its own (e.g. its --epochs or --iters)"]


def capture_warnings(meta: dict, status: ScriptStatus | None) -> list[str]:
    """Warnings about the capture itself: tables missing from the export, rows dropped, a failed script."""
    warnings = []
    if meta.get("missing"):
        warnings.append("missing from the export: " + ", ".join(meta["missing"][:12]))
    warnings.extend(row_checks.warning_lines(meta.get("dropped_rows") or {}, meta.get("rows_read") or {}))
    if status is not None and status.failed:
        warnings.append(f"the script failed (exit code {status.exit_code}): {status.exception or 'see gpudiag.log'}; "
                        "this report covers what was captured until then")
    return warnings


def header(meta: dict, status: ScriptStatus | None, compiled: dict, device_peaks) -> dict:
    """report.json's first keys: versions, source, script status, compiled graphs, environment, device."""
    dynamo = status.compile if status is not None else None
    versions = {k: getattr(status, k) for k in ("torch_version", "torch_cuda_version") if status and getattr(status, k)}
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "gpudiag_version": __version__,
        "source": meta.get("source"),
        # the provenance can run to hundreds of KB: it stays in script_status.json
        # trials: the report's own section (gpudiag.trials.results.attach)
        "script": status.without("inductor_provenance", "trials", "trials_left_out", "trials_budget", "patches").to_json()
        if status else None,
        "compiled": {**compiled, "dynamo": dynamo} if compiled["graphs"] or dynamo else None,
        "environment": {**meta.get("environment", {}), **versions},
        "device": {"name": device_peaks.name, "sm_count": device_peaks.sm_count,
                   "memory_bandwidth_bytes_per_s": device_peaks.bandwidth, "peak_flop_per_s": device_peaks.flops,
                   "peaks_source": device_peaks.source, "launch_overhead_ns": device_peaks.launch_overhead_ns}}


def steps_section(steps: Steps, st: pd.DataFrame, detail_step: int | None, measured: pd.DataFrame,
                   per_step: list[dict], micro_batches: dict | None = None) -> dict:
    """report.json's ``steps``: where steps came from, counts, micro-batches per step
    (:func:`gpudiag.analysis.steps.frames.micro_batches`, None when unknown), step-time statistics
    (ns), per step."""
    return {"source": steps.source, "kind": steps.kind, "count": int(len(st)), "warmup_steps": int(st["warmup"].sum()),
            "micro_batches": micro_batches,
            "detail_step": detail_step, "measured": len(measured), "outliers": int(st["outlier"].sum()),
            "statistics": outliers.STEADY_STATE_RULE,
            "step_time_ns": step_stats.stats(measured["step_time_ns"].astype(float)),
            "step_time_ns_with_outliers": step_stats.stats(st.loc[st["measured"] | st["outlier"], "step_time_ns"].astype(float)),
            "per_step": per_step}


def classification(meta: dict, ncu: pd.DataFrame, km: pd.DataFrame) -> dict:
    """report.json's ``classification``: method, ncu source and the measured kernel time's shares by
    evidence and by class."""
    return {"method": ("roofline: Nsight Compute measurements where profiled, else op shapes where recorded, "
                       "else kernel name heuristics"),
            "ncu_source": meta.get("ncu_source"),
            "ncu_kernels_profiled": int(len(ncu)),
            "evidence_share_percent": tables.shares(km, "evidence"),
            "class_share_of_kernel_time_percent": tables.shares(km, "kernel_class"),
            "ncu_settles_first": ncu_settles_first(km)}


# A class resting on a basis that agreed with ncu this often or more is not worth a replay first.
SETTLED_CONFIDENCE = 0.95


def ncu_settles_first(km: pd.DataFrame, top: int = 5) -> list[dict]:
    """The kernels whose class ``gpudiag profile --ncu`` would settle first: those classed by name
    (evidence ``heuristic``) on a basis that agreed with Nsight Compute on less than
    :data:`SETTLED_CONFIDENCE` of the fixtures' time (:data:`gpudiag.analysis.roofline.tiles.BASIS_CONFIDENCE`),
    ranked by their measured-step time times (1 - confidence), the time a wrong class could
    misplace. Each: name, kernel_class, basis,
    confidence (0-1), time_ns (over the measured steps)."""
    if "confidence" not in km or km.empty:
        return []
    open_ = km[(km["evidence"] == "heuristic") & (km["confidence"] < SETTLED_CONFIDENCE)]
    if open_.empty:
        return []
    g = open_.groupby("name", observed=True).agg(kernel_class=("kernel_class", "first"), basis=("basis", "first"),
                                                 confidence=("confidence", "first"), time_ns=("duration_ns", "sum"))
    g = g.assign(at_stake=g["time_ns"] * (1 - g["confidence"])).nlargest(top, "at_stake")
    return [{"name": str(name), "kernel_class": str(r.kernel_class), "basis": str(r.basis),
             "confidence": round(float(r.confidence), 3), "time_ns": float(r.time_ns)} for name, r in g.iterrows()]


def kernel_tables(km: pd.DataFrame, n: int) -> dict:
    """report.json's operator classes, roofline points, the points furthest below their roof and
    the time per kernel family per measured step (ns)."""
    return {"operator_classes": tables.operator_classes(km) if n else [],
            "roofline_points": (points := tables.roofline_points(km, n)) if n else [],
            "below_roof": tables.below_roof(points if n else []),
            "families_ns_per_step": {f: float(v) / n for f, v in km.groupby("family")["duration_ns"].sum().items()} if n else {}}


def idle_section(idle_m: pd.DataFrame, km: pd.DataFrame, stream_rows: list[dict], top_waits: list[dict], n: int,
                 stretches_m: pd.DataFrame | None = None) -> dict:
    """report.json's ``idle``: host-bound and other GPU-idle time per measured step (ns), the
    host-bound part split into launch-bound and host compute (:func:`host_compute_fields`), stream
    gaps, short kernels, the median queue delay and the kernels waited for."""
    return {
        "host_bound_idle_ns_per_step": step_stats.per_step(idle_m.loc[idle_m["host_bound"], "duration_ns"], n),
        **(host_compute_fields(idle_m, stretches_m, n) if stretches_m is not None else {}),
        "other_idle_ns_per_step": step_stats.per_step(idle_m.loc[~idle_m["host_bound"], "duration_ns"], n),
        "streams": stream_rows,
        # what GD-INPUT-STALL measures, without its 10 % threshold: the ranks table compares ranks by it
        "step_start_idle_ns_per_step": step_stats.per_step(
            idle_m.loc[idle_m["host_bound"] & idle_m["at_step_start"], "duration_ns"], n),
        "kernels_shorter_than_launch_per_step": float(km["shorter_than_launch"].sum()) / n if n else None,
        "median_queue_delay_ns": tables.num(km["queue_delay_ns"].median()),
        "top_waiting_kernels": top_waits,
    }


def host_compute_fields(idle_m: pd.DataFrame, stretches_m: pd.DataFrame, n: int, top: int = 5) -> dict:
    """The ``idle`` section's split of host-bound idle (:mod:`gpudiag.analysis.steps.host_work`),
    per measured step (ns): launch_bound_idle_ns_per_step + host_compute_idle_ns_per_step =
    host_bound_idle_ns_per_step, step_start_host_compute_idle_ns_per_step (host compute before the
    steps' first kernels); host_compute_stretches_per_step, the longest stretch's part in
    its idle interval (longest_host_compute_stretch_ns, None without one), the threshold, and
    ``host_compute_where``: the ``top`` NVTX ranges holding most host-compute time (None: outside
    every range)."""
    labels = stretches_m["where"].astype(object).fillna("").to_numpy()  # "": outside every range
    where = stretches_m.groupby(labels)["ns"].sum().sort_values(ascending=False, kind="stable").head(top)
    return {
        "launch_bound_idle_ns_per_step": step_stats.per_step(idle_m["launch_bound_ns"], n),
        "host_compute_idle_ns_per_step": step_stats.per_step(idle_m["host_compute_ns"], n),
        # the part of step_start_idle_ns_per_step (GD-INPUT-STALL's idle) that is host compute
        "step_start_host_compute_idle_ns_per_step": step_stats.per_step(
            idle_m.loc[idle_m["at_step_start"].astype(bool), "host_compute_ns"], n),
        "host_compute_stretches_per_step": float(len(stretches_m)) / n if n else None,
        "longest_host_compute_stretch_ns": float(stretches_m["ns"].max()) if len(stretches_m) else None,
        "host_compute_threshold_ns": host_work.HOST_COMPUTE_STRETCH_NS,
        "host_compute_where": [{"where": str(w) or None, "ns_per_step": float(v) / n} for w, v in where.items()] if n else [],
    }
