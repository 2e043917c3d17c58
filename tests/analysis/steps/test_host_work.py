"""Launch-bound idle against host compute (gpudiag.analysis.steps.host_work, GD-HOST-COMPUTE) on
real captures (H100/H200, tests/fixtures, examples).

The oracle is interval arithmetic written here, on the export itself (sqlite3): the gap's ending
activity and its launch call give the thread, the thread's CUDA calls give its free stretches, and
gpudiag's NVTX ranges say whether a stretch lies inside the model's own execution. Edited copies of
real exports (a CPU stretch inserted by shifting every later timestamp) show the rules moving with
the split: GD-HOST-COMPUTE appears, GD-OVERHEAD-BOUND's saving shrinks by exactly what became host
compute, and a served model that makes its input on the CPU gets host-side advice first.
"""

from __future__ import annotations

import bisect
import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudiag.analysis.ingest import ingest
from gpudiag.analysis.steps import host_work
from gpudiag.analysis.rules.host_floor import GPU_ONLY_RULES
from gpudiag.analysis.steps.host_work import HOST_COMPUTE_STRETCH_NS
from conftest import FIXTURES, status_of

TRIALS = FIXTURES / "trials"

THRESHOLD = HOST_COMPUTE_STRETCH_NS
MODULE, PHASE, GRAPH = "gpudiag:module ", "gpudiag:phase ", "gpudiag:graph "


# --- the oracle: the export read with SQL, stretches by hand ---------------------------------------------------------

