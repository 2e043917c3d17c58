"""Trials as a benchmark (issue 34): the statistics of a trial on recorded-like noisy runs, checked
against independent computations (scipy's own bootstrap, exact Mann–Whitney enumeration, coverage
of a known shift); the interleaved order of the runs and the budget; the ranking of advice by
conclusive savings only; the changes tried though no rule predicted them, on real reports.
"""

from __future__ import annotations

import itertools
import json
import lzma
import statistics
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from gpudiag.capture.instrument import CaptureConfig
from gpudiag.renderers import html, terminal
from gpudiag.trials import plan, ranking, results, runner, stats

from conftest import FIXTURES

TRIALS = FIXTURES / "trials"


def status(ms: float, seed: int, n: int = 10, cv: float = 0.03, warmup_s: float = 12.0, change: str | None = None,
           loss: float = 2.0) -> dict:
    """A launcher status as a bare run writes it: CUDA-event step times (4 warm-up steps, then
    ``n`` measured steps around ``ms`` with a relative jitter ``cv``), start and window timestamps,
    the loss at steps 0-2, and for a trial the change it applied."""
    rng = np.random.default_rng(seed)
    warm = [3 * ms * 1e6] + [ms * 1e6] * 3
    steps = warm + list(ms * 1e6 * (1 + cv * rng.standard_normal(n)))
    out = {"warmup_steps": 4, "window_steps": n, "step_gpu_ns": {str(i): v for i, v in enumerate(steps)},
           "started_unix_s": 1000.0, "window_start_unix_s": 1000.0 + warmup_s, "exit_code": 0, "exception": None,
           "losses": {"0": 3.0, "1": loss, "2": loss * 0.9}}
    if change:
        out["trial"] = {"change": change, "applied": [f"{change} applied"], "form": None, "not_applicable": None}
    return out


def measured(statuses: list[dict]) -> list[list[float]]:
    """The oracle's reading of the measured steps: keys 4..13, by hand."""
    return [[s["step_gpu_ns"][str(k)] for k in range(4, 14)] for s in statuses]


# ---- issue 34's runs --------------------------------------------------------------------------------

def test_host_bound_server_whose_baselines_disagree_is_inconclusive():
    """Baselines at 10.9 and 11.9 ms and another at 6.57 ms; the trial at 6.58 ms. Pooled, the
    trial looks 4 ms faster with a tight within-run interval, but the unchanged script alone moved
    5 ms between processes: no saving can be claimed."""
    base = [status(10.9, 1), status(11.9, 2), status(6.57, 3)]
    trial = [status(6.58, 4, change="compile")]
    record = results.trial_result({"change": "compile", "rule_id": "GD-OVERHEAD-BOUND"}, base, trial, 0, 30.0)
    medians = [statistics.median(r) for r in measured(base)]
    assert record["baseline_runs_ns"] == pytest.approx(medians)
    assert record["baseline_spread_ns"] == pytest.approx(max(medians) - min(medians))
    assert record["saving_ci_ns"][0] > 0  # the interval alone would have called it a saving
    assert record["status"] == record["verdict"] == "inconclusive"
    assert record["verdict_reason"].startswith("baselines disagree by 5.")
    assert record["payback_steps"] is None


def test_bert_compile_graphs_trial_is_a_conclusive_saving():
    """Baselines 5.14 / 6.22 / 4.53 ms, compile-graphs 2.80 ms: the saving (2.3 ms) outsizes the
    baselines' 1.7 ms spread and its interval excludes zero."""
    base = [status(5.14, 11), status(6.22, 12), status(4.53, 13)]
    trial = [status(2.80, 14, warmup_s=40.0, change="compile-graphs")]
    record = results.trial_result({"change": "compile-graphs", "rule_id": "GD-OVERHEAD-BOUND",
                                   "predicted_saving_ns": 3e6}, base, trial, 0, 60.0)
    pooled_base = statistics.median(v for run in measured(base) for v in run)
    trial_median = statistics.median(measured(trial)[0])
    assert record["saving_ns"] == pytest.approx(pooled_base - trial_median)
    low, high = record["saving_ci_ns"]
    assert 0 < low <= record["saving_ns"] <= high
    assert record["status"] == "measured" and record["verdict_reason"] is None and record["p_value"] < 1e-3
    # one-time cost: 40 s vs 12 s to the first measured step, plus the 4 warm-up steps' saving
    cost = 40.0 - 12.0 + 4 * record["saving_ns"] / 1e9
    assert record["one_time_cost_s"] == pytest.approx(cost)
    assert record["payback_steps"] == pytest.approx(cost / (record["saving_ns"] / 1e9))


