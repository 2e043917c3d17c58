"""The analysis of one run: from an nsys export to the plain data the reporters render.

``ingest`` loads an export into a run database; ``analyse`` reads the run database, writes the
attribution and classification back to it, and returns a JSON-able dict (``report.json``'s
content, documented in docs/architecture.md). Statistics are over *measured* steps: not warm-up,
not the detail step (whose per-op ranges slow it down; its extra time is the instrumentation
overhead the report shows).
"""

from __future__ import annotations

import dataclasses

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import sqlite_utils

from gpudiag import __version__, store
from gpudiag.analysis import comm, invariants, outliers, overlaps, ranks, report_tables, step_stats
from gpudiag.analysis import peaks as peaks_mod
from gpudiag.analysis.attribution import (Steps, attribute, find_steps, launch_calls, op_call_payloads, run_flags,
                                          window_index)
from gpudiag.analysis.errors import AnalysisError
from gpudiag.analysis.families import COMMUNICATION, families
from gpudiag.analysis.classify import classify
from gpudiag.analysis import host_floor
from gpudiag.analysis.fusion import fusion_candidates, mark_host_bound, saving_by_kernel
from gpudiag.analysis.kernel_sequence import kernel_sequence_candidates
from gpudiag.analysis.compiled import attribute_compiled
from gpudiag.analysis.compiled import summarize as summarize_compiled
from gpudiag.analysis.launches import in_measured_steps, launch_counts
from gpudiag.analysis.representative import apply_bare_run, compare_bare
from gpudiag.analysis.distributed_rules import distributed_context
from gpudiag.analysis.serving import apply_requests, rule_context
from gpudiag.analysis.timeline import gpu_activities, idle_intervals, launch_stats, step_table, stream_gaps
from gpudiag.sources import row_checks
from gpudiag.sources.ncu import read_ncu
from gpudiag.sources.nsys_sqlite import read_export

REPORT_SCHEMA_VERSION = 1


def ingest(export_path: Path, db_path: Path, source_name: str | None = None,
           ncu_path: Path | None = None) -> sqlite_utils.Database:
    """Read the nsys SQLite export at ``export_path`` (and, if given, the Nsight Compute report at
    ``ncu_path``, into table ``ncu_kernels``) into a new run database at ``db_path``.
    Raises :class:`gpudiag.sources.nsys_sqlite.ExportError` for a file that is not an export and
    :class:`gpudiag.sources.ncu.NcuError` for an unreadable ncu report."""
    export = read_export(export_path)
    ncu = read_ncu(ncu_path) if ncu_path else None
    kernels = export.kernels.copy()
    kernels.insert(0, "kernel_id", np.arange(len(kernels), dtype=np.int64))
    tables = {"kernels": kernels, "runtime_api": export.runtime_api, "memcpy": export.memcpy,
              "memset": export.memset, "sync": export.sync, "nvtx_ranges": export.nvtx_ranges,
              "devices": export.devices}
    if ncu is not None:
        tables["ncu_kernels"] = ncu
    return store.create_run_db(db_path, tables, {"source": source_name or export_path.name,
                                                 "ncu_source": ncu_path.name if ncu_path else None,
                                                 "missing": export.missing, "environment": export.environment,
                                                 "dropped_rows": export.dropped, "rows_read": export.rows_read})


class Tables(NamedTuple):
    """The run database's frames an analysis reads (after :func:`_one_process`, one process's rows)."""
    kernels: pd.DataFrame
    runtime_api: pd.DataFrame
    nvtx: pd.DataFrame
    devices: pd.DataFrame
    memcpy: pd.DataFrame
    memset: pd.DataFrame


