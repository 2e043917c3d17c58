"""The run database written through Arrow and the ADBC SQLite driver (issue 25, part 1) holds what
pandas' ``to_sql`` writes: the same tables, declared column types, values and SQLite storage classes,
checked table by table on real captures against a run database written with ``to_sql`` alone."""

from __future__ import annotations

import gc
import os
import sqlite3
import weakref

import numpy as np
import pandas as pd
import pytest
import sqlite_utils

from gpudiag import store
from gpudiag.analysis.ingest import UNREAD_COLUMNS, ingest
from gpudiag.analysis.pipeline import analyse

pytest.importorskip("adbc_driver_sqlite")


def _contents(path) -> dict:
    """table -> (CREATE statement, every row with each value's storage class), in rowid order."""
    conn = sqlite3.connect(path)
    out = {}
    for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name"):
        cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{name}")')]
        typed = ", ".join(f'"{c}", typeof("{c}")' for c in cols)
        out[name] = (sql, conn.execute(f'SELECT {typed} FROM "{name}" ORDER BY rowid').fetchall())
    conn.close()
    return out


@pytest.mark.parametrize("name", ["gpt2_train_bf16", "input_pipeline_bad", "towers_inference"])
def test_arrow_writes_what_to_sql_writes(name, export_path, tmp_path, monkeypatch):
    bulk = ingest(export_path(name), tmp_path / "bulk.sqlite")
    analyse(bulk)
    with monkeypatch.context() as m:
        m.setattr(store, "_bulk_append", lambda db, table, df: False)
        plain = ingest(export_path(name), tmp_path / "plain.sqlite")
        analyse(plain)
    bulk.conn.commit()
    plain.conn.commit()
    got, want = _contents(tmp_path / "bulk.sqlite"), _contents(tmp_path / "plain.sqlite")
    assert got.keys() == want.keys() and {"kernels_coded", "names", store.PARQUET_TABLE, "steps"} <= set(got)
    for table in want:
        assert got[table][0] == want[table][0], table
        assert len(got[table][1]) == len(want[table][1]), table
        assert got[table][1] == want[table][1], table


def test_bulk_write_is_used_for_a_file_and_not_for_memory(tmp_path):
    df = pd.DataFrame({"a": [1, 2, None], "b": ["x", None, "z"], "c": [True, False, True]})
    on_file = sqlite_utils.Database(tmp_path / "f.sqlite")
    on_file.conn.execute(pd.io.sql.get_schema(df, "t", con=on_file.conn))
    assert store._bulk_append(on_file, "t", df)
    assert on_file.conn.execute("SELECT a, typeof(a), b, c, typeof(c) FROM t").fetchall() == \
        [(1.0, "real", "x", 1, "integer"), (2.0, "real", None, 0, "integer"), (None, "null", "z", 1, "integer")]
    in_memory = sqlite_utils.Database(memory=True)
    in_memory.conn.execute(pd.io.sql.get_schema(df, "t", con=in_memory.conn))
    assert not store._bulk_append(in_memory, "t", df)


def test_a_column_arrow_cannot_type_falls_back_to_to_sql_with_nothing_half_written(tmp_path):
    """Mixed Python objects in one column (text in a number column of an odd export) go through
    ``to_sql``, which stores each value as it is; the Arrow attempt leaves no rows behind."""
    n = store.ROWS_PER_WRITE + 5
    values = [1] * (n - 1) + ["text"]  # the odd value is in the second slice
    df = pd.DataFrame({"v": pd.Series(values, dtype=object), "i": range(n)})
    db = sqlite_utils.Database(tmp_path / "m.sqlite")
    store.write_table(db, "t", df)
    db.conn.commit()
    assert db.conn.execute("SELECT count(*), count(DISTINCT i) FROM t").fetchone() == (n, n)
    assert db.conn.execute("SELECT v, typeof(v) FROM t WHERE i = ?", (n - 1,)).fetchone() == ("text", "text")


# ---- the run database written in the background (docs/scale.md: 2 cores, 1 M and 5 M kernels) ------

