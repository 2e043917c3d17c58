"""The measured rows as slices (issue 36): ``kept_rows`` and ``rows_at`` give the frame that pandas' row
filter gives (rows, index labels, dtypes), sharing the rows where they are one block, and the caller's
changes to the result never reach the frame it came from (copy-on-write)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudiag.analysis.steps.launches import kept_rows, rows_at


def _frame(n: int) -> pd.DataFrame:
    return pd.DataFrame({"start_ns": np.arange(n, dtype=np.int64) * 10, "name": pd.Categorical([f"k{i % 3}" for i in range(n)]),
                         "x": np.linspace(0.0, 1.0, n)}, index=pd.RangeIndex(n) + 5)


masks = st.integers(0, 40).flatmap(lambda n: st.one_of(
    st.lists(st.booleans(), min_size=n, max_size=n),
    st.tuples(st.integers(0, n), st.integers(0, n)).map(lambda ab: [min(ab) <= i < max(ab) for i in range(n)])))


@settings(max_examples=300, deadline=None)
@given(keep=masks)
def test_kept_rows_is_the_row_filter(keep):
    df = _frame(len(keep))
    mask = np.array(keep, dtype=bool)
    got = kept_rows(df, mask)
    pd.testing.assert_frame_equal(got, df[mask])
    got["x"] = -1.0  # the caller's column change stays its own
    pd.testing.assert_frame_equal(df, _frame(len(keep)))


@settings(max_examples=300, deadline=None)
@given(keep=masks, shuffle=st.booleans())
def test_rows_at_is_iloc(keep, shuffle):
    df = _frame(len(keep))
    positions = np.flatnonzero(np.array(keep, dtype=bool))
    if shuffle:
        positions = positions[::-1]
    pd.testing.assert_frame_equal(rows_at(df, positions), df.iloc[positions])


def test_one_block_is_a_slice_of_the_same_rows():
    """A block of consecutive rows (the measured steps' API calls of a plain export) is a slice: its
    values are the frame's own memory, not a copy."""
    df = _frame(1000)
    keep = np.zeros(1000, dtype=bool)
    keep[3:997] = True
    for got in (kept_rows(df, keep), rows_at(df, np.flatnonzero(keep))):
        assert np.shares_memory(got["start_ns"].to_numpy(), df["start_ns"].to_numpy())
    keep[500] = False  # two blocks: a copy
    assert not np.shares_memory(kept_rows(df, keep)["start_ns"].to_numpy(), df["start_ns"].to_numpy())
