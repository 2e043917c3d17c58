"""Attribution of kernels to steps, phases, modules and ops: the vectorized algorithms against
brute force, and their results on the real Swin-T captures."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudiag.analysis.attribution.ranges import find_steps, innermost_range, window_index


@st.composite
def nested_ranges_and_queries(draw):
    """Random push/pop sequences on up to 3 threads (properly nested per thread) plus query times."""
    rows = []
    for tid in range(draw(st.integers(1, 3))):
        t, stack = 0, []
        for action in draw(st.lists(st.sampled_from(["push", "pop", "wait"]), max_size=40)):
            t += draw(st.integers(0, 3))
            if action == "push":
                stack.append(len(rows))
                rows.append([t, None, tid])
            elif action == "pop" and stack:
                rows[stack.pop()][1] = t
        while stack:
            t += 1
            rows[stack.pop()][1] = t
    ranges = pd.DataFrame(rows, columns=["start_ns", "end_ns", "global_tid"]).astype("int64")
    q = draw(st.lists(st.tuples(st.integers(0, 130), st.integers(0, 2)), max_size=30))
    return ranges, np.array([x for x, _ in q], dtype=np.int64), np.array([y for _, y in q], dtype=np.int64)


def brute_innermost(ranges, t, tid):
    inside = ranges[(ranges.global_tid == tid) & (ranges.start_ns <= t) & (t < ranges.end_ns)]
    if inside.empty:
        return -1
    # innermost = latest start; among equal starts the later-pushed one (higher row index)
    best = inside[inside.start_ns == inside.start_ns.max()]
    return int(best.index.max())


@settings(max_examples=200, deadline=None)
@given(nested_ranges_and_queries())
def test_innermost_range_matches_brute_force(case):
    ranges, q_t, q_tid = case
    got = innermost_range(ranges, q_t, q_tid)
    want = [brute_innermost(ranges, t, tid) for t, tid in zip(q_t, q_tid)]
    # Zero-length ranges contain nothing; with equal starts the deeper range wins in both.
    assert list(got) == want


def test_innermost_range_simple():
    ranges = pd.DataFrame({"start_ns": [0, 10, 20, 100], "end_ns": [50, 40, 30, 110], "global_tid": [1, 1, 1, 2]})
    got = innermost_range(ranges, np.array([5, 15, 25, 45, 50, 105, 25]), np.array([1, 1, 1, 1, 1, 2, 2]))
    assert list(got) == [0, 1, 2, 0, -1, 3, -1]


def test_window_index():
    starts, ends = np.array([0, 10, 30]), np.array([10, 20, 40])
    assert list(window_index(starts, ends, np.array([0, 9, 10, 25, 39, 40, np.nan]))) == [0, 0, 1, -1, 2, -1, -1]


def test_swin_steps_phases_modules_ops(analysed):
    db, report = analysed("swin_t_train_bf16")
    a = pd.read_sql_query("SELECT * FROM kernel_attribution", db.conn)
    assert a["api_start_ns"].notna().all()  # every kernel joined to its launch call
    in_steps = a[a["step"] >= 0]
    assert sorted(in_steps["step"].unique()) == list(range(10))  # the tail step is not a step
    per_step = in_steps.groupby("step").size()
    assert per_step.loc[3:].nunique() == 1  # steady state: same kernel count every step
    phases = in_steps[in_steps["step"] == 5].groupby("phase").size()
    assert set(phases.index) == {"forward", "backward", "optimizer"}
    assert phases["backward"] > phases["forward"] > phases["optimizer"] > 0
    fwd = in_steps[in_steps["phase"] == "forward"]
    assert (fwd["module"] != "").all()  # every forward kernel is inside a module range
    assert fwd["module"].str.fullmatch(r"layers\.\d\.blocks\.\d\.attn.*").any()
    # per-op attribution only on the detail step, with parsable shapes
    with_op = a[a["op"] != ""]
    assert set(with_op["step"]) == {report["steps"]["detail_step"]} == {2}
    payload = json.loads(with_op[with_op["op"] == "aten::addmm"]["op_args"].iloc[0])
    assert payload["op"] == "aten::addmm" and payload["out"].startswith("bfloat16[")
    assert (with_op["op"] == "aten::roll").any()


def test_swin_module_rows_split_inclusive_time_by_class(analysed):
    """Each module row's compute + bandwidth + overhead time per step adds up to its inclusive
    time per step; Swin-T's window attention spends more time bandwidth-bound than compute-bound."""
    _, report = analysed("swin_t_train_bf16")
    rows = {m["module"]: m for m in report["modules"]}
    assert rows
    for m in rows.values():
        parts = [m[f"{c}_ns_per_step"] for c in ("compute", "bandwidth", "overhead")]
        assert all(isinstance(p, float) and p >= 0 for p in parts), m
        assert np.isclose(sum(parts), m["inclusive_ns_per_step"], rtol=1e-6, atol=0), m
    attn = rows["layers.0.blocks.1.attn"]
    assert attn["bandwidth_ns_per_step"] > attn["compute_ns_per_step"]


def test_user_ranges_define_steps_when_there_are_no_gpudiag_ranges(analysed):
    """tiny_gemm_gelu was captured by a plain script with its own 'step0'..'step4' ranges."""
    _, report = analysed("tiny_gemm_gelu")
    assert report["steps"]["kind"] == "nvtx"
    assert report["steps"]["count"] == 5  # step0..step4


def test_steps_from_regex_and_whole_capture(export_path):
    from gpudiag.sources.nsys_sqlite import read_export

    export = read_export(export_path("tiny_gemm_gelu"))
    only_first = find_steps(export.nvtx_ranges, export.kernels, "nvtx:^step0$")
    assert only_first.kind == "nvtx" and len(only_first.table) == 1
    none = find_steps(export.nvtx_ranges, export.kernels, "nvtx:^no such range$")
    assert none.kind == "whole" and "whole capture" in none.source
