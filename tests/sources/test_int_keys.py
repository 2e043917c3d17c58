"""gpudiag.sources.int_keys against pandas, its oracle: the same marks and positions for keys in order,
out of order, repeated, negative and (queries) NaN, and for the real capture's kernel starts and
launch calls' correlation ids."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudiag.sources import int_keys
from gpudiag.sources.nsys_sqlite import read_export

keys = st.lists(st.integers(min_value=-2**62, max_value=2**62) | st.integers(min_value=-3, max_value=3), max_size=60)


@settings(max_examples=300, deadline=None)
@given(values=keys, sort=st.booleans())
def test_duplicated_is_pandas_duplicated(values, sort):
    a = np.array(sorted(values) if sort else values, dtype=np.int64)
    for keep in ("first", False):
        assert int_keys.duplicated(a, keep=keep).tolist() == pd.Series(a, dtype="int64").duplicated(keep=keep).tolist()


def test_duplicated_refuses_keep_last():
    with pytest.raises(ValueError, match="keep"):
        int_keys.duplicated(np.array([1, 1], dtype=np.int64), keep="last")


@settings(max_examples=300, deadline=None)
@given(first=st.integers(min_value=-10, max_value=10**12), n=st.integers(min_value=0, max_value=40),
       queries=st.lists(st.integers(min_value=-15, max_value=60) | st.just(None), max_size=40),
       shift=st.integers(min_value=0, max_value=10**12), as_float=st.booleans())
def test_positions_is_get_indexer(first, n, queries, shift, as_float):
    ids = np.arange(first, first + n, dtype=np.int64)
    q = np.array([np.nan if v is None else v + (shift if n and v is not None and v > 50 else first) for v in queries],
                 dtype=np.float64)
    if not as_float:
        if np.isnan(q).any():
            q = q[~np.isnan(q)]
        q = q.astype(np.int64)
    expected = pd.Index(ids).get_indexer(q) if n else np.full(len(q), -1)
    got = int_keys.positions(ids, q)
    if n == 0:
        assert got is None
    else:
        assert got.tolist() == list(expected)


def test_positions_of_a_fraction_is_not_an_id():
    ids = np.arange(5, dtype=np.int64)
    assert int_keys.positions(ids, np.array([1.5, 2.0, -0.5, 4.0, 5.0])).tolist() == [-1, 2, -1, 4, -1]


@pytest.mark.parametrize("ids", [[0, 2, 3], [3, 2, 1], [0, 1, 1], [5, 7]])
def test_positions_leaves_ids_with_a_gap_to_the_caller(ids):
    assert int_keys.positions(np.array(ids, dtype=np.int64), np.array([0.0, 1.0])) is None


def test_real_capture_keys_in_order_and_marks_as_pandas(export_path):
    """The fast path is taken on a real capture: its kernels come in start order and its runtime calls
    in correlation-id order (nsys 2025.x, H100), and the marks equal pandas' there."""
    export = read_export(export_path("gpt2_train_bf16"))
    starts = export.kernels["start_ns"].to_numpy()
    corr = export.runtime_api["correlation_id"].dropna().to_numpy(np.int64)
    assert int_keys.is_sorted(starts) and int_keys.is_sorted(corr)
    for values in (starts, corr, np.concatenate([corr, corr[::7]])):
        for keep in ("first", False):
            assert (int_keys.duplicated(values, keep=keep) == pd.Series(values).duplicated(keep=keep).to_numpy()).all()
