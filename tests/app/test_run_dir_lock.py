"""One writer per run directory (issue 47, part 1): several ``gpudiag report RUN_DIR`` processes
at once, with and without ``--force``, all end clean and leave whole data; ``--no-wait`` fails with
one line naming the holder; a failing process removes only its own partial files."""

from __future__ import annotations

import json
import lzma
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.app.lock import lock_path, run_dir_lock
from gpudiag.app.output import partial, written_or_removed
from gpudiag.errors import UserError

from conftest import EXPORTS, ROOT


def _run_dir(tmp_path: Path, export: str = "input_pipeline_good") -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "profile.sqlite").write_bytes(lzma.decompress(EXPORTS[export].read_bytes()))
    return run


def _reports(run: Path, n: int, *flags: str) -> list[subprocess.CompletedProcess]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "gpudiag", "report", str(run), *flags], cwd=run.parent, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def _whole(run: Path) -> None:
    """The run's files are complete and agree: report.json parses, run.sqlite opens and holds the
    kernels the report counted, and no partial file is left."""
    report = json.loads((run / "report.json").read_text())
    assert (run / "report.html").read_text().rstrip().endswith("</html>")
    with sqlite3.connect(run / "run.sqlite") as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    assert tables and report["steps"]["count"] > 0
    assert not [p.name for p in run.iterdir() if ".partial" in p.name]


def test_concurrent_forced_reports_all_succeed_one_after_another(tmp_path):
    run = _run_dir(tmp_path)
    results = _reports(run, 3, "--force")
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    assert all("Traceback" not in r.stderr for r in results)
    # the two that came second waited and said for whom
    assert sum("is being written by process" in r.stderr for r in results) >= 1
    _whole(run)


@pytest.mark.parametrize("attempt", range(20))
def test_two_reports_at_once_end_clean_twenty_times_in_twenty(tmp_path, attempt):
    """The issue's bar: 20 of 20 (before the lock: 0 of 16 processes succeeded in 8 tries)."""
    run = _run_dir(tmp_path, "tiny_gemm_gelu")
    forced = _reports(run, 2, "--force")
    assert [r.returncode for r in forced] == [0, 0], [r.stderr for r in forced]
    _whole(run)


def test_concurrent_reports_without_force_one_writes_the_others_refuse_in_one_line(tmp_path):
    run = _run_dir(tmp_path)
    results = sorted(_reports(run, 3), key=lambda r: r.returncode)
    assert [r.returncode for r in results] == [0, 2, 2], [r.stderr for r in results]
    for refused in results[1:]:
        errors = [line for line in refused.stderr.splitlines() if line.startswith("Error:")]
        assert errors == [f"Error: {run}/report.html already exists: pass --force to overwrite it, or -o DIR to "
                          "write elsewhere"] and "Traceback" not in refused.stderr
    _whole(run)


def test_no_wait_fails_at_once_naming_the_holder(tmp_path):
    run = _run_dir(tmp_path)
    with run_dir_lock(run):  # this process writes the folder
        (busy,) = _reports(run, 1, "--force", "--no-wait")
        assert busy.returncode == 2
        assert f"is being written by process {os.getpid()}" in busy.stderr and "--no-wait" in busy.stderr
        assert not (run / "report.json").exists()
    (free,) = _reports(run, 1, "--force", "--no-wait")
    assert free.returncode == 0, free.stderr
    _whole(run)
    assert lock_path(run).parent == run.parent  # the lock stands beside the folder, not in it


def test_a_failing_writer_removes_only_its_own_partial_files(tmp_path):
    other = tmp_path / ".run.sqlite.999999.partial"  # another process's, in progress
    other.write_text("theirs")
    mine = partial(tmp_path / "run.sqlite")
    with pytest.raises(RuntimeError), written_or_removed(tmp_path, None):
        mine.write_text("mine")
        raise RuntimeError("the analysis failed")
    assert other.exists() and not mine.exists()
    assert mine.name == f".run.sqlite.{os.getpid()}.partial"


def test_an_unwritable_parent_is_a_one_line_error(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        if os.access(parent, os.W_OK):
            pytest.skip("running as a user who may write anywhere (root)")
        with pytest.raises(UserError, match="cannot create the lock beside it"), run_dir_lock(parent / "run"):
            pass
    finally:
        parent.chmod(0o700)


def test_report_shows_its_parts_as_stages(tmp_path):
    """gpudiag report on a terminal: reading the export, analysis, report files, each a stage (the
    face's spinner), in order; the times still recorded."""
    from contextlib import contextmanager

    from gpudiag.app.options import AnalysisOptions
    from gpudiag.app.report import ReportRequest, report

    shown = []

    @contextmanager
    def stage(text):
        shown.append(text)
        yield

    report(ReportRequest((EXPORTS["tiny_gemm_gelu"],), AnalysisOptions(None, None), tmp_path / "out", stage=stage))
    assert shown == ["[report] reading the export", "[report] analysis", "[report] report files"]
    assert (tmp_path / "out" / "report.json").is_file()