def analyse(db: sqlite_utils.Database, warmup_steps: int = 2, steps_from: str | None = None,
            status: dict | None = None, top: int = 20, calibration: dict | None = None,
            process: int | None = None, rank_workers: int | None = None) -> dict:
    """Analyse the run database ``db``; returns report.json's content (see module docstring).

    Writes ``kernel_attribution``, ``kernel_class`` and ``steps`` tables back into ``db``.
    Raises :class:`AnalysisError` when the export has no kernels or ``steps_from`` is an invalid
    regular expression (or ``process``, a ``global_pid``, launched no kernel). ``process`` restricts
    the analysis to that process. Without it, an export of several processes is reported for the
    one with the most kernel time (with a warning), and report.json's ``ranks`` compares every
    process, each analysed in a pool of ``rank_workers`` processes (:mod:`gpudiag.analysis.ranks`). ``calibration`` (a ``gpudiag calibrate`` entry of the same GPU)
    replaces datasheet peaks with measured ones."""
    meta = store.read_meta(db)
    warnings: list[str] = []
    t, procs = _one_process(_load(db, meta, warnings), process, warnings)
    launcher_status, status = status, ranks.status_of_process(status, t.kernels["global_pid"])
    dev = _main_device(t.kernels, t.devices, warnings)
    steps: Steps = _named_source(find_steps(t.nvtx, t.kernels, steps_from, t.runtime_api), status)
    if steps.kind == "whole":
        warmup_steps = 0  # the ranks below are analysed with it too
        warnings.append("no step ranges found: the whole capture is treated as one step")
    payloads, attribution, compiled = _attribute(t, steps, status, warnings)
    device_peaks = _peaks(dev, calibration, warnings)
    ncu = store.read_table(db, "ncu_kernels")
    classes = classify(t.kernels, attribution, device_peaks, ncu if not ncu.empty else None)
    detail_step = _detail_step(status, attribution)
    activities = _activities(t, steps)
    st = _step_frame(steps, activities, warmup_steps, detail_step, warnings)
    idle = idle_intervals(activities)
    gaps = stream_gaps(t.kernels, attribution)
    launches = launch_stats(t.kernels, attribution)
    store.write_table(db, "kernel_attribution", attribution)
    store.write_table(db, "kernel_class", classes)
    store.write_table(db, "steps", st)

    measured = st[st["measured"]]
    n = len(measured)
    measured_ids = set(measured["step"])
    compiled = _compiled_in_measured_steps(compiled, t.kernels, attribution, measured_ids, status)
    k = _kernel_frame(t.kernels, attribution, classes, launches)
    km = k[k["step"].isin(measured_ids)]
    idle = step_stats.mark_step_start(step_stats.idle_steps(idle, measured), km)
    idle_m = idle[idle["step"].isin(measured_ids)]
    per_step = step_stats.per_step_entries(st, step_stats.class_ns_per_step(km, activities, measured_ids), idle_m)
    step_ns = float(measured["step_time_ns"].mean()) if n else float("nan")
    breakdown, breakdown_percent = step_stats.breakdown(per_step, step_ns)
    top_kernels = report_tables.top_kernels(km, top, n)
    api_m = _measured_api(t.runtime_api, steps, measured_ids)
    findings = _findings(k, km, detail_step, idle, t, api_m, steps, measured, step_ns, device_peaks, ncu, payloads,
                         _RuleInputs(status, dev, compiled))
    incl, modules = report_tables.modules(km, t.nvtx, n, step_ns)
    stream_rows = report_tables.stream_rows(gaps, k, measured_ids, n)
    top_waits = report_tables.top_waiting_kernels(idle_m, k, n)
    phases = (km.groupby("phase")["duration_ns"].sum() / n).to_dict() if n else {}
    instrumentation = report_tables.instrumentation(st, measured, t.nvtx, detail_step, n)
    warnings.extend(_capture_warnings(meta, status))
    warnings.extend(_few_steps(len(st)))

    report = invariants.check(apply_requests(apply_bare_run({
        **_header(meta, status, compiled, device_peaks),
        "steps": _steps_section(steps, st, detail_step, measured, per_step),
        # None when every measured window is empty (timestamps moved in a damaged export): no share of nothing
        "gpu_busy_percent": (100.0 * float(measured["busy_ns"].sum()) / float(measured["step_time_ns"].sum())
                             if n and measured["step_time_ns"].sum() > 0 else None),
        "outlier_steps": outliers.outlier_report(st, activities, idle, t.runtime_api, steps.table, k),
        "breakdown_ns_per_step": breakdown,
        "breakdown_percent": breakdown_percent,
        "classification": _classification(meta, ncu, km),
        "phases_ns_per_step": {p: float(v) for p, v in phases.items()},
        "top_kernels": top_kernels,
        **findings,
        **_kernel_tables(km, n),
        "modules": modules,
        "per_step_metrics": step_stats.per_step_metrics(km, measured, per_step, incl, modules,
                                                        (status or {}).get("peak_memory_bytes_per_step") or {}) if n else [],
        "idle": _idle_section(idle_m, km, stream_rows, top_waits, n),
        "instrumentation": instrumentation,
        "launches_per_step": launch_counts(km, api_m, n),
        "communication": comm.communication(k, measured_ids, n, step_ns) if n else None,
        "warnings": warnings,
    })))
    collectives = ranks.host_collectives_warning(status, report.get("communication"))
    if collectives:
        report["warnings"].append(collectives)
    if procs is not None:  # every process analysed on its own (the main one again: a plain function of the file)
        options = {"warmup_steps": warmup_steps, "steps_from": steps_from, "status": launcher_status, "top": top,
                   "calibration": calibration}
        report["ranks"] = _ranks(db, procs, options, launcher_status, rank_workers)
    return report


