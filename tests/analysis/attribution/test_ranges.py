"""Attribution of kernels to steps, phases, modules and ops: the vectorized algorithms against
brute force, and their results on the real Swin-T captures."""

from __future__ import annotations

import json
from unittest import mock

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudiag import store
from gpudiag.analysis.attribution import ranges as ranges_mod
from gpudiag.analysis.attribution.ranges import find_steps, innermost_range, window_index

from conftest import ROOT


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


@settings(max_examples=200, deadline=None)
@given(nested_ranges_and_queries(), st.integers(0, 2))
def test_innermost_range_with_few_queries_matches_brute_force(case, kept):
    """Fewer queries than ranges (the host-compute stretches against every NVTX range): only the ranges
    holding a query are searched, and the answers are still the brute force's."""
    ranges, q_t, q_tid = case
    q_t, q_tid = q_t[:kept], q_tid[:kept]
    got = innermost_range(ranges, q_t, q_tid)
    assert list(got) == [brute_innermost(ranges, t, tid) for t, tid in zip(q_t, q_tid)]


def test_innermost_range_simple():
    ranges = pd.DataFrame({"start_ns": [0, 10, 20, 100], "end_ns": [50, 40, 30, 110], "global_tid": [1, 1, 1, 2]})
    got = innermost_range(ranges, np.array([5, 15, 25, 45, 50, 105, 25]), np.array([1, 1, 1, 1, 1, 2, 2]))
    assert list(got) == [0, 1, 2, 0, -1, 3, -1]


def test_window_index():
    starts, ends = np.array([0, 10, 30]), np.array([10, 20, 40])
    assert list(window_index(starts, ends, np.array([0, 9, 10, 25, 39, 40, np.nan]))) == [0, 0, 1, -1, 2, -1, -1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 60), max_size=12, unique=True),
       st.lists(st.one_of(st.integers(-5, 70), st.none()), max_size=40), st.integers(1, 5))
def test_window_index_in_slices_equals_the_whole_array_formula(bounds, times, rows):
    """window_index a few rows at a time (int64 or float times, NaN for none), with and without labels,
    equals the formula over the whole array at once (the oracle: what it computed before slicing)."""
    edges = np.sort(np.array(bounds, dtype=np.int64))
    starts, ends = edges[0::2][:len(edges) // 2], edges[1::2]
    ts = np.array([np.nan if t is None else t for t in times], dtype=float)
    if len(starts):
        i = np.searchsorted(starts.astype(float), ts, side="right") - 1
        ok = (i >= 0) & ~np.isnan(ts)
        ok[ok] &= ts[ok] < ends.astype(float)[i[ok]]
        want = np.where(ok, i, -1)
    else:
        want = np.full(len(ts), -1)
    labels = np.arange(len(starts), dtype=np.int64) * 10 + 3
    with mock.patch.object(ranges_mod, "SLICE_ROWS", rows):
        assert window_index(starts, ends, ts).tolist() == want.tolist()
        assert window_index(starts, ends, ts, labels=labels).tolist() == np.where(want >= 0, labels[want] if len(labels) else 0, -1).tolist()
        if not np.isnan(ts).any():
            assert window_index(starts, ends, ts.astype(np.int64)).tolist() == want.tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 40), max_size=50), st.lists(st.integers(-3, 40), max_size=20), st.integers(1, 7))
def test_isin_ids_in_slices_equals_numpy_isin(ids, wanted, rows):
    """The launch-call join's id lookup (a table over the wanted ids' range, a few ids at a time)
    equals numpy's isin, ids outside the range and an empty side included."""
    ids_a, wanted_a = np.array(ids, dtype=np.int64), np.array(wanted, dtype=np.int64)
    with mock.patch.object(ranges_mod, "SLICE_ROWS", rows):
        assert ranges_mod._isin_ids(ids_a, wanted_a).tolist() == np.isin(ids_a, wanted_a).tolist()


def test_window_index_without_windows_is_minus_one_per_time():
    """No windows (an export without phase ranges): one -1 per query time, an array of their shape."""
    got = window_index(np.array([]), np.array([]), np.array([5.0, np.nan, 7.0]))
    assert got.shape == (3,) and got.tolist() == [-1, -1, -1]


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