@pytest.mark.parametrize("name", ["gpt2_train_bf16", "input_pipeline_bad"])
def test_a_background_write_gives_the_same_file_and_report(name, export_path, tmp_path):
    """The tables written by the writer thread while the analysis runs: the same file (tables,
    declared types, values, storage classes) and the same report as written in line."""
    back = ingest(export_path(name), tmp_path / "back.sqlite", background=True)
    report_back = analyse(back)
    line = ingest(export_path(name), tmp_path / "line.sqlite")
    report_line = analyse(line)
    back.conn.commit()
    line.conn.commit()
    got, want = _contents(tmp_path / "back.sqlite"), _contents(tmp_path / "line.sqlite")
    assert got == want and {"kernels_coded", "names", store.PARQUET_TABLE, "steps"} <= set(got)
    assert report_back == report_line


def test_background_tables_are_read_after_their_write(export_path, tmp_path):
    """While the writer may still run: meta and the export's tables come from memory, a table never
    written reads empty without waiting, and a table queued after ingest is read from the file
    once written."""
    db = ingest(export_path("tiny_gemm_gelu"), tmp_path / "run.sqlite", background=True)
    assert store.read_meta(db)["schema_version"] == store.SCHEMA_VERSION
    assert store.read_table(db, "ncu_kernels").empty
    extra = pd.DataFrame({"kernel_id": [3, 1, 2], "x": [0.5, None, 2.0]})
    store.write_table(db, "extra", extra)
    read = store.read_table(db, "extra")
    pd.testing.assert_frame_equal(read, extra)
    store.close(db)
    conn = sqlite3.connect(tmp_path / "run.sqlite")
    n = conn.execute("SELECT COUNT(*) FROM kernels").fetchone()[0]
    # kept in memory for the analysis (less the columns it never reads): after close too
    assert n == len(store.read_table(db, "kernels", without=UNREAD_COLUMNS["kernels"])) > 0


def test_released_columns_leave_memory_and_stay_in_the_file(tmp_path, monkeypatch):
    """create_run_db's ``released``: once the tables are written, the frame kept in memory holds no
    reference to a released column (its array is freed), a reader without it is served from memory,
    and a reader of every column gets the file's table, released column included."""
    released = np.arange(1000, dtype=np.float64) / 8  # its own block (another dtype than "a")
    alive = weakref.ref(released)
    frame = pd.DataFrame({"a": np.arange(1000), "b": released}, copy=False)
    db = store.create_run_db(tmp_path / "run.sqlite", {"t": frame}, {}, background=True, released={"t": ("b",)})
    del released, frame
    store.flush(db)
    gc.collect()
    assert alive() is None
    with monkeypatch.context() as m:  # from memory: the file is not read
        m.setattr(store, "_read_stored", lambda *a: pytest.fail("read the file"))
        lean = store.read_table(db, "t", without=("b",))
    pd.testing.assert_frame_equal(lean, pd.DataFrame({"a": np.arange(1000)}))
    full = store.read_table(db, "t")
    pd.testing.assert_frame_equal(full, pd.DataFrame({"a": np.arange(1000), "b": np.arange(1000) / 8}))


def test_a_full_disk_in_the_writer_thread_is_one_line(tmp_path, export_path, monkeypatch):
    """The writer thread's "database or disk is full": gpudiag report says it in one line, exits
    non-zero and leaves no output folder, as when the write fails in line."""
    from click.testing import CliRunner

    from gpudiag.cli.main import cli

    def full(db, name, df):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store, "_write", full)
    out = tmp_path / "new" / "out"
    result = CliRunner().invoke(cli, ["report", str(export_path("tiny_gemm_gelu")), "-o", str(out)])
    assert result.exit_code != 0 and "disk is full" in result.output and str(out) in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "new").exists()


# ---- the derived per-kernel tables as Parquet (schema 3, issue 36: docs/scale.md) ---------------------

