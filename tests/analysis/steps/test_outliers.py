"""Steady state and outlier steps (gpudiag/analysis/steps/outliers.py) on a long capture made from a real
one: the compiled-BERT zoo capture (H100) replicated in time as one run, so that its slow first
steps (torch.compile, Inductor autotuning) and its detail step recur among the steady ones, the way
evaluation or checkpoint steps recur in a real run (issue 16: averaged in, they made
GD-OVERHEAD-BOUND claim 168 ms per 23 ms step).

The oracle is this file's: step windows and busy time from the raw export with SQL and interval
arithmetic (tests/analysis/test_pipeline_zoo.py's functions), the detail step from the op ranges, the
outlier rule applied to those numbers, and kernel names per step by a correlation-id join.
"""

from __future__ import annotations

import bisect
import copy
import re
import shutil
import sqlite3
import statistics

import pandas as pd
import pytest
from rich.console import Console

from gpudiag import nvtx_names
from gpudiag.analysis.findings import invariants
from gpudiag.analysis.steps import outliers
from gpudiag.analysis.ingest import ingest
from gpudiag.analysis.pipeline import analyse
from gpudiag.renderers import html, terminal
from gpudiag.sources.replicate import replicate_export

from test_pipeline_zoo import oracle_steps, step_ranges

SOURCE = "zoo_bert_compile"
COPIES = 2
UNREAD = ("OSRT_API", "OSRT_CALLCHAINS", "PROFILER_OVERHEAD")  # gpudiag never reads them: not copied, for speed


def one_long_run(path) -> None:
    """Make the replicated copies one launcher run: drop each copy's tail range and the incomplete
    step it marks (the last copy keeps them, as a real capture would), then number the step ranges
    0, 1, 2, ... in time order."""
    con = sqlite3.connect(path)
    tails = [t for (t,) in con.execute("SELECT start FROM NVTX_EVENTS WHERE text = ? ORDER BY start", (nvtx_names.TAIL,))]
    for t in tails[:-1]:
        con.execute("DELETE FROM NVTX_EVENTS WHERE rowid = (SELECT rowid FROM NVTX_EVENTS WHERE text LIKE ? AND start < ? "
                    "ORDER BY start DESC LIMIT 1)", (nvtx_names.STEP + "%", t))
        con.execute("DELETE FROM NVTX_EVENTS WHERE text = ? AND start = ?", (nvtx_names.TAIL, t))
    rows = con.execute("SELECT rowid FROM NVTX_EVENTS WHERE text LIKE ? ORDER BY start", (nvtx_names.STEP + "%",)).fetchall()
    con.executemany("UPDATE NVTX_EVENTS SET text = ? WHERE rowid = ?", [(f"{nvtx_names.STEP}{i}", r) for i, (r,) in enumerate(rows)])
    con.commit()
    con.close()


@pytest.fixture(scope="module")
def bert(export_path, tmp_path_factory):
    """(original report, replicated export path, replicated report), both analysed without a
    launcher status (the same way)."""
    folder = tmp_path_factory.mktemp("replicated")
    source = folder / "source.sqlite"
    shutil.copy(export_path(SOURCE), source)
    with sqlite3.connect(source) as con:
        for table in UNREAD:
            con.execute(f"DROP TABLE IF EXISTS {table}")
    replica = replicate_export(source, folder / "replica.sqlite", COPIES).path
    one_long_run(replica)
    original = analyse(ingest(source, folder / "original.run.sqlite"))
    return original, replica, analyse(ingest(replica, folder / "replica.run.sqlite"))


def oracle(export) -> dict:
    """From the raw export: per-step time/busy, the detail step (the first holding op ranges),
    the measured steps (not the first two, not the detail step), their median, the outliers
    (> 1.5 x that median, unless 3 or more and over a quarter of the measured steps are) and the steady steps."""
    steps = oracle_steps(export)
    con = sqlite3.connect(export)
    ranges = step_ranges(con)
    ops = sorted(s for (s,) in con.execute("SELECT start FROM NVTX_EVENTS WHERE text LIKE ?", (nvtx_names.OP + "%",)))
    detail = min(s for s, (lo, hi) in ranges.items() if bisect.bisect_left(ops, lo) < bisect.bisect_left(ops, hi))
    measured = [s for s in sorted(steps)[2:] if s != detail]
    median = statistics.median(steps[s]["time"] for s in measured)
    slow = {s for s in measured if steps[s]["time"] > 1.5 * median}
    if len(slow) >= 3 and len(slow) > 0.25 * len(measured):  # slow steps that recur: the steady state's own
        slow = set()
    return {"steps": steps, "ranges": ranges, "detail": detail, "measured": measured, "median": median,
            "outliers": slow, "steady": [s for s in measured if s not in slow]}