def test_whole_capture_without_kernels_is_an_empty_window(export_path):
    """tiny_gemm_gelu's API calls and NVTX ranges without its kernels (a capture stopped before the
    first one; the pipeline refuses such an export, a direct call does not): the whole-capture
    window starts at the first launch call and ends where it starts, [start, start + 1), holding
    no kernel; without launch calls either, at 0. Oracle: the first call's start, read with SQL."""
    import sqlite3

    from gpudiag.sources.nsys_sqlite import read_export

    path = export_path("tiny_gemm_gelu")
    with sqlite3.connect(path) as conn:
        first_call = conn.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    export = read_export(path)
    no_kernels = export.kernels.iloc[:0]
    steps = find_steps(export.nvtx_ranges, no_kernels, "nvtx:^no such range$", export.runtime_api)
    assert steps.kind == "whole"
    assert steps.table[["step", "start_ns", "end_ns"]].values.tolist() == [[0, first_call, first_call + 1]]
    nothing = find_steps(export.nvtx_ranges, no_kernels, "nvtx:^no such range$")
    assert nothing.table[["step", "start_ns", "end_ns"]].values.tolist() == [[0, 0, 1]]


def _edited_export(export_path, tmp_path, name: str, sql: str):
    """A copy of the real export ``name`` with ``sql`` applied (the copy's path)."""
    import shutil
    import sqlite3

    path = tmp_path / f"{name}_edited.sqlite"
    shutil.copyfile(export_path(name), path)
    with sqlite3.connect(path) as conn:
        conn.executescript(sql)
    return path


