"""A long capture made by replicating a real one in time (issue 16's first case, issue 13's scale
benchmark): its report must give the original's per-step numbers, with three times the steps.

The oracle reads the original export with plain SQL and computes the step windows, busy time and
per-kernel time per step by interval arithmetic in Python, without gpudiag's reader or timeline.
"""

from __future__ import annotations

import sqlite3
import statistics

import pandas as pd
import pytest

from gpudiag.analysis.attribution.ranges import gpudiag_steps, run_flags
from gpudiag.analysis.ingest import ingest
from gpudiag.analysis.pipeline import analyse
from gpudiag.sources.replicate import replicate_export, timed_tables

COPIES = 3
WARMUP = 2  # gpudiag's default --warmup-steps


def _union_inside(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of ``intervals`` (sorted by start) inside [lo, hi)."""
    covered, cur_s, cur_e = 0, None, None
    for s, e in intervals:
        s, e = max(s, lo), min(e, hi)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            covered += (cur_e - cur_s) if cur_e is not None else 0
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return covered + ((cur_e - cur_s) if cur_e is not None else 0)


def oracle(path) -> dict:
    """Per-step numbers of a single-run gpudiag capture, from the raw export: steps are the step
    ranges less the one the tail range marks incomplete; a GPU activity (kernel, copy, memset)
    belongs to the step whose range holds its launch call's start; a step's window runs from the
    previous step's last GPU end to its own; the first ``WARMUP`` steps and the step with op ranges
    are not measured."""
    conn = sqlite3.connect(path)
    ranges = conn.execute("SELECT start, \"end\", text FROM NVTX_EVENTS WHERE text LIKE 'gpudiag:step %' "
                          "ORDER BY start").fetchall()
    tail = conn.execute("SELECT MIN(start) FROM NVTX_EVENTS WHERE text = 'gpudiag:tail'").fetchone()[0]
    ranges = [r for r in ranges if r[0] != max(x[0] for x in ranges if x[0] < tail)] if tail else ranges
    op_starts = [r[0] for r in conn.execute("SELECT start FROM NVTX_EVENTS WHERE text LIKE 'gpudiag:op %'")]
    acts = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        name = "k.demangledName" if table.endswith("KERNEL") else "NULL"
        acts += conn.execute(f"SELECT k.start, k.\"end\", r.start, {name} FROM {table} k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                             "ON r.correlationId = k.correlationId").fetchall()
    names = dict(conn.execute("SELECT id, value FROM StringIds"))
    intervals = sorted((s, e) for s, e, _, _ in acts)
    steps = []
    for i, (lo, hi, _) in enumerate(ranges):
        mine = [a for a in acts if lo <= a[2] < hi]
        if mine:
            steps.append({"i": i, "gpu_start": min(a[0] for a in mine), "gpu_end": max(a[1] for a in mine),
                          "kernels": [(names[a[3]], a[1] - a[0]) for a in mine if a[3] is not None],
                          "detail": any(lo <= t < hi for t in op_starts)})
    end_so_far = None
    for s in steps:
        start = s["gpu_start"] if end_so_far is None else end_so_far
        end_so_far = max(s["gpu_end"], end_so_far or s["gpu_end"])
        s["time"] = end_so_far - start
        s["busy"] = _union_inside(intervals, start, end_so_far)
    measured = [s for n, s in enumerate(steps) if n >= WARMUP and not s["detail"]]
    per_kernel: dict[str, float] = {}
    for s in measured:
        for name, ns in s["kernels"]:
            per_kernel[name] = per_kernel.get(name, 0) + ns / len(measured)
    times = [s["time"] for s in measured]
    assert max(times) <= 1.5 * statistics.median(times)  # no outlier step: the report's steady state is all of them
    return {"steps": len(steps), "median_ns": statistics.median(times),
            "busy_percent": 100.0 * sum(s["busy"] for s in measured) / sum(times), "per_kernel": per_kernel}


def _check(report: dict, expected: dict, steps: int) -> None:
    assert report["steps"]["count"] == steps
    assert report["steps"]["step_time_ns"]["median"] == expected["median_ns"]
    assert report["gpu_busy_percent"] == pytest.approx(expected["busy_percent"], rel=1e-12)
    for row in report["top_kernels"]:
        assert row["time_ns_per_step"] == pytest.approx(expected["per_kernel"][row["name"]], rel=1e-12)


def test_replicated_gpt2_keeps_the_original_per_step_numbers(export_path, tmp_path):
    """Issue 16: GPT-2 replicated in time gave 972 steps with a median step of 0 ns (step numbers
    repeat in every copy). Three copies: three times the steps, the original's numbers."""
    original = export_path("gpt2_train_bf16")
    expected = oracle(original)
    replica = replicate_export(original, tmp_path / "gpt2_x3.sqlite", COPIES)
    report = analyse(ingest(replica.path, tmp_path / "run.sqlite"))
    _check(analyse(ingest(original, tmp_path / "orig.sqlite")), expected, expected["steps"])
    _check(report, expected, COPIES * expected["steps"])
    assert report["steps"]["warmup_steps"] == COPIES * WARMUP
    assert all(r["saving_ns_per_step"] <= report["steps"]["step_time_ns"]["median"] for r in report["recommendations"])


def test_replication_copies_every_timed_row_with_unique_ids(export_path, tmp_path):
    """Every time-stamped table holds COPIES times its rows; correlation ids stay unique per table;
    copy k's rows are the original's shifted by k periods."""
    original = export_path("input_pipeline_good")
    replica = replicate_export(original, tmp_path / "x.sqlite", COPIES)
    src, dst = sqlite3.connect(original), sqlite3.connect(replica.path)
    for table in timed_tables(src):
        n = src.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0]
        assert dst.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0] == COPIES * n, table
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"):
        total, distinct = dst.execute(f"SELECT COUNT(correlationId), COUNT(DISTINCT correlationId) FROM {table}").fetchone()
        assert total == distinct == COPIES * src.execute(f"SELECT COUNT(DISTINCT correlationId) FROM {table}").fetchone()[0]
    first = src.execute("SELECT start, \"end\" FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start").fetchall()
    last = dst.execute(f"SELECT start - {2 * replica.period_ns}, \"end\" - {2 * replica.period_ns} FROM "
                       f"CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start DESC LIMIT {len(first)}").fetchall()
    assert sorted(last) == first


