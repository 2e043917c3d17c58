"""The bad-input matrix (../shared/reliability/bad_input_matrix.md, 63 rows, issue 16): every row
ends in a one-line error (exit 2 or 3, naming the file, no output folder left behind) or in a
report that carries a warning naming what was odd; no input or other user file changes.

Inputs are made here from the real tiny GEMM+GELU export (SQL edits, as the matrix did). Rows
that need a uid without root (33, 36, 41, 42) are covered by tests below that fail the writes
with monkeypatch (this machine runs tests as root, which ignores file modes).
"""

from __future__ import annotations

import errno
import hashlib
import json
import lzma
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudiag.cli.main import cli

# nsys declares start/end NOT NULL and ids PRIMARY KEY: a copy without constraints takes the damage
def unconstrained(table: str) -> list[str]:
    return [f"CREATE TABLE _t AS SELECT * FROM {table}", f"DROP TABLE {table}", f"ALTER TABLE _t RENAME TO {table}"]


K = "CUPTI_ACTIVITY_KIND_KERNEL"
KU = unconstrained(K)
SU = unconstrained("StringIds")


def _sql(*statements: str):
    def build(tmp: Path, export: Path) -> Path:
        path = tmp / "export.sqlite"
        shutil.copyfile(export, path)
        con = sqlite3.connect(path)
        for s in statements:
            con.execute(s)
        con.commit()
        con.close()
        return path
    return build


def _bytes(name: str, make):
    def build(tmp: Path, export: Path) -> Path:
        path = tmp / name
        path.write_bytes(make(export.read_bytes()))
        return path
    return build


def _empty_sqlite(*statements: str):
    def build(tmp: Path, export: Path) -> Path:
        path = tmp / "other.sqlite"
        con = sqlite3.connect(path)
        con.execute("PRAGMA user_version = 1")  # else SQLite leaves a 0-byte file
        for s in statements:
            con.execute(s)
        con.commit()
        con.close()
        return path
    return build


def _only_nvtx(tmp: Path, export: Path) -> Path:
    path = _sql()(tmp, export)
    con = sqlite3.connect(path)
    for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'CUPTI%'").fetchall():
        con.execute(f"DROP TABLE {t}")
    con.commit()
    con.close()
    return path


def _fifo(tmp: Path, export: Path) -> Path:
    os.mkfifo(tmp / "pipe.sqlite")
    return tmp / "pipe.sqlite"


def _empty_dir(tmp: Path, export: Path) -> Path:
    (tmp / "emptydir").mkdir()
    return tmp / "emptydir"


def _run_dir(status: str | None = None, profile: bytes | None = None):
    def build(tmp: Path, export: Path) -> Path:
        d = tmp / "rundir"
        d.mkdir()
        (d / "profile.sqlite").write_bytes(profile if profile is not None else export.read_bytes())
        if status is not None:
            (d / "script_status.json").write_text(status)
        return d
    return build


