"""Trials: the changes applied in the user's process (on CPU tensors, Dynamo included), the choice
of changes from a real report, the bookkeeping of real recorded trial runs (a GNN on an H200,
benchmarks/zoo/gnn_train.py, 2026-11-25), and ``gpudiag profile --try`` end to end with a fake nsys.
"""

from __future__ import annotations

import json
import lzma
import statistics
from pathlib import Path

import pytest

from gpudiag.capture.instrument import CaptureConfig
from gpudiag.trials import plan, results, runner

pytest.importorskip("torch")

from test_run import fake_nsys  # noqa: E402,F401 - the fake nsys fixture
from test_window import LONG_TRAINING, launch  # noqa: E402 - after the skip: they need torch

from conftest import FIXTURES

GNN = FIXTURES / "trials" / "gnn_h200"

CONV_TRAINING = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 2))
opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
x = torch.randn(4, 3, 8, 8)
for step in range(10_000):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _status(name: str) -> dict:
    return json.loads((GNN / name).read_text())


def _trial(tmp_path: Path, body: str, change: str | None) -> dict:
    config = runner.trial_config(CaptureConfig(warmup_steps=2, window_steps=20), change)
    proc, status = launch(tmp_path, body, config)
    assert proc.returncode == 0, proc.stderr
    return status


# ---- changes, applied by the launcher on CPU ------------------------------------------------------

def test_compile_trial_compiles_the_root_module_without_graph_breaks(tmp_path):
    baseline = _trial(tmp_path, LONG_TRAINING, None)
    trial = _trial(tmp_path, LONG_TRAINING, "compile")
    assert trial["trial"]["applied"] == ["Sequential.forward = torch.compile(Sequential.forward)"] and not trial["trial"]["not_applicable"]
    dynamo = trial["compile"]
    assert dynamo["unique_graphs"] >= 1 and dynamo["graph_breaks"] == 0 and dynamo["recompiles"] == 0
    # the trial window: 4 warm-up steps (compile settles), then 10 measured, then the script is ended
    assert trial["stopped_after_window"] == 14 and trial["warmup_steps"] == 4
    diff = results.loss_difference(baseline, trial)
    assert diff["step"] == 1 and diff["relative"] <= results.TOLERANCE["fp32"]


def test_fused_optimizer_trial_builds_foreach_on_cpu(tmp_path):
    trial = _trial(tmp_path, LONG_TRAINING, "fused-optimizer")
    # fused=True needs CUDA parameters: on CPU tensors the multi-tensor (foreach) form is used
    assert trial["trial"]["applied"] == ["AdamW(foreach=True)"]


def test_channels_last_trial_converts_conv_models_and_skips_others(tmp_path):
    conv = _trial(tmp_path, CONV_TRAINING, "channels-last")
    assert conv["trial"]["applied"] == ["Sequential.to(memory_format=torch.channels_last) and its 4-D float inputs"]
    baseline = _trial(tmp_path, CONV_TRAINING, None)
    assert results.loss_difference(baseline, conv)["relative"] <= results.TOLERANCE["fp32"]
    mlp = _trial(tmp_path, LONG_TRAINING, "channels-last")
    assert mlp["trial"]["applied"] == [] and "4-D" in mlp["trial"]["not_applicable"]
    record = results.trial_result({"change": "channels-last"}, baseline, mlp, 0, 1.0)
    assert record["status"] == "not applicable" and record["saving_ns"] is None


def test_compile_graphs_trial_marks_each_step_begin(tmp_path):
    """reduce-overhead on CPU tensors compiles without CUDA graphs; the step-begin marks must not
    break it, and the trial says which form it measured."""
    trial = _trial(tmp_path, LONG_TRAINING, "compile-graphs")
    assert trial["trial"]["applied"] == ["Sequential.forward = torch.compile(Sequential.forward, mode='reduce-overhead')"]
    assert "cudagraph_mark_step_begin" in trial["trial"]["form"] and trial["compile"]["graph_breaks"] == 0


def test_unknown_try_change_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown change 'compiler'"):
        plan.parse_try("compile,compiler")
    assert plan.parse_try("none") == [] and plan.parse_try("auto") is None
    assert plan.parse_try("tf32, compile,tf32") == ["tf32", "compile"]


