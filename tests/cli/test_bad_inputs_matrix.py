"""Bad inputs of issue 25 part 1, each made from the real tiny GEMM+GELU export: a 10 MB kernel
name, negative timestamps, and an export that SQLite would have to recover (WAL mode, a hot
rollback journal) in a read-only place. Each ends in a report; no user file changes."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT
from gpudiag.analysis.attribution.families import inner_names
from gpudiag.cli.main import cli

K = "CUPTI_ACTIVITY_KIND_KERNEL"
GELU = "vectorized_elementwise_kernel · GeluCUDAKernelImpl · fp16"  # the GELU kernel's label


def _copy(export: Path, folder: Path, *statements: str, params: tuple = ()) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / "export.sqlite"
    shutil.copyfile(export, path)
    con = sqlite3.connect(path)
    for s in statements:
        con.execute(s, params) if "?" in s else con.execute(s)
    con.commit()
    con.close()
    return path


def _report(source: Path, out: Path) -> tuple[object, dict | None]:
    result = CliRunner().invoke(cli, ["report", str(source), "-o", str(out)])
    assert "Traceback" not in result.output, result.output
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
    return result, report


# --- a 10 MB kernel name ----------------------------------------------------------------------

OLD_INNER = re.compile(r"([A-Za-z_]\w*?(?:_kernel_cuda|_functor|Functor|KernelImpl|_kernel_impl|Kernel|_kernel|_op))\b")


def test_inner_names_finds_what_the_old_expression_found():
    """The linear scan gives the regular expression's matches, in order (random names built from
    the suffixes, letters, digits, a non-ASCII letter and separators)."""
    rng = random.Random(25)
    parts = ["_kernel_cuda", "_functor", "Functor", "KernelImpl", "_kernel_impl", "Kernel", "_kernel", "_op",
             "a", "Z", "_", "9", "é", "<", " ", "::", "op", "ernel", "(int)8"]
    for _ in range(20_000):
        name = "".join(rng.choice(parts) for _ in range(rng.randint(0, 8)))
        assert list(inner_names(name)) == OLD_INNER.findall(name), name


def test_a_10_mb_kernel_name_is_reported(tmp_path, export_path):
    """The GELU kernel's demangled name with 10 MB inside its template arguments (one long word,
    which the functor expression retried from every letter: hours): the report is written, in a
    subprocess with a generous limit, with the kernel's usual label, shortened in the terminal."""
    source = _copy(export_path("tiny_gemm_gelu"), tmp_path / "user",
                   "UPDATE StringIds SET value = substr(value, 1, 60) || ? || substr(value, 61) WHERE id IN "
                   f"(SELECT demangledName FROM {K} WHERE demangledName IN "
                   "(SELECT id FROM StringIds WHERE value LIKE '%GeluCUDAKernelImpl%'))", params=("x" * 10_000_000,))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    done = subprocess.run([sys.executable, "-m", "gpudiag", "report", str(source), "-o", str(out)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    huge = [k for k in report["top_kernels"] if len(k["name"]) > 10_000_000]
    assert [k["label"] for k in huge] == [GELU]
    assert max(len(line) for line in done.stdout.splitlines()) < 300


# --- negative timestamps ----------------------------------------------------------------------

TIMED = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
         "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS")
SHIFT_NS = 10**11  # 100 s: past the start of every row of the tiny export


def _shifted(export: Path, folder: Path, where: dict[str, str]) -> Path:
    """A copy with the rows of each table in ``where`` that match its condition moved SHIFT_NS back."""
    con = sqlite3.connect(export)
    present = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    counts = {t: con.execute(f"SELECT COUNT(*) FROM {t} WHERE {c}").fetchone()[0] for t, c in where.items() if t in present}
    con.close()
    statements = [f'UPDATE {t} SET start = start - {SHIFT_NS}, "end" = "end" - {SHIFT_NS} WHERE {where[t]}' for t in counts]
    return _copy(export, folder, *statements), counts


def test_negative_timestamps_are_dropped_and_warned_about(tmp_path, export_path):
    """Every other kernel moved 100 s before time zero: those rows are dropped and a warning says
    how many kernels had negative timestamps and that they were dropped."""
    export = export_path("tiny_gemm_gelu")
    source, counts = _shifted(export, tmp_path / "user", {K: "rowid % 2 = 0"})
    result, report = _report(source, tmp_path / "out")
    assert result.exit_code == 0, result.output
    lines = [w for w in report["warnings"] if w.startswith("kernels:") and "negative start/end" in w]
    assert len(lines) == 1, report["warnings"]
    assert f"negative start/end (rows dropped): {counts[K]}," in lines[0]
    assert "dropped rows are left out of every number" in lines[0]


def test_a_capture_wholly_before_time_zero_is_a_one_line_error(tmp_path, export_path):
    """All timed rows moved 100 s back (the analysis measured -487 s of idle time per step from
    them): every kernel is dropped, and the error names the file and the count."""
    source, counts = _shifted(export_path("tiny_gemm_gelu"), tmp_path / "user", {t: "1" for t in TIMED})
    result, _ = _report(source, tmp_path / "out")
    assert result.exit_code == 3, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {source}"), result.output
    assert f"negative start/end (rows dropped): {counts[K]}" in lines[0]
    assert not (tmp_path / "out").exists()


# --- exports SQLite would have to recover: WAL mode, a hot rollback journal --------------------

def _state(folder: Path) -> dict:
    """Every entry of ``folder`` with its bytes' hash, size, mode and mtime, and the folder's own
    mtime and mode: what reading an export must leave as it was."""
    files = {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size, p.stat().st_mode, p.stat().st_mtime_ns)
             for p in sorted(folder.iterdir())}
    return {"files": files, "folder": (folder.stat().st_mtime_ns, folder.stat().st_mode)}


