"""Replicate an nsys SQLite export in time: a long capture made from a short real one.

The scale benchmark (benchmarks/scale.py) and the tests build exports of millions of kernels this
way. Every time-stamped table is copied ``copies - 1`` more times, each copy shifted by one
*period* (the export's whole time span plus a gap), with the ids that must stay unique offset per
copy: ``correlationId`` (API calls join their GPU work on it), NVTX ``rangeId`` and the kernels'
``gridId``. Everything else (string ids, threads, processes, devices, streams) stays as it is, so
each copy is the original run again, later in the same process: its steps, kernels and NVTX ranges
are the original's, and per-step numbers of any copy equal the original's.

It is done in SQL inside SQLite (``INSERT ... SELECT`` over a table of copy numbers), so 5 M
kernels with their API calls and NVTX rows take about a minute on one core.
"""

from __future__ import annotations

import lzma
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

TIME_COLUMNS = ("start", "end", "timestamp")  # ns columns shifted per copy (nsys export schema)
ID_COLUMNS = ("correlationId", "rangeId", "gridId")  # ids offset per copy to stay unique
# correlationId is one sequence per process shared by the CUPTI tables, so one offset serves all.
GAP_NS = 1_000_000_000  # idle time between copies (ours: one second keeps copies apart on every clock)


@dataclass
class Replica:
    """What :func:`replicate_export` built: ``period_ns`` between copies, rows per table after."""

    path: Path
    copies: int
    period_ns: int
    rows: dict[str, int]


def _copy_source(source: Path, target: Path) -> None:
    if source.suffix == ".xz":
        with lzma.open(source) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    else:
        shutil.copyfile(source, target)


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]


def timed_tables(conn: sqlite3.Connection) -> dict[str, list[str]]:
    """Tables with a time column (``start``, ``end`` or ``timestamp``) -> their columns.
    ``ANALYSIS_DETAILS`` (one row: the capture's duration) is updated, not copied."""
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
    out = {}
    for name in names:
        cols = _columns(conn, name)
        if name != "ANALYSIS_DETAILS" and set(cols) & set(TIME_COLUMNS):
            out[name] = cols
    return out


def _bounds(conn: sqlite3.Connection, tables: dict[str, list[str]], columns: tuple[str, ...]) -> tuple[int, int]:
    """(min, max) over ``columns`` of every table in ``tables`` that has them."""
    lows, highs = [], []
    for table, cols in tables.items():
        for c in (c for c in columns if c in cols):
            lo, hi = conn.execute(f'SELECT MIN("{c}"), MAX("{c}") FROM "{table}"').fetchone()
            if lo is not None:
                lows.append(int(lo))
                highs.append(int(hi))
    return (min(lows), max(highs)) if lows else (0, 0)


def replicate_export(source: Path, target: Path, copies: int, gap_ns: int = GAP_NS) -> Replica:
    """Write to ``target`` the export ``source`` (``.sqlite`` or ``.sqlite.xz``) with its
    time-stamped rows repeated ``copies`` times (the original first), copy *k* shifted by
    ``k * period_ns`` (period = the export's time span + ``gap_ns``, ns) and its
    ``correlationId``/``rangeId``/``gridId`` offset by ``k`` times (the largest id + 1).
    ``target`` is replaced. Raises ValueError for ``copies`` < 1 and sqlite3.DatabaseError for a
    file that is not SQLite."""
    if copies < 1:
        raise ValueError(f"copies must be at least 1, not {copies}")
    target.unlink(missing_ok=True)
    _copy_source(source, target)
    conn = sqlite3.connect(target)
    try:
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        tables = timed_tables(conn)
        low, high = _bounds(conn, tables, TIME_COLUMNS)
        period = high - low + gap_ns
        id_step = {c: _bounds(conn, tables, (c,))[1] + 1 for c in ID_COLUMNS}
        conn.execute("CREATE TEMP TABLE copy_number (k INTEGER PRIMARY KEY)")
        conn.executemany("INSERT INTO copy_number VALUES (?)", [(k,) for k in range(1, copies)])
        rows = {}
        for table, cols in tables.items():
            n0 = conn.execute(f'SELECT MAX(rowid) FROM "{table}"').fetchone()[0] or 0
            exprs = [f'"{c}" + k * {period}' if c in TIME_COLUMNS else
                     f'"{c}" + k * {id_step[c]}' if c in ID_COLUMNS else f'"{c}"' for c in cols]
            col_list = ", ".join(f'"{c}"' for c in cols)
            # Copy by copy in rowid order, so each copy's rows keep the original's order.
            conn.execute(f'INSERT INTO "{table}" ({col_list}) SELECT {", ".join(exprs)} '
                         f'FROM copy_number CROSS JOIN "{table}" WHERE "{table}".rowid <= {n0} '
                         f'ORDER BY k, "{table}".rowid')
            rows[table] = conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0]
        if "ANALYSIS_DETAILS" in {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}:
            cols = _columns(conn, "ANALYSIS_DETAILS")
            if {"duration", "stopTime"} <= set(cols):
                extra = (copies - 1) * period
                conn.execute(f"UPDATE ANALYSIS_DETAILS SET duration = duration + {extra}, stopTime = stopTime + {extra}")
        conn.commit()
    finally:
        conn.close()
    return Replica(path=target, copies=copies, period_ns=period, rows=rows)