# What made gpudiag's step ranges, by the launcher's step_mode (gpudiag.capture.instrument).
STEP_SOURCES = {"optimizer": "optimizer.step()", "call": "gpudiag.step() or --steps-from call:",
                "forward": "calls of the outermost module", "generate": "generate() calls"}


def _named_source(steps: Steps, status: dict | None) -> Steps:
    """``steps`` with the launcher's own step source named where its status recorded one: a
    generate() loop's steps are not "optimizer.step() or gpudiag.step()"."""
    mode = (status or {}).get("step_mode")
    if steps.kind != "gpudiag" or mode not in STEP_SOURCES:
        return steps
    return dataclasses.replace(steps, source=steps.source.replace("optimizer.step() or gpudiag.step()",
                                                                  STEP_SOURCES[mode]))


def _load(db: sqlite_utils.Database, meta: dict, warnings: list[str]) -> Tables:
    """The run database's frames (an empty ``nvtx`` with its columns); raises :class:`AnalysisError`
    when the export holds no kernel."""
    kernels = store.read_table(db, "kernels")
    runtime_api = store.read_table(db, "runtime_api")
    nvtx = store.read_table(db, "nvtx_ranges")
    devices = store.read_table(db, "devices")
    memcpy, memset = store.read_table(db, "memcpy"), store.read_table(db, "memset")
    if kernels.empty:
        odd = (meta.get("dropped_rows") or {}).get("kernels")
        if odd:  # every kernel row was odd: say so rather than "no kernels"
            raise AnalysisError(f"all {(meta.get('rows_read') or {}).get('kernels', '?')} kernel rows hold impossible values "
                                f"({', '.join(f'{r}: {n}' for r, n in odd.items())}): export the report again")
        raise AnalysisError("the export holds no CUDA kernels: was the script run on a GPU with CUDA tracing on (nsys --trace=cuda)?")
    if nvtx.empty:
        nvtx = pd.DataFrame(columns=["start_ns", "end_ns", "text", "global_tid", "global_pid", "event_type", "domain_id"])
    # before one process is kept: a collective's transfer part needs every rank's kernels (comm module doc)
    kernels["transfer_ns"] = comm.peer_transfer_ns(kernels, (families(kernels["name"]) == COMMUNICATION).to_numpy())
    if runtime_api.empty:
        warnings.append("no CUDA API calls in the export: steps, modules and host-bound idle time cannot be attributed")
    return Tables(kernels, runtime_api, nvtx, devices, memcpy, memset)