def test_a_trial_within_the_noise_is_inconclusive():
    base = [status(5.00, 21), status(5.05, 22), status(4.98, 23)]
    record = results.trial_result({"change": "tf32"}, base, [status(4.99, 24, change="tf32")], 0, 10.0)
    assert record["status"] == "inconclusive" and "includes zero" in record["verdict_reason"]
    low, high = record["saving_ci_ns"]
    assert low < 0 < high and record["p_value"] > 0.05


def test_a_conclusive_slowdown_is_measured_and_negative():
    base = [status(14.0, 31), status(14.1, 32), status(13.9, 33)]
    record = results.trial_result({"change": "bf16-autocast"}, base, [status(14.8, 34, change="bf16-autocast")], 0, 1.0)
    assert record["status"] == "measured" and record["saving_ns"] < 0 and record["saving_ci_ns"][1] < 0
    assert record["payback_steps"] is None


def test_one_baseline_run_says_nothing_of_the_spread():
    record = results.trial_result({"change": "compile"}, status(14.0, 41), status(3.95, 42, change="compile"), 0, 1.0)
    assert record["status"] == "inconclusive" and "one baseline run" in record["verdict_reason"]


# ---- the statistics against independent computations ----------------------------------------------

def test_bootstrap_interval_agrees_with_scipys_percentile_bootstrap():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(5)
    a = 5e6 * (1 + 0.05 * rng.standard_normal(30))
    b = 4.5e6 * (1 + 0.05 * rng.standard_normal(20))
    ours = stats.bootstrap_interval([list(a)], [list(b)], resamples=20000)
    theirs = scipy_stats.bootstrap((a, b), lambda x, y, axis: np.median(x, axis=axis) - np.median(y, axis=axis),
                                   vectorized=True, paired=False, n_resamples=20000, method="percentile",
                                   confidence_level=0.95, random_state=1).confidence_interval
    width = theirs.high - theirs.low
    assert ours[0] == pytest.approx(theirs.low, abs=0.05 * width)
    assert ours[1] == pytest.approx(theirs.high, abs=0.05 * width)


def test_bootstrap_interval_covers_a_known_shift_in_nine_seeds_of_ten():
    """Steps = 5 ms + right-skewed host jitter (lognormal); the trial is the same distribution
    shifted by 0.3 ms, so the true difference of medians is 0.3 ms. The 95 % interval must hold it
    in at least 90 % of 200 independent data sets."""
    true = 0.3e6
    hits = 0
    for seed in range(200):
        rng = np.random.default_rng(1000 + seed)
        base = [list(5e6 + 0.4e6 * rng.lognormal(0, 0.6, 10)) for _ in range(3)]
        trial = [list(5e6 - true + 0.4e6 * rng.lognormal(0, 0.6, 10))]
        low, high = stats.bootstrap_interval(base, trial)
        hits += low <= true <= high
    assert hits >= 180


def test_bootstrap_is_reproducible():
    base, trial = measured([status(5.0, 1), status(5.2, 2)]), measured([status(4.0, 3)])
    assert stats.bootstrap_interval(base, trial) == stats.bootstrap_interval(base, trial)


def _exact_mann_whitney(a: list[float], b: list[float]) -> float:
    """Two-sided exact p-value by enumerating every split of the pooled values (no ties)."""
    pooled = a + b
    def u(xs):
        return sum(1 for x in xs for y in pooled if y not in xs and x > y)
    observed = u(a)
    us = [u([pooled[i] for i in idx]) for idx in itertools.combinations(range(len(pooled)), len(a))]
    lower = sum(v <= observed for v in us) / len(us)
    upper = sum(v >= observed for v in us) / len(us)
    return min(1.0, 2 * min(lower, upper))


