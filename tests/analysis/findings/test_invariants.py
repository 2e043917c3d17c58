"""The report invariants (gpudiag/analysis/findings/invariants.py): they hold on every committed real
capture, and each one fires on a report that breaks it."""

from __future__ import annotations

import copy
import json
import re
import shutil
import statistics

import pandas as pd
import pytest
from click.testing import CliRunner

from gpudiag.analysis.findings import invariants
from gpudiag.analysis.rules import overlaps
from gpudiag.analysis.roofline.peaks import lookup
from gpudiag.analysis.rules.base import RuleContext
from gpudiag.analysis.rules.kernels import multi_stream
from gpudiag.cli.main import cli

from conftest import EXPORTS, ROOT
from test_outliers import oracle


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_every_committed_capture_satisfies_every_invariant(analysed, name):
    _, report = analysed(name)
    assert report["invariants"] == {}
    assert not any(w.startswith("invariant ") for w in report["warnings"])


@pytest.fixture
def gpt2(analysed):
    _, report = analysed("gpt2_train_bf16")
    report = copy.deepcopy(report)
    report["warnings"] = []
    return report


def _first_measured(report: dict) -> dict:
    return next(s for s in report["steps"]["per_step"] if s["measured"])


@pytest.mark.parametrize("breakage,invariant", [
    (lambda r: r.update(gpu_busy_percent=-1.3), "gpu_busy_within_0_100"),
    (lambda r: r["steps"]["step_time_ns"].update(median=0.0), "step_times_positive"),
    (lambda r: r["breakdown_percent"].update(idle=r["breakdown_percent"]["idle"] + 3), "breakdown_sums_to_100"),
    (lambda r: r["recommendations"][0].update(saving_percent_of_step=56943.0), "savings_within_the_step"),
    (lambda r: r["fusion_candidates"][0].update(saving_ns_per_step=1e12), "savings_within_the_step"),
    # launch-bound + host compute = host-bound idle: in the idle section, a step's entry, the breakdown
    (lambda r: r["idle"].update(host_compute_idle_ns_per_step=r["idle"]["host_compute_idle_ns_per_step"] + 1e5),
     "overhead_split_adds_up"),
    (lambda r: _first_measured(r).update(launch_bound_idle_ns=_first_measured(r)["launch_bound_idle_ns"] + 2e3),
     "overhead_split_adds_up"),
    (lambda r: r["overhead_split_ns_per_step"].update(host_compute_ns=r["overhead_split_ns_per_step"]["host_compute_ns"] + 50.0),
     "overhead_split_adds_up"),
])
def test_each_invariant_fires_with_one_warning(gpt2, breakage, invariant):
    breakage(gpt2)
    report = invariants.check(gpt2)
    assert list(report["invariants"]) == [invariant]
    assert len(report["warnings"]) == 1 and report["warnings"][0].startswith(f"invariant {invariant} violated")


def test_reports_written_before_the_overhead_split_are_not_checked_for_it(gpt2):
    """A report.json of an older gpudiag (no launch-bound / host-compute fields) passes."""
    gpt2.pop("overhead_split_ns_per_step"), gpt2.pop("overhead_split_percent")
    for key in [k for k in gpt2["idle"] if "host_compute" in k or "launch_bound" in k]:
        gpt2["idle"].pop(key)
    for s in gpt2["steps"]["per_step"]:
        s.pop("launch_bound_idle_ns", None), s.pop("host_compute_idle_ns", None)
    assert invariants.overhead_split_adds_up(gpt2) == [] and invariants.check(gpt2)["invariants"] == {}


def test_an_additive_set_of_savings_past_the_step_breaks_the_invariant(gpt2):
    """Two recommendations that count different time may be added; if together they exceed the
    step, the invariant names them. Once they say they overlap, the invariant holds."""
    mean = gpt2["steps"]["step_time_ns"]["mean"]
    recs = gpt2["recommendations"]
    a, b = next((x, y) for x in recs for y in recs if x is not y and y["rule_id"] not in x["overlaps"])
    a["saving_ns_per_step"] = b["saving_ns_per_step"] = 0.6 * mean
    report = invariants.check(copy.deepcopy(gpt2))
    assert list(report["invariants"]) == ["additive_savings_within_the_step"]
    assert a["rule_id"] in report["invariants"]["additive_savings_within_the_step"][0]
    a["overlaps"], b["overlaps"] = [b["rule_id"]], [a["rule_id"]]
    assert invariants.check(gpt2)["invariants"] == {}