def _one_process(t: Tables, process: int | None, warnings: list[str]) -> tuple[Tables, pd.DataFrame | None]:
    """``t`` restricted to the rows of one process: ``process``, else :func:`_main_process` (with a
    warning); and, when several processes launched kernels and ``process`` is None, every process
    (:func:`gpudiag.analysis.ranks.processes`) for the ranks table, else None."""
    # One process per report: step numbers, stream ids and correlation ids are per process.
    kernel_ns_by_pid = t.kernels.groupby("global_pid")["duration_ns"].sum()
    procs = ranks.processes(t.kernels) if len(kernel_ns_by_pid) > 1 and process is None else None
    if process is not None and process not in kernel_ns_by_pid.index:
        raise AnalysisError(f"process {ranks.os_pid(process)} (globalPid {process}) launched no kernel in this export")
    if len(kernel_ns_by_pid) <= 1:
        return t, procs
    pid = process
    if process is None:
        pid, which = _main_process(t.kernels, kernel_ns_by_pid)
        warnings.append(f"{len(kernel_ns_by_pid)} processes launched kernels; this report covers {which} "
                        f"(pid {ranks.os_pid(pid)}, {100 * kernel_ns_by_pid[pid] / kernel_ns_by_pid.sum():.0f} % of the "
                        "kernel time); the ranks table compares them all")
    own = {name: getattr(t, name) for name in ("runtime_api", "nvtx", "memcpy", "memset")}
    return t._replace(kernels=t.kernels[t.kernels["global_pid"] == pid].reset_index(drop=True),
                      **{name: df[df["global_pid"] == pid].reset_index(drop=True) if not df.empty else df
                         for name, df in own.items()}), procs


def _main_process(kernels: pd.DataFrame, kernel_ns_by_pid: pd.Series) -> tuple[int, str]:
    """(global_pid, how it was chosen) of the process a several-process report covers: where the
    collectives were split into transfer and wait (comm module doc), the rank whose collectives
    wait least, the one the others wait for (its steps are the job's critical path; the ranks that
    arrive first spin longest in NCCL and would win on kernel time); else the most kernel time."""
    split = kernels["transfer_ns"].notna()
    if split.any():
        waits = (kernels["duration_ns"] - kernels["transfer_ns"])[split].groupby(kernels["global_pid"][split]).sum()
        return int(waits.idxmin()), "the rank the others wait for in their collectives"
    return int(kernel_ns_by_pid.idxmax()), "the one with the most kernel time"


def _main_device(kernels: pd.DataFrame, devices: pd.DataFrame, warnings: list[str]) -> pd.Series:
    """The ``devices`` row of the GPU that ran the most kernel time (an empty Series when none is known)."""
    # The GPU that ran most of the kernels sets the peaks (TARGET_INFO_GPU lists every GPU present).
    by_device = kernels.groupby("device_id")["duration_ns"].sum()
    if by_device.empty:  # no kernel names its device (a damaged export): the first GPU listed
        warnings.append("no kernel records its device; peaks are those of the first GPU the export lists")
    main_device = by_device.idxmax() if not by_device.empty else (devices["device_id"].iloc[0] if not devices.empty else None)
    if kernels["device_id"].nunique() > 1:
        warnings.append(f"kernels ran on {kernels['device_id'].nunique()} GPUs; peaks are those of device {main_device}")
    dev_rows = devices[devices["device_id"] == main_device] if not devices.empty else devices
    return dev_rows.iloc[0] if not dev_rows.empty else (devices.iloc[0] if not devices.empty else pd.Series(dtype=object))


def _attribute(t: Tables, steps: Steps, status: dict | None, warnings: list[str]) -> tuple[pd.Series, pd.DataFrame, dict]:
    """(op call payloads, attribution, compiled-graph summary): per kernel (rows of ``t.kernels``)
    its step, phase, module, op and graph (:func:`attribute`), kernels of compiled graphs
    attributed through the inductor provenance (:func:`attribute_compiled`)."""
    payloads = op_call_payloads(t.nvtx)  # once: attribution and the fusion data flow both read them
    attribution = attribute(t.kernels, t.runtime_api, t.nvtx, steps, payloads)
    attribution, compiled = attribute_compiled(t.kernels, attribution, t.nvtx, (status or {}).get("inductor_provenance"))
    warnings.extend(compiled["warnings"] if compiled["graphs"] else [])
    return payloads, attribution, compiled


