"""Trials that end sooner (issue, part 5): the early decision of a change checked against
brute-force oracles written here (pooled medians by ``statistics.median``, a percentile bootstrap
with ``random``), the schedule with its early stops on a fake clock, the settling run counted on
recorded runs, and the budget account the report and the terminal show.
"""

from __future__ import annotations

import json
import random
import statistics

import numpy as np
import pytest
from rich.console import Console

from gpudiag.capture.instrument import CaptureConfig
from gpudiag.renderers import terminal
from gpudiag.trials import results, runner, stats

from conftest import FIXTURES

MS = 1e6


# ---- oracles ----------------------------------------------------------------------------------------

def pooled(runs: list[list[float]]) -> float:
    return statistics.median([v for run in runs for v in run])


def spread(runs: list[list[float]]) -> float:
    medians = [statistics.median(r) for r in runs]
    return max(medians) - min(medians)


def brute_interval(baselines, trials, confidence: float, resamples: int = 3000, seed: int = 7) -> tuple[float, float]:
    """Percentile bootstrap of pooled-median differences, steps drawn within each run, by loops."""
    rng = random.Random(seed)
    diffs = []
    for _ in range(resamples):
        base = [rng.choice(run) for run in baselines for _ in run]
        trial = [rng.choice(run) for run in trials for _ in run]
        diffs.append(statistics.median(base) - statistics.median(trial))
    diffs.sort()
    tail = (1 - confidence) / 2
    return diffs[int(tail * resamples)], diffs[int((1 - tail) * resamples) - 1]


def steps(ms: float, seed: int, n: int = 10, cv: float = 0.005) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(ms * MS * (1 + cv * rng.standard_normal(n)))


# ---- the early decision -----------------------------------------------------------------------------

def test_a_pooled_median_lies_within_its_runs_medians():
    """The lemma the "no win" decision rests on, on random runs of odd and even sizes."""
    rng = random.Random(1)
    for _ in range(2000):
        runs = [[rng.choice((rng.uniform(0, 10), rng.randint(0, 3))) for _ in range(rng.randint(1, 6))]
                for _ in range(rng.randint(1, 4))]
        medians = [statistics.median(r) for r in runs]
        assert min(medians) - 1e-12 <= pooled(runs) <= max(medians) + 1e-12, runs


def test_no_baseline_to_come_turns_a_no_win_into_a_measured_win():
    """A change whose pooled median is at or above the fastest baseline run's: decided "no win";
    whatever baseline runs follow (outliers included), its saving never exceeds the spread, so
    the verdict can never be a measured saving."""
    rng = random.Random(2)
    checked = 0
    for case in range(300):
        base = [steps(rng.uniform(8, 12), 10 * case + i, cv=0.05) for i in range(rng.randint(2, 4))]
        trial = [steps(rng.uniform(7, 13), 10 * case + 9, cv=0.05)]
        if pooled(trial) < min(statistics.median(r) for r in base):
            assert stats.early_decision(base, trial) != "no win"
            continue
        assert stats.early_decision(base, trial) == "no win"
        checked += 1
        for extra in range(1, 4):
            more = base + [steps(rng.choice((rng.uniform(1, 30), rng.uniform(8, 12))), 7000 + case * 5 + k, cv=0.3)
                           for k in range(extra)]
            assert pooled(more) - pooled(trial) <= spread(more) + 1e-6
    assert checked > 50


def _margin(base, trial) -> tuple[float, float]:
    """(the 99 % interval's low end by brute force, the margin it must clear: (M − lo) + 3 × spread)."""
    lo = min(statistics.median(r) for r in base)
    low, _ = brute_interval(base, trial, 0.99)
    return low, (pooled(base) - lo) + 3 * spread(base)


def test_a_clear_win_is_decided_from_three_baseline_runs_only():
    base = [steps(10.0, 1), steps(10.05, 2), steps(9.98, 3)]
    trial = [steps(6.0, 4)]
    assert stats.early_decision(base[:2], trial) is None  # two baselines: the spread is too young
    low, margin = _margin(base, trial)
    assert low > margin + 0.5 * MS  # far from the boundary: the oracle's own resampling cannot tip it
    assert stats.early_decision(base, trial) == "win"