def test_p_value_is_the_exact_two_sided_mann_whitney_test():
    a, b = [5.1, 5.3, 4.9, 5.6, 5.0], [4.2, 4.8, 4.4, 5.2]
    assert stats.p_value(a, b) == pytest.approx(_exact_mann_whitney(a, b))
    assert stats.p_value([1.0], [2.0, 3.0]) == 1.0  # too few steps to test


def test_spread_needs_two_runs():
    assert stats.spread([[5.0, 5.0]]) == (None, None)
    width, relative = stats.spread([[4.0, 4.2], [5.0], [4.5]])
    assert width == pytest.approx(0.9) and relative == pytest.approx(0.9 / 4.1)


# ---- the interleaved runs ---------------------------------------------------------------------------

class FakeRuns:
    """A fake ``run_bare``: records each call and returns a status; each run takes ``run_s`` of a
    fake clock. ``ms``: median step of the baseline and of each change."""

    def __init__(self, ms: dict, run_s: float = 20.0, fail: tuple = ()):
        self.calls, self.clock, self.ms, self.run_s, self.fail = [], 0.0, ms, run_s, fail

    def monotonic(self) -> float:
        return self.clock

    def __call__(self, script, args, run_dir, config, status_name, timeout_s=None):
        self.calls.append({"name": status_name, "change": config.trial, "warmup": config.warmup_steps,
                           "window": config.window_steps, "bare": config.bare, "args": list(args)})
        self.clock += min(self.run_s, timeout_s) if timeout_s else self.run_s
        if config.trial in self.fail:
            return 1, {"exception": "RuntimeError: boom", "trial": {"change": config.trial}}
        ms = self.ms[config.trial]
        return 0, status(ms, len(self.calls), change=config.trial)


@pytest.fixture
def fake_runs(monkeypatch):
    def make(ms, **kwargs):
        fake = FakeRuns(ms, **kwargs)
        monkeypatch.setattr(runner, "run_bare", fake)
        monkeypatch.setattr(runner, "time", fake)
        return fake
    return make


def _run(tmp_path, chosen, budget=300.0, profiled=None):
    lines = []
    records = runner.run_trials("train.py", ["--x"], tmp_path, CaptureConfig(warmup_steps=2, window_steps=20),
                                [{"change": c, "predicted_saving_ns": None, "rule_id": None} for c in chosen],
                                profiled or {}, budget, echo=lines.append)
    return records, lines


def test_runs_are_interleaved_with_the_baseline_under_one_config(tmp_path, fake_runs):
    fake = fake_runs({None: 10.0, "compile": 6.0, "tf32": 9.0})
    records, lines = _run(tmp_path, ["compile", "tf32"])
    assert [(c["name"], c["change"]) for c in fake.calls] == [
        ("trial_settle.json", None), ("trial_baseline.json", None), ("trial_compile.json", "compile"),
        ("trial_baseline_2.json", None), ("trial_tf32.json", "tf32"), ("trial_baseline_3.json", None)]
    # every run: the same warm-up, window, bare mode and arguments; only the change differs
    assert {(c["warmup"], c["window"], c["bare"], tuple(c["args"])) for c in fake.calls} == {(4, 10, True, ("--x",))}
    compile_, tf32 = records
    assert len(compile_["baseline_runs_ns"]) == 3 and compile_["baseline_after"] is True
    assert compile_["status"] == "measured" and tf32["status"] == "measured"
    assert "not counted: the settling run" in compile_["baseline_note"]
    # one progress line per run, then the note on the baselines
    assert [ln.split(":")[0] for ln in lines[1:]] == ["[try] settling run (not counted)", "[try] baseline",
                                                     "[try 1/2] compile", "[try] baseline", "[try 2/2] tf32",
                                                     "[try] baseline", "[try] 3 baseline runs interleaved with the trials",
                                                     "[try] trials budget"]
    # two changes: a win needs three baselines before it is decided, so the last baseline ran
    assert "120 s of 300 s used" in lines[-1] and "every planned run made" in lines[-1]


