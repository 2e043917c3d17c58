"""Data-quality accounting for the rows read from an export: timed rows whose timestamps cannot be
true are dropped and counted, never dropped silently and never a traceback.

A kernel, copy, memset, synchronization or API call needs a start and an end that are integers
(nanoseconds) with end ≥ start; nsys writes nothing else, so anything else is a damaged or edited
export. Each drop is counted per table and reason; the analysis shows one warning line per table
(``report.json`` ``warnings``; the counts are in the run database's ``meta`` as ``dropped_rows``).
"""

from __future__ import annotations

import pandas as pd

NOT_A_TIME = "NULL or non-numeric start/end"
END_BEFORE_START = "end before start"


def valid_times(df: pd.DataFrame, table: str, dropped: dict[str, dict[str, int]],
                duration: bool = False) -> pd.DataFrame:
    """``df`` without the rows whose ``start_ns``/``end_ns`` are not integers or run backwards;
    the timestamps become int64, and with ``duration`` a ``duration_ns`` column (end - start) is
    added. Counts go into ``dropped[table][reason]``. A frame without the two columns (a table
    missing from the export) is returned as is."""
    if not {"start_ns", "end_ns"} <= set(df.columns):
        return df
    start = pd.to_numeric(df["start_ns"], errors="coerce")
    end = pd.to_numeric(df["end_ns"], errors="coerce")
    # text that happens to parse as a float (e.g. '1.5e9') is not a timestamp nsys writes either
    not_time = start.isna() | end.isna() | (start % 1 != 0) | (end % 1 != 0)
    backwards = ~not_time & (end < start)
    counts = {NOT_A_TIME: int(not_time.sum()), END_BEFORE_START: int(backwards.sum())}
    counts = {reason: n for reason, n in counts.items() if n}
    if counts:
        dropped[table] = counts
    keep = ~(not_time | backwards)
    out = df[keep].copy()
    out["start_ns"] = start[keep].astype("int64")
    out["end_ns"] = end[keep].astype("int64")
    if duration:
        out["duration_ns"] = out["end_ns"] - out["start_ns"]
    return out.reset_index(drop=True)


def warning_lines(dropped: dict[str, dict[str, int]], totals: dict[str, int]) -> list[str]:
    """One warning per table with odd rows: ``kernels: odd rows in the export (NULL or non-numeric
    start/end: 12, of 3400 rows); ...``; ``totals`` are the rows read before dropping."""
    lines = []
    for table, reasons in dropped.items():
        detail = ", ".join(f"{reason}: {count}" for reason, count in reasons.items())
        lines.append(f"{table}: odd rows in the export ({detail}, of {totals.get(table, '?')} rows); "
                     "dropped rows are left out of every number")
    return lines


def numeric(df: pd.DataFrame, table: str, columns: list[str], dropped: dict[str, dict[str, int]]) -> pd.DataFrame:
    """``df`` with ``columns`` (launch configuration, ids, sizes) made numeric: a value that is not
    a number becomes NULL (the row stays: its timing is good) and is counted as repaired."""
    present = [c for c in columns if c in df.columns]
    if df.empty or not present:
        return df
    out = df.copy()
    repaired = 0
    for c in present:
        values = pd.to_numeric(out[c], errors="coerce")
        repaired += int((values.isna() & out[c].notna()).sum())
        out[c] = values
    if repaired:
        dropped.setdefault(table, {})["non-numeric values set to NULL (rows kept)"] = repaired
    return out
