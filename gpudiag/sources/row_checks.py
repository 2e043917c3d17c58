"""Data-quality accounting for the rows read from an export: timed rows whose timestamps cannot be
true are dropped and counted, never dropped silently and never a traceback.

A kernel, copy, memset, synchronization or API call needs a start and an end that are integers
(nanoseconds) with end ≥ start; nsys writes nothing else, so anything else is a damaged or edited
export. Timestamps are ns since the session's start, so a negative one is damage too (no committed
real export has one, and the analysis, which measures from time zero, mis-measures such rows: a
capture moved before zero showed -487 s of idle time per step). Each drop is counted per table
and reason; the analysis shows one warning line per table (``report.json`` ``warnings``; the
counts are in the run database's ``meta`` as ``dropped_rows``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpudiag.sources import int_keys
from gpudiag.sources import names as names_encoding

NOT_A_TIME = "NULL or non-numeric start/end"
END_BEFORE_START = "end before start"
OUT_OF_RANGE = "start/end beyond 2**53 ns"
DUPLICATES = "exact duplicate rows"
ZERO_DURATION = "zero duration (rows kept)"
NEGATIVE = "negative start/end (rows dropped)"
# float64 holds integers exactly up to 2**53 (104 days in ns); the analysis computes in float64
# in places, and no capture lasts that long, so a timestamp beyond it is damage, not data.
MAX_TIME_NS = 2**53


def valid_times(df: pd.DataFrame, table: str, dropped: dict[str, dict[str, int]],
                duration: bool = False, zero_is_odd: bool = False) -> pd.DataFrame:
    """``df`` without the rows whose ``start_ns``/``end_ns`` are not integers or run backwards;
    the timestamps become int64, and with ``duration`` a ``duration_ns`` column (end - start) is
    added. With ``zero_is_odd``, rows with end = start are kept but counted (no kernel takes 0 ns;
    a capture full of them is edited). Rows with a negative start or end (before the session's
    start; nsys writes none) are dropped like the other impossible ones. Counts go into
    ``dropped[table][reason]`` (a report warning each, :func:`warning_lines`). A frame without the
    two columns (a table missing from the export) is returned as is."""
    if not {"start_ns", "end_ns"} <= set(df.columns):
        return df
    start = pd.to_numeric(df["start_ns"], errors="coerce")
    end = pd.to_numeric(df["end_ns"], errors="coerce")
    # text that happens to parse as a float (e.g. '1.5e9') is not a timestamp nsys writes either; int64
    # columns (an export's, read without NULLs) hold neither (5 M kernels and 13.5 M calls: 0.3 s of modulo)
    not_time = (pd.Series(False, index=df.index) if start.dtype == end.dtype == np.int64 else
                start.isna() | end.isna() | (start % 1 != 0) | (end % 1 != 0))
    huge = ~not_time & ((start.abs() >= MAX_TIME_NS) | (end.abs() >= MAX_TIME_NS))
    backwards = ~not_time & ~huge & (end < start)
    negative = ~not_time & ~huge & ~backwards & (start < 0)  # end >= start: start is the earlier
    counts = {NOT_A_TIME: int(not_time.sum()), OUT_OF_RANGE: int(huge.sum()), END_BEFORE_START: int(backwards.sum()),
              NEGATIVE: int(negative.sum()),
              ZERO_DURATION: int((~not_time & (end == start)).sum()) if zero_is_odd else 0}
    counts = {reason: n for reason, n in counts.items() if n}
    if counts:
        dropped.setdefault(table, {}).update(counts)
    keep = ~(not_time | huge | backwards | negative)
    # a shallow copy when every row stays: filtering copies every column, text included (copy-on-write
    # keeps ``df`` unchanged by the assignments below)
    out = df[keep] if not keep.all() else df.copy(deep=False)
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


def integers(values: pd.Series) -> pd.Series:
    """``values`` as float64 numbers where they are integers within int64, NaN elsewhere (NULL,
    text such as ``'12 ns'``, bytes, 1.5, 1e300): ids, counts and sizes are integers in nsys. An
    int64 column (no NULL, no text) is returned as it is."""
    if values.dtype == "int64":  # what an INTEGER column without NULLs reads as: nothing to check
        return values
    out = pd.to_numeric(values, errors="coerce")
    return out.where((out % 1 == 0) & (out.abs() < 2**63))


def numeric(df: pd.DataFrame, table: str, columns: list[str], dropped: dict[str, dict[str, int]]) -> pd.DataFrame:
    """``df`` with ``columns`` (launch configuration, ids, sizes) made numeric: a value that is not
    an integer within int64 becomes NULL (the row stays: its timing is good) and is counted as repaired."""
    present = [c for c in columns if c in df.columns]
    if df.empty or not present:
        return df
    out = df.copy(deep=False)  # copy-on-write: the columns replaced below are the only ones copied
    repaired = 0
    for c in present:
        values = integers(out[c])
        repaired += int((values.isna() & out[c].notna()).sum())
        out[c] = values
    if repaired:
        dropped.setdefault(table, {})["non-numeric values set to NULL (rows kept)"] = repaired
    return out


def drop_duplicates(df: pd.DataFrame, table: str, dropped: dict[str, dict[str, int]]) -> pd.DataFrame:
    """``df`` without rows identical to an earlier one in every column (nsys records each kernel,
    copy or call once; rows sharing only a correlation id are kept: CUDA graph replays do that)."""
    if df.empty:
        return df
    dup = _duplicated(df)
    if dup.any():
        dropped.setdefault(table, {})[DUPLICATES] = int(dup.sum())
        return df[~dup].reset_index(drop=True)
    return df


def _duplicated(df: pd.DataFrame) -> pd.Series:
    """``df.duplicated(keep="first")``, hashing every column only for the rows that share their
    start with another row: rows identical in every column share it too, and a kernel table has
    almost none (hashing 1 M rows of 30 columns, text included, took 0.67 s; the start and end
    pair as a frame subset 0.40 s, the start column alone 0.03 s: docs/scale.md, issue 36)."""
    key = next((c for c in ("start_ns", "end_ns") if c in df.columns), None)
    if key is None:
        return df.duplicated(keep="first")
    # the shared starts without hashing 5 M of them (1.3 s): the export's kernels are in start order
    candidates = (pd.Series(int_keys.duplicated(df[key].to_numpy(), keep=False), index=df.index)
                  if df[key].dtype == np.int64 else df[key].duplicated(keep=False))
    dup = pd.Series(False, index=df.index)
    if candidates.any():
        dup[candidates] = df[candidates].duplicated(keep="first")
    return dup


NOT_TEXT = "values that are not text (rows kept)"


def as_text(values: pd.Series, table: str, dropped: dict[str, dict[str, int]]) -> pd.Series:
    """``values`` (a text column) with a BLOB or number where text belongs shown as text (bytes
    decoded as UTF-8, bad bytes as U+FFFD), counted as repaired; NULLs stay NULL."""
    if values.empty or pd.api.types.infer_dtype(values, skipna=True) in ("string", "empty"):
        return values  # the common case, decided in C without a per-value Python call
    not_text = values.map(lambda v: pd.notna(v) and not isinstance(v, str)).astype(bool)
    if not not_text.any():
        return values
    dropped.setdefault(table, {})[NOT_TEXT] = dropped.get(table, {}).get(NOT_TEXT, 0) + int(not_text.sum())
    return values.astype(object).where(~not_text, values[not_text].map(
        lambda v: v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)))


def id_lookup(ids: pd.Series, values: pd.Series, table: str, dropped: dict[str, dict[str, int]]) -> pd.Series:
    """A Series value-by-id from an id -> value table (``StringIds``, ``ENUM_*``): rows whose id is
    NULL or not an integer are left out, and of ids given twice the first row counts; both counted."""
    key = pd.to_numeric(ids, errors="coerce")
    bad = key.isna() | (key % 1 != 0) | (key.abs() >= 2**62)
    values = as_text(values, table, dropped)
    out = pd.Series(values[~bad].to_numpy(), index=key[~bad].astype("int64").to_numpy(), dtype=object)
    dup = out.index.duplicated(keep="first")
    counts = {"NULL or non-integer ids": int(bad.sum()), "duplicate ids (first kept)": int(dup.sum())}
    counts = {reason: n for reason, n in counts.items() if n}
    if counts:
        dropped.setdefault(table, {}).update(counts)
    return out[~dup]


def resolve_ids(ids: pd.Series, lookup: pd.Series, table: str, what: str, dropped: dict[str, dict[str, int]],
            placeholder: str | None = None) -> pd.Series:
    """``ids`` mapped through ``lookup`` (from :func:`id_lookup`), dictionary-encoded
    (:func:`gpudiag.sources.names.categorical`); ids that are set but absent from it resolve to NULL
    and are counted as ``what`` (e.g. "kernel names not in StringIds"). With ``placeholder``, a
    name that stays NULL becomes ``"<placeholder> (string id N)"``, so every kernel keeps a name the
    report can show and group by."""
    key = pd.to_numeric(ids, errors="coerce")
    key = key.where((key % 1 == 0) & (key.abs() < 2**62)).astype("Int64")
    # Looked up once per distinct id (a few thousand names for millions of rows); the rows keep
    # codes into those names (issue 36, part 1: names once, docs/scale.md).
    codes, distinct = pd.factorize(key)  # a NULL id gets code -1: the last value below
    names = pd.Series(distinct).map(lookup).to_numpy(dtype=object) if len(lookup) else np.full(len(distinct), None)
    missing = np.append(pd.isna(names), True)
    unknown = int((ids.notna().to_numpy() & missing[codes]).sum())
    if unknown:
        dropped.setdefault(table, {})[what] = unknown
    values = np.append(np.where(missing[:-1], None, names), None)
    if placeholder is not None:
        values = np.array([f"{placeholder} (string id {i})" if v is None else v for i, v in zip(distinct, values[:-1])]
                          + [placeholder], dtype=object)
    return names_encoding.categorical(values, codes, ids.index)


def required(df: pd.DataFrame, table: str, columns: list[str], dropped: dict[str, dict[str, int]]) -> pd.DataFrame:
    """``df`` without the rows whose value in any of ``columns`` is not an integer (NULL, text,
    bytes; see :func:`integers`), those columns made numeric. Without a thread or process id, or
    the correlation id that joins GPU work to its launch call, a row cannot be placed (in a
    process, a step), so it is dropped and counted. nsys writes these ids on every row (all
    committed real exports checked), so a row without one is damage. A column missing from the
    export counts as NULL on every row."""
    if df.empty:
        return df
    out = df.copy(deep=False)  # copy-on-write: the columns replaced below are the only ones copied
    for c in columns:
        out[c] = integers(out[c]) if c in out.columns else float("nan")
    bad = out[columns].isna().any(axis=1)
    if bad.any():
        dropped.setdefault(table, {})[f"NULL or non-integer {'/'.join(columns)} (rows dropped)"] = int(bad.sum())
        return out[~bad].reset_index(drop=True)
    return out


def unique_ids(df: pd.DataFrame, table: str, column: str, dropped: dict[str, dict[str, int]]) -> pd.DataFrame:
    """``df`` with one row per ``column`` value (the first; e.g. one ``TARGET_INFO_GPU`` row per
    device id), the others counted."""
    if df.empty or column not in df.columns:
        return df
    dup = df[column].duplicated(keep="first") & df[column].notna()
    if dup.any():
        dropped.setdefault(table, {})[f"duplicate {column} (first kept)"] = int(dup.sum())
        return df[~dup].reset_index(drop=True)
    return df