def test_a_lone_trial_runs_twice_between_three_baselines(tmp_path, fake_runs):
    fake = fake_runs({None: 10.0, "compile": 6.0})
    (record,), _ = _run(tmp_path, ["compile"])
    assert [c["change"] for c in fake.calls] == [None, None, "compile", None, "compile", None]
    assert record["trial_runs"] == 2 and record["steps"] == 20 and len(record["baseline_runs_ns"]) == 3


def test_a_failed_trial_is_not_run_again(tmp_path, fake_runs):
    fake = fake_runs({None: 10.0}, fail=("compile",))
    (record,), _ = _run(tmp_path, ["compile"])
    # nor is a baseline run after it: nothing was measured since the one before it
    assert [c["change"] for c in fake.calls] == [None, None, "compile"]
    assert record["status"] == "failed" and record["error"] == "RuntimeError: boom"


def test_a_trial_the_budget_left_without_a_following_baseline_says_so(tmp_path, fake_runs):
    """Runs of 20 s in a 103 s budget: settle, A, compile, A, tf32 end at 100 s; 3 s are left, too
    few to start the baseline after tf32, and fused-optimizer never starts."""
    fake = fake_runs({None: 10.0, "compile": 6.0, "tf32": 7.0, "fused-optimizer": 9.0}, run_s=20.0)
    records, _ = _run(tmp_path, ["compile", "tf32", "fused-optimizer"], budget=103.0)
    assert [c["change"] for c in fake.calls] == [None, None, "compile", None, "tf32"]
    compile_, tf32, fused = records
    assert compile_["baseline_after"] is True
    assert tf32["baseline_after"] is False and "none after it" in tf32["compared_with"]
    assert len(tf32["baseline_runs_ns"]) == 2 and tf32["saving_ns"] is not None
    assert fused["status"] == "over budget" and "--try-budget" in fused["error"]


def test_the_bare_run_before_the_capture_is_a_note_not_a_baseline(tmp_path, fake_runs):
    fake_runs({None: 10.0, "compile": 6.0})
    bare = status(5.0, 99)
    (record,), _ = _run(tmp_path, ["compile"], profiled={"bare_run": bare})
    assert len(record["baseline_runs_ns"]) == 3 and all(v > 9e6 for v in record["baseline_runs_ns"])
    bare_ms = statistics.median(measured([bare])[0]) / 1e6
    assert f"the bare run before the capture {bare_ms:.2f} ms" in record["baseline_note"]


# ---- ranking by conclusive savings only -------------------------------------------------------------

def _recs():
    return [{"rule_id": "GD-OVERHEAD-BOUND", "saving_ns_per_step": 10e6, "how_to_fix": "Use CUDA graphs.",
             "title": "overhead"},
            {"rule_id": "GD-UNFUSED-OPTIMIZER", "saving_ns_per_step": 1e6, "how_to_fix": "fused=True",
             "title": "optimizer"}]


def _record(change, base_ms, trial_ms, rule_id=None, seeds=(1, 2, 3, 4)):
    base = [status(ms, s) for ms, s in zip(base_ms, seeds)]
    return results.trial_result({"change": change, "rule_id": rule_id}, base,
                                [status(trial_ms, seeds[-1] + 10, change=change)], 0, 1.0)


def test_an_inconclusive_trial_never_sets_the_measured_saving_nor_the_rank():
    inconclusive = _record("fused-optimizer", (10.9, 11.9, 6.57), 6.58, "GD-UNFUSED-OPTIMIZER")
    assert inconclusive["status"] == "inconclusive" and inconclusive["saving_ns"] > 1e6
    report = {"recommendations": _recs()}
    ranking.attach(report, [inconclusive], [])
    assert [r["rule_id"] for r in report["recommendations"]] == ["GD-OVERHEAD-BOUND", "GD-UNFUSED-OPTIMIZER"]
    rec = report["recommendations"][1]
    assert rec["measured_saving_ns"] is None and rec["measured_saving_percent"] is None
    assert rec["trial_status"] == "inconclusive" and rec["trial_saving_ns"] == inconclusive["saving_ns"]
    assert rec["trial_saving_ci_ns"] == inconclusive["saving_ci_ns"] and "baselines disagree" in rec["trial_reason"]
    # the graph-form note speaks only of a conclusive compile-graphs trial
    graphs = _record("compile-graphs", (10.9, 11.9, 6.57), 6.58, "GD-OVERHEAD-BOUND")
    report = ranking.attach({"recommendations": _recs()}, [graphs], [])
    assert report["recommendations"][0]["how_to_fix"] == "Use CUDA graphs."


