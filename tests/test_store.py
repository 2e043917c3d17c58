"""The run database written through Arrow and the ADBC SQLite driver (issue 25, part 1) holds what
pandas' ``to_sql`` writes: the same tables, declared column types, values and SQLite storage classes,
checked table by table on real captures against a run database written with ``to_sql`` alone."""

from __future__ import annotations

import sqlite3

import pandas as pd
import pytest
import sqlite_utils

from gpudiag import store
from gpudiag.analysis.ingest import ingest
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
    assert got.keys() == want.keys() and {"kernels_coded", "names", "kernel_attribution", "kernel_class", "steps"} <= set(got)
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
    assert got == want and {"kernels_coded", "names", "kernel_attribution", "kernel_class", "steps"} <= set(got)
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
    assert n == len(store.read_table(db, "kernels")) > 0


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
