"""The analysis of one run, stage by stage: open this module first.

``analyse`` reads a run database (made by :func:`gpudiag.analysis.ingest.ingest` from an nsys
export), writes the attribution and classification back to it, and returns a JSON-able dict
(``report.json``'s content, documented in docs/architecture.md). Statistics are over *measured*
steps: not warm-up, not the detail step (whose per-op ranges slow it down; its extra time is the
instrumentation overhead the report shows).

The stages, in the order ``analyse`` runs them; each is a subpackage of ``gpudiag.analysis`` and
imports only the stages above it (tests/test_layout.py holds the order):

1. ``ingest``: export -> run database -> the frames of one process;
2. ``attribution``: steps, and every kernel to its step, phase, module and aten op;
3. ``roofline``: device peaks, op costs, each kernel compute-, bandwidth- or overhead-bound;
4. ``steps``: the step table, GPU idle, per-step statistics, outlier steps, the bare run;
5. ``ranks``: collectives of this process, and every process of the export side by side;
6. ``fusion``: groups of op calls one fused kernel could replace;
7. ``rules``: the recommendations, one module per rule family, assembled by ``rules.registry``;
8. ``report``: report.json's sections, the findings, the bare-run corrections, the invariants.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import sqlite_utils

from gpudiag import store
from gpudiag.analysis.attribution.compiled import attribute_compiled, measured_summary
from gpudiag.analysis.attribution.families import COMMUNICATION, families
from gpudiag.analysis.attribution.ranges import Steps, attribute, find_steps, op_call_payloads
from gpudiag.analysis.ingest import Tables, read_tables
from gpudiag.analysis.ranks import comm, engine, processes
from gpudiag.analysis.findings import invariants, sections, tables
from gpudiag.analysis.findings.bare_run import apply_bare_run
from gpudiag.analysis.findings.recommendations import FindingsInput, RuleInputs, findings
from gpudiag.analysis.roofline import peaks
from gpudiag.analysis.roofline.classify import classify
from gpudiag.analysis.steps import frames, host_work, outliers, step_stats
from gpudiag.script_status import ScriptStatus
from gpudiag.analysis.steps.launches import kept_rows, launch_counts
from gpudiag.analysis.steps.serving import apply_requests
from gpudiag.analysis.steps.timeline import idle_intervals, launch_stats, stream_gaps


def analyse(db: sqlite_utils.Database, warmup_steps: int = 2, steps_from: str | None = None,
            status: ScriptStatus | dict | None = None, top: int = 20, calibration: dict | None = None,
            process: int | None = None, rank_workers: int | None = None,
            ranks_engine: engine.RankEngine | None = None) -> dict:
    """Analyse the run database ``db``; returns report.json's content (see module docstring).

    Writes ``kernel_attribution``, ``kernel_class`` and ``steps`` tables back into ``db``.
    Raises :class:`AnalysisError` when the export has no kernels or ``steps_from`` is an invalid
    regular expression (or ``process``, a ``global_pid``, launched no kernel). ``process`` restricts
    the analysis to that process. Without it, an export of several processes is reported for the
    one with the most kernel time (with a warning), and report.json's ``ranks`` compares every
    process, each analysed where ``ranks_engine`` says (:mod:`gpudiag.analysis.ranks.engine`: Dask,
    a local cluster or a scheduler's), without it in a pool of ``rank_workers`` processes
    (:mod:`gpudiag.analysis.ranks.processes`); raises :class:`gpudiag.analysis.ranks.engine.EngineError`
    when the engine asked for cannot be used. ``calibration`` (a ``gpudiag calibrate`` entry of the same GPU)
    replaces datasheet peaks with measured ones. ``status``: the launcher's status (a dict is read
    with :meth:`ScriptStatus.from_json`, raising :class:`gpudiag.errors.UserError` when it is none)."""
    status = ScriptStatus.of(status)
    meta = store.read_meta(db)
    warnings: list[str] = []
    # 1. ingest: the run database's frames, of one process
    loaded = _load(db, meta, warnings)
    t, procs = processes.one_process(loaded, process, warnings)
    # the collectives' transfer parts, paired across every rank: stored for the ranks' own analyses
    paired = loaded.kernels.loc[loaded.kernels["transfer_ns"].notna(), ["kernel_id", "transfer_ns"]] if procs is not None else None
    del loaded
    launcher_status, status = status, processes.status_of_process(status, t.kernels["global_pid"])
    dev = peaks.main_device(t.kernels, t.devices, warnings)
    # 2. attribution
    steps: Steps = frames.named_source(find_steps(t.nvtx, t.kernels, steps_from, t.runtime_api), status)
    if steps.kind == "whole":
        warmup_steps = 0  # the ranks below are analysed with it too
        warnings.append("no step ranges found: the whole capture is treated as one step")
    payloads, attribution, compiled = _attribute(t, steps, status, warnings)
    # 3. roofline
    device_peaks = peaks.device_peaks(dev, calibration, warnings)
    ncu = store.read_table(db, "ncu_kernels")
    classes = classify(t.kernels, attribution, device_peaks, ncu if not ncu.empty else None)
    # 4. steps
    s = _step_frames(t, steps, attribution, classes, status, warmup_steps, warnings)
    store.write_table(db, "kernel_attribution", attribution)
    store.write_table(db, "kernel_class", classes)
    store.write_table(db, "steps", s.st)
    compiled = measured_summary(compiled, t.kernels, attribution, s.measured_ids, status)
    # 5-7. ranks (this process's collectives), fusion and rules: the findings
    found, api_m = findings(FindingsInput(s.k, s.km, s.detail_step, s.idle_m, t, steps, s.measured, s.step_ns,
                                          device_peaks, ncu, payloads, RuleInputs(status, dev, compiled, s.stretches_m)))
    warnings.extend(sections.capture_warnings(meta, status))
    warnings.extend(sections.few_steps(len(s.st)))
    # 8. report
    summary, step_tables = _step_sections(t, steps, s, api_m, meta, ncu, top, status)
    del api_m
    report = invariants.check(apply_requests(apply_bare_run({
        **sections.header(meta, status, compiled, device_peaks), **summary, **found, **step_tables,
        "warnings": warnings})))
    collectives = processes.host_collectives_warning(status, report.get("communication"))
    if collectives:
        report["warnings"].append(collectives)
    store.flush(db)  # the tables written in the background (ingest's, then the three above) are in the file
    # 5. ranks: every process analysed on its own
    if procs is not None:  # every process analysed on its own (the main one again: a plain function of the file)
        options = {"warmup_steps": warmup_steps, "steps_from": steps_from, "status": launcher_status, "top": top,
                   "calibration": calibration}
        store.write_table(db, comm.TRANSFER_TABLE, paired)
        report["ranks"] = _ranks(db, procs, options, launcher_status,
                                 ranks_engine or engine.RankEngine(workers=rank_workers, dask=False))
    return report


@dataclass
class StepFrames:
    """The steps stage's frames (times in ns): ``st`` the step table with its flags, ``measured``
    its measured steps (``n`` of them, numbers ``measured_ids``, mean step ``step_ns``), ``k`` every
    kernel with its attribution, class and launch delay, ``km`` those of measured steps,
    ``activities`` kernels, copies and memsets (start_ns, end_ns, kind, step), ``idle`` GPU-idle intervals
    (``idle_m``: in measured steps; each split into launch-bound and host-compute time),
    ``stretches_m`` the measured steps' host-compute stretches (:mod:`~gpudiag.analysis.steps.host_work`),
    ``per_step`` report.json's per-step entries, ``gaps`` the stream gaps and ``detail_step`` (None
    without one). The measured steps' API calls are made later, by the findings (after the kernel
    sequence search, whose peak they would add to)."""
    st: pd.DataFrame
    measured: pd.DataFrame
    n: int
    measured_ids: set
    step_ns: float
    k: pd.DataFrame
    km: pd.DataFrame
    activities: pd.DataFrame
    idle: pd.DataFrame
    idle_m: pd.DataFrame
    per_step: list[dict]
    gaps: pd.DataFrame
    detail_step: int | None
    stretches_m: pd.DataFrame


def _step_frames(t: Tables, steps: Steps, attribution: pd.DataFrame, classes: pd.DataFrame, status: ScriptStatus | None,
                 warmup_steps: int, warnings: list[str]) -> StepFrames:
    """Stage 4: the step table, GPU activities and idle per step, the kernel frame, the per-step
    entries (:class:`StepFrames`)."""
    detail_step = frames.detail_step(status, attribution)
    activities = frames.activities(t, steps, attribution)
    st = frames.step_frame(steps, activities, warmup_steps, detail_step, warnings)
    idle = idle_intervals(activities)
    # later readers (the classes per step, the outlier steps) read four of its columns: the launch
    # calls' and the ids go before the stage's peak (5 M kernels: 0.31 GB, docs/scale.md)
    activities = activities[["start_ns", "end_ns", "kind", "step"]]
    gaps = stream_gaps(t.kernels, attribution)
    launches = launch_stats(t.kernels, attribution)
    measured = st[st["measured"]]
    n = len(measured)
    measured_ids = set(measured["step"])
    k = frames.kernel_frame(t.kernels, attribution, classes, launches)
    km = kept_rows(k, k["step"].isin(measured_ids).to_numpy())
    idle = step_stats.mark_step_start(step_stats.idle_steps(idle, measured), km)
    idle, stretches = host_work.split_host_idle(idle, t.runtime_api, t.nvtx)  # launch-bound vs host compute
    idle_m = kept_rows(idle, idle["step"].isin(measured_ids).to_numpy())  # shared, not copied, where all are measured
    per_step = step_stats.per_step_entries(st, step_stats.class_ns_per_step(km, activities, measured_ids), idle_m)
    step_ns = float(measured["step_time_ns"].mean()) if n else float("nan")
    return StepFrames(st, measured, n, measured_ids, step_ns, k, km, activities, idle, idle_m, per_step, gaps,
                      detail_step, stretches[stretches["step"].isin(measured_ids)])


def _step_sections(t: Tables, steps: Steps, s: StepFrames, api_m: pd.DataFrame, meta: dict, ncu: pd.DataFrame,
                   top: int, status: ScriptStatus | None) -> tuple[dict, dict]:
    """Stage 8, the measured steps' sections of report.json, in its order: (the summary: steps,
    breakdown, classification, top kernels; the tables after the findings: kernel and module tables,
    idle, instrumentation, launches, communication). ``api_m``: the measured steps' API calls."""
    n, km = s.n, s.km
    breakdown, breakdown_percent = step_stats.breakdown(s.per_step, s.step_ns)
    split, split_percent = step_stats.overhead_split(s.per_step, s.step_ns)
    incl, modules = tables.modules(km, t.nvtx, n, s.step_ns)
    phases = (km.groupby("phase")["duration_ns"].sum() / n).to_dict() if n else {}
    busy, total = float(s.measured["busy_ns"].sum()), float(s.measured["step_time_ns"].sum())
    return {
        "steps": sections.steps_section(steps, s.st, s.detail_step, s.measured, s.per_step,
                                        frames.micro_batches(status, steps, s.measured_ids)),
        # None when every measured window is empty (timestamps moved in a damaged export): no share of nothing
        "gpu_busy_percent": 100.0 * busy / total if n and total > 0 else None,
        "outlier_steps": outliers.outlier_report(s.st, s.activities, s.idle, t.runtime_api, steps.table, s.k),
        "breakdown_ns_per_step": breakdown,
        "breakdown_percent": breakdown_percent,
        "overhead_split_ns_per_step": split,  # the breakdown's overhead = launch-bound + host compute
        "overhead_split_percent": split_percent,
        "classification": sections.classification(meta, ncu, km),
        "phases_ns_per_step": {p: float(v) for p, v in phases.items()},
        "top_kernels": tables.top_kernels(km, top, n),
    }, {
        **sections.kernel_tables(km, n),
        "modules": modules,
        "per_step_metrics": step_stats.per_step_metrics(km, s.measured, s.per_step, incl, modules,
                                                        (status.peak_memory_bytes_per_step if status else None) or {}) if n else [],
        "idle": sections.idle_section(s.idle_m, km, tables.stream_rows(s.gaps, s.k, s.measured_ids, n),
                                      tables.top_waiting_kernels(s.idle_m, s.k, n), n, s.stretches_m),
        "instrumentation": tables.instrumentation(s.st, s.measured, t.nvtx, s.detail_step, n),
        "launches_per_step": launch_counts(km, api_m, n),
        "communication": comm.communication(s.k, s.measured_ids, n, s.step_ns) if n else None,
    }


