"""Inference read per request (issue 24): latency percentiles, samples/s, start-up, TTFT / TPOT /
tokens/s, from launcher statuses of real CPU runs (a serving loop, a tiny generate() model), the
numbers checked against arithmetic written here; the gate's latency_p90 and tokens_per_s."""

from __future__ import annotations

import pytest

from gpudiag.analysis import gate
from gpudiag.analysis.steps.serving import decode_floor, is_inference, request_metrics
from gpudiag.capture.instrument import CaptureConfig

pytest.importorskip("torch")

from test_call_steps import GENERATE, SERVING  # noqa: E402
from test_window import LONG_TRAINING, launch  # noqa: E402


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (NumPy's default), written out."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def test_a_serving_loop_is_read_per_request(tmp_path):
    config = CaptureConfig(warmup_steps=2, window_steps=6, bare=True)
    proc, status = launch(tmp_path, SERVING, config)
    assert proc.returncode == 0, proc.stderr
    measured = list(range(2, 8))
    inf = request_metrics(status, measured)
    times = [float(status["step_wall_ns"][str(i)]) for i in measured if str(i) in status["step_wall_ns"]]
    assert inf["source"] == "profiled run" and inf["steps"] == len(times) >= 5
    for q in (50, 90, 99):
        assert inf["latency_ns"][f"p{q}"] == pytest.approx(_percentile(times, q))
    assert inf["samples_per_step"] == 3
    assert inf["samples_per_s"] == pytest.approx(3 / (_percentile(times, 50) / 1e9))
    assert inf["startup_ns"] > 0 and inf["generation"] is None


def test_generate_gives_ttft_tpot_and_tokens_per_second(tmp_path):
    pytest.importorskip("transformers")
    config = CaptureConfig(warmup_steps=2, window_steps=3, bare=True)
    proc, status = launch(tmp_path, GENERATE, config)
    assert proc.returncode == 0, proc.stderr
    # the bare run's status, as gpudiag profile attaches it to the profiled one
    inf = request_metrics({"step_mode": "generate", "bare_run": status}, [2, 3, 4])
    assert inf["source"] == "bare run" and inf["steps"] == 3
    gen = inf["generation"]
    ttft, tpot, rate = [], [], []
    for k in ("2", "3", "4"):
        offsets, step = status["generate_forwards"][k]["wall_ns"], status["step_wall_ns"][k]
        ttft.append(offsets[1])  # the second forward starts once the first token exists
        tpot.append((step - offsets[1]) / 4)  # 5 forwards: 4 decode intervals
        rate.append(2 * 5 / (step / 1e9))  # 2 sequences x 5 new tokens
    assert gen["ttft_ns"] == pytest.approx(sorted(ttft)[1])
    assert gen["tpot_ns"] == pytest.approx(sorted(tpot)[1])
    assert gen["tokens_per_s"] == pytest.approx(sorted(rate)[1])
    assert gen["tokens_per_step"] == 10 and gen["ttft_ns"] < inf["latency_ns"]["p50"]
    # the decode roofline: GPT-2 (1 layer, 2 heads of 32/2, fp32) keeps 2 x 1 x 2 x 16 x 4 bytes of
    # K and V per position; 2 prompts of 4 tokens, 5 new: mean context 4 + 2.5 positions
    params = status["root_parameters"]
    n_params = sum(p.numel() for p in _gpt2().parameters())  # tied embeddings counted once, as torch does
    assert params == {"bytes": 4 * n_params, "tensors": len(list(_gpt2().parameters())), "dtype": "float32",
                      "kv_bytes_per_position": 256}
    assert status["first_input_shape"] == [2, 4]
    roof = decode_floor(gen, {"bare_run": status}, 2e12)
    expected_bytes = 4 * n_params + 2 * (4 + 2.5) * 256
    assert roof["bytes"] == pytest.approx(expected_bytes) and roof["kv_included"]
    assert roof["floor_ns"] == pytest.approx(expected_bytes / 2e12 * 1e9)
    assert roof["tpot_over_floor"] == pytest.approx(gen["tpot_ns"] / roof["floor_ns"])


def _gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64))