@pytest.mark.parametrize("name", ["gpt2_train_bf16", "towers_inference"])
def test_parquet_tables_read_with_sql_as_sqlite_rows_stored_them(name, export_path, tmp_path, monkeypatch):
    """The oracle is schema 2's storage: the frames the analysis hands to ``write_table`` for the
    Parquet tables, written as SQLite rows (``_write``), give the same declared types, values and
    storage classes as the same tables read with SQL through :func:`store.queryable`."""
    written: list[pd.DataFrame] = []
    parts = store.parquet_parts

    def recorded(df: pd.DataFrame) -> list[bytes]:
        written.append(df)
        return parts(df)

    monkeypatch.setattr(store, "parquet_parts", recorded)
    db = ingest(export_path(name), tmp_path / "run.sqlite")
    analyse(db)
    conn = store.queryable(db)
    rows = sqlite_utils.Database(tmp_path / "rows.sqlite")
    for table, df in zip(store.PARQUET_TABLES, written):
        store._write(rows, table, df)
        rows.conn.commit()
        cols = [r[1] for r in rows.conn.execute(f'PRAGMA table_info("{table}")')]
        assert [r[1] for r in conn.execute(f'PRAGMA temp.table_info("{table}")')] == cols
        typed = ", ".join(f'"{c}", typeof("{c}")' for c in cols)
        query = f'SELECT {typed} FROM "{table}" ORDER BY kernel_id'
        assert conn.execute(query).fetchall() == rows.conn.execute(query).fetchall(), table
    assert len(written) == 2 and "kernel_attribution" not in db.table_names()


def test_a_parquet_table_in_parts_reads_back_whole(tmp_path, monkeypatch):
    """More rows than a part holds: several parts, read back in order as the frame written
    (dictionary-encoded columns as Categoricals, NaN kept); written again, the old parts go."""
    monkeypatch.setattr(store, "PARQUET_PART_ROWS", 4)
    df = pd.DataFrame({"kernel_id": range(10), "flop": [1.5, None] * 5,
                       "family": pd.Categorical(["gemm", "copy"] * 5), "op": ["a", None, "c", "d", "e"] * 2})
    db = sqlite_utils.Database(tmp_path / "run.sqlite")
    store.write_table(db, "kernel_class", df)
    assert db.conn.execute("SELECT count(*) FROM parquet WHERE name = 'kernel_class'").fetchone() == (3,)
    pd.testing.assert_frame_equal(store.read_table(db, "kernel_class"), df)
    store.write_table(db, "kernel_class", df.iloc[:2])
    assert db.conn.execute("SELECT count(*) FROM parquet").fetchone() == (1,)
    assert store.queryable(db).execute("SELECT kernel_id, flop, family, op FROM kernel_class").fetchall() == \
        [(0, 1.5, "gemm", "a"), (1, None, "copy", None)]


def test_a_parquet_part_over_the_byte_limit_is_halved_until_it_fits(tmp_path, monkeypatch):
    """Rows of long distinct texts: a part larger than PARQUET_PART_BYTES is split in row order, each
    piece under the limit (or one row), and the table reads back whole."""
    texts = [os.urandom(1500).hex() for _ in range(40)]  # incompressible: a part's size follows its rows
    df = pd.DataFrame({"kernel_id": range(40), "op_args": texts})
    whole = store.parquet_parts(df)
    assert len(whole) == 1
    monkeypatch.setattr(store, "PARQUET_PART_BYTES", len(whole[0]) // 5)
    parts = store.parquet_parts(df)
    assert len(parts) >= 5 and all(len(p) <= store.PARQUET_PART_BYTES for p in parts)
    db = sqlite_utils.Database(tmp_path / "run.sqlite")
    store.write_table(db, "kernel_attribution", df)
    pd.testing.assert_frame_equal(store.read_table(db, "kernel_attribution"), df)


def test_an_empty_parquet_table_keeps_its_columns_and_an_absent_one_reads_empty(tmp_path):
    db = sqlite_utils.Database(tmp_path / "run.sqlite")
    assert store.read_table(db, "kernel_attribution").empty
    store.write_table(db, "kernel_attribution", pd.DataFrame({"kernel_id": pd.Series([], dtype="int64"),
                                                               "module": pd.Series([], dtype=object)}))
    read = store.read_table(db, "kernel_attribution")
    assert list(read.columns) == ["kernel_id", "module"] and read.empty
    assert store.queryable(db).execute("SELECT count(*) FROM kernel_attribution").fetchone() == (0,)