def _compiled_in_measured_steps(compiled: dict, kernels: pd.DataFrame, attribution: pd.DataFrame, measured_ids: set,
                                status: dict | None) -> dict:
    """The compiled-graph summary's shares (compiled share of kernel time, mapped, coarse, with a
    module, the unmapped kernels) over the measured steps, as every other statistic of the report.
    Over the whole capture, the warm-up's compilation counts: under max-autotune, Inductor's
    benchmarking (its L2-flushing fills and candidate kernels, 1.4 s of a BERT capture on the
    H100) made the module attribution look like 47.7 % (docs/workload_zoo.md). The graph counts
    and warnings stay the whole capture's."""
    if not compiled["graphs"]:
        return compiled
    if not measured_ids:
        return {**compiled, "statistics": "whole capture"}
    sel = attribution["step"].isin(measured_ids).to_numpy()
    steady = summarize_compiled(kernels[sel], attribution[sel], (status or {}).get("inductor_provenance"))
    keep = ("graphs", "graphs_recorded", "warnings")
    return {**compiled, **{key: v for key, v in steady.items() if key not in keep}, "statistics": "measured steps"}


def _peaks(dev: pd.Series, calibration: dict | None, warnings: list[str]) -> peaks_mod.DevicePeaks:
    """The datasheet peaks of the main GPU ``dev``, measured ones where ``calibration`` is of that GPU."""
    device_peaks = peaks_mod.lookup(str(dev.get("name", "")), int(dev.get("sm_count", 0) or 0),
                                    dev.get("memory_bandwidth_bytes_per_s"))
    if "MIG slice" in device_peaks.source:
        warnings.append(f"ran on a MIG slice ({device_peaks.name}): {device_peaks.source.split('; ', 1)[-1]}")
    if calibration and calibration.get("gpu") == device_peaks.name:
        device_peaks = peaks_mod.with_calibration(device_peaks, calibration)
    elif calibration:
        warnings.append(f"calibration of {calibration.get('gpu')} ignored: the capture ran on {device_peaks.name}")
    return device_peaks


def _detail_step(status: dict | None, attribution: pd.DataFrame) -> int | None:
    """The step recorded with per-op ranges: the launcher's, else the step most op calls fall in."""
    detail_step = (status or {}).get("detail_step")
    if detail_step is None and (attribution["op_call"] >= 0).any():
        detail_step = int(attribution.loc[attribution["op_call"] >= 0, "step"].mode().iloc[0])
    return detail_step


def _activities(t: Tables, steps: Steps) -> pd.DataFrame:
    """Kernels, copies and memsets (:func:`gpu_activities`) with ``step``: the step window holding
    the launch call (-1 for none; the GPU start where the whole capture is one step)."""
    activities = gpu_activities(t.kernels, t.memcpy, t.memset, t.runtime_api)
    when = activities["api_start_ns"].to_numpy(dtype=float)
    if steps.kind == "whole":
        when = np.where(np.isnan(when), activities["start_ns"].to_numpy(dtype=float), when)
    widx = window_index(steps.table["start_ns"].to_numpy(), steps.table["end_ns"].to_numpy(), when)
    activities["step"] = np.where(widx >= 0, steps.table["step"].to_numpy()[np.maximum(widx, 0)], -1)
    return activities


def _step_frame(steps: Steps, activities: pd.DataFrame, warmup_steps: int, detail_step: int | None,
                warnings: list[str]) -> pd.DataFrame:
    """The step table (:func:`step_table`: times in ns) with the warm-up, detail, measured and
    outlier flags."""
    # several launcher runs in one capture: each run has its own warm-up and detail step
    st = outliers.flag_outliers(run_flags(step_table(steps.table, activities, warmup_steps, detail_step), steps,
                                          warmup_steps, detail_step))
    if len(st) and not st["warmup"].any() and warmup_steps > 0:
        warnings.append(f"only {len(st)} step(s), not more than the {warmup_steps} warm-up steps: "
                        "the statistics include them (capture more steps, or lower --warmup-steps)")
    return st


