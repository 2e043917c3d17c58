"""Bare vs profiled step time and the overhead-bound numbers corrected for the profiler's inflation,
on the real Swin-T bf16 batch-32 capture (host-bound: GD-OVERHEAD-BOUND fires on it). The bare
run's step times are set in the test; the expected numbers are computed here from them."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from gpudiag.analysis.gate import metrics_from_report
from gpudiag.analysis.findings.bare_run import OVERHEAD_BOUND_SHARE, apply_bare_run


@pytest.fixture
def swin(analysed):
    """A fresh copy of the analysed batch-32 report, with the profiled host wall-clock times set to
    its own step times (as the launcher records them)."""
    _, report = analysed("swin_t_train_bf16")
    report = copy.deepcopy(report)
    report["script"] = dict(report.get("script") or {})
    report["script"]["step_wall_ns"] = {str(s["step"]): s["step_time_ns"] for s in report["steps"]["per_step"]}
    return report


def _overhead_rule(report: dict) -> dict | None:
    return next((r for r in report["recommendations"] if r["rule_id"] == "GD-OVERHEAD-BOUND"), None)


def _with_bare(report: dict, less_ns: float) -> dict:
    """The bare run completed the same steps, each ``less_ns`` shorter."""
    walls = report["script"]["step_wall_ns"]
    report["script"]["bare_run"] = {"exit_code": 0, "step_wall_ns": {k: v - less_ns for k, v in walls.items()}}
    return apply_bare_run(report)


def test_no_bare_run_leaves_the_report_as_it_was(swin):
    before = copy.deepcopy(swin)
    after = apply_bare_run(swin)
    assert after["representativeness"] is None
    assert after["recommendations"] == before["recommendations"]


def test_inflation_is_the_median_difference_over_the_measured_steps(swin):
    measured = [s for s in swin["steps"]["per_step"] if s["measured"]]
    report = _with_bare(swin, 4e6)
    r = report["representativeness"]
    assert r["steps_compared"] == [s["step"] for s in measured]
    assert r["profiled_step_time_ns"] == pytest.approx(np.median([s["step_time_ns"] for s in measured]))
    assert r["bare_step_time_ns"] == pytest.approx(r["profiled_step_time_ns"] - 4e6)
    assert r["inflation_ns"] == pytest.approx(4e6)
    assert r["inflation_percent"] == pytest.approx(100 * 4e6 / r["bare_step_time_ns"])
    assert any("the profiler slowed the step" in w for w in report["warnings"])
    # the gate gets the bare samples as their own metric
    assert metrics_from_report(report)["bare_step_time"].samples == r["bare_samples_ns"]


def test_small_inflation_shrinks_the_overhead_saving_by_exactly_the_inflation(swin):
    raw = _overhead_rule(swin)
    assert raw is not None, "the batch-32 Swin capture is overhead-bound"
    raw_ns, host_idle = raw["saving_ns_per_step"], swin["idle"]["host_bound_idle_ns_per_step"]
    report = _with_bare(swin, 1e6)
    rule = _overhead_rule(report)
    assert rule["saving_ns_per_step"] == pytest.approx(raw_ns - 1e6)
    assert rule["saving_ns_per_step_under_profiler"] == pytest.approx(raw_ns)
    assert report["idle"]["host_bound_idle_ns_per_step_corrected"] == pytest.approx(host_idle - 1e6)
    assert report["fusion_note"] is not None  # still overhead-bound: the fusion note stays


def test_inflation_that_explains_the_idle_suppresses_the_verdict(swin):
    """When the bare run is faster by more than the host-bound idle minus 15 % of the bare step,
    the verdict does not survive the correction: it moves to `suppressed` with the reason, and the
    fusion note that depended on it goes."""
    raw_ns = _overhead_rule(swin)["saving_ns_per_step"]
    report = _with_bare(swin, raw_ns * 0.9)
    bare = report["representativeness"]["bare_step_time_ns"]
    assert raw_ns * 0.1 < OVERHEAD_BOUND_SHARE * bare  # the premise, computed independently
    assert _overhead_rule(report) is None
    suppressed = [r for r in report["suppressed"] if r["rule_id"] == "GD-OVERHEAD-BOUND"]
    assert suppressed and "bare step" in suppressed[0]["suppressed_because"]
    assert report["fusion_note"] is None
    assert not any(c["host_bound"] for c in report["fusion_candidates"])


def test_a_bare_run_that_completed_no_measured_step_is_said_so(swin):
    swin["script"]["bare_run"] = {"exit_code": 1, "step_wall_ns": {"0": 5, "1": 7}}
    report = apply_bare_run(swin)
    assert "exit code 1" in report["representativeness"]["unavailable"]
    assert _overhead_rule(report) is not None  # nothing to correct with


def test_both_step_times_are_shown_side_by_side(swin, tmp_path):
    """Terminal and HTML show the profiled and bare medians with the inflation, as report.json has them."""
    from rich.console import Console

    from gpudiag.renderers import html, terminal
    from gpudiag.renderers.units import fmt_ns

    report = _with_bare(swin, 4e6)
    r = report["representativeness"]
    console = Console(record=True, width=160)
    terminal.render(report, console)
    expected = (f"step time under the profiler {fmt_ns(r['profiled_step_time_ns'])}, without it "
                f"{fmt_ns(r['bare_step_time_ns'])} ({r['inflation_percent']:+.0f} %)")
    assert expected in console.export_text()
    page = tmp_path / "report.html"
    html.write(report, page)
    text = page.read_text()
    assert "step time without the profiler" in text and fmt_ns(r["bare_step_time_ns"]) in text


def test_cuda_event_times_win_over_wall_clock_when_both_runs_have_them(swin):
    """A host that runs ahead of the GPU makes wall-clock steps short; CUDA-event step times (both
    runs) are used instead, and the method says so."""
    ids = [str(s["step"]) for s in swin["steps"]["per_step"]]
    swin["script"]["step_gpu_ns"] = {k: 30e6 for k in ids}
    swin["script"]["bare_run"] = {"exit_code": 0, "step_wall_ns": {k: 1e5 for k in ids},
                                  "step_gpu_ns": {k: 25e6 for k in ids}}
    r = apply_bare_run(swin)["representativeness"]
    assert r["bare_step_time_ns"] == 25e6 and r["profiled_step_time_ns"] == 30e6
    assert r["method"].startswith("CUDA events")


def test_without_a_bare_run_the_terminal_says_the_overhead_numbers_are_uncorrected(swin):
    from rich.console import Console

    from gpudiag.renderers import terminal

    console = Console(record=True, width=200)
    terminal.render(apply_bare_run(swin), console)
    assert "no run without the profiler to compare with" in console.export_text()