@pytest.fixture(scope="module")
def truth(bert):
    return oracle(bert[1])


def test_outlier_steps_are_the_slow_steps_of_the_raw_export(bert, truth):
    _, _, report = bert
    assert len(truth["outliers"]) >= 3  # the second copy's compile steps and detail step at least
    assert {s["step"] for s in report["outlier_steps"]["steps"]} == truth["outliers"]
    assert report["steps"]["outliers"] == report["outlier_steps"]["count"] == len(truth["outliers"])
    assert report["steps"]["count"] == len(truth["steps"])
    assert report["steps"]["measured"] == len(truth["steady"])
    assert report["outlier_steps"]["median_step_time_ns"] == pytest.approx(truth["median"])
    assert report["invariants"] == {}


def test_the_median_step_is_unchanged(bert, truth):
    """The steady-state median is the oracle's, and the original capture's within 2 %."""
    original, _, report = bert
    steady_median = statistics.median(truth["steps"][s]["time"] for s in truth["steady"])
    assert report["steps"]["step_time_ns"]["median"] == pytest.approx(steady_median)
    assert report["steps"]["step_time_ns"]["median"] == pytest.approx(original["steps"]["step_time_ns"]["median"], rel=0.02)
    # the mean over every measured step is what the old statistics used: seconds, not milliseconds
    assert report["steps"]["step_time_ns_with_outliers"]["mean"] > 20 * steady_median


def test_no_saving_is_larger_than_the_median_step(bert, truth):
    """Every saving stays under the median step; the overhead-bound one under the steady steps'
    mean GPU idle (time - busy: an upper bound of host-bound idle) and within 10 % of the original
    capture's (steady-state numbers are the original's, the copies only add steps)."""
    original, _, report = bert
    steady_median = statistics.median(truth["steps"][s]["time"] for s in truth["steady"])
    idle = statistics.mean(truth["steps"][s]["time"] - truth["steps"][s]["busy"] for s in truth["steady"])
    recs = {r["rule_id"]: r for r in report["recommendations"]}
    assert recs and all(r["saving_ns_per_step"] < steady_median for r in recs.values())
    overhead = recs["GD-OVERHEAD-BOUND"]["saving_ns_per_step"]
    assert overhead <= idle
    before = {r["rule_id"]: r for r in original["recommendations"]}["GD-OVERHEAD-BOUND"]["saving_ns_per_step"]
    assert overhead == pytest.approx(before, rel=0.10)


def kernel_names_by_step(export, ranges: dict) -> dict[int, set[str]]:
    """Kernel names launched inside each step range (launch call by correlationId in the process)."""
    con = sqlite3.connect(export)
    rows = con.execute("SELECT r.start, COALESCE(s.value, '') FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                       "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
                       "AND (r.globalTid >> 24) = (k.globalPid >> 24) "
                       "LEFT JOIN StringIds s ON s.id = k.demangledName").fetchall()
    order = sorted(ranges.items(), key=lambda kv: kv[1][0])
    starts = [lo for _, (lo, _) in order]
    names: dict[int, set[str]] = {}
    for host, name in rows:
        i = bisect.bisect_right(starts, host) - 1
        if i >= 0 and host < order[i][1][1]:
            names.setdefault(order[i][0], set()).add(name)
    return names


