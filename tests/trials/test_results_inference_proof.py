"""Issue 24 on real captures of plain inference scripts (benchmarks/zoo/infer_zoo.py, H100,
2026-11-25; tests/fixtures/trials/<workload>_h100; docs/inference.md): steps from calls, the
per-request section, and the first advice's predicted saving against the same change made by hand
and timed bare on the device (hand.tsv: the oracle, measured apart from gpudiag)."""

from __future__ import annotations

import pytest

from test_plan_estimates import TRIALS, run_report  # noqa: F401 - the fixture: gpudiag report on a fixture run


def hand(name: str) -> dict[str, float]:
    """Median ms per request of each hand-made change (zoo_changes flags), timed bare on the device."""
    rows = (line.split("\t") for line in (TRIALS / name / "hand.tsv").read_text().splitlines() if line)
    return {change: float(ms) for change, ms in rows if ms.replace(".", "", 1).isdigit()}


def test_a_plain_classifier_gets_one_step_per_batch(run_report):
    """mixer: no optimizer, no NVTX, no gpudiag call. Steps are the model's calls; start-up (model
    construction, weight upload: 7.8 s) is in no step; the profiled median is within 20 % of the
    bare one."""
    report = run_report("mixer_h100")
    status = report["script"]
    assert status["step_mode"] == "forward" and report["steps"]["measured"] >= 5
    assert status["startup_ns"] > 1e9  # seconds of imports and model construction before step 0
    # the capture began at the warm-up's last step: start-up was not traced, and no step holds it
    assert status["capture_started_step"] == status["warmup_steps"] - 1 >= 1
    rep = report["representativeness"]
    assert abs(rep["profiled_step_time_ns"] / rep["bare_step_time_ns"] - 1) < 0.20
    inf = report["inference"]
    assert inf["source"] == "bare run" and inf["samples_per_step"] == 32
    assert inf["latency_ns"]["p50"] <= inf["latency_ns"]["p90"] <= inf["latency_ns"]["p99"]
    assert inf["samples_per_s"] == pytest.approx(32 / (inf["latency_ns"]["p50"] / 1e9))


def test_the_first_advice_on_the_fp32_classifier_is_half_weights_within_25_percent(run_report):
    """fp32 MLP-Mixer B/16 at batch 32: the first advice is GD-HALF-WEIGHTS; its half-weights
    estimate against model.to(torch.bfloat16) made by hand: 24.89 -> 5.53 ms, 19.36 ms saved."""
    report = run_report("mixer_h100")
    first = report["recommendations"][0]
    assert first["rule_id"] == "GD-HALF-WEIGHTS"
    ms = hand("mixer_h100")
    measured = ms["baseline"] - ms["half-weights"]
    predicted = first["change_estimates"]["half-weights"] / 1e6
    assert abs(predicted - measured) <= 0.25 * measured
    # half weights is the change worth most by hand, and the rule ranks it first among its changes
    assert min(ms, key=ms.get) == "half-weights"
    assert max(first["change_estimates"], key=first["change_estimates"].get) == "half-weights"
    assert "GD-FP32-MATMUL" not in {r["rule_id"] for r in report["recommendations"]}  # replaced at inference


def _share_points(saving_ms: float, base_ms: float) -> float:
    return 100.0 * saving_ms / base_ms