def _load(db: sqlite_utils.Database, meta: dict, warnings: list[str]) -> Tables:
    """The run database's frames (:func:`gpudiag.analysis.ingest.read_tables`), each collective
    kernel with its transfer part (``transfer_ns``): paired across the ranks here, or read from
    :data:`comm.TRANSFER_TABLE` where an analysis of every rank stored them (a rank's own analysis,
    whose copy of the run database holds its own kernels only)."""
    t = read_tables(db, meta, warnings)
    stored = store.read_table(db, comm.TRANSFER_TABLE)
    if not stored.empty:
        t.kernels["transfer_ns"] = t.kernels["kernel_id"].map(stored.set_index("kernel_id")["transfer_ns"]).astype(float)
        return t
    # before one process is kept: a collective's transfer part needs every rank's kernels (comm module doc)
    t.kernels["transfer_ns"] = comm.peer_transfer_ns(t.kernels, (families(t.kernels["name"]) == COMMUNICATION).to_numpy())
    return t


def _attribute(t: Tables, steps: Steps, status: ScriptStatus | None, warnings: list[str]) -> tuple[pd.Series, pd.DataFrame, dict]:
    """(op call payloads, attribution, compiled-graph summary): per kernel (rows of ``t.kernels``)
    its step, phase, module, op and graph (:func:`attribute`), kernels of compiled graphs
    attributed through the inductor provenance (:func:`attribute_compiled`)."""
    payloads = op_call_payloads(t.nvtx)  # once: attribution and the fusion data flow both read them
    attribution = attribute(t.kernels, t.runtime_api, t.nvtx, steps, payloads)
    attribution, compiled = attribute_compiled(t.kernels, attribution, t.nvtx, status.inductor_provenance if status else None)
    warnings.extend(compiled["warnings"] if compiled["graphs"] else [])
    return payloads, attribution, compiled


def _ranks(db: sqlite_utils.Database, procs: pd.DataFrame, options: dict, status: ScriptStatus | None,
           ranks_engine: engine.RankEngine) -> dict:
    """report.json's ``ranks``: every process of ``procs`` analysed on its own with ``options``,
    where ``ranks_engine`` says (workers read the run database's file: it is committed first)."""
    db.conn.commit()
    path = processes.database_file(db)
    # analyse is passed in: the ranks stage never imports the pipeline (no import cycle)
    reports = engine.analyse_ranks(path, procs["global_pid"].tolist(), options, ranks_engine, analyse) if path else {}
    return processes.merged_view(procs, reports, status)
