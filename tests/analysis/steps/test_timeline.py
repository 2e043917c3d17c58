"""Step times, busy/idle accounting and host-bound gaps: interval algebra against brute force, and
the accounting identities on the real captures."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudiag.analysis.steps.timeline import covered_ns, merge_intervals

from conftest import FIXTURES

intervals = st.lists(st.tuples(st.integers(0, 200), st.integers(1, 30)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(intervals, st.lists(st.tuples(st.integers(0, 250), st.integers(0, 80)), min_size=1, max_size=10))
def test_covered_ns_matches_a_bitmap(ivs, windows):
    starts = np.array([s for s, _ in ivs], dtype=np.int64)
    ends = np.array([s + d for s, d in ivs], dtype=np.int64)
    bitmap = np.zeros(400, dtype=bool)
    for s, e in zip(starts, ends):
        bitmap[s:e] = True
    m_s, m_e = merge_intervals(starts, ends)
    assert (m_s[1:] > m_e[:-1]).all()  # disjoint, sorted, not touching
    w_s = np.array([a for a, _ in windows], dtype=np.int64)
    w_e = w_s + np.array([b for _, b in windows], dtype=np.int64)
    got = covered_ns(m_s, m_e, w_s, w_e)
    assert list(got) == [int(bitmap[a:b].sum()) for a, b in zip(w_s, w_e)]


@settings(max_examples=200, deadline=None)
@given(intervals, st.randoms(use_true_random=False))
def test_merge_intervals_is_the_same_for_rows_in_start_order_and_shuffled(ivs, rnd):
    """Rows already in start order skip the sort (the usual export); the union is the bitmap's either way."""
    ordered = sorted(ivs)
    shuffled = list(ordered)
    rnd.shuffle(shuffled)
    bitmap = np.zeros(400, dtype=bool)
    for s, d in ordered:
        bitmap[s:s + d] = True
    for rows in (ordered, shuffled):
        m_s, m_e = merge_intervals(np.array([s for s, _ in rows], dtype=np.int64),
                                   np.array([s + d for s, d in rows], dtype=np.int64))
        got = np.zeros(400, dtype=bool)
        for a, b in zip(m_s, m_e):
            got[a:b] = True
        assert (got == bitmap).all() and (m_s[1:] > m_e[:-1]).all()


def test_step_accounting_identities(analysed):
    for name in ("swin_t_train_bf16", "swin_t_train_fp32", "swin_t_train_bf16_bare"):
        _, r = analysed(name)
        measured = [s for s in r["steps"]["per_step"] if s["measured"]]
        assert len(measured) >= 7
        for s in measured:
            assert 0 < s["busy_ns"] <= s["step_time_ns"]
            parts = s["compute_ns"] + s["bandwidth_ns"] + s["overhead_ns"] + s["other_idle_ns"]
            assert abs(parts - s["step_time_ns"]) <= 1e-6 * s["step_time_ns"] + 1, name
        shares = r["breakdown_percent"]
        assert abs(sum(shares.values()) - 100.0) < 1e-6


def test_bf16_swin_is_host_bound_and_fp32_is_not(analysed):
    """Measured on the H200: bf16 Swin-T at batch 32 leaves the GPU idle ~40 % of each step waiting
    for Python to launch ~1360 kernels; fp32 keeps it >90 % busy with SIMT GEMMs."""
    _, bf16 = analysed("swin_t_train_bf16")
    _, fp32 = analysed("swin_t_train_fp32")
    assert bf16["gpu_busy_percent"] < 70 < 90 < fp32["gpu_busy_percent"]
    assert bf16["idle"]["host_bound_idle_ns_per_step"] > 0.25 * bf16["steps"]["step_time_ns"]["median"]
    assert fp32["idle"]["host_bound_idle_ns_per_step"] < 0.05 * fp32["steps"]["step_time_ns"]["median"]
    assert bf16["breakdown_percent"]["overhead"] > bf16["breakdown_percent"]["compute"]
    waits = {w["short_name"] for w in bf16["idle"]["top_waiting_kernels"]}
    assert waits  # the kernels that waited are named
    stream = bf16["idle"]["streams"][0]
    assert stream["host_bound_gaps_per_step"] > 100


