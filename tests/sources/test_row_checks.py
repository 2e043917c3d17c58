"""Odd rows in a real export (tests/fixtures/tiny_gemm_gelu.sqlite.xz, edited here with SQL as the
issue's bad-input matrix did): counted in one warning line per table, left out of the numbers,
never a traceback. The expected counts come from the edits made in each test."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pandas as pd
import pytest
from click.testing import CliRunner

from gpudiag.cli.main import cli
from gpudiag.sources import row_checks


@pytest.fixture
def edited(export_path, tmp_path):
    """A copy of the tiny GEMM+GELU export, an SQL edit applied to it, and its kernel count."""

    def make(*statements: str):
        path = tmp_path / "edited.sqlite"
        shutil.copy(export_path("tiny_gemm_gelu"), path)
        con = sqlite3.connect(path)
        total = con.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        for sql in statements:
            con.execute(sql)
        con.commit()
        con.close()
        return path, total

    return make


# nsys declares start/end NOT NULL: a copy of the table without constraints takes the NULLs
UNCONSTRAINED = ("CREATE TABLE k2 AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL",
                 "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL",
                 "ALTER TABLE k2 RENAME TO CUPTI_ACTIVITY_KIND_KERNEL")


def _report(path, tmp_path):
    result = CliRunner().invoke(cli, ["report", str(path), "-o", str(tmp_path / "out"), "--json"])
    return result, (json.loads((tmp_path / "out" / "report.json").read_text()) if result.exit_code == 0 else None)


def test_end_before_start_rows_are_dropped_and_counted(edited, tmp_path):
    path, total = edited("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 5 WHERE rowid % 4 = 0")
    bad = sum(1 for i in range(1, total + 1) if i % 4 == 0)  # rowids are 1..total in an nsys export
    result, report = _report(path, tmp_path)
    assert result.exit_code == 0, result.output
    line = next(w for w in report["warnings"] if w.startswith("kernels:"))
    assert f"end before start: {bad}" in line and f"of {total} rows" in line
    assert 0 <= report["gpu_busy_percent"] <= 100


def test_null_starts_are_dropped_without_a_numpy_warning(edited, tmp_path):
    path, total = edited(*UNCONSTRAINED, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = NULL WHERE rowid % 3 = 0")
    bad = total // 3
    result, report = _report(path, tmp_path)
    assert result.exit_code == 0 and "RuntimeWarning" not in result.output
    assert any(f"NULL or non-numeric start/end: {bad}" in w for w in report["warnings"])


def test_text_in_an_integer_column_is_repaired_not_a_traceback(edited, tmp_path):
    path, total = edited("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridX = 'abc' WHERE rowid <= 5")
    result, report = _report(path, tmp_path)
    assert result.exit_code == 0, result.output
    assert any("non-numeric values set to NULL (rows kept): 5" in w for w in report["warnings"])


def test_every_kernel_dropped_is_a_one_line_error_that_says_so(edited, tmp_path):
    path, total = edited(*UNCONSTRAINED, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = NULL, end = NULL")
    result, _ = _report(path, tmp_path)
    assert result.exit_code == 3 and "Traceback" not in result.output
    assert f"all {total} kernel rows" in result.output and len(result.output.strip().splitlines()) == 1


def test_blobs_and_numbers_in_a_text_column_are_shown_as_text_and_counted():
    """NVTX texts stored as BLOBs (fuzz seeds 6002198, 6002753): decoded as UTF-8 with U+FFFD for
    bad bytes, numbers as their text, NULL kept, each repaired value counted; text-only columns
    come back as they were."""
    dropped: dict = {}
    values = pd.Series(["gpudiag:step 1", b"\x00\xff", None, 7, b"ok"], dtype=object)
    out = row_checks.as_text(values, "nvtx_ranges", dropped)
    assert out.tolist() == ["gpudiag:step 1", "\x00\ufffd", None, "7", "ok"]
    assert dropped == {"nvtx_ranges": {row_checks.NOT_TEXT: 3}}
    text = pd.Series(["a", None, "b"], dtype=object)
    assert row_checks.as_text(text, "nvtx_ranges", dropped) is text and dropped["nvtx_ranges"][row_checks.NOT_TEXT] == 3