@pytest.mark.parametrize("name,batch", [("encoder_h100", 1), ("serve_h100", 8)])
def test_host_bound_requests_first_advice_is_cuda_graphs_within_10_points(run_report, name, batch):
    """A batch-1 encoder with .cpu() per request, and a served MobileNetV3 that never ends (stopped
    by --steps): the first advice is GD-OVERHEAD-BOUND, whose form (compile-graphs) is the change
    worth most by hand; its predicted share of the bare step is within 10 points of the hand-made
    change's share of its own baseline (the baselines of separate processes differ by up to 62 %
    on this machine: docs/inference.md)."""
    report = run_report(name)
    assert report["script"]["step_mode"] == "forward" and report["inference"]["samples_per_step"] == batch
    first = report["recommendations"][0]
    assert first["rule_id"] == "GD-OVERHEAD-BOUND"
    ms = hand(name)
    assert min(ms, key=ms.get) == "compile-graphs"
    predicted = _share_points(first["saving_ns_per_step"] / 1e6, report["representativeness"]["bare_step_time_ns"] / 1e6)
    measured = _share_points(ms["baseline"] - ms["compile-graphs"], ms["baseline"])
    assert abs(predicted - measured) <= 10
    # the trial measured it, and the step with the change agrees with the hand-made one within 15 %
    trial = next(t for t in report["trials"] if t["change"] == "compile-graphs")
    assert trial["status"] == "measured" and abs(trial["trial_step_ns"] / 1e6 / ms["compile-graphs"] - 1) <= 0.15


def test_the_serving_loop_that_never_ends_was_stopped_by_the_window(run_report):
    status = run_report("serve_h100")["script"]
    assert status["exit_code"] == 0 and status["window_complete"] is True
    assert status["stopped_after_window"] == status["warmup_steps"] + status["window_steps"]


def test_inference_trials_compare_outputs(run_report):
    """No loss at inference: each trial is checked on the model's output (bf16 weights move an fp32
    encoder's output by ~2 %, under the bf16 tolerance; compile by ~1e-6)."""
    trials = {t["change"]: t for t in run_report("encoder_h100")["trials"]}
    assert trials["half-weights"]["result_difference"]["compared"] == "outputs"
    assert 1e-3 < trials["half-weights"]["result_difference"]["relative"] < 0.05
    assert trials["compile"]["result_difference"]["relative"] < 1e-4


def test_a_generate_loop_gets_one_step_per_generate_call(run_report):
    """decoder: a Llama-style LM's generate() of 48 tokens for 4 prompts, no NVTX or optimizer.
    Each generate() call is a step with its forwards (prefill + one per token) as sub-steps; the
    steps are named as generate() calls (they were said to be optimizer steps); start-up (18 s of
    imports, model construction and weight upload) is in no step."""
    report = run_report("decoder_h100")
    status = report["script"]
    assert status["step_mode"] == "generate" and report["steps"]["source"].endswith("(generate() calls)")
    assert status["startup_ns"] > 1e9 and status["capture_started_step"] == status["warmup_steps"] - 1
    gen = report["inference"]["generation"]
    assert gen["tokens_per_step"] == 4 * 48 and gen["sequences_per_step"] == 4
    # a request is its first token plus 47 more: TTFT + 47 x TPOT within 5 % of the median latency
    latency = report["inference"]["latency_ns"]["p50"]
    assert gen["ttft_ns"] > 0 and gen["tpot_ns"] > 0 and abs(gen["ttft_ns"] + 47 * gen["tpot_ns"] - latency) <= 0.05 * latency


def _share(rec: dict, report: dict, change: str | None = None) -> float:
    """A recommendation's predicted saving (or one change's) as a share of the bare step, %."""
    ns = rec["change_estimates"][change] if change else rec["saving_ns_per_step"]
    return 100.0 * ns / report["representativeness"]["bare_step_time_ns"]