def test_training_is_not_read_per_request(tmp_path):
    proc, status = launch(tmp_path, LONG_TRAINING, CaptureConfig(warmup_steps=1, window_steps=3, bare=True))
    assert proc.returncode == 0, proc.stderr
    assert not is_inference(status) and request_metrics(status, [1, 2, 3]) is None
    assert not is_inference(None) and not is_inference({"step_mode": None})


def _inference(latencies, rates=None):
    return {"inference": {"latency_samples_ns": latencies,
                          "generation": {"tokens_per_s_samples": rates} if rates else None}}


@pytest.mark.parametrize("latency_factor,rate_factor,expected", [
    (1.0, 1.0, {"latency_p90": "ok", "tokens_per_s": "ok"}),
    (1.3, 1.0, {"latency_p90": "regression", "tokens_per_s": "ok"}),
    (1.0, 0.7, {"latency_p90": "ok", "tokens_per_s": "regression"}),   # fewer tokens/s is worse
    (1.0, 1.3, {"latency_p90": "ok", "tokens_per_s": "improvement"}),
    (0.7, 1.0, {"latency_p90": "improvement", "tokens_per_s": "ok"}),
])
def test_gate_on_p90_latency_and_tokens_per_second(latency_factor, rate_factor, expected):
    base_lat = [10e6 + 1e5 * i for i in range(12)]
    base_rate = [1000.0 + 3 * i for i in range(12)]
    before = gate.inference_metrics(_inference(base_lat, base_rate)["inference"])
    after = gate.inference_metrics(_inference([v * latency_factor for v in base_lat],
                                              [v * rate_factor for v in base_rate])["inference"])
    verdicts = {c.name: c.verdict for c in gate.compare(before, after, gate.GateConfig())}
    assert verdicts == expected
    p90 = next(c for c in gate.compare(before, after, gate.GateConfig()) if c.name == "latency_p90")
    assert p90.baseline_median == pytest.approx(_percentile(base_lat, 90))


def test_a_tail_regression_is_caught_at_p90_where_the_median_holds():
    """Three slow requests in twelve: the median does not move, the p90 does."""
    base = [10e6] * 12
    tail = [10e6] * 9 + [20e6] * 3
    cmp = {c.name: c for c in gate.compare(gate.inference_metrics(_inference(base)["inference"]),
                                           gate.inference_metrics(_inference(tail)["inference"]), gate.GateConfig())}
    assert cmp["latency_p90"].current_median == pytest.approx(20e6)
    assert cmp["latency_p90"].verdict in ("regression", "warning")


def test_the_profiled_status_keeps_what_the_bare_run_measured_for_requests(tmp_path):
    """gpudiag profile attaches the bare run to the profiled status (cli.profile._keep_bare_run):
    everything the per-request section reads must survive it (a subset once lost TTFT/TPOT)."""
    pytest.importorskip("transformers")
    from gpudiag.app.profile_steps import keep_bare_run as _keep_bare_run

    proc, bare = launch(tmp_path, GENERATE, CaptureConfig(warmup_steps=2, window_steps=3, bare=True))
    assert proc.returncode == 0, proc.stderr
    from gpudiag.script_status import ScriptStatus, read_status

    profiled = ScriptStatus.from_json({"step_mode": "generate", "losses": {}})
    _keep_bare_run(ScriptStatus.from_json(bare), tmp_path, profiled)
    assert read_status(tmp_path / "script_status.json") == profiled  # written as kept in memory
    direct = request_metrics({"step_mode": "generate", "bare_run": bare}, [2, 3, 4])
    kept = request_metrics(profiled, [2, 3, 4])
    assert kept == direct and kept["generation"] is not None and kept["startup_ns"] == bare["startup_ns"] > 0