def _kernel_frame(kernels: pd.DataFrame, attribution: pd.DataFrame, classes: pd.DataFrame,
                  launches: pd.DataFrame) -> pd.DataFrame:
    """``kernels`` with their attribution, classification and launch statistics (queue delay, ns)."""
    k = kernels.assign(**{c: attribution[c].to_numpy() for c in ("step", "phase", "module", "module_class", "op", "op_args",
                                                                  "op_call", "graph", "api_start_ns")},
                       **{c: classes[c].to_numpy() for c in ("family", "kernel_class", "evidence", "intensity", "ridge", "efficiency",
                                                             "config_key", "flop", "bytes", "math_path", "achieved_flop_per_s",
                                                             "achieved_bytes_per_s")})
    k["queue_delay_ns"] = launches["queue_delay_ns"].to_numpy()
    k["shorter_than_launch"] = launches["shorter_than_launch"].to_numpy()
    return k


def _measured_api(runtime_api: pd.DataFrame, steps: Steps, measured_ids: set) -> pd.DataFrame:
    """The API calls of the measured steps, with ``step``."""
    # API calls of the measured steps, once: the rules and the launch counts both read them
    return (in_measured_steps(runtime_api, runtime_api["start_ns"].to_numpy(dtype=float), steps.table, measured_ids)
            if not runtime_api.empty else runtime_api)


class _RuleInputs(NamedTuple):
    """What :func:`_rule_context` reads besides the fusion candidates and the measured steps."""
    status: dict | None
    dev: pd.Series
    compiled: dict


def _findings(k: pd.DataFrame, km: pd.DataFrame, detail_step: int | None, idle: pd.DataFrame, t: Tables,
              api_m: pd.DataFrame, steps: Steps, measured: pd.DataFrame, step_ns: float, device_peaks, ncu: pd.DataFrame,
              payloads: pd.Series, rule_inputs: _RuleInputs) -> dict:
    """report.json's recommendations, suppressed, fusion candidates (the op data flow of the detail
    step, else the kernel sequence), fusion saving per kernel, fusion note, host time per step (ns)
    and fusion source."""
    n, measured_ids = len(measured), set(measured["step"])
    detail = k[(k["step"] == detail_step) & (k["op"] != "")] if detail_step is not None else k.iloc[0:0]
    all_candidates = fusion_candidates(detail, device_peaks, top=None, op_payloads=payloads.tolist() if len(payloads) else None)
    fusion_source = "op_dataflow"
    if not all_candidates and not (k["op_call"] >= 0).any():  # no op ranges: the kernel sequence alone (lower confidence)
        all_candidates, fusion_source = kernel_sequence_candidates(km, device_peaks, n, top=None), "kernel_sequence"
    recommendations, suppressed = _recommendations(
        km, detail, idle, t.runtime_api, api_m, t.memcpy, steps, measured_ids, n, step_ns, device_peaks, ncu,
        _rule_context(rule_inputs.status, rule_inputs.dev, rule_inputs.compiled, all_candidates, measured_ids)
        | {"phase_host_ns": host_floor.phase_ranges_ns(t.nvtx, steps.table, measured_ids),
           "outside_modules": host_floor.outside_modules(t.nvtx, steps.table, measured_ids)}) if n else ([], [])
    host_ns = host_floor.host_ns_per_step(api_m) if n else None  # the step cannot get shorter than this
    host_floor.bound_by_host(recommendations, float(measured["step_time_ns"].median()) if n else 0.0, host_ns)
    candidates = all_candidates[:10]
    fusion_note = mark_host_bound(candidates, recommendations)
    return {"recommendations": overlaps.mark_overlaps(recommendations), "suppressed": suppressed,
            "fusion_candidates": candidates, "fusion_saving_by_kernel": saving_by_kernel(all_candidates),
            "fusion_note": fusion_note, "host_ns_per_step": host_ns, "fusion_source": fusion_source}


MIN_STEPS = 3  # issue 24: fewer steps than this give no median worth the name