def test_every_rule_says_what_time_it_counts():
    """Every rule id in the rule modules is in the overlap table (a rule missing from it would be
    taken to overlap every other); kinds of time meet along their paths."""
    source = "".join((ROOT / "gpudiag" / "analysis" / "rules" / f).read_text() for f in ("kernels.py", "host.py", "expert.py"))
    ids = set(re.findall(r'"(GD-[A-Z0-9-]+)"', source))
    assert ids and ids <= set(overlaps.TIME_ACTED_ON), ids - set(overlaps.TIME_ACTED_ON)
    assert overlaps.overlap("GD-SMALL-GRID", "GD-FP32-MATMUL") and overlaps.overlap("GD-TORCH-COMPILE", "GD-UNFUSED-NORM")
    assert not overlaps.overlap("GD-INPUT-STALL", "GD-OVERHEAD-BOUND")
    # the two parts of host-bound idle: disjoint; host compute before the first kernel is the stall's too
    assert not overlaps.overlap("GD-HOST-COMPUTE", "GD-OVERHEAD-BOUND")
    assert overlaps.overlap("GD-HOST-COMPUTE", "GD-INPUT-STALL") and overlaps.overlap("GD-HOST-COMPUTE", "GD-HOST-SYNC")
    assert not overlaps.overlap("GD-UNFUSED-OPTIMIZER", "GD-FP32-MATMUL")
    assert overlaps.overlap("GD-SOMETHING-NEW", "GD-INPUT-STALL")
    total, chosen = overlaps.largest_additive_total({"A": 5.0, "B": 4.0, "C": 3.0}, {"A": ["B", "C"], "B": ["A"], "C": ["A"]})
    assert (total, sorted(chosen)) == (7.0, ["B", "C"])


def test_multi_stream_never_claims_more_than_the_step(analysed):
    """GD-MULTI-STREAM on the towers' real detail step, with the step time set below its kernels'
    serialized time: the saving is the step minus the critical path, never more than the step."""
    db, report = analysed("towers_inference")
    kernels = db.execute("SELECT k.*, a.step, a.op, a.op_args, a.op_call FROM kernels k "
                         "JOIN kernel_attribution a USING (kernel_id) WHERE a.step = ? AND a.op != ''",
                         [report["steps"]["detail_step"]]).fetchall()
    cols = [c[0] for c in db.execute("SELECT k.*, a.step, a.op, a.op_args, a.op_call FROM kernels k "
                                      "JOIN kernel_attribution a USING (kernel_id) LIMIT 0").description]
    detail = pd.DataFrame(kernels, columns=cols)
    peaks = lookup(report["device"]["name"], report["device"]["sm_count"])
    empty = pd.DataFrame()

    def saving(step_ns: float):
        ctx = RuleContext(km=detail, detail=detail, api=empty, memcpy=empty, idle=empty, n_steps=1, step_ns=step_ns,
                          peaks=peaks)
        rec = multi_stream(ctx)
        return rec.saving_ns_per_step if rec else None

    serialized = float(detail.groupby("op_call")["duration_ns"].sum().sum())
    uncapped = saving(10 * serialized)
    critical = serialized - uncapped
    assert 0 < critical < serialized
    step = (serialized + critical) / 2  # a step shorter than the serialized kernels
    assert saving(step) == pytest.approx(step - critical) and saving(step) < step
    assert saving(critical) is None  # the step is its critical path already: nothing to save


@pytest.mark.parametrize("name", ["input_pipeline_bad", "towers_inference"])
def test_step_count_and_median_do_not_depend_on_how_the_export_is_read(tmp_path, export_path, name):
    """The same capture as .sqlite.xz, .sqlite and a run directory: the same steps, outliers and
    median (invariants.same_steps), and the step count of the raw export (SQL oracle)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(export_path(name), run_dir / "profile.sqlite")
    reports = {}
    for label, path in {"xz": EXPORTS[name], "sqlite": export_path(name), "run directory": run_dir}.items():
        result = CliRunner().invoke(cli, ["report", str(path), "-o", str(tmp_path / label.replace(" ", "_")), "--json"],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        reports[label] = json.loads(result.output)
    assert invariants.same_steps(reports) == []
    truth = oracle(export_path(name))
    assert reports["xz"]["steps"]["count"] == len(truth["steps"])
    assert reports["xz"]["steps"]["outliers"] == len(truth["outliers"])
    assert reports["xz"]["steps"]["step_time_ns"]["median"] == pytest.approx(
        statistics.median(truth["steps"][s]["time"] for s in truth["steady"]))
    broken = copy.deepcopy(reports)
    broken["sqlite"]["steps"]["count"] += 1
    assert invariants.same_steps(broken) and invariants.same_steps(broken)[0].startswith("sqlite:")