def test_issue_34_would_have_been_a_win_from_two_baselines():
    """Two baselines at 10.9 and 11.9 ms, the trial at 6.58 ms: the verdict on those runs says
    measured, which the third baseline (6.57 ms) overturns. Undecided at two; "no win" at three."""
    base = [steps(10.9, 11, cv=0.001), steps(11.9, 12, cv=0.001)]
    trial = [steps(6.58, 14, cv=0.001)]
    assert stats.compare(base, trial)["verdict"] == "measured"
    assert stats.early_decision(base, trial) is None
    base.append(steps(6.57, 13, cv=0.001))
    assert pooled(trial) >= min(statistics.median(r) for r in base)
    assert stats.early_decision(base, trial) == "no win" and stats.compare(base, trial)["verdict"] == "inconclusive"


def test_a_measured_saving_near_the_spread_stays_undecided():
    """Baselines 10.0 / 10.6 / 9.7 ms, trial 8.0 ms: measured on these runs (2 ms against a 0.9 ms
    spread) but inside the margin a next baseline could take away: the last runs are made."""
    base = [steps(10.0, 21), steps(10.6, 22), steps(9.7, 23)]
    trial = [steps(8.0, 24)]
    assert stats.compare(base, trial)["verdict"] == "measured"
    low, margin = _margin(base, trial)
    assert low < margin - 0.3 * MS
    assert stats.early_decision(base, trial) is None


# ---- the schedule on a fake clock ---------------------------------------------------------------------

def status(ms: float, seed: int, change: str | None = None, cv: float = 0.005, first: int = 4, n: int = 10) -> dict:
    """A bare run's status: 4 warm-up steps, then ``n`` CUDA-event steps around ``ms``."""
    times = [3 * ms * MS] + [ms * MS] * (first - 1) + steps(ms, seed, n, cv)
    out = {"warmup_steps": first, "window_steps": n, "step_gpu_ns": {str(i): v for i, v in enumerate(times)},
           "started_unix_s": 1000.0, "window_start_unix_s": 1010.0, "ended_unix_s": 1010.5, "exit_code": 0,
           "exception": None, "losses": {"0": 3.0, "1": 2.0}}
    if change:
        out["trial"] = {"change": change, "applied": [f"{change} applied"], "form": None, "not_applicable": None}
    return out


def bare_run(ms: float) -> dict:
    """The bare run before the capture: warm-up 2, window 20, as gpudiag profile's defaults."""
    times = [3 * ms * MS] + [ms * MS] + steps(ms, 99, 20)
    return {"warmup_steps": 2, "step_gpu_ns": {str(i): v for i, v in enumerate(times)}}


class Fake:
    """A fake ``run_bare`` and clock: each run takes ``run_s`` s; ``ms`` maps a change (None: the
    unchanged script) to its median step; ``settle_ms`` the settling run's; ``fail`` and
    ``not_applicable`` changes. Keeps every status it returns, by file name."""

    def __init__(self, ms: dict, run_s: float = 20.0, settle_ms: float | None = None, fail=(), not_applicable=()):
        self.ms, self.run_s, self.settle_ms = ms, run_s, settle_ms
        self.fail, self.not_applicable = fail, not_applicable
        self.calls, self.statuses, self.clock = [], {}, 0.0

    def monotonic(self) -> float:
        return self.clock

    def __call__(self, script, args, run_dir, config, name, timeout_s=None):
        self.calls.append((name, config.trial))
        self.clock += min(self.run_s, timeout_s) if timeout_s else self.run_s
        if config.trial in self.fail:
            return 1, {"exception": "RuntimeError: boom", "trial": {"change": config.trial}}
        ms = self.settle_ms if name == "trial_settle.json" and self.settle_ms else self.ms[config.trial]
        out = status(ms, len(self.calls), config.trial)
        if config.trial in self.not_applicable:
            out["trial"].update(applied=[], not_applicable="nothing to change")
        self.statuses[name] = out
        return 0, out


@pytest.fixture
def fake(monkeypatch):
    def make(*args, **kwargs):
        made = Fake(*args, **kwargs)
        monkeypatch.setattr(runner, "run_bare", made)
        monkeypatch.setattr(runner, "time", made)
        return made
    return make


def session(tmp_path, changes, budget=300.0, profiled=None):
    lines = []
    chosen = [{"change": c, "predicted_saving_ns": None, "rule_id": None} for c in changes]
    records, account = runner.run_session("train.py", [], tmp_path, CaptureConfig(warmup_steps=2, window_steps=20),
                                          chosen, profiled or {}, budget, echo=lines.append)
    return records, account, lines