def test_nvtx_ranges_without_text_attribute_nothing(export_path, tmp_path):
    """NVTX ranges pushed with no message (text and registered string both NULL): the run
    database reads the text column back as objects (no value is a string), the ranges name no
    step, phase, module or op, and the analysis runs on the whole capture. The oracle is SQL on
    the edited export: every kernel in the one window, from the first launch call or kernel to
    one past the last kernel's end."""
    import sqlite3

    from gpudiag.analysis.ingest import ingest
    from gpudiag.analysis.pipeline import analyse

    path = _edited_export(export_path, tmp_path, "mlp_decode", "UPDATE NVTX_EVENTS SET text = NULL, textId = NULL;")
    with sqlite3.connect(path) as conn:
        n_ranges = conn.execute("SELECT count(*) FROM NVTX_EVENTS WHERE end IS NOT NULL").fetchone()[0]
        n_kernels, first_kernel, last_end = conn.execute(
            "SELECT count(*), min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
        first_call = conn.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    assert n_ranges > 100 and n_kernels > 0
    db = ingest(path, tmp_path / "run.sqlite")
    report = analyse(db)
    assert report["steps"]["kind"] == "whole" and report["steps"]["count"] == 1
    steps = pd.read_sql_query("SELECT * FROM steps", db.conn)
    assert steps[["cpu_start_ns", "cpu_end_ns"]].values.tolist() == [[min(first_kernel, first_call), last_end + 1]]
    assert steps["kernels"].tolist() == [n_kernels]
    a = pd.read_sql_query("SELECT * FROM kernel_attribution", store.queryable(db))
    assert len(a) == n_kernels and (a["step"] == 0).all()
    assert (a["module"] == "").all() and (a["module_class"] == "").all() and (a["phase"] == "other").all()
    assert (a["op"] == "").all() and (a["op_call"] == -1).all()


def test_nested_user_steps_pushed_in_the_same_ns(export_path, tmp_path):
    """Coarse timestamps: each of tiny_gemm_gelu's 'stepN' ranges gets three nested ranges that
    match the step pattern too ('iteration N.k', 'iter N.k', 'step N.k'), pushed after it in the
    same ns (so listed after it, as the export lists pushes) and popped before it. The steps are
    the outer ranges, whatever the order of the NVTX frame's rows beyond each thread's push order
    (here: newest ranges first). Oracle: the 'stepN' rows, read with SQL."""
    import sqlite3

    from gpudiag.sources.nsys_sqlite import read_export

    inner = "".join(
        f"""CREATE TEMP TABLE inner{k} AS SELECT * FROM NVTX_EVENTS WHERE text GLOB 'step[0-9]';
        UPDATE inner{k} SET end = start + (end - start) * {4 - k} / 4, text = '{label} ' || substr(text, 5) || '.{k}';
        INSERT INTO NVTX_EVENTS SELECT * FROM inner{k};
        """ for k, label in enumerate(["iteration", "iter", "step"], start=1))
    path = _edited_export(export_path, tmp_path, "tiny_gemm_gelu", inner)
    with sqlite3.connect(path) as conn:
        outer = [list(r) for r in conn.execute(
            "SELECT start, end FROM NVTX_EVENTS WHERE text GLOB 'step[0-9]' ORDER BY start")]
        # each outer range starts with three others in the same ns, all strictly inside it
        assert conn.execute("""SELECT count(*) FROM NVTX_EVENTS o JOIN NVTX_EVENTS i
                               ON i.start = o.start AND i.end < o.end AND i.rowid > o.rowid
                               WHERE o.text GLOB 'step[0-9]'""").fetchone()[0] == 3 * len(outer)
    assert len(outer) == 5
    export = read_export(path)
    nvtx = export.nvtx_ranges
    assert len(nvtx) == 20
    newest_first = nvtx.sort_values("start_ns", ascending=False, kind="stable")  # ties keep push order
    for frame in (nvtx, newest_first):
        steps = find_steps(frame, export.kernels)
        assert steps.kind == "nvtx"
        assert steps.table[["start_ns", "end_ns"]].values.tolist() == outer


def test_nested_modules_pushed_in_the_same_ns(export_path, tmp_path):
    """Coarse timestamps: in mlp_decode every 'module 0|Linear' range is moved to start in the same
    ns as its parent 'module Sequential' (the row before it in the export, its push). A kernel
    belongs to the innermost module range open on its launching thread at the launch call's
    start: the oracle finds it with SQL (the containing range that started last, then ends first)."""
    import sqlite3

    from gpudiag.analysis.ingest import ingest
    from gpudiag.analysis.pipeline import analyse

    path = _edited_export(export_path, tmp_path, "mlp_decode", """
        UPDATE NVTX_EVENTS SET start = (SELECT p.start FROM NVTX_EVENTS p WHERE p.rowid = NVTX_EVENTS.rowid - 1)
        WHERE text LIKE 'gpudiag:module 0|%'
          AND (SELECT p.text FROM NVTX_EVENTS p WHERE p.rowid = NVTX_EVENTS.rowid - 1) LIKE 'gpudiag:module Sequential|%';""")
    with sqlite3.connect(path) as conn:
        same_start = conn.execute("""SELECT count(*) FROM NVTX_EVENTS o JOIN NVTX_EVENTS i
                                     ON i.start = o.start AND i.end < o.end AND i.globalTid = o.globalTid
                                     WHERE o.text LIKE 'gpudiag:module Sequential|%' AND i.text LIKE 'gpudiag:module 0|%'""").fetchone()[0]
        oracle = dict(conn.execute("""
            SELECT k.correlationId, coalesce((SELECT substr(m.text, length('gpudiag:module ') + 1) FROM NVTX_EVENTS m
                     WHERE m.globalTid = r.globalTid AND m.start <= r.start AND r.start < m.end
                       AND m.text LIKE 'gpudiag:module %' ORDER BY m.start DESC, m.end ASC LIMIT 1), '')
            FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId"""))
        in_first_linear = sum(v == "0|Linear" for v in oracle.values())
    assert same_start == 96 and in_first_linear > 0
    db = ingest(path, tmp_path / "run.sqlite")
    analyse(db)
    a = pd.read_sql_query("""SELECT k.correlation_id, a.module, a.module_class FROM kernel_attribution a
                             JOIN kernels k USING (kernel_id)""", store.queryable(db))
    assert len(a) == len(oracle)
    got = dict(zip(a["correlation_id"], (a["module"] + "|" + a["module_class"]).str.strip("|")))
    assert got == oracle


def test_attribution_table_has_the_documented_columns(analysed):
    """The run database's kernel_attribution table (what a user queries) has the columns
    docs/architecture.md lists for it, in that order: kernel_id, the row key, first."""
    import re
    from pathlib import Path

    doc = (ROOT / "docs" / "architecture.md").read_text()
    row = re.search(r"^\| `kernel_attribution` \| [^|]+ \| ([^|]+) \|$", doc, re.M).group(1)
    documented = [c.split(" ")[0] for c in row.split(", ")]
    db, _ = analysed("mlp_decode")
    assert [r[1] for r in db.conn.execute("PRAGMA table_info(kernel_attribution)")] == documented


def test_module_kernels_inside_a_phase_take_the_phase(export_path, tmp_path):
    """The phase of a kernel is the phase range open at its launch call's start (any thread); a
    kernel outside every phase range is 'forward' when a module range is open on its launching
    thread, else 'other'. gpt2_train_bf16 edited as activation checkpointing would record it: each
    backward() recomputes a block first, so a module range is pushed on the autograd thread during
    the first half of every backward phase (its kernels are backward work, the first step's
    included). GPT2LMHeadModel's own kernels (outside its submodules, the earliest module range)
    are forward. Oracle: each kernel's phase from the edited export's ranges, in SQL."""
    import sqlite3

    from gpudiag.analysis.attribution.ranges import attribute
    from gpudiag.sources.nsys_sqlite import read_export

    path = _edited_export(export_path, tmp_path, "gpt2_train_bf16", """
        CREATE TEMP TABLE recompute AS SELECT e.* FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
          WHERE coalesce(e.text, s.value) = 'gpudiag:phase backward';
        UPDATE recompute SET
          globalTid = (SELECT r.globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN CUPTI_ACTIVITY_KIND_KERNEL k USING (correlationId)
                       WHERE r.start >= recompute.start AND r.start < recompute.end AND r.globalTid != recompute.globalTid LIMIT 1),
          end = start + (end - start) / 2, text = 'gpudiag:module transformer.h.11|GPT2Block', textId = NULL;
        INSERT INTO NVTX_EVENTS SELECT * FROM recompute;""")
    with sqlite3.connect(path) as conn:
        conn.executescript("""
            CREATE TEMP TABLE n AS SELECT e.start, e.end, e.globalTid AS tid, coalesce(e.text, s.value) AS text
              FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId WHERE e.end > e.start;
            CREATE TEMP TABLE phases AS SELECT start, end, substr(text, length('gpudiag:phase ') + 1) AS name FROM n
              WHERE text LIKE 'gpudiag:phase %';
            CREATE TEMP TABLE modules AS SELECT start, end, tid FROM n WHERE text LIKE 'gpudiag:module %';
            CREATE INDEX temp.modules_at ON modules (tid, start);
            CREATE TEMP TABLE launches AS SELECT k.correlationId AS corr, r.start, r.globalTid AS tid,
                (SELECT p.name FROM phases p WHERE p.start <= r.start AND r.start < p.end ORDER BY p.start LIMIT 1) AS phase,
                EXISTS (SELECT 1 FROM modules m WHERE m.tid = r.globalTid AND m.start <= r.start AND r.start < m.end) AS in_module
              FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r USING (correlationId);""")
        oracle = dict(conn.execute(
            "SELECT corr, coalesce(phase, CASE WHEN in_module THEN 'forward' ELSE 'other' END) FROM launches"))
        first_backward = conn.execute("SELECT min(start), min(end) FROM phases WHERE name = 'backward'").fetchone()
        recomputed_first = conn.execute("SELECT count(*) FROM launches WHERE in_module AND ? <= start AND start < ?",
                                        first_backward).fetchone()[0]
        earliest = conn.execute("SELECT start, end, tid FROM modules ORDER BY start LIMIT 1").fetchone()
        outermost_own = conn.execute("""SELECT count(*) FROM launches l WHERE l.tid = ? AND ? <= l.start AND l.start < ?
            AND NOT EXISTS (SELECT 1 FROM modules m WHERE m.tid = l.tid AND m.start <= l.start AND l.start < m.end
                            AND (m.start, m.end) != (?, ?))""", (earliest[2], *earliest[:2], *earliest[:2])).fetchone()[0]
        counts = dict(conn.execute("SELECT coalesce(phase, in_module), count(*) FROM launches GROUP BY 1"))
    # the edit gives backward kernels in module ranges, the first phase's among them
    assert recomputed_first > 0 and outermost_own > 0 and counts[1] > 0 and counts[0] > 0, counts
    export = read_export(path)
    steps = find_steps(export.nvtx_ranges, export.kernels, runtime_api=export.runtime_api)
    kernels = export.kernels.assign(kernel_id=np.arange(len(export.kernels)))  # as the run database numbers them
    a = attribute(kernels, export.runtime_api, export.nvtx_ranges, steps)
    assert len(a) == len(oracle)
    assert dict(zip(kernels["correlation_id"].tolist(), a["phase"].tolist())) == oracle


def test_op_range_without_an_op_name_is_shown_as_unknown(export_path, tmp_path):
    """An op range whose payload names no op (mlp_decode with ``"op":"aten::gelu",`` cut out of
    its GELU op ranges): the kernels those ranges launched are attributed to op "?", in the same
    op calls; every other kernel's op is as in the unedited export (the oracle: its analysis)."""
    from gpudiag.analysis.ingest import ingest
    from gpudiag.analysis.pipeline import analyse

    def attribution(path, folder):
        folder.mkdir()
        db = ingest(path, folder / "run.sqlite")
        analyse(db)
        return pd.read_sql_query("SELECT kernel_id, op, op_call FROM kernel_attribution ORDER BY kernel_id",
                                 store.queryable(db))

    edit = """UPDATE NVTX_EVENTS SET text = replace(text, '{"op":"aten::gelu",', '{')
              WHERE text LIKE 'gpudiag:op {"op":"aten::gelu",%';"""
    before = attribution(export_path("mlp_decode"), tmp_path / "before")
    after = attribution(_edited_export(export_path, tmp_path, "mlp_decode", edit), tmp_path / "after")
    gelu = (before["op"] == "aten::gelu").to_numpy()
    assert gelu.sum() > 0
    assert (after.loc[gelu, "op"] == "?").all()
    assert after.loc[~gelu, "op"].tolist() == before.loc[~gelu, "op"].tolist()
    assert after["op_call"].tolist() == before["op_call"].tolist()