# ---- choosing from a real report ------------------------------------------------------------------

def test_choose_maps_recommendations_to_changes_by_predicted_saving():
    report = json.loads(lzma.open(GNN / "report.json.xz").read())
    status = _status("script_status.json")
    chosen, left = plan.choose(report, status, None)
    recs = {r["rule_id"]: r["saving_ns_per_step"] for r in report["recommendations"]}
    # GD-FP32-MATMUL (tf32, then bf16 autocast: the script has none) predicts more than GD-TORCH-COMPILE
    assert [c["change"] for c in chosen if c["origin"] == "predicted"] == ["tf32", "bf16-autocast", "compile"]
    assert chosen[0]["predicted_saving_ns"] == recs["GD-FP32-MATMUL"]
    by_change = {c["change"]: c for c in chosen}
    assert by_change["compile"]["predicted_saving_ns"] == recs["GD-TORCH-COMPILE"]
    # then what no rule predicted but applies to a training step: CUDA graphs, the optimizer; the
    # changes that compile run last (one compile must not spend every change's budget)
    assert [(c["change"], c["rule_id"]) for c in chosen[2:]] == [("fused-optimizer", None), ("compile", "GD-TORCH-COMPILE"),
                                                                  ("compile-graphs", None)]
    # the GNN has no model gpudiag.fused knows: the kernels change is left out, with the reason
    assert {e["change"]: e["reason"] for e in left} == {"kernels": "no model gpudiag.fused has fused kernels for"}
    # a compiled script is not offered compile; an autocast one not bf16-autocast
    assert plan.blocked("compile", {"compiled": {"graphs": 3}}, {}) and plan.blocked("bf16-autocast", {}, {"autocast_dtype": "bfloat16"})
    assert [c["change"] for c in plan.choose(report, status, ["compile"])[0]] == ["compile"]


# ---- bookkeeping of recorded device runs ----------------------------------------------------------

def _median_of_window(status: dict) -> float:
    """The oracle: CUDA-event step times of the steps [warm-up, warm-up + window), median."""
    lo = status["warmup_steps"]
    hi = lo + status["window_steps"]
    return statistics.median(v for k, v in status["step_gpu_ns"].items() if lo <= int(k) < hi)


@pytest.mark.parametrize("name", ["trial_compile.json", "trial_tf32.json", "trial_bf16-autocast.json"])
def test_trial_result_of_recorded_h200_runs(name):
    baseline, trial = _status("trial_baseline.json"), _status(name)
    change = trial["trial"]["change"]
    record = results.trial_result({"change": change, "predicted_saving_ns": 1e6, "rule_id": "X"}, baseline, trial, 0,
                                  30.0, autocast_dtype=None)
    base, value = _median_of_window(baseline), _median_of_window(trial)
    assert record["baseline_step_ns"] == base and record["trial_step_ns"] == value
    assert record["saving_ns"] == pytest.approx(base - value) and record["steps"] == 10
    assert record["saving_percent"] == pytest.approx(100 * (base - value) / base)
    # one baseline run: the run-to-run spread is unknown, so no saving is claimed
    assert record["method"] == "CUDA events" and record["status"] == "inconclusive"
    assert "one baseline run" in record["verdict_reason"] or "includes zero" in record["verdict_reason"]
    assert record["warmup_s"] == pytest.approx(trial["window_start_unix_s"] - trial["started_unix_s"], abs=0.06)


def test_recorded_gnn_compile_trial_is_the_big_saving():
    """What the device measured (and the same change by hand: docs/trials_proof.md): compile took
    the GNN step from 14.0 to 3.95 ms; TF32 5.8 %; bf16 autocast made it slower."""
    baseline = _status("trial_baseline.json")
    pct = {n: results.trial_result({"change": n}, baseline, _status(f"trial_{n}.json"), 0, 1.0)["saving_percent"]
           for n in ("compile", "tf32", "bf16-autocast")}
    assert pct["compile"] > 70 and 3 < pct["tf32"] < 10 and pct["bf16-autocast"] < 0