def test_a_conclusive_trial_ranks_its_advice_and_prefers_conclusive_over_larger():
    fused = _record("fused-optimizer", (10.0, 10.1, 9.9), 1.0, "GD-UNFUSED-OPTIMIZER")
    graphs_noisy = _record("compile-graphs", (10.9, 11.9, 6.57), 6.3, "GD-OVERHEAD-BOUND")
    compile_sure = _record("compile", (10.0, 10.1, 9.9), 9.0, "GD-OVERHEAD-BOUND")
    assert fused["status"] == compile_sure["status"] == "measured" and graphs_noisy["status"] == "inconclusive"
    assert graphs_noisy["saving_ns"] > compile_sure["saving_ns"]
    report = ranking.attach({"recommendations": _recs()}, [graphs_noisy, compile_sure, fused], [])
    first, second = report["recommendations"]
    assert first["rule_id"] == "GD-UNFUSED-OPTIMIZER" and first["measured_saving_ns"] == fused["saving_ns"]
    assert second["trial_change"] == "compile" and second["measured_saving_ns"] == compile_sure["saving_ns"]


def test_an_unpredicted_win_becomes_a_measured_recommendation_once():
    win = _record("channels-last", (10.0, 10.1, 9.9), 8.0) | {"origin": "generic"}
    noise = _record("tf32", (10.9, 11.9, 6.57), 6.58) | {"origin": "generic"}
    report = {"recommendations": _recs()}
    for _ in range(2):  # gpudiag report RUN_DIR attaches the trials again
        ranking.attach(report, [win, noise], [])
    measured_recs = [r for r in report["recommendations"] if r["rule_id"] == ranking.MEASURED_RULE]
    (rec,) = measured_recs
    assert rec["predicted"] is False and rec["measured_saving_ns"] == win["saving_ns"]
    assert rec["trial_change"] == "channels-last" and "channels_last" in rec["how_to_fix"]
    # ranked by its measured 2 ms: below the 10 ms predicted, above the 1 ms predicted
    assert [r["rule_id"] for r in report["recommendations"]] == ["GD-OVERHEAD-BOUND", "GD-MEASURED",
                                                                  "GD-UNFUSED-OPTIMIZER"]
    assert not any(r["rule_id"] == ranking.MEASURED_RULE and r["trial_change"] == "tf32"
                   for r in report["recommendations"])


# ---- changes no rule predicted, on real reports (tests/fixtures/trials, H100/H200) -----------------

def _report(name: str) -> dict:
    return json.loads(lzma.open(TRIALS / name / "report.json.xz").read())


def _status(name: str) -> dict:
    return json.loads((TRIALS / name / "script_status.json").read_text())


def test_generic_changes_follow_what_the_run_does():
    """ViT-S fp32 training: fp32 GEMMs (37 of 56 ms), an optimizer step, a 0.55 ms patch
    convolution; ConvNeXt: 20 ms of convolutions; BERT serving (inference, fp32); a generate loop;
    a host-bound server whose GEMMs already run TF32 (0.03 ms fp32)."""
    vit = dict(plan.generic_changes(_report("vit_h100")))
    assert list(vit) == ["tf32", "compile", "bf16-autocast", "compile-graphs", "fused-optimizer"]
    assert "channels-last" not in vit  # the patch convolution is 1 % of the step
    convnext = dict(plan.generic_changes(_report("convnext_h100")))
    assert {"channels-last", "cudnn-benchmark", "tf32", "fused-optimizer"} <= set(convnext)
    encoder = dict(plan.generic_changes(_report("encoder_h100")))
    assert "half-weights" in encoder and "bf16-autocast" not in encoder and "fused-optimizer" not in encoder
    assert "static-cache" in dict(plan.generic_changes(_report("decoder_h100")))
    serve = dict(plan.generic_changes(_report("serve_h100")))
    assert "tf32" not in serve and set(serve) == {"compile", "compile-graphs"}


