"""Inference trials (issue 24) through the real launcher on CPU: half-weights casts the model and its
inputs to bf16 from its second call and hands fp32 outputs back, static-cache switches generate()
to a static KV cache; both are checked by their outputs (no loss at inference) against the
baseline run's, with PyTorch's own fp32 model as the reference; training is refused half-weights."""

from __future__ import annotations

import pytest

from gpudiag.capture.instrument import CaptureConfig
from gpudiag.trials import changes, plan, results

pytest.importorskip("torch")

from test_window import LONG_TRAINING, launch  # noqa: E402

SERVING = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 10)).eval()
x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
seen = []
with torch.no_grad():
    while True:
        y = model(x)
        seen.append(str(y.dtype))  # what the script sees: unchanged by the trial
        print("dtype", seen[-1], flush=True)
        y.tolist()
"""

GENERATE = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)).eval()
model.generation_config.pad_token_id = 0
prompt = torch.randint(1, 64, (2, 4), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    while True:
        out = model.generate(prompt, max_new_tokens=5, min_new_tokens=5, do_sample=False)
        print("cache", type(model.generation_config.cache_implementation).__name__,
              model.generation_config.cache_implementation, flush=True)
"""


def _run(tmp_path, body, trial=None):
    config = changes.with_change(CaptureConfig(warmup_steps=2, window_steps=3, bare=True), trial)
    proc, status = launch(tmp_path, body, config)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, status


def test_half_weights_runs_bf16_and_keeps_the_scripts_dtypes(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, base = _run(tmp_path / "a", SERVING)
    proc, trial = _run(tmp_path / "b", SERVING, "half-weights")
    assert trial["trial"]["applied"] == ["Sequential.to(torch.bfloat16), float inputs cast to bf16 and outputs back "
                                         "to torch.float32"]
    # the script saw float32 outputs throughout (the cast back), so its own code ran unchanged
    assert set(l.split()[1] for l in proc.stdout.splitlines() if l.startswith("dtype")) == {"torch.float32"}
    diff = results.output_difference(base, trial)
    # bf16 weights move the outputs (it did act) by less than the bf16 tolerance
    assert diff is not None and 1e-4 < diff["relative"] <= results.TOLERANCE["bf16"]
    record = results.trial_result({"change": "half-weights"}, base, trial, 0, 1.0, comparable=True)
    # within tolerance: the status is the timing's (one baseline run here: inconclusive)
    assert record["status"] == "inconclusive" and record["result_difference"]["compared"] == "outputs"


def test_the_baseline_output_is_pytorchs_fp32_result(tmp_path):
    """The kept sample is the model's own output (oracle: the same model built and run here)."""
    import torch
    from torch import nn

    _, base = _run(tmp_path, SERVING)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 10)).eval()
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(x).reshape(-1).tolist()
    assert set(base["outputs"]) == {"1", "2", "3"}
    assert base["outputs"]["1"] == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_static_cache_switches_generate_and_keeps_its_logits(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, base = _run(tmp_path / "a", GENERATE)
    proc, trial = _run(tmp_path / "b", GENERATE, "static-cache")
    assert trial["step_mode"] == "generate"
    assert any("static" in a and "disable_compile = True" in a for a in trial["trial"]["applied"])
    assert "cache str static" in proc.stdout
    diff = results.output_difference(base, trial)
    assert diff is not None and diff["relative"] <= results.TOLERANCE["fp32"]


SEQ2SEQ = """
import torch
from transformers import BartConfig, BartForConditionalGeneration

torch.manual_seed(0)
model = BartForConditionalGeneration(BartConfig(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1,
                                                encoder_attention_heads=2, decoder_attention_heads=2,
                                                encoder_ffn_dim=64, decoder_ffn_dim=64,
                                                max_position_embeddings=64)).eval()
model.generation_config.pad_token_id = 0
prompt = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    while True:
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4, min_new_tokens=4,
                             do_sample=False)
        print("cache", model.generation_config.cache_implementation, flush=True)
"""


def test_static_cache_reaches_an_encoder_decoder_past_its_encoder(tmp_path):
    """generate() of an encoder-decoder calls its encoder first, as an outermost module: the trial
    must still reach the model generate() was called on (on the H100 the BART trial said "no
    Hugging Face model with a generation_config was called": its hooks went before the decoder ran)."""
    pytest.importorskip("transformers")
    proc, trial = _run(tmp_path, SEQ2SEQ, "static-cache")
    assert trial["step_mode"] == "generate" and trial["trial"]["not_applicable"] is None
    assert trial["trial"]["applied"] == ["BartForConditionalGeneration.generation_config.cache_implementation = "
                                         "'static'; generation_config.disable_compile = True"]
    # from the second generate() on, the script's own model generates with the static cache
    assert "cache static" in proc.stdout


def test_inference_changes_are_planned_for_inference_only(tmp_path):
    report = {"recommendations": [{"rule_id": "GD-HALF-WEIGHTS", "saving_ns_per_step": 9e6,
                                   "change_estimates": {"half-weights": 9e6, "tf32": 4e6, "bf16-autocast": -1e6}}]}
    preds = plan.predictions(report)
    assert preds["half-weights"]["predicted_saving_ns"] == 9e6 and preds["tf32"]["predicted_saving_ns"] == 4e6
    assert preds["bf16-autocast"]["predicted_saving_ns"] == -1e6  # autocast's casts cost more than it saves
    chosen, left = plan.choose(report, {}, None)  # a training report: no "inference" section
    assert [c["change"] for c in chosen if c["origin"] == "predicted"] == ["tf32", "bf16-autocast"]
    assert [e["change"] for e in left] == ["half-weights"] and "training run" in left[0]["reason"]
    inference = report | {"inference": {"step_mode": "forward"}}
    chosen, left = plan.choose(inference, {}, None)
    assert [c["change"] for c in chosen if c["origin"] == "predicted"] == ["half-weights", "tf32", "bf16-autocast"]
    # no kernels in this report: only the changes that apply to any model are added
    assert [c["change"] for c in chosen if c["origin"] == "generic"] == ["compile", "compile-graphs"]
    assert plan.blocked("static-cache", inference, {}).startswith("no generate()")
    assert plan.blocked("static-cache", {"inference": {"step_mode": "generate"}}, {}) is None


def test_training_refuses_half_weights(tmp_path):
    proc, status = launch(tmp_path, LONG_TRAINING, CaptureConfig(warmup_steps=1, window_steps=2, bare=True))
    assert proc.returncode == 0
    assert plan.blocked("half-weights", {"inference": None}, status).startswith("a training run")
