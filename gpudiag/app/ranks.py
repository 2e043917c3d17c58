"""What the terminal says about the ranks of a job: which engine analysed them, and whether the
exports given as the ranks of one job can be that (their captures must overlap in time and run
the same command)."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from pathlib import Path

from gpudiag.app.options import AnalysisOptions
from gpudiag.errors import UserError

# The tables whose last event ends a capture's span (nanoseconds from the session's start).
SPAN_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")


def engine_note(options: AnalysisOptions, ranks: int) -> str | None:
    """One line naming where the per-rank analyses of ``ranks`` processes ran, as
    :func:`gpudiag.analysis.ranks.engine.analyse_ranks` chooses it: the ``--scheduler`` cluster, a
    local Dask cluster (its worker count), a local process pool, or in this process. None for a
    single process (no per-rank analysis to speak of)."""
    if ranks <= 1:
        return None
    from gpudiag.analysis.ranks import engine

    if options.scheduler:
        return f"ranks: {ranks} analysed on the Dask cluster at {options.scheduler}"
    settings = engine.RankEngine(dask=options.dask, **({"worker_memory": options.worker_memory}
                                                       if options.worker_memory else {}))
    if options.dask and engine.dask_installed():
        workers = engine.local_workers(ranks, settings)
        return f"ranks: {ranks} analysed on a local Dask cluster ({workers} worker{'s' if workers > 1 else ''})"
    return f"ranks: {ranks} analysed in a local process pool" + (
        "" if options.dask is False else f" (Dask is not installed: {engine.INSTALL})")


def capture_identity(export: Path) -> dict:
    """What tells one capture from another, read from an (uncompressed) nsys SQLite export:
    ``start_ns`` (the session's start, ns since the UTC epoch, or None), ``span_ns`` (its last
    kernel, runtime call or NVTX range's end, ns after the start; 0 when it has none) and
    ``command`` (the profiled command and its arguments, or None). Unreadable parts are None:
    the ingest, not this check, reports a damaged file."""
    out: dict = {"start_ns": None, "span_ns": 0, "command": None}
    try:
        conn = sqlite3.connect(f"file:{export}?mode=ro", uri=True)
    except sqlite3.Error:
        return out
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "TARGET_INFO_SESSION_START_TIME" in tables:
            row = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
            out["start_ns"] = int(row[0]) if row and row[0] is not None else None
        ends = [conn.execute(f'SELECT max("end") FROM {t}').fetchone()[0] for t in SPAN_TABLES if t in tables]
        out["span_ns"] = max((int(e) for e in ends if e is not None), default=0)
        if "META_DATA_CAPTURE" in tables:
            args = conn.execute("SELECT name, value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_0:%' "
                                "AND (name LIKE '%:COMMAND' OR name LIKE '%:ARGUMENT_%') ORDER BY rowid").fetchall()
            out["command"] = " ".join(v for _, v in args) or None
    except (sqlite3.Error, TypeError, ValueError):
        pass
    finally:
        conn.close()
    return out


def job_mismatches(exports: list[Path], names: list[Path] | None = None) -> list[str]:
    """Warnings, one line each, when ``exports`` (given as the ranks of one job; ``names``: how to
    call them, e.g. the user's files of decompressed copies) cannot be one job: two captures that
    do not overlap in time (ranks of one job run together), or that ran different commands.
    Empty when they agree, or when the exports do not record what is compared."""
    names = names or exports
    ids = [capture_identity(e) for e in exports]
    warnings = []
    timed = [(n, i) for n, i in zip(names, ids) if i["start_ns"] is not None]
    for (name_a, a), (name_b, b) in zip(timed, timed[1:]):
        if a["start_ns"] + a["span_ns"] < b["start_ns"] or b["start_ns"] + b["span_ns"] < a["start_ns"]:
            warnings.append(f"{name_a.name} ({_utc(a['start_ns'])}) and {name_b.name} ({_utc(b['start_ns'])}): "
                            "captures that do not overlap in time cannot be ranks of one job; the cross-rank "
                            "comparison (straggler, waits) compares unrelated runs")
            break
    commands = {i["command"] for i in ids if i["command"]}
    if len(commands) > 1:
        warnings.append(f"the exports ran {len(commands)} different commands (e.g. {sorted(commands)[0]!r}): "
                        "they may not be ranks of one job")
    return warnings


def _utc(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def rank0_has(name: str, value):
    """``value`` as rank 0 of a torchrun job has it (:func:`gpudiag.capture.rank_hook.as_rank0_has`),
    ``value`` itself elsewhere. Raises UserError (exit 3) when rank 0 stopped answering."""
    from gpudiag.capture.rank_hook import as_rank0_has

    try:
        return as_rank0_has(name, value)
    except TimeoutError as exc:
        raise UserError(f"{exc}: see rank 0's gpudiag.log", exit_code=3) from None
