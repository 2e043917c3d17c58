"""The fast paths of issue 25's third pass (docs/scale.md), each against the plain pandas it
replaced, on real exports (some edited with SQL): values looked up once per distinct value, exact
duplicates looked for among rows sharing their timestamps, names resolved once per string id, and
the kernels' launch calls reused for the GPU activities."""

from __future__ import annotations

import re
import shutil
import sqlite3

import numpy as np
import pandas as pd
import pytest

from gpudiag.analysis.attribution.families import families, family_of, per_distinct
from gpudiag.analysis.attribution.ranges import launch_calls
from gpudiag.analysis.steps.timeline import gpu_activities
from gpudiag.sources import row_checks
from gpudiag.sources.nsys_sqlite import read_export


@pytest.fixture(scope="module")
def gpt2(export_path):
    """The GPT-2 training capture (7,215 kernels, 148 copies, 646 memsets), read as gpudiag reads it."""
    return read_export(export_path("gpt2_train_bf16"))


def _nulls_and_a_counted_fn(names: pd.Series) -> tuple[pd.Series, list, object]:
    """``names`` with every 97th row NULL; fn (a name's length modulo 7) and the list of the names it was called with."""
    names = names.copy()
    names.iloc[::97] = None
    calls = []

    def fn(name):
        calls.append(name)
        return len(name) % 7

    return names, calls, fn


def test_per_distinct_equals_a_call_per_row(gpt2):
    """Every kernel name, with NULLs put in: the result per row is fn(row), NULL rows get na_value,
    and fn runs once per distinct name."""
    names, calls, fn = _nulls_and_a_counted_fn(gpt2.kernels["name"].astype(object))
    got = per_distinct(names, fn, na_value=-1, dtype=np.int64)
    expected = np.array([-1 if v is None else len(v) % 7 for v in names], dtype=np.int64)
    assert np.array_equal(got, expected)
    assert sorted(calls) == sorted(names.dropna().unique())
    assert (got == -1).sum() == names.isna().sum() > 0


def test_per_distinct_on_codes_equals_a_call_per_row(gpt2):
    """The dictionary-encoded names as read (the run's one dictionary holds API and NVTX names too, which
    no kernel uses), NULLs put in: the same result per row as the text gives, fn called once per name the
    rows use and never for a name they do not."""
    names, calls, fn = _nulls_and_a_counted_fn(gpt2.kernels["name"])
    assert isinstance(names.dtype, pd.CategoricalDtype)
    got = per_distinct(names, fn, na_value=-1, dtype=np.int64)
    assert np.array_equal(got, per_distinct(names.astype(object), lambda n: len(n) % 7, na_value=-1, dtype=np.int64))
    assert sorted(calls) == sorted(names.dropna().unique())
    assert len(names.cat.categories) > len(calls) and (got == -1).sum() == names.isna().sum() > 0


def test_families_equal_the_pattern_per_name(gpt2):
    names = gpt2.kernels["name"]
    got = families(names)
    assert got.index.equals(names.index)
    assert got.tolist() == [family_of(n) for n in names]


def _duplicate_rows(path):
    """Edits the export: the first 20 kernels written again (exact duplicates), and 30 kernels given
    another kernel's start and end (same timestamps, not duplicates). Returns nothing: the counts
    are the edit's."""
    con = sqlite3.connect(path)
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL "
                "ORDER BY start LIMIT 20")
    first = con.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start LIMIT 1").fetchone()
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = ?, end = ? WHERE rowid IN "
                "(SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start DESC LIMIT 30)", first)
    con.commit()
    con.close()


def test_exact_duplicates_equal_pandas_on_every_column(export_path, tmp_path):
    path = tmp_path / "dup.sqlite"
    shutil.copy(export_path("gpt2_train_bf16"), path)
    _duplicate_rows(path)
    raw = pd.read_sql("SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL", sqlite3.connect(path))
    raw = raw.rename(columns={"start": "start_ns", "end": "end_ns"})
    dropped: dict = {}
    kept = row_checks.drop_duplicates(raw, "kernels", dropped)
    oracle = raw[~raw.duplicated(keep="first")].reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, oracle)
    assert dropped == {"kernels": {row_checks.DUPLICATES: 20}}
    # the 30 rows that share only their timestamps stay
    assert (kept["start_ns"] == kept["start_ns"].min()).sum() == 1 + 30


def test_names_resolve_as_a_lookup_per_row(export_path, tmp_path):
    """Kernel name ids of the export, some made NULL, some pointing at no string: each row's name
    is the StringIds value of its id (oracle: a dict lookup per row), NULL where there is none,
    and the ids missing from StringIds are counted."""
    con = sqlite3.connect(export_path("gpt2_train_bf16"))
    ids = pd.read_sql("SELECT demangledName AS id FROM CUPTI_ACTIVITY_KIND_KERNEL", con)["id"].astype(object)
    strings = dict(con.execute("SELECT id, value FROM StringIds").fetchall())
    ids.iloc[::50] = None
    ids.iloc[1::40] = 10**9  # no such string
    lookup = pd.Series(list(strings.values()), index=list(strings.keys()), dtype=object)
    dropped: dict = {}
    got = row_checks.resolve_ids(ids, lookup, "kernels", "names not in StringIds", dropped)
    expected = [None if v is None else strings.get(int(v)) for v in ids]
    assert got.astype(object).where(got.notna(), None).tolist() == expected  # dictionary-encoded: NULL as None
    assert dropped["kernels"]["names not in StringIds"] == sum(v is not None and int(v) not in strings for v in ids)


def test_activities_with_the_kernels_calls_equal_a_join_of_every_row(gpt2):
    """gpu_activities given the kernels' launch calls (as the attribution holds them) equals the
    join of every kernel, copy and memset with its call."""
    kernels = gpt2.kernels.assign(kernel_id=np.arange(len(gpt2.kernels)))
    plain = gpu_activities(kernels, gpt2.memcpy, gpt2.memset, gpt2.runtime_api)
    reused = gpu_activities(kernels, gpt2.memcpy, gpt2.memset, gpt2.runtime_api,
                            launch_calls(kernels, gpt2.runtime_api)[["api_start_ns", "api_end_ns", "api_tid"]])
    pd.testing.assert_frame_equal(reused, plain)
    copies = plain[plain["kind"] != "kernel"]
    assert len(copies) == len(gpt2.memcpy) + len(gpt2.memset) > 0
    assert copies["api_start_ns"].notna().all()  # the copies' own calls were looked up


def test_integer_and_float_correlation_ids_join_the_same_calls(gpt2):
    """launch_calls' integer fast path (numpy isin) and its general path (float ids, as a table with
    NULL ids reads) pick the same launch call for every kernel."""
    kernels = gpt2.kernels
    as_float = kernels.assign(correlation_id=kernels["correlation_id"].astype(float))
    pd.testing.assert_frame_equal(launch_calls(kernels, gpt2.runtime_api), launch_calls(as_float, gpt2.runtime_api))
    assert launch_calls(kernels, gpt2.runtime_api)["api_name"].str.match(re.compile("cu(da)?Launch|cudaGraphLaunch")).mean() > 0.99