def _few_steps(found: int) -> list[str]:
    """A warning, saying what to pass, when fewer than :data:`MIN_STEPS` steps were found."""
    if found >= MIN_STEPS:
        return []
    return [f"only {found} step{'s' if found != 1 else ''} found: per-step numbers need at least {MIN_STEPS}. "
            "Pass --steps-from forward (one step per call of the outermost model), generate (one per generate() "
            "call) or nvtx:REGEX (your own ranges), or call gpudiag.step() at the end of each step; a short script "
            "needs more steps of its own (e.g. its --epochs or --iters)"]


def _capture_warnings(meta: dict, status: dict | None) -> list[str]:
    """Warnings about the capture itself: tables missing from the export, rows dropped, a failed script."""
    warnings = []
    if meta.get("missing"):
        warnings.append("missing from the export: " + ", ".join(meta["missing"][:12]))
    warnings.extend(row_checks.warning_lines(meta.get("dropped_rows") or {}, meta.get("rows_read") or {}))
    if status and status.get("exit_code") not in (0, None):
        warnings.append(f"the script failed (exit code {status.get('exit_code')}): {status.get('exception') or 'see gpudiag.log'}; "
                        "this report covers what was captured until then")
    return warnings


def _header(meta: dict, status: dict | None, compiled: dict, device_peaks) -> dict:
    """report.json's first keys: versions, source, script status, compiled graphs, environment, device."""
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "gpudiag_version": __version__,
        "source": meta.get("source"),
        # the provenance can run to hundreds of KB: it stays in script_status.json
        # trials: the report's own section (gpudiag.trials.results.attach)
        "script": {k: v for k, v in status.items() if k not in ("inductor_provenance", "trials", "trials_left_out")}
        if status else None,
        "compiled": {**compiled, "dynamo": (status or {}).get("compile")} if compiled["graphs"] or (status or {}).get("compile") else None,
        "environment": {**meta.get("environment", {}),
                        **{k: (status or {}).get(k) for k in ("torch_version", "torch_cuda_version") if (status or {}).get(k)}},
        "device": {"name": device_peaks.name, "sm_count": device_peaks.sm_count,
                   "memory_bandwidth_bytes_per_s": device_peaks.bandwidth, "peak_flop_per_s": device_peaks.flops,
                   "peaks_source": device_peaks.source, "launch_overhead_ns": device_peaks.launch_overhead_ns}}


def _steps_section(steps: Steps, st: pd.DataFrame, detail_step: int | None, measured: pd.DataFrame,
                   per_step: list[dict]) -> dict:
    """report.json's ``steps``: where steps came from, counts, step-time statistics (ns), per step."""
    return {"source": steps.source, "kind": steps.kind, "count": int(len(st)), "warmup_steps": int(st["warmup"].sum()),
            "detail_step": detail_step, "measured": len(measured), "outliers": int(st["outlier"].sum()),
            "statistics": outliers.STEADY_STATE_RULE,
            "step_time_ns": step_stats.stats(measured["step_time_ns"].astype(float)),
            "step_time_ns_with_outliers": step_stats.stats(st.loc[st["measured"] | st["outlier"], "step_time_ns"].astype(float)),
            "per_step": per_step}


def _classification(meta: dict, ncu: pd.DataFrame, km: pd.DataFrame) -> dict:
    """report.json's ``classification``: method, ncu source and the measured kernel time's shares by
    evidence and by class."""
    return {"method": ("roofline: Nsight Compute measurements where profiled, else op shapes where recorded, "
                       "else kernel name heuristics"),
            "ncu_source": meta.get("ncu_source"),
            "ncu_kernels_profiled": int(len(ncu)),
            "evidence_share_percent": report_tables.shares(km, "evidence"),
            "class_share_of_kernel_time_percent": report_tables.shares(km, "kernel_class")}


def _kernel_tables(km: pd.DataFrame, n: int) -> dict:
    """report.json's operator classes, roofline points, the points furthest below their roof and
    the time per kernel family per measured step (ns)."""
    return {"operator_classes": report_tables.operator_classes(km) if n else [],
            "roofline_points": (points := report_tables.roofline_points(km, n)) if n else [],
            "below_roof": report_tables.below_roof(points if n else []),
            "families_ns_per_step": {f: float(v) / n for f, v in km.groupby("family")["duration_ns"].sum().items()} if n else {}}