class Oracle:
    """One export's threads, calls and ranges, read with SQL; the split of a gap computed by hand."""

    def __init__(self, path):
        self.con = sqlite3.connect(path)
        tables = {t for (t,) in self.con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        self.api = [t for t in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER") if t in tables]
        self.calls: dict[int, tuple[list, list, list]] = {}
        # each GPU activity's start -> the threads of its launch call (same correlation id, same process)
        self.launchers: dict[int, set] = {}
        for act in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            for api in self.api if act in tables else ():
                for start, tid in self.con.execute(
                        f"SELECT a.start, r.globalTid FROM {act} a JOIN {api} r ON r.correlationId = a.correlationId "
                        "AND (r.globalTid >> 24) = (a.globalPid >> 24)"):
                    self.launchers.setdefault(start, set()).add(tid)
        text = "COALESCE(n.text, (SELECT value FROM StringIds s WHERE s.id = n.textId))"
        ranges = self.con.execute(f"SELECT n.start, n.end, n.globalTid, {text} FROM NVTX_EVENTS n WHERE n.end IS NOT NULL "
                                  f"AND ({text} LIKE '{MODULE}%' OR {text} LIKE '{PHASE}%' OR {text} LIKE '{GRAPH}%')").fetchall()
        self.modules: dict[int, np.ndarray] = {}
        for tid in {r[2] for r in ranges if r[3].startswith(MODULE)}:
            self.modules[tid] = np.array([(a, b) for a, b, t, x in ranges if t == tid and x.startswith(MODULE)], dtype=float)
        self.spans = np.array([(a, b) for a, b, _, x in ranges if not x.startswith(MODULE)], dtype=float).reshape(-1, 2)

    def thread(self, end_ns: int) -> int:
        """The thread whose call launched the GPU activity that starts at ``end_ns`` (the gap's end)."""
        found = self.launchers.get(end_ns, set())
        assert len(found) == 1, (end_ns, found)
        return next(iter(found))

    def free(self, tid: int) -> tuple[list, list, list]:
        """The thread's free stretches (between the union's blocks of its calls; open at both ends)
        and, per stretch, the name of the last call that started before it."""
        if tid not in self.calls:
            rows = sorted(r for api in self.api for r in self.con.execute(
                f"SELECT start, end FROM {api} WHERE globalTid = ? AND start IS NOT NULL AND end IS NOT NULL", (tid,)))
            blocks: list[list[int]] = []
            for s, e in rows:
                if blocks and s <= blocks[-1][1]:
                    blocks[-1][1] = max(blocks[-1][1], e)
                else:
                    blocks.append([s, e])
            starts = [-np.inf] + [b[1] for b in blocks]
            ends = [b[0] for b in blocks] + [np.inf]
            self.calls[tid] = (starts, ends, blocks)
        return self.calls[tid]

    def in_model(self, t: float, tid: int) -> bool:
        """Whether time ``t`` is inside a gpudiag module range on ``tid`` or a phase/graph range
        on any thread."""
        module = self.modules.get(tid, np.zeros((0, 2)))
        return bool(((module[:, 0] <= t) & (module[:, 1] > t)).any() or
                    ((self.spans[:, 0] <= t) & (self.spans[:, 1] > t)).any())

    def long_stretches(self, a: int, b: int, tid: int) -> list[tuple[int, int, bool]]:
        """The thread's stretches longer than the threshold that meet the gap [a, b): (part's start,
        part's end, inside the model?)."""
        starts, ends, _ = self.free(tid)
        out = []
        i = max(bisect.bisect_right(starts, a) - 1, 0)
        while i < len(starts) and starts[i] < b:
            s, e = max(starts[i], a), min(ends[i], b)
            if e > s and ends[i] - starts[i] > THRESHOLD:
                out.append((int(s), int(e), self.in_model((s + e) / 2, tid)))
            i += 1
        return out

    def split(self, a: int, b: int) -> tuple[int, int]:
        """(launch-bound ns, host-compute ns) of the host-bound gap [a, b)."""
        tid = self.thread(b)
        host = sum(e - s for s, e, model in self.long_stretches(a, b, tid) if not model)
        return (b - a) - host, host

    def longest_free_outside(self, a: int, b: int) -> tuple[int, int] | None:
        """The longest part of a free stretch inside [a, b) of the gap's thread that lies outside
        the model (where CPU work can be inserted): (start, end), None without one."""
        tid = self.thread(b)
        starts, ends, _ = self.free(tid)
        best = None
        i = max(bisect.bisect_right(starts, a) - 1, 0)
        while i < len(starts) and starts[i] < b:
            s, e = int(max(starts[i], a)), int(min(ends[i], b))
            if e > s and not self.in_model((s + e) // 2, tid) and (best is None or e - s > best[1] - best[0]):
                best = (s, e)
            i += 1
        return best


@pytest.fixture(scope="module")
def oracle(export_path):
    cache: dict[str, Oracle] = {}

    def get(name: str) -> Oracle:
        if name not in cache:
            cache[name] = Oracle(export_path(name))
        return cache[name]

    return get


def _ctx(analysed, rule_contexts, name: str):
    """(report, the RuleContext its analysis gave the rules) of a capture of conftest's list."""
    _, report = analysed(name)
    return report, rule_contexts[1][name]


def _host_bound(ctx):
    return ctx.idle[ctx.idle["host_bound"]]


# --- the split against the oracle -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,sample", [
    ("input_pipeline_bad", None),  # CPU augmentation in the main process: every measured gap
    ("zoo_bert_compile", 60),  # compiled training: 1-3 ms stretches inside the model (launch-bound)
    ("swin_t_train_bf16", 60),  # eager, launch-bound
])
def test_split_of_each_gap_is_the_oracles(analysed, rule_contexts, oracle, name, sample):
    """Per host-bound gap of the measured steps (all, or the ``sample`` longest plus as many
    others), launch_bound_ns and host_compute_ns equal the oracle's, to the ns; they add up to the
    gap, and other idle has neither."""
    _, ctx = _ctx(analysed, rule_contexts, name)
    gaps = _host_bound(ctx)
    if sample:
        rest = gaps.drop(gaps.nlargest(sample, "duration_ns").index).sample(sample, random_state=0)
        gaps = gaps.loc[gaps.nlargest(sample, "duration_ns").index.union(rest.index)]
    o = oracle(name)
    for g in gaps.itertuples():
        assert (g.launch_bound_ns, g.host_compute_ns) == o.split(int(g.start_ns), int(g.end_ns)), g
    assert (ctx.idle["launch_bound_ns"] + ctx.idle["host_compute_ns"] == ctx.idle["duration_ns"])[ctx.idle["host_bound"]].all()
    other = ctx.idle[~ctx.idle["host_bound"]]
    assert (other["launch_bound_ns"] == 0).all() and (other["host_compute_ns"] == 0).all()


def test_the_input_pipelines_cpu_work_is_host_compute_and_its_totals_add_up(analysed, rule_contexts, oracle):
    """examples/input_pipeline_train.py --practice bad (H200): the main process augments each batch
    on the CPU (FFTs, no DataLoader workers) while the GPU waits. The oracle over every measured gap
    finds one 24-69 ms stretch per step before the step's first kernel; the report's idle section,
    per-step entries and breakdown carry the same split, each adding up to its total."""
    report, ctx = _ctx(analysed, rule_contexts, "input_pipeline_bad")
    o, n = oracle("input_pipeline_bad"), ctx.n_steps
    per_gap = [o.split(int(g.start_ns), int(g.end_ns)) for g in _host_bound(ctx).itertuples()]
    host = sum(h for _, h in per_gap)
    idle = report["idle"]
    assert idle["host_compute_idle_ns_per_step"] == pytest.approx(host / n, rel=1e-12)
    assert idle["launch_bound_idle_ns_per_step"] == pytest.approx(sum(lb for lb, _ in per_gap) / n, rel=1e-12)
    assert host / n > 0.8 * report["steps"]["step_time_ns"]["mean"]  # the step is the CPU's work
    assert idle["step_start_host_compute_idle_ns_per_step"] > 0.95 * idle["host_compute_idle_ns_per_step"]
    # the slow steps (3 of 9, recurrent: steady state, not outliers) hold the longest stretch, ~69 ms
    assert 20e6 < idle["longest_host_compute_stretch_ns"] < 80e6
    assert idle["host_compute_where"][0]["where"] is None  # outside every range: the DataLoader's next()
    measured = [s for s in report["steps"]["per_step"] if s["measured"]]
    assert all(s["launch_bound_idle_ns"] + s["host_compute_idle_ns"] == s["host_bound_idle_ns"] for s in measured)
    split = report["overhead_split_ns_per_step"]
    assert split["launch_bound_ns"] + split["host_compute_ns"] == pytest.approx(report["breakdown_ns_per_step"]["overhead_ns"])
    assert split["host_compute_ns"] == pytest.approx(host / n, rel=1e-12)
    assert sum(report["overhead_split_percent"].values()) == pytest.approx(report["breakdown_percent"]["overhead"])
    assert report["invariants"] == {}


def test_host_compute_rule_fires_on_cpu_work_and_not_on_launch_bound_steps(analysed, rule_contexts, oracle):
    """GD-HOST-COMPUTE on the bad input pipeline: saving = the oracle's host compute per step,
    evidence with ms/step, stretches per step, the longest stretch and where; it overlaps
    GD-INPUT-STALL (the same idle before the first kernel), which stays first. Silent on
    launch-bound captures, eager (MLP decode, Swin-T) and compiled (BERT: its long stretches are
    inside the model)."""
    report, ctx = _ctx(analysed, rule_contexts, "input_pipeline_bad")
    o = oracle("input_pipeline_bad")
    host = sum(o.split(int(g.start_ns), int(g.end_ns))[1] for g in _host_bound(ctx).itertuples()) / ctx.n_steps
    recs = {r["rule_id"]: r for r in report["recommendations"]}
    rec = recs["GD-HOST-COMPUTE"]
    assert rec["saving_ns_per_step"] == pytest.approx(host, rel=1e-12)
    assert rec["evidence"][0].startswith(f"{host / 1e6:.2f} ms/step of GPU idle")
    assert "stretches/step" in rec["evidence"][1] and "the longest" in rec["evidence"][1]
    assert rec["evidence"][2].startswith("where (innermost NVTX range on the launching thread): outside every range")
    assert "DataLoader workers" in rec["how_to_fix"] and "non_blocking=True" in rec["how_to_fix"]
    assert "CUDA graphs and torch.compile do not remove" in rec["how_to_fix"]
    assert "GD-INPUT-STALL" in rec["overlaps"] and "GD-OVERHEAD-BOUND" not in rec["overlaps"]
    assert report["recommendations"][0]["rule_id"] == "GD-INPUT-STALL"
    for name in ("mlp_decode", "swin_t_train_bf16", "zoo_bert_compile"):
        _, other = analysed(name)
        assert "GD-HOST-COMPUTE" not in {r["rule_id"] for r in other["recommendations"] + other["suppressed"]}, name
        assert other["idle"]["host_compute_idle_ns_per_step"] < 0.02 * other["steps"]["step_time_ns"]["mean"], name


def test_long_stretches_inside_the_model_stay_launch_bound(analysed, rule_contexts, oracle):
    """Compiled BERT training (H100): stretches of 1-3 ms with no CUDA call inside the model's
    forward, backward and optimizer step (Dynamo's guards, AOTAutograd, the autograd engine, the
    optimizer's Python) — the oracle finds them, yet they count launch-bound: CUDA graphs (mode
    max-autotune) removed that idle on this workload (docs/notes/measurements.md)."""
    report, ctx = _ctx(analysed, rule_contexts, "zoo_bert_compile")
    o = oracle("zoo_bert_compile")
    inside = 0
    for g in _host_bound(ctx).nlargest(40, "duration_ns").itertuples():
        stretches = o.long_stretches(int(g.start_ns), int(g.end_ns), o.thread(int(g.end_ns)))
        inside += sum(e - s for s, e, model in stretches if model)
        assert not any(not model for _, _, model in stretches) or g.host_compute_ns > 0
    assert inside / ctx.n_steps > 3e6  # ms of such stretches per step
    assert report["idle"]["host_compute_idle_ns_per_step"] < 0.02 * report["steps"]["step_time_ns"]["mean"]


# --- edited exports: CPU work inserted --------------------------------------------------------------------------------

def _insert_cpu_work(path, points: list[int], delta: int) -> None:
    """Shift every timestamp at or after each point by ``delta`` (ns), in every table with start
    and end columns: the host thread that was free at the point now computes ``delta`` longer
    there, and all later CPU and GPU work comes ``delta`` later. Ranges open at the point stretch."""
    con = sqlite3.connect(path)
    tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
              if {"start", "end"} <= {c[1] for c in con.execute(f"PRAGMA table_info({t})")}]
    for t0 in sorted(points, reverse=True):  # the latest first: an earlier point's shift moves the later ones
        for table in tables:
            con.execute(f'UPDATE {table} SET "end" = "end" + ? WHERE "end" >= ?', (delta, t0))
            con.execute(f"UPDATE {table} SET start = start + ? WHERE start >= ?", (delta, t0))
    con.commit()
    con.close()