def _hot_journal(tmp: Path, export: Path) -> Path:
    path = _sql()(tmp, export)
    (tmp / "export.sqlite-journal").write_bytes(b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7" + os.urandom(4088))
    return path


def _huge_name(tmp: Path, export: Path) -> Path:
    return _sql(*SU, f"UPDATE StringIds SET value = value || '{'x' * 1_000_000}' WHERE id IN "
                f"(SELECT demangledName FROM {K} LIMIT 1)")(tmp, export)


ERROR, REPORT = "error", "report"
# (row, case, build, extra args, outcome, text expected in the error or in a warning (None: any))
REPORT_ROWS = [
    (1, "nonexistent path", lambda t, e: t / "does-not-exist.sqlite", [], ERROR, "no such file"),
    (2, "empty directory", _empty_dir, [], ERROR, "no profile.sqlite"),
    (3, "empty file", _bytes("empty.sqlite", lambda b: b""), [], ERROR, "empty file"),
    (4, "text file named .sqlite", _bytes("notes.sqlite", lambda b: b"notes\n" * 10), [], ERROR, "not an SQLite file"),
    (5, "PNG named .sqlite", _bytes("image.sqlite", lambda b: b"\x89PNG\r\n\x1a\n" + b"\0" * 100), [], ERROR, "not an SQLite file"),
    (6, "random bytes named .sqlite", _bytes("random.sqlite", lambda b: os.urandom(65536)), [], ERROR, "not an SQLite file"),
    (7, "random bytes named .nsys-rep", _bytes("capture.nsys-rep", lambda b: os.urandom(4096)), [], ERROR, "nsys export"),
    (8, "truncated .sqlite", _bytes("truncated.sqlite", lambda b: b[:len(b) // 2]), [], ERROR, "truncated.sqlite"),
    (9, "truncated .sqlite.xz", _bytes("truncated.sqlite.xz", lambda b: lzma.compress(b)[:len(lzma.compress(b)) // 2]),
     [], ERROR, "not a readable .xz file"),
    (10, ".sqlite.xz holding text", _bytes("text.sqlite.xz", lambda b: lzma.compress(b"hello\n")), [], ERROR, "not an SQLite file"),
    (11, "plain SQLite named .xz", _bytes("renamed.sqlite.xz", lambda b: b), [], ERROR, "not a readable .xz file"),
    (12, "FIFO named .sqlite", _fifo, [], ERROR, "pipe.sqlite"),
    (13, "SQLite without tables", _empty_sqlite(), [], ERROR, "not an nsys export"),
    (14, "SQLite with unrelated tables", _empty_sqlite("CREATE TABLE t(x)", "INSERT INTO t VALUES (1)"), [], ERROR,
     "not an nsys export"),
    (15, "no kernel table", _sql(f"DROP TABLE {K}"), [], ERROR, "no CUDA kernels"),
    (16, "0 kernel rows", _sql(f"DELETE FROM {K}"), [], ERROR, "no CUDA kernels"),
    (17, "NULL end every 3rd kernel", _sql(*KU, f"UPDATE {K} SET end = NULL WHERE rowid % 3 = 0"), [], REPORT, "NULL or non-numeric"),
    (18, "NULL start every 3rd kernel", _sql(*KU, f"UPDATE {K} SET start = NULL WHERE rowid % 3 = 0"), [], REPORT, "NULL or non-numeric"),
    (19, "start and end NULL everywhere", _sql(*KU, f"UPDATE {K} SET start = NULL, end = NULL"), [], ERROR, "impossible"),
    (20, "zero duration everywhere", _sql(f"UPDATE {K} SET end = start"), [], REPORT, "zero duration"),
    (21, "negative duration every 2nd kernel", _sql(f"UPDATE {K} SET end = start - 1000 WHERE rowid % 2 = 0"), [], REPORT,
     "end before start"),
    (22, "start and end swapped", _sql(f'UPDATE {K} SET start = "end", "end" = start'), [], ERROR, "end before start"),
    (23, "negative timestamps", _sql(f'UPDATE {K} SET start = -start, "end" = -"end"'), [], ERROR, "end before start"),
    (24, "kernel names missing from StringIds", _sql(f"DELETE FROM StringIds WHERE id IN (SELECT demangledName FROM {K})"),
     [], REPORT, "names not in StringIds"),
    (25, "StringIds dropped", _sql("DROP TABLE StringIds"), [], REPORT, "StringIds"),
    (26, "duplicate StringIds ids", _sql(*SU, f"INSERT INTO StringIds SELECT id, value || '_2' FROM StringIds WHERE id IN "
                                              f"(SELECT demangledName FROM {K})"), [], REPORT, "duplicate ids"),
    (27, "every kernel twice", _sql(*KU, f"INSERT INTO {K} SELECT * FROM {K}"), [], REPORT, "exact duplicate rows"),
    (28, "duplicate device ids", _sql(*unconstrained("TARGET_INFO_GPU"), "INSERT INTO TARGET_INFO_GPU SELECT * FROM TARGET_INFO_GPU"),
     [], REPORT, "duplicate device_id"),
    (29, "1 MB kernel name", _huge_name, [], REPORT, None),
    (30, "non-UTF-8 kernel names", _sql(*SU, "UPDATE StringIds SET value = CAST(CAST(value AS BLOB) || X'FFFE' AS TEXT) "
                                             f"WHERE id IN (SELECT demangledName FROM {K})"), [], REPORT, "non-UTF-8"),
    (31, "non-UTF-8 NVTX text", _sql("UPDATE NVTX_EVENTS SET text = CAST(CAST(COALESCE(text, 'x') AS BLOB) || X'FF' AS TEXT)"),
     [], REPORT, "non-UTF-8"),
    (32, "only NVTX rows", _only_nvtx, [], ERROR, "no CUDA kernels"),
    (43, "hot rollback journal beside it", _hot_journal, [], None, None),
    (44, "damaged script_status.json", _run_dir(status="{not json"), [], ERROR, "not a gpudiag status file"),
    (45, "run dir with a text profile.sqlite", _run_dir(profile=b"text\n"), [], ERROR, "not an SQLite file"),
    (46, "--ncu pointing to text", _sql(), ["--ncu", "{tmp}/bad.ncu-rep"], ERROR, "bad.ncu-rep"),
    (47, "--peaks pointing to a PNG", _sql(), ["--peaks", "{tmp}/peaks.json"], ERROR, "not a gpudiag calibration file"),
    (48, "invalid --steps-from regex", _sql(), ["--steps-from", "nvtx:(unclosed"], ERROR, "invalid regular expression"),
    (49, "--steps-from matching nothing", _sql(), ["--steps-from", "nvtx:^nothing$"], REPORT, "no step ranges found"),
]


def _snapshot(folder: Path) -> dict[str, str]:
    """Content hash of every regular file under ``folder`` (FIFOs and sockets skipped)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def run(*args) -> object:
    return CliRunner().invoke(cli, [str(a) for a in args])


def check_error(result, names: tuple[str, ...], text: str | None) -> None:
    """A one-line ``Error:`` with exit 2 or 3 that names one of ``names`` (and holds ``text``)."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code in (2, 3), result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert any(n in lines[0] for n in names), lines[0]
    if text:
        assert text in lines[0], lines[0]


@pytest.mark.parametrize("row, case, build, extra, outcome, text", REPORT_ROWS, ids=[f"{r[0]}-{r[1]}" for r in REPORT_ROWS])
def test_report_matrix_row(row, case, build, extra, outcome, text, tmp_path, export_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "bad.ncu-rep").write_text("not an ncu report")
    (user / "peaks.json").write_bytes(b"\x89PNG\r\n\x1a\n")
    source = build(user, export_path("tiny_gemm_gelu"))
    before = _snapshot(user)
    out = tmp_path / "out"
    result = run("report", source, "-o", out, *[a.format(tmp=user) for a in extra])
    assert "Traceback" not in result.output and "Warning:" not in result.output, result.output
    assert _snapshot(user) == before, "a user file changed"
    if outcome is None:  # either ending is right (SQLite decides whether the journal is hot)
        outcome = REPORT if result.exit_code == 0 else ERROR
    if outcome == ERROR:
        check_error(result, (source.name, "bad.ncu-rep", "peaks.json", "--steps-from"), text)
        assert not out.exists(), "a failed run left its output folder"
        return
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert (out / "report.html").read_text().rstrip().endswith("</html>")
    assert not report["invariants"] or report["warnings"]
    if text is not None:
        assert any(text in w for w in report["warnings"]), report["warnings"]
    assert not list(out.glob(".*partial*")), "a partial file was left"


def test_rows_34_35_output_below_or_on_a_file(tmp_path, export_path):
    a_file = tmp_path / "outfile.txt"
    a_file.write_text("mine")
    for out in (a_file, a_file / "sub"):
        result = run("report", export_path("tiny_gemm_gelu"), "-o", out)
        check_error(result, ("outfile.txt",), None)
    assert a_file.read_text() == "mine"


def test_rows_33_36_unwritable_output_folder(tmp_path, export_path, monkeypatch):
    """No permission to create the folder (as a uid without root gets): one line, exit 2."""
    def refuse(self, *a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    result = run("report", export_path("tiny_gemm_gelu"), "-o", tmp_path / "ro" / "out")
    check_error(result, ("ro/out",), "Permission denied")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_row_33_read_only_folder_for_real(tmp_path, export_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    check_error(run("report", export_path("tiny_gemm_gelu"), "-o", ro), ("ro",), "not writable")


def test_a_full_disk_leaves_the_old_report_and_no_partial_file(tmp_path, export_path, monkeypatch):
    """ENOSPC while the report is written (--force over an existing report): one line, exit 2,
    the previous report.html/report.json/run.sqlite untouched, no partial file left."""
    out = tmp_path / "out"
    assert run("report", export_path("tiny_gemm_gelu"), "-o", out).exit_code == 0
    before = _snapshot(out)
    real = Path.write_text

    def full(self, *a, **k):
        if self.name.endswith(".partial"):
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    result = run("report", export_path("tiny_gemm_gelu"), "-o", out, "--force")
    check_error(result, (str(out),), "No space left on device")
    assert _snapshot(out) == before and not list(out.glob(".*partial*"))


def test_a_full_disk_while_the_run_database_is_written(tmp_path, export_path, monkeypatch):
    """SQLite's "database or disk is full" during ingest: one line, and no output folder left."""
    import gpudiag.store

    def full(*a, **k):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(gpudiag.store, "write_table", full)
    out = tmp_path / "new" / "out"
    result = run("report", export_path("tiny_gemm_gelu"), "-o", out)
    check_error(result, (str(out),), "disk is full")
    assert not (tmp_path / "new").exists()


def test_rows_37_to_40_nothing_overwritten_without_force(tmp_path, export_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.sqlite").write_text("someone's database")
    check_error(run("report", export_path("tiny_gemm_gelu"), "-o", out), ("run.sqlite",), "--force")
    assert (out / "run.sqlite").read_text() == "someone's database"
    # the input is never the output, even with --force
    shutil.copyfile(export_path("tiny_gemm_gelu"), out / "run.sqlite")
    digest = hashlib.sha256((out / "run.sqlite").read_bytes()).hexdigest()
    for force in ([], ["--force"]):
        check_error(run("report", out / "run.sqlite", "-o", out, *force), ("run.sqlite",), None)
    assert hashlib.sha256((out / "run.sqlite").read_bytes()).hexdigest() == digest
    assert not (out / "report.html").exists()


@pytest.fixture(scope="module")
def a_report(tmp_path_factory, export_path):
    out = tmp_path_factory.mktemp("gate") / "run"
    assert run("report", export_path("tiny_gemm_gelu"), "-o", out).exit_code == 0
    return out


def _edited_report(path: Path, edit) -> object:
    def build(tmp: Path, run_dir: Path) -> Path:
        data = json.loads((run_dir / "report.json").read_text())
        edit(data)
        target = tmp / path
        target.write_text(json.dumps(data))
        return target
    return build


def _each_step(key, value):
    def edit(data):
        for s in data["per_step_metrics"]:
            s[key] = value(s[key])
    return edit


def _write(name: str, text: str | bytes):
    def build(tmp: Path, run_dir: Path) -> Path:
        target = tmp / name
        target.write_bytes(text if isinstance(text, bytes) else text.encode())
        return target
    return build


GATE_ROWS = [
    (50, "nonexistent baseline", lambda t, r: t / "nope.json", [], 2, "no such file"),
    (53, "empty directory", lambda t, r: (t / "empty").mkdir() or t / "empty", [], 3, "not found"),
    (55, "an export, not a report", lambda t, r: Path(shutil.copyfile(r / "run.sqlite", t / "export.sqlite")), [], 3, "not valid JSON"),
    (56, "text file", _write("base.json", "hello"), [], 3, "not valid JSON"),
    (57, "JSON {}", _write("base.json", "{}"), [], 3, "neither a gpudiag report.json nor a baseline file"),
    (58, "JSON list", _write("base.json", "[1, 2, 3]"), [], 3, "neither a gpudiag report.json nor a baseline file"),
    (58.1, "JSON string", _write("base.json", '"step times"'), [], 3, "neither a gpudiag report.json nor a baseline file"),
    (59, "per_step_metrics null", _edited_report(Path("base.json"), lambda d: d.update(per_step_metrics=None)), [], 3,
     "no per-step samples"),
    (60, "step times as strings", _edited_report(Path("base.json"), _each_step("step_time_ns", str)), [], 3, "not numbers"),
    (60.1, "step times as lists", _edited_report(Path("base.json"), _each_step("step_time_ns", lambda v: [v])), [], 3,
     "not numbers"),
    (61, "invalid TOML config", lambda t, r: r / "report.json", ["--config", "{tmp}/gate.toml"], 2, "cannot read the gate configuration"),
]


@pytest.mark.parametrize("row, case, build, extra, code, text", GATE_ROWS, ids=[f"{r[0]}-{r[1]}" for r in GATE_ROWS])
def test_gate_matrix_row(row, case, build, extra, code, text, tmp_path, a_report):
    (tmp_path / "gate.toml").write_text("[tool.gpudiag.gate\nalpha = 1")
    baseline = build(tmp_path, a_report)
    before = _snapshot(tmp_path)
    result = run("gate", baseline, a_report, *[a.format(tmp=tmp_path) for a in extra])
    assert result.exit_code == code, result.output
    check_error(result, (baseline.name, "gate.toml"), text)
    assert _snapshot(tmp_path) == before


def test_gate_rows_51_52_same_run_twice_passes(a_report):
    assert run("gate", a_report, a_report).exit_code == 0
    assert run("gate", a_report / "report.json", a_report / "report.json").exit_code == 0
