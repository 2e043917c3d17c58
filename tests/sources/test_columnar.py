"""The fast paths of reading (connectorx) and of the run database kept in memory give exactly the
frames the slow paths give (pandas over sqlite3): same columns, types, values and odd-row counts."""

from __future__ import annotations

import shutil
import sqlite3

import numpy as np
import pandas as pd
import pytest
import sqlite_utils

from gpudiag import store
from gpudiag.analysis.ingest import UNREAD_COLUMNS, ingest
from gpudiag.sources import columnar, names
from gpudiag.sources.nsys_sqlite import read_export

FRAMES = ("kernels", "runtime_api", "memcpy", "memset", "sync", "nvtx_ranges", "devices")
pytest.importorskip("connectorx")


def _read(path, monkeypatch, fast: bool):
    monkeypatch.setattr(columnar, "FAST_MIN_ROWS", 0 if fast else 10 ** 18)
    return read_export(path)


def _same(a, b) -> None:
    for name in FRAMES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), obj=name)
    assert (a.dropped, a.missing, a.rows_read) == (b.dropped, b.missing, b.rows_read)


@pytest.mark.parametrize("name", ["gpt2_train_bf16", "input_pipeline_good", "tiny_gemm_gelu", "zoo_bert_compile"])
def test_connectorx_reads_what_pandas_reads(export_path, monkeypatch, name):
    path = export_path(name)
    _same(_read(path, monkeypatch, fast=True), _read(path, monkeypatch, fast=False))


