"""The nsys SQLite reader, anchored on NVIDIA's own `nsys stats --report cuda_gpu_kern_sum`
output captured on the device for the same exports."""

from __future__ import annotations

import shutil
import sqlite3

import pandas as pd
import pytest

from gpudiag.analysis.ingest import ingest
from gpudiag.analysis.pipeline import analyse
from gpudiag.sources.nsys_sqlite import ExportError, kernel_summary, read_export

from conftest import FIXTURES

CAPTURES = ["swin_t_train_bf16", "swin_t_train_fp32", "swin_t_train_bf16_repeat", "swin_t_train_bf16_bare",
            "swin_t_train_bf16_crash"]


@pytest.mark.parametrize("name", CAPTURES)
def test_kernel_summary_equals_nsys_stats(export_path, name):
    """Every kernel name, count, total, min, max and median equals nsys's; the mean, standard
    deviation and percentage equal it within nsys's one-decimal rounding."""
    ours = kernel_summary(read_export(export_path(name)).kernels)
    nsys = pd.read_csv(FIXTURES / "nsys_stats" / f"{name}.cuda_gpu_kern_sum.csv")
    merged = nsys.merge(ours, left_on="Name", right_on="name", how="outer", indicator=True)
    assert (merged["_merge"] == "both").all(), merged.loc[merged["_merge"] != "both", ["Name", "name"]]
    for theirs, mine in (("Total Time (ns)", "total_ns"), ("Instances", "instances"), ("Min (ns)", "min_ns"),
                         ("Max (ns)", "max_ns"), ("Med (ns)", "med_ns")):
        assert (merged[theirs] - merged[mine]).abs().max() <= 0.5, theirs
    for theirs, mine in (("Avg (ns)", "avg_ns"), ("StdDev (ns)", "stddev_ns"), ("Time (%)", "time_percent")):
        assert (merged[theirs] - merged[mine]).abs().max() <= 0.051, theirs
    assert list(ours["name"][:10]) == list(nsys["Name"][:10])  # same order: by total time


def test_reader_resolves_names_and_joins_pids(export_path):
    export = read_export(export_path("swin_t_train_bf16"))
    k = export.kernels
    assert k["name"].notna().all() and k["short_name"].notna().all()
    assert (k["duration_ns"] > 0).all() and k["start_ns"].is_monotonic_increasing
    assert export.devices.loc[0, "name"] == "NVIDIA H200"
    assert export.devices.loc[0, "memory_bandwidth_bytes_per_s"] > 1e12  # bytes/s, not GB/s
    # globalPid derived from globalTid matches the kernels' own globalPid
    assert set(export.runtime_api["global_pid"].dropna().unique()) >= set(k["global_pid"].unique())
    texts = export.nvtx_ranges["text"]
    assert texts.str.startswith("gpudiag:step ").sum() == 11  # 10 steps + the incomplete tail step
    assert texts.str.startswith("gpudiag:op ").sum() > 1000


def test_absent_tables_are_reported_not_fatal(export_path, tmp_path):
    """An export without NVTX or runtime API tables (tracing off) still reads and analyses; the
    missing core tables are listed (an empty memcpy table is normal, not "missing")."""
    copy = tmp_path / "stripped.sqlite"
    shutil.copy(export_path("swin_t_train_bf16"), copy)
    with sqlite3.connect(copy) as conn:
        conn.execute("DROP TABLE NVTX_EVENTS")
        conn.execute("DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME")
        conn.execute("DROP TABLE CUPTI_ACTIVITY_KIND_MEMCPY")
    export = read_export(copy)
    assert {"NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME"} <= set(export.missing)
    assert "CUPTI_ACTIVITY_KIND_MEMCPY" not in export.missing
    assert export.nvtx_ranges.empty and export.runtime_api.empty and len(export.kernels) > 10000
    report = analyse(ingest(copy, tmp_path / "run.sqlite"))
    assert report["steps"]["kind"] == "whole" and report["steps"]["count"] == 1
    assert any("no CUDA API calls" in w for w in report["warnings"])
    assert any("CUPTI_ACTIVITY_KIND_RUNTIME" in w for w in report["warnings"])
    # every kernel is in the one window (placed by its own start time, there being no launch calls)
    assert report["steps"]["per_step"][0]["kernels"] == len(export.kernels)


def test_not_an_export(tmp_path):
    text = tmp_path / "notes.sqlite"
    text.write_text("hello")
    with pytest.raises(ExportError, match="not an SQLite file"):
        read_export(text)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(ExportError, match="not an nsys export"):
        read_export(other)
    with pytest.raises(ExportError, match="no such file"):
        read_export(tmp_path / "missing.sqlite")


def test_empty_files_and_nsys_reports(tmp_path):
    """sqlite3 opens an empty file as an empty database: the reader says "empty" instead of "not an
    nsys export", and points a .nsys-rep at nsys export."""
    empty = tmp_path / "profile.sqlite"
    empty.write_bytes(b"")
    with pytest.raises(ExportError, match=r"profile.sqlite: empty file \(0 bytes\)"):
        read_export(empty)
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"")
    with pytest.raises(ExportError, match=r"run.nsys-rep: empty file .* nsys export --type sqlite -o run.sqlite run.nsys-rep"):
        read_export(rep)
    rep.write_bytes(b"not sqlite at all")
    with pytest.raises(ExportError, match=r"run.nsys-rep: an Nsight Systems report, not its SQLite export; export it first"):
        read_export(rep)
    damaged = tmp_path / "damaged.sqlite"
    damaged.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    with pytest.raises(ExportError, match="damaged.sqlite: a damaged SQLite file"):
        read_export(damaged)