def test_the_last_baseline_is_left_out_once_every_change_is_decided(tmp_path, fake):
    made = fake({None: 10.0, "compile": 6.0, "tf32": 9.0, "fused-optimizer": 10.2})
    records, account, lines = session(tmp_path, ["compile", "tf32", "fused-optimizer"])
    assert made.calls == [("trial_settle.json", None), ("trial_baseline.json", None), ("trial_compile.json", "compile"),
                          ("trial_baseline_2.json", None), ("trial_tf32.json", "tf32"), ("trial_baseline_3.json", None),
                          ("trial_fused-optimizer.json", "fused-optimizer")]
    compile_, tf32, fused = records
    assert [compile_["status"], tf32["status"]] == ["measured", "measured"] and fused["saving_ns"] < 0
    assert fused["baseline_after"] is False and fused["decided_early"] == "no win"
    assert "decided (no win)" in fused["compared_with"] and compile_["baseline_after"] is True
    # the interval comes from the runs made, and from nothing else
    base = [made.statuses[n] for n in ("trial_baseline.json", "trial_baseline_2.json", "trial_baseline_3.json")]
    oracle = results.trial_result({"change": "fused-optimizer"}, base, made.statuses["trial_fused-optimizer.json"],
                                  0, 1.0)
    assert fused["saving_ci_ns"] == oracle["saving_ci_ns"] and fused["baseline_runs_ns"] == oracle["baseline_runs_ns"]
    assert account["runs"] == {"settle": 1, "baseline": 3, "trial": 3} and account["used_s"] == 140.0
    assert account["run_s"] == {"settle": 20.0, "baseline": 60.0, "trial": 60.0}
    assert account["not_run"] == {runner.DECIDED: 1} and account["left_out_for_budget"] == []
    assert account["decided_early"] == [{"change": "fused-optimizer", "decision": "no win"}]
    assert [r["name"] for r in account["run_log"]] == [name for name, _ in made.calls]
    assert any(ln.startswith("[try] not run: a baseline run; every change tried is decided") for ln in lines)


def test_a_change_still_undecided_keeps_the_last_baseline(tmp_path, fake):
    """0.07 ms faster than 10.0 ms baselines: faster than every baseline run, inside the margin."""
    made = fake({None: 10.0, "compile": 6.0, "tf32": 9.0, "kernels": 9.93})
    records, account, _ = session(tmp_path, ["compile", "tf32", "kernels"])
    assert made.calls[-1] == ("trial_baseline_4.json", None) and account["not_run"] == {}
    names = ("trial_baseline.json", "trial_baseline_2.json", "trial_baseline_3.json")
    base = [results.step_times(made.statuses[n])[0] for n in names]
    trial = [results.step_times(made.statuses["trial_kernels.json"])[0]]
    assert pooled(trial) < min(statistics.median(r) for r in base)  # not a "no win"
    low, margin = _margin(base, trial)
    assert low < margin  # nor a win
    assert all(r["baseline_after"] for r in records) and account["decided_early"] == []


def test_a_lone_change_with_no_win_runs_twice_without_the_last_baseline(tmp_path, fake):
    """Its repeat is made (two baselines are too few to skip a change's own next run: its speed can
    move between its processes); the baseline after it is not: no baseline can make it a win."""
    made = fake({None: 10.0, "channels-last": 10.4})
    (record,), account, _ = session(tmp_path, ["channels-last"])
    assert [c for _, c in made.calls] == [None, None, "channels-last", None, "channels-last"]
    assert record["trial_runs"] == 2 and len(record["baseline_runs_ns"]) == 2 and record["baseline_after"] is False
    assert record["decided_early"] == "no win" and "decided (no win)" in record["compared_with"]
    assert account["not_run"] == {runner.DECIDED: 1} and account["runs"]["trial"] == 2
    assert account["decided_early"] == [{"change": "channels-last", "decision": "no win"}]


def test_a_change_decided_from_three_baselines_is_not_run_again(tmp_path, fake, monkeypatch):
    """The schedule's rule for a change's repeat, on a schedule that repeats every change."""
    monkeypatch.setattr(runner, "schedule", lambda n, settle=True: [("settle", None), ("baseline", None)]
                        + [run for i in range(n) for run in (("trial", i), ("baseline", None))] * 2)
    made = fake({None: 10.0, "compile": 6.0, "tf32": 9.95})
    records, account, _ = session(tmp_path, ["compile", "tf32"])
    # after S A c A t A: compile is a win from three baselines, tf32 undecided: only tf32 runs again
    assert [c for _, c in made.calls] == [None, None, "compile", None, "tf32", None, "tf32", None]
    assert [r["trial_runs"] for r in records] == [1, 2] and records[0]["decided_early"] == "win"
    assert account["not_run"] == {runner.DECIDED: 1, runner.NOTHING_SINCE: 1}


