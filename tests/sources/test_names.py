"""gpudiag.sources.names: kernel, API and NVTX names as codes into one dictionary (issue 36, part 1),
checked against SQLite's own join of the export's ids with StringIds."""

from __future__ import annotations

import sqlite3

import numpy as np
import pandas as pd
import sqlite_utils

from gpudiag import store
from gpudiag.analysis.ingest import ingest
from gpudiag.sources import names
from gpudiag.sources.nsys_sqlite import read_export


def _oracle(path, sql: str) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        return sorted(conn.execute(sql).fetchall(), key=repr)


def test_every_name_column_shares_one_sorted_dictionary_and_reads_as_the_export_text(export_path):
    """Each name column is dictionary-encoded with the same dtype; its categories are sorted (so
    ordering by a name orders by its text) and hold "" (the analysis fills NULLs with it); decoded,
    the rows give the text SQLite's join of the ids with StringIds gives."""
    path = export_path("input_pipeline_good")
    exp = read_export(path)
    dtypes = {exp.kernels["name"].dtype, exp.kernels["short_name"].dtype, exp.runtime_api["name"].dtype,
              exp.nvtx_ranges["text"].dtype}
    assert len(dtypes) == 1 and isinstance(next(iter(dtypes)), pd.CategoricalDtype)
    categories = list(next(iter(dtypes)).categories)
    assert categories == sorted(set(categories)) and "" in categories
    kernels = _oracle(path, "SELECT k.start, s.value, t.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                            "JOIN StringIds s ON s.id = k.demangledName JOIN StringIds t ON t.id = k.shortName")
    got = sorted(zip(exp.kernels["start_ns"].tolist(), exp.kernels["name"].tolist(), exp.kernels["short_name"].tolist()),
                 key=repr)
    assert got == kernels
    api = _oracle(path, "SELECT r.start, s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId")
    assert sorted(zip(exp.runtime_api["start_ns"].tolist(), exp.runtime_api["name"].tolist()), key=repr) == api
    nvtx = _oracle(path, "SELECT n.start, COALESCE(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN StringIds s "
                         "ON s.id = n.textId WHERE n.eventType IN (59, 60) AND n.end IS NOT NULL")
    assert sorted(zip(exp.nvtx_ranges["start_ns"].tolist(), exp.nvtx_ranges["text"].tolist()), key=repr) == nvtx
    # sorting by the codes is sorting by the text
    order = exp.kernels.sort_values("name", kind="stable")["name"].astype(object).tolist()
    assert order == sorted(order)


def test_the_run_database_stores_each_name_once(export_path, tmp_path):
    """The file's rows hold integer codes into ``names`` (one row per distinct text); the table's
    view gives the text; read back, they decode to the frames the analysis holds in memory."""
    db = ingest(export_path("input_pipeline_good"), tmp_path / "run.sqlite")
    conn = sqlite3.connect(tmp_path / "run.sqlite")
    stored = conn.execute("SELECT COUNT(*), COUNT(DISTINCT value) FROM names").fetchone()
    assert stored[0] == stored[1] > 1
    assert {r[0] for r in conn.execute("SELECT DISTINCT typeof(name) FROM kernels_coded")} == {"integer"}
    joined = conn.execute("SELECT n.value FROM kernels_coded k JOIN names n ON n.id = k.name ORDER BY k.rowid").fetchall()
    viewed = conn.execute("SELECT name FROM kernels").fetchall()
    assert joined == viewed
    assert [r[0] for r in viewed] == store.read_table(db, "kernels")["name"].astype(object).tolist()
    disk = store.read_table(sqlite_utils.Database(tmp_path / "run.sqlite"), "runtime_api")
    pd.testing.assert_series_equal(disk["name"], store.read_table(db, "runtime_api")["name"])


def test_resolved_names_keep_nulls_and_placeholders():
    """Codes of ids absent from StringIds are NULL (counted), a NULL id gets the placeholder, and
    filling NULLs from another column (short names from full names) keeps the codes."""
    from gpudiag.sources.row_checks import resolve_ids

    lookup = pd.Series(["b", "a", "b"], index=[1, 2, 3], dtype=object)  # two ids, one text
    dropped: dict = {}
    ids = pd.Series([1, 2, 3, 9, None, 1], dtype=object)
    out = resolve_ids(ids, lookup, "kernels", "unknown", dropped)
    assert out.tolist()[:3] == ["b", "a", "b"] and out.iloc[3:5].isna().all() and out.iloc[5] == "b"
    assert dropped == {"kernels": {"unknown": 1}}
    assert len(out.cat.categories) == 2  # "b" stored once although two ids name it
    named = resolve_ids(ids, lookup, "kernels", "unknown", {}, placeholder="unnamed")
    assert named.tolist() == ["b", "a", "b", "unnamed (string id 9)", "unnamed", "b"]
    filled = names.filled(out, named)
    assert isinstance(filled.dtype, pd.CategoricalDtype)
    assert filled.tolist() == named.tolist()


def test_encode_gives_frames_of_several_exports_one_dictionary():
    """Two exports' names, each with its own dictionary, share one after encode: concatenated, the
    column stays dictionary-encoded and every row keeps its text."""
    a = {"kernels": pd.DataFrame({"name": pd.Categorical(["x", "y", None]), "short_name": ["x", "y", "z"]})}
    b = {"kernels": pd.DataFrame({"name": ["w", "x"], "short_name": ["w", "x"]}),
         "runtime_api": pd.DataFrame({"name": ["cudaLaunchKernel", None]})}
    dtype = names.encode([a, b])
    assert list(dtype.categories) == ["", "cudaLaunchKernel", "w", "x", "y", "z"]
    both = pd.concat([a["kernels"], b["kernels"]], ignore_index=True)
    assert both["name"].dtype == dtype
    assert both["name"].tolist()[:2] == ["x", "y"] and pd.isna(both["name"].iloc[2])
    assert both["name"].tolist()[3:] == ["w", "x"]
    assert np.array_equal(b["runtime_api"]["name"].isna().to_numpy(), [False, True])


def test_spread_gives_each_row_its_ranges_text_with_sorted_categories():
    """Row i is values[index[i]] ("" or the given text where the index is -1), with the categories
    sorted so that ordering and grouping by the column follow the text, as a text column would."""
    values = np.array(["b.mlp", "a.attn", "b.mlp", "c"], dtype=object)
    index = np.array([2, -1, 1, 3, 0, -1])
    got = names.spread(values, index)
    assert list(got) == [values[i] if i >= 0 else "" for i in index]
    assert list(got.categories) == sorted(set(got.categories)) == ["", "a.attn", "b.mlp", "c"]
    other = names.spread(np.array(["x"], dtype=object), np.array([-1, 0]), "other")
    assert list(other) == ["other", "x"]
    rows = pd.DataFrame({"module": got, "ns": np.arange(6)})
    assert rows.groupby("module")["ns"].sum().to_dict() == \
        pd.DataFrame({"module": list(got), "ns": np.arange(6)}).groupby("module")["ns"].sum().to_dict()