def test_odd_values_fall_back_to_pandas_and_are_counted_the_same(export_path, monkeypatch, tmp_path):
    """Text in an integer column, a real in a timestamp, non-UTF-8 text: connectorx refuses them,
    pandas reads them, the row checks count the same odd rows."""
    path = tmp_path / "odd.sqlite"
    shutil.copy(export_path("tiny_gemm_gelu"), path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridX = 'abc' WHERE rowid = 2")
        conn.execute('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = 1.5 WHERE rowid = 3')
        conn.execute("UPDATE StringIds SET value = CAST(X'6B65726E656CFFFE' AS TEXT) WHERE id = "
                     "(SELECT nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1)")
    fast, slow = _read(path, monkeypatch, fast=True), _read(path, monkeypatch, fast=False)
    _same(fast, slow)
    assert fast.dropped["kernels"] and "text" in fast.dropped


def test_run_database_in_memory_equals_the_file(export_path, tmp_path):
    """analyse reads the frames ingest kept (less the columns it never reads); they equal what
    reading the written file gives, and a reader of every column gets them all."""
    db = ingest(export_path("input_pipeline_good"), tmp_path / "run.sqlite")
    disk = sqlite_utils.Database(tmp_path / "run.sqlite")
    for name in FRAMES:
        unread = list(UNREAD_COLUMNS.get(name, ()))
        pd.testing.assert_frame_equal(store.read_table(db, name, without=tuple(unread)),
                                      store.read_table(disk, name).drop(columns=unread), obj=name)
        pd.testing.assert_frame_equal(store.read_table(db, name), store.read_table(disk, name), obj=name)
    assert set(UNREAD_COLUMNS["kernels"]) <= set(store.read_table(disk, "kernels").columns)
    assert store.read_table(db, "kernels") is not store.read_table(db, "kernels")  # callers get their own frame


def test_run_database_written_in_slices_equals_one_write(export_path, tmp_path, monkeypatch):
    """write_table hands pandas slices of rows (bounded memory); the tables, their declared
    column types and each value's SQLite type equal one to_sql call over the whole frame (the
    oracle; names as their codes), also where a column's first slice holds only NULLs."""
    monkeypatch.setattr(store, "ROWS_PER_WRITE", 7)
    exp = read_export(export_path("input_pipeline_good"))
    odd = pd.DataFrame({"n": [None] * 7 + [1, 2], "t": [None] * 7 + ["x", "y"], "f": [float("nan")] * 8 + [1.5]})
    frames = {"kernels": exp.kernels, "nvtx_ranges": exp.nvtx_ranges, "odd": odd}
    sliced = sqlite_utils.Database(tmp_path / "sliced.sqlite")
    whole = sqlite3.connect(tmp_path / "whole.sqlite")
    for name, df in frames.items():
        store.write_table(sliced, name, df)
        # names stored as their codes, in the coded table (the name is a view of it)
        table = names.coded_table(name) if names.is_coded(df, name) else name
        names.as_codes(df, name).to_sql(table, whole, index=False)
        assert len(df) > 7
        schema = 'SELECT sql FROM sqlite_master WHERE name = ?'
        assert sliced.conn.execute(schema, [table]).fetchone() == whole.execute(schema, [table]).fetchone()
        typed = f'SELECT {", ".join(f"typeof({c!r}), {c!r}".replace(chr(39), chr(34)) for c in df.columns)} FROM "{table}"'
        assert sliced.conn.execute(typed).fetchall() == whole.execute(typed).fetchall(), name


def test_a_frame_read_back_is_kept_as_it_is(export_path, tmp_path):
    """as_read_back of frames pandas read from the run database file changes nothing and copies no
    column (the export's tables are not held twice in memory); an odd frame is converted without
    changing the caller's frame."""
    ingest(export_path("input_pipeline_good"), tmp_path / "run.sqlite")
    disk = sqlite_utils.Database(tmp_path / "run.sqlite")
    for name in FRAMES:
        read = pd.read_sql_query(f'SELECT * FROM "{name}"', disk.conn)
        again = columnar.as_read_back(read)
        pd.testing.assert_frame_equal(again, read, obj=name)
        for c in read.columns:
            if read[c].dtype.kind in "if":
                assert np.shares_memory(again[c].to_numpy(), read[c].to_numpy()), (name, c)
    odd = pd.DataFrame({"flag": [True, False], "n": pd.array([1, None], dtype="Int64"), "none": [None, None]})
    before = odd.copy()
    out = columnar.as_read_back(odd)
    assert [str(t) for t in out.dtypes] == ["int64", "float64", "object"]
    pd.testing.assert_frame_equal(odd, before)


@pytest.mark.parametrize("name", ["gpt2_train_bf16", "zoo_bert_compile"])
def test_tables_read_ahead_in_other_threads_equal_those_read_in_turn(export_path, monkeypatch, name):
    """The large tables read ahead by other threads (columnar.prefetch) give the frames, dropped-row
    counts and missing columns that reading them in turn gives; no read is left behind."""
    from gpudiag.sources import nsys_sqlite

    path = export_path(name)
    ahead = _read(path, monkeypatch, fast=True)
    assert not columnar._PREFETCHED
    monkeypatch.setattr(nsys_sqlite, "PREFETCHED", ())
    _same(ahead, _read(path, monkeypatch, fast=True))


def test_a_read_ahead_that_fails_is_read_by_pandas_and_dropped_after_an_error(export_path, monkeypatch, tmp_path):
    """A prefetched query connectorx refuses is read by pandas as before; reads started for an export
    whose reading then fails are dropped with it."""
    path = tmp_path / "odd.sqlite"
    shutil.copy(export_path("tiny_gemm_gelu"), path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = 'x' WHERE rowid = 5")
    fast, slow = _read(path, monkeypatch, fast=True), _read(path, monkeypatch, fast=False)
    _same(fast, slow)
    assert fast.dropped["runtime_api"]
    from gpudiag.sources import nsys_sqlite

    monkeypatch.setattr(nsys_sqlite, "_environment", lambda conn, tables: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        _read(path, monkeypatch, fast=True)
    assert not columnar._PREFETCHED


def _read_kernel_count(path, queue) -> None:
    queue.put(len(read_export(path).kernels))


def test_a_forked_child_reads_ahead_too(export_path, monkeypatch):
    """After this process read an export ahead in other threads, a child forked from it (mutmut
    forks one per mutant; multiprocessing forks on Linux) reads an export too: threads do not
    survive a fork, and a read left to the parent's executor would wait forever."""
    import multiprocessing

    monkeypatch.setattr(columnar, "FAST_MIN_ROWS", 0)
    path = export_path("tiny_gemm_gelu")
    with sqlite3.connect(path) as conn:
        n = conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert len(read_export(path).kernels) == n  # the executor's threads are started here
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_kernel_count, args=(path, queue))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        child.join()
    assert child.exitcode == 0
    assert queue.get(timeout=5) == n
