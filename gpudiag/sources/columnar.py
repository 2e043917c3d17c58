"""Reading SQLite query results into pandas fast, with the frames pandas itself would give.

``pandas.read_sql_query`` goes through Python's sqlite3 row by row: for an export of 1 M kernels
(2.7 M API calls) reading took a quarter of ``gpudiag report`` (docs/scale.md). connectorx reads
SQLite into columns in Rust, 3.4x less CPU on the same query. Its frames differ from pandas' in
types only (nullable Int64, object text), so :func:`as_read_back` gives them pandas' types, and
anything connectorx refuses (a value of the wrong type in a column, text that is not UTF-8, a
file it cannot open) is read by pandas as before: odd exports take the slow path and keep
pandas' handling of their odd rows.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
import warnings

import numpy as np
import pandas as pd

FAST_MIN_ROWS = 20_000  # below this pandas is as fast and connectorx's start-up is not worth it (measured)


def as_read_back(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the types ``pandas.read_sql_query`` gives the same values stored in SQLite:
    bools and nullable integers become int64 (float64 with NULLs), text becomes pandas' string
    dtype, all-NULL columns become object None, an empty frame has object columns. Columns already
    of those types are kept, not copied (a frame read back is read back again at no cost)."""
    if df.empty:
        return pd.DataFrame(columns=list(df.columns) or ["_empty"], dtype=object)
    changed = {}
    for c in df.columns:
        s = df[c]
        if s.dtype == np.int64:  # never NULL: as read back
            continue
        if s.dtype == bool:
            s = s.astype(np.int64)
        elif isinstance(s.dtype, pd.api.extensions.ExtensionDtype) and pd.api.types.is_integer_dtype(s.dtype):
            s = s.astype(np.float64 if s.isna().any() else np.int64)
        elif s.dtype == object:
            s = s.infer_objects()
        if s.dtype != object and s.isna().all():  # SQLite keeps no type for NULL: read back as None
            s = pd.Series([None] * len(s), index=s.index, dtype=object)
        if s is not df[c]:
            changed[c] = s
    out = df.copy(deep=False)  # copy-on-write: the caller's frame is never changed
    for c, s in changed.items():
        out[c] = s
    return out


def _database_file(conn: sqlite3.Connection) -> str | None:
    row = conn.execute("PRAGMA database_list").fetchone()
    return row[2] if row and row[2] else None


def read_sql(conn: sqlite3.Connection, sql: str, rows_hint: int | None = None) -> pd.DataFrame:
    """The result of ``sql`` on ``conn``'s database file, as ``pandas.read_sql_query(sql, conn)``
    gives it. Read by connectorx when installed, the connection is a file with default text
    handling and ``rows_hint`` (rows the query returns, or None if unknown) is at least
    :data:`FAST_MIN_ROWS`; else, or when connectorx refuses the data, by pandas. A connection
    whose ``fast_read`` is False (an export opened immutable, which connectorx would open as SQLite
    does, writing beside it) is read by pandas."""
    path = _database_file(conn)
    fast = getattr(conn, "fast_read", True) and conn.text_factory is str
    if path and fast and (rows_hint is None or rows_hint >= FAST_MIN_ROWS):
        try:
            import connectorx
        except ImportError:
            connectorx = None
        if connectorx is not None:
            try:
                with warnings.catch_warnings():  # connectorx 0.4.6 builds frames with a pandas call pandas 4 drops
                    warnings.simplefilter("ignore", category=FutureWarning)
                    warnings.simplefilter("ignore", category=DeprecationWarning)
                    frame = connectorx.read_sql("sqlite://" + urllib.parse.quote(path), sql)
                return as_read_back(frame)
            except BaseException as exc:  # refused (odd types, bad UTF-8; a Rust panic is a BaseException)
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
    return pd.read_sql_query(sql, conn)