def _in_child(path: Path, *statements: str, commit: bool) -> None:
    """Run ``statements`` on ``path`` in a child process that dies (os._exit) before closing the
    database: after the commit (a WAL keeps the change, unmerged) or before it (a hot journal)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        con = sqlite3.connect(path, isolation_level=None)
        con.execute("PRAGMA cache_size = 1")  # spill changed pages into the file before the commit
        con.execute("BEGIN")
        for s in statements:
            con.execute(s)
        if commit:
            con.execute("COMMIT")
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0


def _read_only(folder: Path) -> None:
    for p in folder.iterdir():
        p.chmod(0o444)
    folder.chmod(0o555)


@pytest.fixture
def user_folder(tmp_path):
    folder = tmp_path / "user"
    yield folder
    if folder.exists():  # writable again, so that pytest can remove it (uids without root)
        folder.chmod(0o755)


def _same_analysis(report: dict, original: dict) -> None:
    for key in ("top_kernels", "breakdown_ns_per_step", "per_step_metrics"):
        assert report[key] == original[key], key


def _reported_as_the_original(source, export, user_folder, tmp_path) -> None:
    """``source`` (in ``user_folder``, made read-only here) is reported as ``export`` is, and no file
    in the folder changes."""
    _read_only(user_folder)
    before = _state(user_folder)
    _, original = _report(export, tmp_path / "original")
    result, report = _report(source, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert _state(user_folder) == before
    _same_analysis(report, original)


def test_a_read_only_export_in_wal_mode_is_read_without_writing_beside_it(tmp_path, export_path, user_folder):
    """An export left in WAL mode (no -wal file) in a read-only folder: read as it is (immutable),
    where it used to be "a damaged SQLite file" (uids without root) or to gain -wal and -shm files
    in the user's folder (root, which ignores file modes)."""
    export = export_path("tiny_gemm_gelu")
    source = _copy(export, user_folder)
    con = sqlite3.connect(source)
    assert con.execute("PRAGMA journal_mode = WAL").fetchone() == ("wal",)
    con.close()
    _reported_as_the_original(source, export, user_folder, tmp_path)