def test_the_generate_loops_first_advice_is_cuda_graphs_within_10_points(run_report):
    """The decoder's generate() is host-bound (GPU busy 10 %). Its first two advices are the two
    forms of CUDA graphs: GD-OVERHEAD-BOUND (compile-graphs) and GD-STATIC-KV-CACHE (a static
    cache and generate()'s own compile; first once its trial measured it). Each predicted share of
    the bare step is within 10 points of the same change made by hand (79 % and 76 %) and the
    static cache's of its trial; the first advice's change is within 5 points of the change worth
    most by hand (compile-graphs). Both once predicted the step less its kernels (86 %; the static
    cache 120 % of the step, from the traced step); they now leave the token loop's own host time."""
    report = run_report("decoder_h100")
    assert not any("savings_within_the_step" in w for w in report["warnings"])
    recs = {r["rule_id"]: r for r in report["recommendations"]}
    assert {r["rule_id"] for r in report["recommendations"][:2]} == {"GD-OVERHEAD-BOUND", "GD-STATIC-KV-CACHE"}
    ms = hand("decoder_h100")
    by_hand = {c: _share_points(ms["baseline"] - ms[c], ms["baseline"]) for c in ms if c != "baseline"}
    assert abs(_share(recs["GD-OVERHEAD-BOUND"], report) - by_hand["compile-graphs"]) <= 10
    kv = recs["GD-STATIC-KV-CACHE"]
    assert abs(_share(kv, report, "static-cache-compile") - by_hand["static-cache-compile"]) <= 10
    trial = next(t for t in report["trials"] if t["change"] == "static-cache-compile")
    assert trial["status"] == "measured" and abs(_share(kv, report, "static-cache-compile") - trial["saving_percent"]) <= 10
    first_change = {"GD-OVERHEAD-BOUND": "compile-graphs", "GD-STATIC-KV-CACHE": "static-cache-compile"}[
        report["recommendations"][0]["rule_id"]]
    assert max(by_hand.values()) - by_hand[first_change] <= 5


@pytest.mark.parametrize("name,measured", [
    ("seq2seq_h100", None),  # BART: compile-graphs by hand, 199.8 -> 60.1 ms
    ("generate_h100", "trial"),  # GPT-2 (issue 21's workload, not used to build the floor): its trial
])
def test_cuda_graphs_of_a_generate_loop_leave_its_own_host_time(run_report, name, measured):
    """GD-OVERHEAD-BOUND on a loop of forwards (one per token) predicts the step less what CUDA
    graphs of the model leave: the loop's host time outside the forwards (untraced) and the
    kernels. Against compile-graphs: BART by hand (70 %), GPT-2 by its trial (69-74 % against its
    two baselines); both within 10 points (the step less its kernels said 93 %)."""
    report = run_report(name)
    first = report["recommendations"][0]
    assert first["rule_id"] == "GD-OVERHEAD-BOUND" and first["graph_floor"]["forwards_per_step"] >= 32
    if measured == "trial":  # its statuses: the trial against the baseline run after it (CUDA events, medians)
        import json
        import statistics

        from gpudiag.trials.results import step_times

        med = {f: statistics.median(step_times(json.loads((TRIALS / name / f"trial_{f}.json").read_text()))[0])
               for f in ("baseline_after", "compile-graphs")}
        truth = _share_points((med["baseline_after"] - med["compile-graphs"]) / 1e6, med["baseline_after"] / 1e6)
    else:
        ms = hand(name)
        truth = _share_points(ms["baseline"] - ms["compile-graphs"], ms["baseline"])
    assert abs(_share(first, report) - truth) <= 10


def test_the_static_cache_trial_reaches_the_encoder_decoder_and_matches_the_hand_made_change(run_report):
    """seq2seq: BART-base generate() of 32 tokens. generate() calls the encoder first; the trial
    now reaches BartForConditionalGeneration (on the first device run it said "no Hugging Face
    model with a generation_config was called") and its step with the change agrees with the
    hand-made one within 15 % (80.8 / 71.5 ms). The prediction does not (docs/inference.md): the
    bare step ran 135 ms in one call and 234 ms in the next, and the estimate (bare step minus
    kernel time) takes the compiled step to be its kernels alone."""
    report = run_report("seq2seq_h100")
    assert report["script"]["step_mode"] == "generate"
    trial = next(t for t in report["trials"] if t["change"] == "static-cache-compile")
    assert trial["status"] == "measured"
    assert trial["applied"] == ["BartForConditionalGeneration.generation_config.cache_implementation = 'static'"]
    assert abs(trial["trial_step_ns"] / 1e6 / hand("seq2seq_h100")["static-cache-compile"] - 1) <= 0.15
    kv = next(r for r in report["recommendations"] if r["rule_id"] == "GD-STATIC-KV-CACHE")
    assert kv["saving_ns_per_step"] < report["representativeness"]["bare_step_time_ns"]