def test_detail_step_overhead_is_measured_and_excluded(analysed):
    _, r = analysed("swin_t_train_bf16")
    inst = r["instrumentation"]
    assert inst["detail_step"] == 2 and inst["op_calls_recorded"] > 1000
    assert inst["detail_step_time_ns"] > inst["median_step_time_ns"]
    detail = [s for s in r["steps"]["per_step"] if s["step"] == 2][0]
    assert detail["detail"] and not detail["measured"]
    assert [s["step"] for s in r["steps"]["per_step"] if s["warmup"]] == [0, 1]


def test_busy_time_against_an_independent_bitmap(analysed, export_path):
    """Busy time of one real step recomputed from the raw export with a 1-ns bitmap."""
    import sqlite3

    db, r = analysed("swin_t_train_bf16")
    steps = {row["step"]: row for row in db["steps"].rows}
    step = steps[5]
    lo, hi = int(step["window_start_ns"]), int(step["gpu_end_ns"])
    bitmap = np.zeros(hi - lo, dtype=bool)
    with sqlite3.connect(export_path("swin_t_train_bf16")) as conn:
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            for start, end in conn.execute(f"SELECT start, end FROM {table} WHERE end > ? AND start < ?", (lo, hi)):
                bitmap[max(start, lo) - lo:min(end, hi) - lo] = True
    assert int(bitmap.sum()) == step["busy_ns"]
    entry = next(s for s in r["steps"]["per_step"] if s["step"] == 5)
    assert entry["host_bound_idle_ns"] <= entry["idle_ns"]
    assert entry["busy_ns"] == step["busy_ns"]


def test_two_processes_report_the_busier_one(export_path, tmp_path):
    """An export where a second process ran a copy of half the kernels: the report covers the
    busier process (the original), says so, and its numbers equal the single-process report."""
    import shutil
    import sqlite3

    from gpudiag.analysis.ingest import ingest
    from gpudiag.analysis.pipeline import analyse

    copy = tmp_path / "two.sqlite"
    shutil.copy(export_path("tiny_gemm_gelu"), copy)
    other = 1 << 40  # another globalPid (pids live in bits 24..)
    with sqlite3.connect(copy) as conn:
        cols = [c[1] for c in conn.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")]
        select = ", ".join(f"globalPid + {other}" if c == "globalPid" else c for c in cols)
        conn.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL ({', '.join(cols)}) "
                     f"SELECT {select} FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid % 2 = 0")
    single = analyse(ingest(export_path("tiny_gemm_gelu"), tmp_path / "one.run.sqlite"))
    double = analyse(ingest(copy, tmp_path / "two.run.sqlite"))
    assert any("2 processes launched kernels" in w for w in double["warnings"])
    assert double["steps"]["step_time_ns"] == single["steps"]["step_time_ns"]
    assert double["top_kernels"] == single["top_kernels"]


def test_idle_ended_by_a_copy_is_named_as_such(tmp_path):
    """A batch-1 encoder with `.cpu()` per request (tests/fixtures/trials/encoder_h100, H100): most of
    its host-bound idle ends at the device-to-host copy, not at a kernel; the table says so rather
    than naming a kernel "nan"."""
    import json
    import lzma
    import shutil

    from conftest import FIXTURES
    from gpudiag.analysis.ingest import ingest
    from gpudiag.analysis.pipeline import analyse

    src = FIXTURES / "trials" / "encoder_h100"
    with lzma.open(src / "profile.sqlite.xz") as a, open(tmp_path / "p.sqlite", "wb") as b:
        shutil.copyfileobj(a, b)
    status = json.loads((src / "script_status.json").read_text())
    waits = analyse(ingest(tmp_path / "p.sqlite", tmp_path / "run.sqlite"), status=status)["idle"]["top_waiting_kernels"]
    names = [w["short_name"] for w in waits]
    assert "nan" not in names and names[0] == "(a copy or memset, not a kernel)"
