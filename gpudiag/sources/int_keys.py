"""Duplicates and lookups of int64 keys (timestamps in ns, correlation ids, kernel ids) without a hash table.

pandas answers ``duplicated`` and ``Index.get_indexer`` by hashing every key. At millions of keys the
hash table outgrows the CPU caches: 5 M int64 keys took 1.35 s to hash against 0.006 s to check that
they are in order and compare neighbours, and 0.12 s for a stable argsort of keys in order but for a
tenth of them (this project's CPU machine, 2026-11-27; docs/scale.md, issue 36). An export's columns
are mostly in order already (kernels by start, API calls by correlation id, as in the GPT-2 capture
that tests/sources/test_int_keys.py reads), so the functions below compare neighbours where the keys
are sorted, sort them (stably) where they are not, and give pandas' answer in either case (the same
tests check them against pandas).
"""

from __future__ import annotations

import numpy as np


def is_sorted(values: np.ndarray) -> bool:
    """Whether ``values`` (1-D) never decrease: a stable sort would leave them as they are."""
    return bool(len(values) < 2 or np.all(values[1:] >= values[:-1]))


def duplicated(values: np.ndarray, keep: str | bool = "first") -> np.ndarray:
    """``pd.Series(values).duplicated(keep=keep)`` for int64 ``values`` (n,), as a bool array (n,):
    ``keep="first"`` marks each repeat after a value's first occurrence, ``keep=False`` every
    occurrence of a value that repeats. Raises ValueError for another ``keep``."""
    if keep not in ("first", False):
        raise ValueError(f"keep={keep!r}: 'first' or False")
    n = len(values)
    if n < 2:
        return np.zeros(n, dtype=bool)
    order = None if is_sorted(values) else np.argsort(values, kind="stable")  # stable: a first occurrence stays first
    ordered = values if order is None else values[order]
    same = ordered[1:] == ordered[:-1]  # same[i]: ordered element i + 1 repeats element i
    marked = np.zeros(n, dtype=bool)
    marked[1:] = same
    if keep is False:
        marked[:-1] |= same
    if order is None:
        return marked
    out = np.empty(n, dtype=bool)
    out[order] = marked
    return out


def positions(ids: np.ndarray, queries: np.ndarray) -> np.ndarray | None:
    """``pd.Index(ids).get_indexer(queries)`` (the position in ``ids`` of each query, -1 where it is not
    there or is NaN) for unique int64 ``ids`` (n,) that run without a gap (``ids[i] == ids[0] + i``, as
    kernel ids of one export do), by arithmetic; ``queries`` (m,) may be float with NaN. None where
    ``ids`` do not run without a gap: the caller hashes them."""
    n = len(ids)
    if n == 0 or int(ids[-1]) - int(ids[0]) != n - 1 or not bool(np.all(ids[1:] > ids[:-1])):
        return None
    q = np.asarray(queries)
    q = q if q.dtype.kind == "i" else q.astype(np.float64)
    at = np.full(len(q), -1, dtype=np.int64)
    offset = q - ids[0]
    inside = (offset >= 0) & (offset < n)
    if q.dtype.kind == "f":  # a float query is an id only where it is a whole number (get_indexer: equality)
        inside &= offset == np.floor(offset)
    at[inside] = offset[inside].astype(np.int64)
    return at