def test_auto_tries_the_predicted_changes_then_generic_ones_up_to_six():
    report, status = _report("vit_h100"), _status("vit_h100")
    chosen, left = plan.choose(report, status, None)
    predicted = [c["change"] for c in chosen if c["origin"] == "predicted"]
    assert predicted == ["tf32", "bf16-autocast", "compile-graphs"]  # the three largest predictions
    generic = [c for c in chosen if c["origin"] == "generic"]
    # the changes that compile run after the others: fused-optimizer before compile
    assert [c["change"] for c in generic] == ["fused-optimizer", "compile"]
    assert [c["change"] for c in chosen] == ["tf32", "bf16-autocast", "fused-optimizer", "compile-graphs", "compile"]
    # compile was predicted (GD-TORCH-COMPILE) but ranked fourth: tried with its prediction
    assert generic[1]["rule_id"] == "GD-TORCH-COMPILE" and generic[1]["predicted_saving_ns"] > 0
    assert generic[0]["rule_id"] is None and generic[0]["why"] == "the step runs optimizer.step()"
    assert len(chosen) <= plan.TOTAL_COUNT and all(e["change"] != "compile" for e in left)


def test_generic_changes_respect_blocked():
    report = _report("vit_h100") | {"compiled": {"graphs": 2}}
    chosen, _ = plan.choose(report, {"autocast_dtype": "bfloat16"}, None)
    names = [c["change"] for c in chosen]
    assert not {"compile", "compile-graphs", "bf16-autocast"} & set(names)
    capped, left = plan.choose(_report("convnext_h100"), _status("convnext_h100"), None, total=4)
    assert len(capped) == 4 and any("beyond the 4 trials" in e["reason"] for e in left)


def test_generic_changes_on_analysed_captures(analysed):
    """The zoo's ResNet-50 (bf16, convolutions) and BERT already compiled (H100 captures, analysed
    here): convolution changes for the one; no compile of either kind for the other."""
    from conftest import status_of

    _, resnet = analysed("zoo_resnet50")
    chosen, _ = plan.choose(resnet, status_of("zoo_resnet50") or {}, None)
    assert {"channels-last", "cudnn-benchmark"} <= {c["change"] for c in chosen}
    assert "tf32" not in {c["change"] for c in chosen}  # its GEMMs and convolutions run bf16
    _, bert = analysed("zoo_bert_compile")
    chosen, _ = plan.choose(bert, status_of("zoo_bert_compile") or {}, None)
    assert not {"compile", "compile-graphs"} & {c["change"] for c in chosen}


# ---- the reports say "inconclusive" and why -------------------------------------------------------

def _report_with_trials(analysed):
    """The zoo's ResNet-50 report with an inconclusive channels-last trial (GD-CHANNELS-LAST) and a
    conclusive cudnn-benchmark win no rule predicted."""
    report = json.loads(json.dumps(analysed("zoo_resnet50")[1]))
    inconclusive = _record("channels-last", (10.9, 11.9, 6.57), 6.58, "GD-CHANNELS-LAST")
    inconclusive["verdict_reason"] += " <b>x</b>"
    win = _record("cudnn-benchmark", (14.0, 14.1, 13.9), 4.0) | {"origin": "generic"}
    return ranking.attach(report, [inconclusive, win], [])


def test_html_and_terminal_say_inconclusive_and_why(analysed):
    report = _report_with_trials(analysed)
    page = html.render(report)
    assert "inconclusive" in page and "baselines disagree by 5." in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page  # autoescaped
    assert "none: no rule predicted this change" in page and "Measured, not predicted: cudnn-benchmark" in page
    console = Console(record=True, width=250)
    terminal.render_trials(report, console)
    text = console.export_text()
    assert "channels-last inconclusive: baselines disagree by 5." in text and "95 % CI" in text  # both tables
    assert "not predicted" in text and "GD-MEASURED" in text and "repaid in" in text
    assert "inconclusive (channels-last" in text  # the recommendation's measured column
    saved = json.loads(json.dumps(report))  # report.json keeps the GD-MEASURED entry for rule authors
    assert [r["trial_change"] for r in saved["recommendations"] if r["rule_id"] == "GD-MEASURED"] == ["cudnn-benchmark"]