def test_loss_check_flags_a_changed_result():
    baseline = {"losses": {"0": 3.0, "1": 2.0, "2": 1.5}}
    assert results.trial_result({"change": "compile"}, baseline | _window(), {"losses": {"1": 2.01}} | _window(),
                                0, 1.0)["status"] == "changes results"  # 0.5 % > fp32's 0.1 %
    within_bf16 = results.trial_result({"change": "bf16-autocast"}, baseline | _window(),
                                       {"losses": {"1": 2.01}} | _window(), 0, 1.0)
    # the timing decides the rest of the status: the same steps, no saving
    assert within_bf16["status"] == "inconclusive" and within_bf16["result_difference"]["tolerance"] == 0.05
    # an unseeded script (two plain runs differ) is not checked, and says so
    unseeded = results.trial_result({"change": "compile"}, baseline | _window(), {"losses": {"1": 2.5}} | _window(),
                                    0, 1.0, comparable=False)
    assert unseeded["status"] != "changes results" and "not checked" in unseeded["result_difference"]["note"]
    assert results.deterministic({"losses": {"1": 2.0}}, {"losses": {"1": 2.5}}) is False


def _window() -> dict:
    return {"warmup_steps": 1, "window_steps": 2, "step_gpu_ns": {"1": 10.0, "2": 12.0}}


def test_failed_and_over_budget_trials_keep_a_reason():
    baseline = _window()
    crashed = results.trial_result({"change": "compile"}, baseline, {"exception": "BackendCompilerFailed: boom\nmore"},
                                   1, 5.0)
    assert crashed["status"] == "failed" and crashed["error"] == "BackendCompilerFailed: boom"
    slow = results.trial_result({"change": "compile"}, baseline, {}, 143, 300.0, timed_out=True)
    assert slow["status"] == "over budget" and "--try-budget" in slow["error"]


def test_attach_ranks_by_measured_saving_and_names_the_graph_form():
    report = {"recommendations": [
        {"rule_id": "GD-OVERHEAD-BOUND", "saving_ns_per_step": 10e6, "how_to_fix": "Use CUDA graphs."},
        {"rule_id": "GD-UNFUSED-OPTIMIZER", "saving_ns_per_step": 1e6, "how_to_fix": "fused=True"}]}
    trials = [{"change": "compile-graphs", "saving_ns": 1e6, "saving_percent": 5.0, "status": "measured",
               "verdict": "measured"},
              {"change": "fused-optimizer", "saving_ns": 9e6, "saving_percent": 11.0, "status": "measured",
               "verdict": "measured"}]
    results.attach(report, trials, [])
    assert [r["rule_id"] for r in report["recommendations"]] == ["GD-UNFUSED-OPTIMIZER", "GD-OVERHEAD-BOUND"]
    overhead = report["recommendations"][1]
    assert overhead["measured_saving_ns"] == 1e6 and overhead["trial_change"] == "compile-graphs"
    assert "one CUDA graph of the whole step" in overhead["how_to_fix"]


# ---- gpudiag profile --try, end to end (fake nsys) ------------------------------------------------

def test_profile_runs_the_asked_trial_and_reports_it(tmp_path, fake_nsys):
    from click.testing import CliRunner

    from gpudiag.cli.main import cli

    script = tmp_path / "train.py"
    script.write_text(LONG_TRAINING)
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(cli, ["profile", str(script), "-o", str(run_dir), "--nsys", str(fake_nsys),
                                      "--steps", "5", "--try", "fused-optimizer"])
    assert result.exit_code == 0, result.output
    report = json.loads((run_dir / "report.json").read_text())
    (trial,) = report["trials"]
    account = report["trials_budget"]
    # every run the budget account lists left its status file and one progress line
    assert account["run_log"][0]["name"] == "trial_settle.json" and "[try] settling run (" in result.output
    assert all((run_dir / r["name"]).is_file() for r in account["run_log"])
    assert result.output.count("[try 1/1] fused-optimizer") == account["runs"]["trial"] == trial["trial_runs"]
    assert result.output.count("[try] baseline:") == account["runs"]["baseline"]
    assert len(trial["baseline_runs_ns"]) == account["runs"]["baseline"] + account["settle_counted"]
    # a lone trial runs twice between three baseline runs, the last left out when it is no win
    assert trial["trial_runs"] == 2
    if trial["decided_early"]:
        assert (trial["decided_early"], len(trial["baseline_runs_ns"]), trial["baseline_after"]) == ("no win", 2, False)
    else:
        assert len(trial["baseline_runs_ns"]) == 3 and trial["baseline_after"] is True
    assert "trials budget: " in result.output and account["budget_s"] == 135
    # CPU: no CUDA events, so host wall-clock time; the change was applied and timed; whether its
    # saving on a tiny CPU model is told from the noise is the statistics' call
    assert trial["change"] == "fused-optimizer" and trial["status"] in ("measured", "inconclusive"), trial
    assert trial["method"] == "host wall-clock time" and trial["applied"] == ["AdamW(foreach=True)"]
    assert trial["steps"] == 5 * trial["trial_runs"]  # 5 steps each: the capture's window
    assert trial["saving_ci_ns"][0] <= trial["saving_ns"] <= trial["saving_ci_ns"][1]
    html = (run_dir / "report.html").read_text()
    assert "Trials: the changes applied and measured" in html and "measured (trial)" in html
    # 'gpudiag report RUN_DIR' analyses the run again and keeps its trials
    again = CliRunner().invoke(cli, ["report", str(run_dir), "--force"])
    assert again.exit_code == 0, again.output
    report = json.loads((run_dir / "report.json").read_text())
    assert [t["change"] for t in report["trials"]] == ["fused-optimizer"] and "trials" not in report["script"]