def test_a_lone_win_runs_twice_between_three_baselines(tmp_path, fake):
    made = fake({None: 10.0, "compile": 6.0})
    (record,), account, _ = session(tmp_path, ["compile"])
    assert [c for _, c in made.calls] == [None, None, "compile", None, "compile", None]
    assert record["trial_runs"] == 2 and record["status"] == "measured" and account["decided_early"] == []


@pytest.mark.parametrize("how", ["fail", "not_applicable"])
def test_no_baseline_follows_a_change_that_measured_nothing(tmp_path, fake, how):
    made = fake({None: 10.0, "compile": 6.0, "tf32": 9.0, "kernels": 9.0}, **{how: ("tf32",)})
    records, account, _ = session(tmp_path, ["compile", "tf32", "kernels"])
    assert [c for _, c in made.calls] == [None, None, "compile", None, "tf32", "kernels", None]
    assert records[1]["status"] == ("failed" if how == "fail" else "not applicable")
    assert records[2]["baseline_after"] is True and account["not_run"] == {runner.NOTHING_SINCE: 1}


def test_a_lone_change_that_fails_ends_the_session(tmp_path, fake):
    made = fake({None: 10.0}, fail=("compile",))
    (record,), account, _ = session(tmp_path, ["compile"])
    assert [c for _, c in made.calls] == [None, None, "compile"] and record["status"] == "failed"
    assert account["not_run"] == {runner.NOTHING_SINCE: 2, runner.FAILED: 1}


def test_a_settling_run_as_fast_as_the_bare_run_is_the_first_baseline(tmp_path, fake):
    made = fake({None: 10.0, "compile": 6.0, "tf32": 9.0, "fused-optimizer": 10.3}, settle_ms=10.1)
    records, account, lines = session(tmp_path, ["compile", "tf32", "fused-optimizer"],
                                      profiled={"bare_run": bare_run(10.0)})
    assert [c for _, c in made.calls] == [None, "compile", None, "tf32", None, "fused-optimizer"]
    assert lines[1].startswith("[try] settling run (counted as the first baseline)")
    settle = statistics.median(results.step_times(made.statuses["trial_settle.json"])[0])
    assert records[0]["baseline_runs_ns"][0] == pytest.approx(settle) and len(records[0]["baseline_runs_ns"]) == 3
    assert "the first: the settling run" in records[0]["baseline_note"]
    assert account["settle_counted"] is True and account["run_log"][0]["counted"] is True
    assert account["not_run"] == {runner.SETTLED: 1, runner.DECIDED: 1}


def test_a_slow_settling_run_is_left_out(tmp_path, fake):
    made = fake({None: 10.0, "compile": 6.0}, settle_ms=12.0)  # +20 %: the capture's slowdown
    (record,), account, lines = session(tmp_path, ["compile"], profiled={"bare_run": bare_run(10.0)})
    assert [c for _, c in made.calls] == [None, None, "compile", None, "compile", None]
    assert lines[1].startswith("[try] settling run (not counted)") and account["settle_counted"] is False
    assert all(v < 11 * MS for v in record["baseline_runs_ns"])


def test_no_run_starts_that_cannot_finish_in_the_budget(tmp_path, fake):
    """Runs of 20 s in 110 s: after five runs 10 s are left, more than 5 s but less than 3/4 of a
    run, so neither the baseline nor the third change starts (none is cut by the budget)."""
    made = fake({None: 10.0, "compile": 6.0, "tf32": 9.0, "kernels": 9.5}, run_s=20.0)
    records, account, lines = session(tmp_path, ["compile", "tf32", "kernels"], budget=110.0)
    assert [c for _, c in made.calls] == [None, None, "compile", None, "tf32"]
    assert account["stopped_by_budget"] == 0 and account["used_s"] == 100.0
    assert account["not_run"] == {runner.BUDGET: 3} and account["left_out_for_budget"] == ["kernels"]
    assert records[1]["baseline_after"] is False and "--try-budget ran out" in records[1]["compared_with"]
    assert records[2]["status"] == "over budget"
    assert "[try] not run: the trial of kernels (10 s of the budget left, a run takes 15 s or more)" in lines


# ---- the settling run on recorded runs (tests/fixtures/trials) ---------------------------------------

@pytest.mark.parametrize("name, counts", [("convnext_h100", True), ("vit_h100", True), ("gnn_h200", True),
                                          ("generate_h100", False), ("lstm_h200", False)])