def _edited_report(source, tmp_path, points, delta, status, rule_contexts):
    path = tmp_path / "edited.sqlite"
    shutil.copyfile(source, path)
    _insert_cpu_work(path, points, delta)
    analyse_recording, contexts = rule_contexts
    report = analyse_recording(ingest(path, tmp_path / "edited.run.sqlite"), "edited", status)
    return report, contexts["edited"]


def _points(ctx, o: Oracle, at_step_start: bool) -> tuple[list[int], list[int]]:
    """Per measured step, where to insert CPU work: the middle of the longest free stretch (outside
    the model) of a host-bound gap's thread inside the gap, at the step's start or between kernels;
    returns (points, each stretch's length inside its gap)."""
    points, lengths = [], []
    gaps = _host_bound(ctx)
    for _, step in gaps[gaps["at_step_start"] == at_step_start].groupby("step"):
        best = None
        for g in step.itertuples():
            free = o.longest_free_outside(int(g.start_ns), int(g.end_ns))
            if free and (best is None or free[1] - free[0] > best[1] - best[0]):
                best = free
        points.append((best[0] + best[1]) // 2)
        lengths.append(best[1] - best[0])
    return points, lengths


def _recs(report) -> dict:
    return {r["rule_id"]: r for r in report["recommendations"]}


def test_cpu_work_inserted_between_kernels_becomes_host_compute(export_path, analysed, rule_contexts, oracle, tmp_path):
    """Swin-T bf16 training (H200, launch-bound), edited: 8 ms of CPU work inserted, in every
    measured step, into a host-bound gap between kernels where the training loop's thread was
    outside the model (between the model's calls). Host compute grows by the inserted time plus
    the free stretch it lengthened; GD-HOST-COMPUTE fires with that saving; GD-OVERHEAD-BOUND's
    saving shrinks by exactly the stretch that became host compute, although the host-bound idle
    between kernels (its measure before the split) grew by 8 ms per step."""
    name, delta = "swin_t_train_bf16", 8_000_000
    before, ctx = _ctx(analysed, rule_contexts, name)
    points, lengths = _points(ctx, oracle(name), at_step_start=False)
    n = ctx.n_steps
    assert len(points) == n and all(0 < x < THRESHOLD for x in lengths)
    after, _ = _edited_report(export_path(name), tmp_path, points, delta, status_of(name), rule_contexts)
    i0, i1 = before["idle"], after["idle"]
    grown = sum(delta + x for x in lengths) / n
    assert i1["host_compute_idle_ns_per_step"] == pytest.approx(i0["host_compute_idle_ns_per_step"] + grown, rel=1e-9)
    def between(i: dict) -> float:  # host-bound idle between kernels: GD-OVERHEAD-BOUND's measure before the split
        return i["host_bound_idle_ns_per_step"] - i["step_start_idle_ns_per_step"]

    assert between(i1) == pytest.approx(between(i0) + delta, rel=1e-9)
    rec = _recs(after)["GD-HOST-COMPUTE"]
    assert rec["saving_ns_per_step"] == pytest.approx(i1["host_compute_idle_ns_per_step"], rel=1e-12)
    assert f"{rec['saving_ns_per_step'] / 1e6:.2f} ms/step" in rec["evidence"][0]
    assert "the longest left the GPU idle 8." in rec["evidence"][1]
    ob_before, ob_after = _recs(before)["GD-OVERHEAD-BOUND"], _recs(after)["GD-OVERHEAD-BOUND"]
    assert ob_after["saving_ns_per_step"] == pytest.approx(ob_before["saving_ns_per_step"] - sum(lengths) / n, rel=1e-9)
    assert any("not counted: " in e and "GD-HOST-COMPUTE" in e for e in ob_after["evidence"])
    assert "GD-OVERHEAD-BOUND" not in rec["overlaps"]  # different time: their savings add up
    assert after["invariants"] == {}


def test_cpu_work_inserted_inside_the_model_stays_launch_bound(export_path, analysed, rule_contexts, tmp_path):
    """The same edit at points inside a module's forward on the launching thread (the middle of a
    host-bound gap's free stretch inside gpudiag's module range): the long stretch is framework
    time by the split's rule, so host compute does not move and GD-OVERHEAD-BOUND takes it."""
    name, delta = "swin_t_train_bf16", 2_000_000
    before, ctx = _ctx(analysed, rule_contexts, name)
    o = Oracle(export_path(name))
    points = []
    gaps = _host_bound(ctx)
    for _, step in gaps[~gaps["at_step_start"]].groupby("step"):
        g = step.nlargest(1, "duration_ns").iloc[0]
        tid = o.thread(int(g["end_ns"]))
        starts, ends, _ = o.free(tid)
        i = max(bisect.bisect_right(starts, g["start_ns"]) - 1, 0)
        candidates = [(max(starts[j], g["start_ns"]), min(ends[j], g["end_ns"])) for j in range(i, len(starts))
                      if starts[j] < g["end_ns"]]
        s, e = max((c for c in candidates if c[1] > c[0] and o.in_model((c[0] + c[1]) // 2, tid)),
                   key=lambda c: c[1] - c[0])
        points.append(int((s + e) // 2))
    after, _ = _edited_report(export_path(name), tmp_path, points, delta, status_of(name), rule_contexts)
    n = ctx.n_steps
    assert after["idle"]["host_compute_idle_ns_per_step"] == pytest.approx(before["idle"]["host_compute_idle_ns_per_step"])
    ob_before, ob_after = _recs(before)["GD-OVERHEAD-BOUND"], _recs(after)["GD-OVERHEAD-BOUND"]
    assert ob_after["saving_ns_per_step"] == pytest.approx(ob_before["saving_ns_per_step"] + delta * len(points) / n, rel=1e-9)


def test_a_server_that_makes_its_input_on_the_cpu_gets_host_side_advice_first(rule_contexts, tmp_path):
    """MobileNetV3 served in a loop (benchmarks/zoo/infer_zoo.py serve, H100, batch 8; steps =
    requests), edited: 6 ms of CPU work inserted before each measured request's forward, where the
    loop's thread waited for nothing on the GPU (the CPU making the next input). GD-HOST-COMPUTE
    fires with that time (and GD-INPUT-STALL with the same idle, overlapping); no GPU-side rule
    comes first, and GD-OVERHEAD-BOUND (idle between kernels) is unchanged. The launcher's bare run
    is left out: it timed the unedited script."""
    import lzma

    source = tmp_path / "serve.sqlite"
    with lzma.open(TRIALS / "serve_h100" / "profile.sqlite.xz") as src, open(source, "wb") as dst:
        shutil.copyfileobj(src, dst)
    status = {k: v for k, v in json.loads((TRIALS / "serve_h100" / "script_status.json").read_text()).items()
              if k not in ("bare_run", "trials", "trials_left_out")}
    analyse_recording, contexts = rule_contexts
    before = analyse_recording(ingest(source, tmp_path / "serve.run.sqlite"), "serve", status)
    ctx = contexts["serve"]
    o = Oracle(source)
    points, lengths = _points(ctx, o, at_step_start=True)
    delta, n = 6_000_000, ctx.n_steps
    assert len(points) == n
    (tmp_path / "edited").mkdir()
    after, _ = _edited_report(source, tmp_path / "edited", points, delta, status, rule_contexts)
    recs = _recs(after)
    rec = recs["GD-HOST-COMPUTE"]
    grown = sum(delta + x for x in lengths) / n
    assert rec["saving_ns_per_step"] == pytest.approx(before["idle"]["host_compute_idle_ns_per_step"] + grown, rel=1e-9)
    assert "before the step's first kernel" in rec["evidence"][0]
    assert after["recommendations"][0]["rule_id"] not in GPU_ONLY_RULES
    first_gpu = min((i for i, r in enumerate(after["recommendations"]) if r["rule_id"] in GPU_ONLY_RULES), default=None)
    assert first_gpu is None or after["recommendations"].index(rec) < first_gpu
    assert recs["GD-OVERHEAD-BOUND"]["saving_ns_per_step"] == pytest.approx(
        _recs(before)["GD-OVERHEAD-BOUND"]["saving_ns_per_step"], rel=1e-9)
    assert "GD-INPUT-STALL" in rec["overlaps"] and after["invariants"] == {}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5_000), st.integers(0, 400)), min_size=1, max_size=30),
       st.lists(st.tuples(st.integers(0, 6_000), st.integers(1, 3_000)), min_size=1, max_size=6),
       st.randoms(use_true_random=False))
def test_stretches_are_the_same_for_calls_in_start_order_and_shuffled(calls, gaps, rnd):
    """One thread's calls already in start order skip the sort and its copies (the usual export, 13.5 M
    calls at 5 M kernels); shuffled, they are sorted first: the stretches found are the same, names included."""
    ordered = sorted(calls)
    shuffled = list(ordered)
    rnd.shuffle(shuffled)
    frame = lambda rows: pd.DataFrame({"start_ns": [s for s, _ in rows], "end_ns": [s + d for s, d in rows],
                                       "name": [f"call{s}_{d}" for s, d in rows]})
    g = pd.DataFrame({"start_ns": [a for a, _ in gaps], "end_ns": [a + b for a, b in gaps]})
    fast = host_work._stretches_in(g, frame(ordered), 200)
    slow = host_work._stretches_in(g, frame(shuffled), 200)
    # equal starts may be ordered differently by the shuffle: compare the stretches, not the call order
    cols = ["gap", "start_ns", "end_ns", "ns", "stretch_ns"]
    pd.testing.assert_frame_equal(fast[cols], slow[cols])
    ties = pd.Series([s for s, _ in ordered]).duplicated(keep=False).any()
    if not ties:
        pd.testing.assert_frame_equal(fast, slow)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 5_000)), max_size=25), st.integers(0, 20_000))
def test_long_free_time_is_every_free_interval_filtered(blocks, threshold):
    """The long free stretches between merged blocks, found without the arrays of every free interval,
    are those the free intervals' arrays give (written out here: open at both ends), none of them included."""
    m_s, m_e = host_work.merge_intervals(np.array([s for s, _ in blocks], dtype=np.int64),
                                         np.array([s + d for s, d in blocks], dtype=np.int64))
    f_s = np.concatenate([[-host_work._OPEN], m_e]).astype(np.int64)
    f_e = np.concatenate([m_s, [host_work._OPEN]]).astype(np.int64)
    long = (f_e - f_s) > threshold
    l_s, l_e = host_work._long_free_time(m_s, m_e, threshold)
    assert l_s.dtype == l_e.dtype == np.int64
    assert l_s.tolist() == f_s[long].tolist() and l_e.tolist() == f_e[long].tolist()
