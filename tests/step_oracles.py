"""Oracles shared by the step-statistics tests, written from the run database's own rows."""

from __future__ import annotations

import pandas as pd


def copies_by_step(conn, steps: pd.DataFrame) -> dict[int, float]:
    """ns of copies and memsets per step, each in the step whose host range holds its launch call.

    ``conn``: a connection to a run database; ``steps``: its ``steps`` table (``step``,
    ``cpu_start_ns``, ``cpu_end_ns``). Interval arithmetic in Python, independent of the analysis.
    """
    rows = conn.execute(
        "SELECT r.start_ns, c.duration_ns FROM (SELECT correlation_id, global_pid, duration_ns FROM memcpy"
        " UNION ALL SELECT correlation_id, global_pid, duration_ns FROM memset) c"
        " JOIN runtime_api r ON r.correlation_id = c.correlation_id AND r.global_pid = c.global_pid").fetchall()
    out: dict[int, float] = {}
    for api_start, duration in rows:
        for s in steps.itertuples():
            if s.cpu_start_ns <= api_start < s.cpu_end_ns:
                out[int(s.step)] = out.get(int(s.step), 0.0) + duration
    return out