def test_the_first_run_after_a_recorded_capture(name, counts):
    """ConvNeXt, ViT and the GNN ran as fast right after the capture as before it (0.0 to -0.1 %);
    the generate loop (+42.5 %) and the LSTM (+33 %) did not."""
    folder = FIXTURES / "trials" / name
    first = json.loads((folder / "trial_baseline.json").read_text())
    bare = json.loads((folder / "script_status.json").read_text())["bare_run"]
    ids = [str(k) for k in range(first["warmup_steps"], first["warmup_steps"] + first["window_steps"])
           if str(k) in bare["step_gpu_ns"] and str(k) in first["step_gpu_ns"]]
    ratio = (statistics.median(first["step_gpu_ns"][k] for k in ids)
             / statistics.median(float(bare["step_gpu_ns"][k]) for k in ids))
    assert (ratio <= 1.05) is counts
    assert runner.settle_counts(first, bare)[0] is counts


# ---- the account in the terminal --------------------------------------------------------------------

def test_the_budget_account_is_one_line_in_the_terminal(tmp_path, fake):
    fake({None: 10.0, "compile": 6.0, "tf32": 9.0, "fused-optimizer": 10.2})
    records, account, _ = session(tmp_path, ["compile", "tf32", "fused-optimizer"])
    console = Console(record=True, width=400)
    terminal.render_trials({"trials": records, "trials_budget": account, "recommendations": []}, console)
    text = console.export_text()
    assert ("trials budget: 140 s of 300 s used; runs: 1 settling (not counted), 3 baseline, 3 trial; "
            "1 planned not made (1: every change tried was decided); decided early: fused-optimizer (no win); "
            "left out for the budget: none") in text
    console = Console(record=True, width=400)
    terminal.render_trials({"trials": records, "recommendations": []}, console)  # a report from before
    assert "trials budget" not in console.export_text()


# ---- benchmarks/trial_wall.py on a run directory made here --------------------------------------------

def test_trial_wall_splits_a_session(tmp_path):
    """Two runs with known timestamps: the split computed by hand from them."""
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("trial_wall", ROOT / "benchmarks" / "trial_wall.py")
    wall = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wall)
    (tmp_path / "stage_times.json").write_text(json.dumps({"stages_s": {"profiling": 30.0, "analysing": 12.0,
                                                                        "trials": 50.0}}))
    log = [{"name": "trial_baseline.json", "kind": "baseline", "change": None, "elapsed_s": 21.0},
           {"name": "trial_tf32.json", "kind": "trial", "change": "tf32", "elapsed_s": 25.0}]
    (tmp_path / "report.json").write_text(json.dumps({"trials_budget": {"budget_s": 300, "run_log": log}}))
    for name, (startup, warmup, to_window, window, lived) in {"trial_baseline.json": (9.0, 1.0, 14.0, 0.6, 14.6),
                                                               "trial_tf32.json": (10.0, 2.0, 17.0, 0.5, 17.5)}.items():
        (tmp_path / name).write_text(json.dumps(status(50.0, 1) | {
            "started_unix_s": 100.0, "window_start_unix_s": 100.0 + to_window, "ended_unix_s": 100.0 + lived,
            "startup_ns": startup * 1e9, "warmup_ns": warmup * 1e9}))
    (tmp_path.with_name(tmp_path.name + ".wall_s")).write_text("101.5\n")
    data = wall.session(tmp_path, 180.0)
    assert data["profile_s"] == 42.0 and data["trials_s"] == 50.0 and data["command_wall_s"] == 101.5
    base, tf32 = data["runs"]
    assert base["imports"] == pytest.approx(14.0 - 9.0 - 1.0) and base["outside"] == pytest.approx(21.0 - 14.6)
    assert tf32["window"] == pytest.approx(0.5) and tf32["start-up"] == 10.0 and tf32["warm-up"] == 2.0
    assert data["parts_s"]["outside"] == pytest.approx(6.4 + 7.5)
    assert data["mean_run_s"] == 23.0 and data["runs_that_fit"] == int((180 - 42) // 23)
    assert abs(base["step_ms"] - 50.0) < 1.0


def test_a_script_that_measures_no_steps_ends_the_session_and_says_what_was_not_run(tmp_path, fake):
    """The unchanged script fails: after its first baseline nothing can be compared, and the
    budget account lists every planned run left, with that reason."""
    made = fake({None: 10.0, "compile": 6.0, "tf32": 9.0}, fail=(None,))
    records, account, _ = session(tmp_path, ["compile", "tf32"])
    assert [name for name, _ in made.calls] == ["trial_settle.json", "trial_baseline.json"]
    planned = len(runner.schedule(2))
    assert account["not_run"] == {runner.NO_BASELINE: planned - 2}
    assert [(r["status"], r["error"]) for r in records] == [("skipped", "the baseline run measured no steps")] * 2
