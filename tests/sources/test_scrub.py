"""Scrubbing an export removes machine paths and environments and changes no measurement."""

from __future__ import annotations

import shutil
import sqlite3

from gpudiag.sources.nsys_sqlite import kernel_summary, read_export
from gpudiag.sources.scrub import ENV_REMOVED, scrub, scrub_text


def test_scrub_text():
    assert scrub_text("/home/alice/proj/train.py --epochs 1") == "train.py --epochs 1"
    assert scrub_text("PATH=/usr/local/bin:/opt/x/bin") == "PATH=bin:bin"
    assert scrub_text("A=1\x00B=2\x00HOME=/root") == ENV_REMOVED
    kernel = "void at::native::reduce_kernel<(int)128, (int)4>(T3)"
    assert scrub_text(kernel) == kernel
    assert scrub_text("ratio 3/4 and a/b") == "ratio 3/4 and a/b"


def test_scrub_a_real_export(export_path, tmp_path):
    copy = tmp_path / "x.sqlite"
    shutil.copy(export_path("tiny_gemm_gelu"), copy)
    with sqlite3.connect(copy) as conn:  # plant what captures leak
        conn.execute("INSERT INTO StringIds (id, value) VALUES (999999, '/home/alice/secret/run.py')")
        conn.execute("INSERT INTO StringIds (id, value) VALUES (999998, 'TOKEN=abc' || char(0) || 'HOME=/root' || char(0) || 'X=1')")
    before = kernel_summary(read_export(copy).kernels)
    assert scrub(copy) >= 2
    raw = copy.read_bytes()
    assert b"/home/alice" not in raw and b"TOKEN=abc" not in raw  # gone from free pages too (VACUUM)
    after = kernel_summary(read_export(copy).kernels)
    assert before.equals(after)


def test_scrubbed_fixture_keeps_driver_but_not_host(export_path):
    export = read_export(export_path("swin_t_train_bf16"))
    assert export.environment["driver_version"] == "580.159.04"
    assert export.environment["os"].startswith("Ubuntu")
    with sqlite3.connect(export_path("swin_t_train_bf16")) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM TARGET_INFO_SYSTEM_ENV")}
    assert "Hostname" not in names and "DeviceEnvironment" not in names