def _ranges(numbers: list[int], tails_after: list[int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Step ranges 10 ns apart with the given numbers, and tail ranges right after the given ones."""
    steps = pd.DataFrame({"start_ns": [10 * i for i in range(len(numbers))],
                          "end_ns": [10 * i + 9 for i in range(len(numbers))],
                          "text": [f"gpudiag:step {n}" for n in numbers]})
    tails = pd.DataFrame({"start_ns": [10 * i + 9 for i in tails_after], "end_ns": [10 * i + 9 for i in tails_after],
                          "text": "gpudiag:tail"})
    return steps, tails


def test_one_run_keeps_the_launchers_numbers():
    steps = gpudiag_steps(*_ranges([0, 1, 2, 3, 4], tails_after=[4]))
    assert steps.runs is None and steps.table["step"].tolist() == [0, 1, 2, 3]


def test_runs_start_where_the_numbers_restart_and_each_tail_drops_its_step():
    steps = gpudiag_steps(*_ranges([0, 1, 2, 3, 0, 1, 2, 3, 0, 1], tails_after=[3, 7]))
    assert steps.table["step"].tolist() == list(range(8))
    assert steps.runs["run"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    assert steps.runs["run_step"].tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    st = pd.DataFrame({"step": range(8), "warmup": False, "detail": False, "measured": True})
    flagged = run_flags(st, steps, warmup_steps=1, detail_step=1)
    assert flagged["warmup"].tolist() == [True, False, False] * 2 + [True, False]
    assert flagged["detail"].tolist() == [False, True, False] * 2 + [False, True]
    assert flagged["measured"].tolist() == [False, False, True] * 2 + [False, False]