def test_an_export_with_committed_changes_in_its_wal_is_read_with_them(tmp_path, export_path, user_folder):
    """A WAL holding a committed rename of the top kernel (never checkpointed: the writer died),
    read-only: the report has the renamed kernel, and the export, its -wal and -shm are unchanged."""
    source = _copy(export_path("tiny_gemm_gelu"), user_folder)
    con = sqlite3.connect(source)
    top = con.execute(f"SELECT shortName FROM {K} GROUP BY shortName ORDER BY SUM(\"end\" - start) DESC LIMIT 1").fetchone()[0]
    con.execute("PRAGMA journal_mode = WAL")
    con.close()
    _in_child(source, f"UPDATE StringIds SET value = 'renamed_in_the_wal' WHERE id = {top}", commit=True)
    assert {p.name for p in user_folder.iterdir()} == {"export.sqlite", "export.sqlite-wal", "export.sqlite-shm"}
    _read_only(user_folder)
    before = _state(user_folder)
    result, report = _report(source, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert report["top_kernels"][0]["label"] == "renamed_in_the_wal"
    assert _state(user_folder) == before


def test_a_hot_journal_is_rolled_back_on_a_copy(tmp_path, export_path, user_folder):
    """A write interrupted before its commit (changed pages already in the file, the hot journal
    beside it), read-only: the report is the one of the export before that write (rolled back on a
    private copy), where it used to be "a damaged SQLite file"; neither file changes."""
    export = export_path("tiny_gemm_gelu")
    source = _copy(export, user_folder)
    _in_child(source, f'UPDATE {K} SET start = start + 1000, "end" = "end" + 5000',
              "UPDATE StringIds SET value = value || '_half_written'", commit=False)
    assert (user_folder / "export.sqlite-journal").stat().st_size > 0
    assert hashlib.sha256(source.read_bytes()).digest() != hashlib.sha256(export.read_bytes()).digest()
    _reported_as_the_original(source, export, user_folder, tmp_path)


# --- issue 35, part 5: bad inputs still told wrongly -------------------------------------------

def _one_line_error(result, source: Path, *words: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {source}"), result.output
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _zip(data: bytes) -> bytes:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("profile.sqlite", data)
    return buffer.getvalue()


@pytest.mark.parametrize("name, pack, words", [
    ("profile.sqlite.gz", lambda b: __import__("gzip").compress(b), ("gzip-compressed", "gunzip -k", "profile.sqlite")),
    ("profile.sqlite", lambda b: __import__("gzip").compress(b), ("gzip-compressed", "gunzip -c", "profile.unpacked.sqlite")),
    ("profile.sqlite.zst", lambda b: b"\x28\xb5\x2f\xfd" + b[:4096], ("zstd-compressed", "unzstd")),
    ("profile.sqlite.bz2", lambda b: __import__("bz2").compress(b[:4096]), ("bzip2-compressed", "bunzip2 -k")),
    ("profile.sqlite", lambda b: __import__("lzma").compress(b[:4096]), ("xz-compressed", "unxz -c")),
    ("profile.zip", _zip, ("a zip archive", "unzip")),
])
def test_a_compressed_export_is_told_to_be_decompressed(name, pack, words, tmp_path, export_path):
    """A gzip'd export was "not an SQLite file": the error says which compression (by its magic
    bytes) and the command that decompresses it."""
    source = tmp_path / name
    source.write_bytes(pack(export_path("tiny_gemm_gelu").read_bytes()))
    result, _ = _report(source, tmp_path / "out")
    line = _one_line_error(result, source, *words)
    assert "not an SQLite file" in line or "zip archive" in line
    assert not (tmp_path / "out").exists()


def test_an_export_locked_by_a_writer_is_told_to_be_locked(tmp_path, export_path):
    """An export a writer still holds (BEGIN EXCLUSIVE, as nsys export holds it while writing) was
    "a damaged SQLite file": the error says it is locked by another process and to retry."""
    source = _copy(export_path("tiny_gemm_gelu"), tmp_path / "user")
    writer = sqlite3.connect(source, isolation_level=None)
    try:
        writer.execute("BEGIN EXCLUSIVE")
        result, _ = _report(source, tmp_path / "out")
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    line = _one_line_error(result, source, "locked by another process", "again when it has finished")
    assert "damaged" not in line
    assert not (tmp_path / "out").exists()
    result, report = _report(source, tmp_path / "out")  # the writer gone, it reads
    assert result.exit_code == 0 and report["top_kernels"], result.output


def test_a_steps_regex_with_a_capture_group_prints_no_warning(tmp_path, export_path):
    """``--steps-from nvtx:`` with a capture group printed pandas' "has match groups" warning; the
    steps are those of the same regex without the group."""
    import warnings

    source = export_path("tiny_gemm_gelu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grouped = CliRunner().invoke(cli, ["report", str(source), "-o", str(tmp_path / "a"), "--steps-from", "nvtx:(step|iter)"])
    assert grouped.exit_code == 0, grouped.output
    assert not [w for w in caught if "match groups" in str(w.message)]
    assert "match groups" not in grouped.output
    plain = CliRunner().invoke(cli, ["report", str(source), "-o", str(tmp_path / "b"), "--steps-from", "nvtx:(?:step|iter)"])
    a, b = (json.loads((tmp_path / d / "report.json").read_text()) for d in "ab")
    assert a["steps"]["measured"] == b["steps"]["measured"] > 0
    assert a["steps"]["step_time_ns"] == b["steps"]["step_time_ns"]


def test_a_10_mb_short_name_is_reported_quickly(tmp_path, export_path):
    """The 10 MB name of issue 35 (the short name the labels are built from, shared by the
    element-wise kernels): 323 s were spent wrapping it into the terminal's fusion table. Now the
    summary cuts names (report.json keeps them whole); the run ends within the limit with short lines."""
    import time

    source = _copy(export_path("tiny_gemm_gelu"), tmp_path / "user",
                   *[f"CREATE TABLE _t AS SELECT * FROM StringIds", "DROP TABLE StringIds",
                     "ALTER TABLE _t RENAME TO StringIds"],
                   f"UPDATE StringIds SET value = value || ? WHERE id IN (SELECT shortName FROM {K} WHERE demangledName "
                   "IN (SELECT id FROM StringIds WHERE value LIKE '%GeluCUDAKernelImpl%'))", params=("x" * 10_000_000,))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gpudiag", "report", str(source), "-o", str(out)], env=env,
                          capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-2000:]
    assert max(len(line) for line in done.stdout.splitlines()) < 300
    assert "GD-TORCH-COMPILE" in done.stdout
    report = json.loads((out / "report.json").read_text())
    assert any(len(k["label"]) > 10_000_000 for k in report["top_kernels"])  # the report keeps the name
    assert elapsed < 60, elapsed  # 10 s on an idle machine; the terminal's share is under a second