def test_args_trial_is_compared_per_sample(tmp_path):
    """``--try 'args:--batch 10'``: the script run with the user's other arguments; the batch
    (dimension 0 of the first module input) doubles, so the comparison is per sample."""
    body = LONG_TRAINING.replace("x = torch.randn(5, 4)", "x = torch.randn(int(sys.argv[2]) if len(sys.argv) > 2 else 5, 4)")
    script = tmp_path / "train.py"
    script.write_text(body)
    config = runner.trial_config(CaptureConfig(warmup_steps=2, window_steps=20), None)
    from gpudiag.capture.run import run_bare

    _, base = run_bare(script, [], tmp_path, config, "base.json")
    _, wide = run_bare(script, ["--batch", "10"], tmp_path, config, "wide.json")
    assert base.samples_per_step == 5 and wide.samples_per_step == 10
    record = results.trial_result({"change": "args:--batch 10"}, base, wide, 0, 1.0)
    step_b, _ = results.step_times(base)
    step_w, _ = results.step_times(wide)
    assert record["per"] == "sample" and record["result_difference"] is None
    assert record["baseline_step_ns"] == pytest.approx(statistics.median(step_b) / 5)
    assert record["trial_step_ns"] == pytest.approx(statistics.median(step_w) / 10)
    assert plan.parse_try("compile,args:--batch 64,--lr 1e-3") == ["compile", "args:--batch 64,--lr 1e-3"]


def test_a_saving_inside_the_unchanged_scripts_spread_is_called_noise():
    """Three runs of the unchanged serving loop on the H100 (docs/inference.md: 4.89, 7.92 and
    6.26 ms per request) are 3 ms apart: a trial 1.5 ms under them is inconclusive however tight
    its interval; one 5 ms under them is measured."""
    def run(ms, seed):
        rng = statistics.NormalDist(ms * 1e6, ms * 1e4)
        values = rng.samples(10, seed=seed)
        return {"warmup_steps": 0, "window_steps": None, "step_gpu_ns": {str(i): v for i, v in enumerate(values)}}

    base = [run(4.89, 1), run(7.92, 2), run(6.26, 3)]
    noise = results.trial_result({"change": "compile"}, base, run(4.76, 4), 0, 1.0)
    assert noise["status"] == "inconclusive" and noise["verdict_reason"].startswith("baselines disagree by ")
    assert noise["baseline_spread_percent"] == pytest.approx(100 * (7.92 - 4.89) / 4.89, rel=0.02)
    win = results.trial_result({"change": "compile"}, base, run(1.2, 5), 0, 1.0)
    assert win["status"] == "measured"
    per_sample = results.trial_result({"change": "args:--batch 2"}, [b | {"samples_per_step": 1} for b in base],
                                      run(9.0, 6) | {"samples_per_step": 2}, 0, 1.0)
    assert per_sample["per"] == "sample" and per_sample["trial_step_ns"] == pytest.approx(4.5e6, rel=0.02)
