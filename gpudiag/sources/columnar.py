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

import os
import sqlite3
import sys
import urllib.parse
import warnings
from concurrent.futures import ThreadPoolExecutor

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
            s = pd.Series(np.full(len(s), None, dtype=object), index=s.index)
        if s is not df[c]:
            changed[c] = s
    out = df.copy(deep=False)  # copy-on-write: the caller's frame is never changed
    for c, s in changed.items():
        out[c] = s
    return out


def _database_file(conn: sqlite3.Connection) -> str | None:
    row = conn.execute("PRAGMA database_list").fetchone()
    return row[2] if row and row[2] else None


def _fast_path(conn: sqlite3.Connection, rows_hint: int | None) -> str | None:
    """The database file connectorx may read for ``conn`` (None where pandas reads: see :func:`read_sql`)."""
    path = _database_file(conn)
    fast = getattr(conn, "fast_read", True) and conn.text_factory is str and not _FORKED_AFTER_CONNECTORX
    return path if path and fast and (rows_hint is None or rows_hint >= FAST_MIN_ROWS) else None


def _connectorx_read(path: str, sql: str) -> pd.DataFrame:
    """``sql`` on the file ``path`` read by connectorx, with pandas' types; raises whatever it
    raises (ImportError without it; a Rust panic is a BaseException)."""
    import connectorx

    return as_read_back(connectorx.read_sql("sqlite://" + urllib.parse.quote(path), sql))


# connectorx 0.4.6 builds frames with a pandas call pandas 4 drops: not the user's concern. A filter
# for its module, set once: warnings.catch_warnings is not thread-safe and the reads run in threads.
for _category in (FutureWarning, DeprecationWarning):
    warnings.filterwarnings("ignore", category=_category, module="connectorx")


# Reads started ahead (prefetch), per connection: connectorx reads in Rust with the GIL released,
# so on 2 cores a large table is read while this thread checks the rows of the one before.
_READER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpudiag-read")
_PREFETCHED: dict[int, dict] = {}  # id of a connection -> {sql: Future}; emptied by forget_prefetched


def _reader_after_fork() -> None:
    """A forked child (mutmut forks one per mutant, after the tests ran in the parent) has none of
    its parent's threads: the executor copied from the parent would queue reads that no thread runs
    (they waited forever), and connectorx, once loaded, crashes there (its Rust threads are gone too:
    segmentation fault). The child gets an executor of its own, none of the parent's reads, and
    reads with pandas where the parent had loaded connectorx."""
    global _READER, _FORKED_AFTER_CONNECTORX
    _READER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpudiag-read")
    _PREFETCHED.clear()
    _FORKED_AFTER_CONNECTORX = _FORKED_AFTER_CONNECTORX or "connectorx" in sys.modules


_FORKED_AFTER_CONNECTORX = False  # set in a child forked after connectorx was loaded: pandas reads there
os.register_at_fork(after_in_child=_reader_after_fork)


def prefetch(conn: sqlite3.Connection, sql: str, rows_hint: int | None = None) -> None:
    """Start reading ``sql`` in another thread where :func:`read_sql` would read it with connectorx;
    the next ``read_sql(conn, sql)`` takes the result (or, if that read failed, reads as it always
    does). Call :func:`forget_prefetched` when ``conn`` is done with."""
    path = _fast_path(conn, rows_hint)
    if path is not None:
        _PREFETCHED.setdefault(id(conn), {})[sql] = _READER.submit(_connectorx_read, path, sql)


def forget_prefetched(conn: sqlite3.Connection) -> None:
    """Drop the reads started for ``conn`` and not taken (after an error), waiting for them to end."""
    for future in _PREFETCHED.pop(id(conn), {}).values():
        future.cancel() or future.exception()


def read_sql(conn: sqlite3.Connection, sql: str, rows_hint: int | None = None) -> pd.DataFrame:
    """The result of ``sql`` on ``conn``'s database file, as ``pandas.read_sql_query(sql, conn)``
    gives it. Read by connectorx when installed, the connection is a file with default text
    handling and ``rows_hint`` (rows the query returns, or None if unknown) is at least
    :data:`FAST_MIN_ROWS` (or taken from a :func:`prefetch` of the same query); else, or when
    connectorx refuses the data, by pandas. A connection whose ``fast_read`` is False (an export
    opened immutable, which connectorx would open as SQLite does, writing beside it) is read by pandas."""
    future = _PREFETCHED.get(id(conn), {}).pop(sql, None)
    path = _fast_path(conn, rows_hint)
    if future is not None or path is not None:
        try:
            return future.result() if future is not None else _connectorx_read(path, sql)
        except BaseException as exc:  # refused (odd types, bad UTF-8; a Rust panic is a BaseException)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
    return pd.read_sql_query(sql, conn)