def test_outliers_name_what_made_them_slow(bert, truth):
    """The copy's compile step runs kernels no steady step runs (the oracle counts the names); the
    copy's detail step is slow from GPU idle (its op ranges cost host time), as its own time - busy
    says; no cause claims more than the step's excess by more than rounding."""
    _, replica, report = bert
    by_step = {s["step"]: s for s in report["outlier_steps"]["steps"]}
    names = kernel_names_by_step(replica, truth["ranges"])
    steady_names = set().union(*(names.get(s, set()) for s in truth["steady"]))
    compile_step = min(truth["outliers"])
    extra = {c["cause"]: c for c in by_step[compile_step]["causes"]}["extra_kernels"]
    assert extra["new_names"] == len(names[compile_step] - steady_names) > 0
    detail_copy = max(s for s in truth["outliers"] if truth["steps"][s]["time"] < 10 * truth["median"])
    t = truth["steps"][detail_copy]
    idle_excess = (t["time"] - t["busy"]) - statistics.median(truth["steps"][s]["time"] - truth["steps"][s]["busy"]
                                                              for s in truth["steady"])
    first = by_step[detail_copy]["causes"][0]
    assert first["cause"] in ("host_bound_idle", "input_stall", "other_idle")
    assert idle_excess > 0.5 * by_step[detail_copy]["excess_ns"]
    for s in by_step.values():
        assert all(c["excess_ns"] <= s["excess_ns"] * 1.01 + 1e3 for c in s["causes"] if c["cause"] != "host_sync")


def test_terminal_and_html_show_the_outliers(bert):
    _, _, report = bert
    console = Console(record=True, width=200)
    terminal.render(report, console)
    text = console.export_text()
    slowest = report["outlier_steps"]["steps"][0]
    assert f"{report['outlier_steps']['count']} outlier steps" in text and f"step {slowest['step']}:" in text
    assert ("not to be added up" in text) == bool(terminal.overlap_pairs(report["recommendations"][:5]))
    hostile = copy.deepcopy(report)
    evil = '<script>alert("outlier")</script>'
    hostile["outlier_steps"]["steps"][0]["causes"][0]["text"] = evil
    page = html.render(hostile)
    assert 'id="outliers"' in page and evil not in page and "&lt;script&gt;alert(" in page


def test_the_rule_at_its_boundary():
    """Exactly 1.5 x the median is not an outlier, just above is; warm-up and detail steps never are."""
    st = pd.DataFrame({"step": range(6), "step_time_ns": [900, 10, 10, 10, 15, 16], "measured": [False, True, True, True,
                                                                                                True, True]})
    flagged = outliers.flag_outliers(st)
    assert flagged["outlier"].tolist() == [False, False, False, False, False, True]
    assert flagged["measured"].tolist() == [False, True, True, True, True, False]
    assert outliers.period([10, 20, 30, 40]) == 10 and outliers.period([10, 20, 35]) is None


def test_a_report_with_an_outlier_in_its_steady_state_breaks_the_invariant(bert):
    report = copy.deepcopy(bert[2])
    report["warnings"] = []
    slow = next(s for s in report["steps"]["per_step"] if s["outlier"])
    slow.update(outlier=False, measured=True)
    checked = invariants.check(report)
    assert list(checked["invariants"]) == ["steady_state_excludes_outliers"]
    assert re.search(r"steady-state step \d+ lasts", checked["invariants"]["steady_state_excludes_outliers"][0])


def test_recurrent_slow_steps_are_the_steady_state():
    """A loader that keeps up with every other batch (H100, 2026-11-26: 15 ms and 75 ms steps in
    turn): the slow half is the workload's rhythm, not outliers; one slow step in ten still is one."""
    import pandas as pd

    times = [15.3e6, 75.6e6] * 10
    st = pd.DataFrame({"step": range(20), "step_time_ns": times, "measured": True})
    flagged = outliers.flag_outliers(st)
    assert not flagged["outlier"].any() and flagged["measured"].all()
    assert flagged["step_time_ns"][flagged["measured"]].mean() == pytest.approx(45.45e6)
    rare = st.assign(step_time_ns=[15.3e6] * 9 + [75.6e6] + [15.3e6] * 10)
    assert outliers.flag_outliers(rare)["outlier"].tolist() == [False] * 9 + [True] + [False] * 10
    two_of_seven = st.head(7).assign(step_time_ns=[8e8, 8e8, 1.3e9, 1.3e9, 8e8, 8e8, 8e8])  # not yet a rhythm
    assert outliers.flag_outliers(two_of_seven)["outlier"].sum() == 2
