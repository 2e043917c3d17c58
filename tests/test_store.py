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
    assert got.keys() == want.keys() and {"kernels_coded", "names", "kernel_class_coded", "kernel_class_text", "kernel_attribution_coded", "steps"} <= set(got)
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
    assert got == want and {"kernels_coded", "names", "kernel_class_coded", "kernel_class_text", "kernel_attribution_coded", "steps"} <= set(got)
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


# ---- the derived per-kernel tables as SQLite tables (schema 4, issue 47 part 2) --------------------------

CHECK_WITHOUT_GPUDIAG = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
print(dict(con.execute("select kernel_class, count(*) from kernel_class group by 1").fetchall()))
print(con.execute("select count(*) from kernel_attribution join kernels using (kernel_id)").fetchone()[0])
print('gpudiag' in sys.modules)
"""


@pytest.mark.parametrize("name", ["gpt2_train_bf16", "towers_inference"])
def test_the_derived_tables_are_read_with_sql_without_gpudiag(name, export_path, tmp_path):
    """The issue's check, `select kernel_class, count(*) from kernel_class group by 1`, in a Python that
    imports only sqlite3, against the frames the analysis itself holds; and with the sqlite3 shell where
    the machine has one."""
    import ast
    import shutil
    import subprocess
    import sys

    db = ingest(export_path(name), tmp_path / "run.sqlite", background=True)
    analyse(db)
    classes = store.read_table(db, "kernel_class")["kernel_class"].value_counts().to_dict()
    kernels = len(store.read_table(db, "kernels"))
    store.flush(db)
    db.conn.close()
    out = subprocess.run([sys.executable, "-c", CHECK_WITHOUT_GPUDIAG, str(tmp_path / "run.sqlite")],
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout.splitlines()
    assert ast.literal_eval(out[0]) == classes and int(out[1]) == kernels and out[2] == "False"
    if shutil.which("sqlite3"):
        shell = subprocess.run(["sqlite3", str(tmp_path / "run.sqlite"),
                                "select kernel_class, count(*) from kernel_class group by 1"],
                               capture_output=True, text=True, check=True).stdout
        assert dict((c, int(n)) for c, n in (line.split("|") for line in shell.split())) == classes


def test_a_derived_table_reads_back_as_written(tmp_path):
    """Text as Categoricals, NaN kept, through a database opened afresh; written again, replaced."""
    df = pd.DataFrame({"kernel_id": range(10), "flop": [1.5, None] * 5,
                       "family": pd.Categorical(["gemm", "copy"] * 5), "op": ["a", None, "c", "d", "e"] * 2})
    store.write_table(sqlite_utils.Database(tmp_path / "run.sqlite"), "kernel_class", df)
    back = store.read_table(sqlite_utils.Database(tmp_path / "run.sqlite"), "kernel_class")
    pd.testing.assert_frame_equal(back.astype({"op": df["op"].dtype}), df, check_categorical=False)
    assert isinstance(back["family"].dtype, pd.CategoricalDtype)
    db = sqlite_utils.Database(tmp_path / "run.sqlite")
    store.write_table(db, "kernel_class", df.iloc[:2])
    assert store.queryable(db).execute("SELECT kernel_id, flop, family, op FROM kernel_class").fetchall() == \
        [(0, 1.5, "gemm", "a"), (1, None, "copy", None)]


@pytest.fixture
def analysed_file(export_path, tmp_path):
    """A run database file analysed from a real export, closed."""
    db = ingest(export_path("gpt2_train_bf16"), tmp_path / "run.sqlite")
    analyse(db)
    db.conn.commit()
    db.conn.close()
    return tmp_path / "run.sqlite"


def _store_error(path, table: str) -> str:
    with pytest.raises(store.StoreError) as info:
        store.read_table(sqlite_utils.Database(path), table)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and "gpudiag report" in message
    return message


def test_a_damaged_derived_table_is_one_store_error_naming_file_and_table(analysed_file):
    con = sqlite3.connect(analysed_file)
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'kernel_class_coded'").fetchone()[0]
    page = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    with open(analysed_file, "r+b") as f:  # the table's root page overwritten: SQLite calls the file malformed
        f.seek((root - 1) * page)
        f.write(os.urandom(page))
    assert "kernel_class" in _store_error(analysed_file, "kernel_class")


def test_a_missing_derived_table_is_one_store_error(analysed_file):
    con = sqlite3.connect(analysed_file)
    con.execute("DROP TABLE kernel_attribution_coded")
    con.commit()
    con.close()
    assert "kernel_attribution is missing" in _store_error(analysed_file, "kernel_attribution")


def test_a_file_of_an_older_schema_is_one_store_error_not_empty_frames(analysed_file):
    con = sqlite3.connect(analysed_file)
    con.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    for table in ("kernels", "kernel_class"):
        assert "schema 3" in _store_error(analysed_file, table)


def test_an_empty_derived_table_keeps_its_columns_and_an_absent_one_reads_empty(tmp_path):
    db = sqlite_utils.Database(tmp_path / "run.sqlite")
    assert store.read_table(db, "kernel_attribution").empty
    store.write_table(db, "kernel_attribution", pd.DataFrame({"kernel_id": pd.Series([], dtype="int64"),
                                                               "module": pd.Series([], dtype=object)}))
    read = store.read_table(db, "kernel_attribution")
    assert list(read.columns) == ["kernel_id", "module"] and read.empty
    assert store.queryable(db).execute("SELECT count(*) FROM kernel_attribution").fetchone() == (0,)