def _idle_section(idle_m: pd.DataFrame, km: pd.DataFrame, stream_rows: list[dict], top_waits: list[dict], n: int) -> dict:
    """report.json's ``idle``: host-bound and other GPU-idle time per measured step (ns), stream
    gaps, short kernels, the median queue delay and the kernels waited for."""
    return {
        "host_bound_idle_ns_per_step": step_stats.per_step(idle_m.loc[idle_m["host_bound"], "duration_ns"], n),
        "other_idle_ns_per_step": step_stats.per_step(idle_m.loc[~idle_m["host_bound"], "duration_ns"], n),
        "streams": stream_rows,
        # what GD-INPUT-STALL measures, without its 10 % threshold: the ranks table compares ranks by it
        "step_start_idle_ns_per_step": step_stats.per_step(
            idle_m.loc[idle_m["host_bound"] & idle_m["at_step_start"], "duration_ns"], n),
        "kernels_shorter_than_launch_per_step": float(km["shorter_than_launch"].sum()) / n if n else None,
        "median_queue_delay_ns": report_tables.num(km["queue_delay_ns"].median()),
        "top_waiting_kernels": top_waits,
    }


def _ranks(db: sqlite_utils.Database, procs: pd.DataFrame, options: dict, status: dict | None,
           rank_workers: int | None) -> dict:
    """report.json's ``ranks``: every process of ``procs`` analysed on its own with ``options``."""
    db.conn.commit()
    path = ranks.database_file(db)
    reports = (ranks.analyse_processes(path, procs["global_pid"].tolist(), options, rank_workers) if path else {})
    return ranks.merged_view(procs, reports, status)


def _rule_context(status: dict | None, dev: pd.Series, compiled: dict, candidates: list[dict], measured_ids) -> dict:
    """The rules' context beyond the kernels: the launcher's per-step peak memory, cudnn.benchmark and
    autocast dtype, the GPU's memory, the compiled-graph summary, all fusion candidates and the
    bare run's inflation (profiled - bare median step time, ns; None without a bare run)."""
    status = status or {}
    bare = compare_bare({"script": status, "steps": {"per_step": [{"step": s, "measured": True} for s in measured_ids]}})
    return {"peak_memory_bytes": {int(s): int(v) for s, v in (status.get("peak_memory_bytes_per_step") or {}).items() if v},
            "device_memory_bytes": report_tables.num(dev.get("total_memory_bytes")),
            "cudnn_benchmark": status.get("cudnn_benchmark"), "autocast_dtype": status.get("autocast_dtype"),
            "compiled": {**compiled, "dynamo": status.get("compile")} if compiled["graphs"] else None,
            "candidates": candidates, "bare_inflation_ns": (bare or {}).get("inflation_ns"),
            "inference": rule_context(status), "distributed": distributed_context(status, measured_ids)}


def _recommendations(km, detail, idle, runtime_api, api, memcpy, steps, measured_ids, n, step_ns,
                     device_peaks, ncu, context: dict) -> tuple[list[dict], list[dict]]:
    """Build the rules' context (measured steps only; ``api``: the measured steps' API calls;
    ``context``: :func:`_rule_context`) and run them (:mod:`gpudiag.analysis.recommend`):
    (shown, suppressed under 0.5 % of the step)."""
    from gpudiag.analysis.recommend import RuleContext, recommend_split

    copies = (in_measured_steps(memcpy, launch_calls(memcpy, runtime_api)["api_start_ns"].to_numpy(dtype=float),
                                steps.table, measured_ids)
              if not memcpy.empty else memcpy.assign(step=pd.Series(dtype=int)))

    ctx = RuleContext(km=km, detail=detail, api=api, memcpy=copies, idle=idle[idle["step"].isin(measured_ids)],
                      n_steps=n, step_ns=step_ns, peaks=device_peaks, ncu=ncu, measured_steps=sorted(measured_ids),
                      **context)
    return recommend_split(ctx)

