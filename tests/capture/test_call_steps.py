"""Steps from calls (issue 24) through the real launcher on CPU: a plain inference loop (no
optimizer, no NVTX, no gpudiag calls) gets one step per request; a Hugging Face generate() loop
gets one step per generate() call, not per token; training keeps its optimizer steps; the window
counts these steps and ends a serving loop that never ends."""

from __future__ import annotations

import pytest

from gpudiag.capture.instrument import CaptureConfig

pytest.importorskip("torch")

from test_window import launch  # noqa: E402 - after the skip: it needs torch

SERVING = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
print("model ready", flush=True)
requests = 0
with torch.no_grad():
    while True:  # a server: it never ends by itself
        x = torch.randn(3, 8)
        y = model(x).tolist()  # the request's own host copy belongs to its step
        requests += 1
"""

GENERATE = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64)).eval()
prompt = torch.randint(0, 64, (2, 4))
forwards = [0]
model.register_forward_pre_hook(lambda *a: forwards.__setitem__(0, forwards[0] + 1))
with torch.no_grad():
    for i in range(10_000):
        model.generate(prompt, max_new_tokens=5, min_new_tokens=5, do_sample=False, pad_token_id=0)
        print("forwards", forwards[0], flush=True)
"""


def test_a_serving_loop_gets_one_step_per_request_and_is_stopped(tmp_path):
    config = CaptureConfig(warmup_steps=2, window_steps=4, bare=True)
    proc, status = launch(tmp_path, SERVING, config)
    assert proc.returncode == 0, proc.stderr
    assert status["step_mode"] == "forward" and status["stopped_after_window"] == 6
    # boundaries at each request's forward: step k (k ≥ 1) is timed from request k's start to k+1's
    assert {"1", "2", "3", "4", "5"} <= set(status["step_wall_ns"])
    assert status["samples_per_step"] == 3


def test_explicit_forward_steps_start_at_the_first_call(tmp_path):
    config = CaptureConfig(steps_from="forward", warmup_steps=1, window_steps=3, bare=True)
    proc, status = launch(tmp_path, SERVING, config)
    assert proc.returncode == 0, proc.stderr
    assert status["step_mode"] == "forward" and status["stopped_after_window"] == 4


def test_generate_loop_gets_one_step_per_generate_call(tmp_path):
    pytest.importorskip("transformers")
    config = CaptureConfig(warmup_steps=2, window_steps=3, bare=True)
    proc, status = launch(tmp_path, GENERATE, config)
    assert proc.returncode == 0, proc.stderr
    assert status["step_mode"] == "generate"
    # 5 new tokens = 5 forwards per generate() call; 5 steps (2 warm-up + 3) took 4 full calls
    # and the window ended as the 5th began (the script printed after each of the first 4 only)
    counts = [int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("forwards")]
    assert counts == [5, 10, 15, 20] and status["stopped_after_window"] == 5
    # each complete generate() step (2, 3, 4) records its 5 forwards' starts, prefill first,
    # in order, inside the step (step k's time is step_wall_ns[k])
    forwards = status["generate_forwards"]
    assert {"2", "3", "4"} <= set(forwards)
    for k in ("2", "3", "4"):
        offsets = forwards[k]["wall_ns"]
        assert len(offsets) == 5 and offsets == sorted(offsets) and 0 <= offsets[0]
        assert offsets[-1] < status["step_wall_ns"][k]
    # start-up (imports, model construction) is before step 0, in no step
    assert status["startup_ns"] > 0 and status["warmup_ns"] > 0


def test_training_keeps_optimizer_steps(tmp_path):
    from test_window import LONG_TRAINING

    proc, status = launch(tmp_path, LONG_TRAINING, CaptureConfig(warmup_steps=1, window_steps=3, bare=True))
    assert proc.returncode == 0, proc.stderr
    assert status["step_mode"] == "optimizer" and status["stopped_after_window"] == 4


COMPILED_SERVING = """
import json, torch
from torch import nn

torch.manual_seed(0)
model = torch.compile(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval(), backend="aot_eager")
x = torch.randn(3, 8)
outs = []
with torch.no_grad():
    for _ in range(6):
        outs.append(model(x).sum().item())
from torch._dynamo.utils import counters
print("RESULT " + json.dumps({"outs": outs, "unique_graphs": counters["stats"]["unique_graphs"],
                              "recompiles": sum(counters["recompiles"].values())}))
"""


@pytest.mark.parametrize("bare", [True, False])
def test_forward_steps_of_a_compiled_model_add_no_graph(tmp_path, bare):
    """Dynamo's counters are the oracle: the tracker adds no hook after the first (compiled) call,
    so the launched script compiles the same one graph as the plain one, and never recompiles."""
    import json
    import subprocess
    import sys

    script = tmp_path / "plain.py"
    script.write_text(COMPILED_SERVING)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-2000:]
    config = CaptureConfig(warmup_steps=1, window_steps=3, bare=bare, run_to_end=True)
    proc, status = launch(tmp_path, COMPILED_SERVING, config)
    assert proc.returncode == 0, proc.stderr[-2000:]

    def result(text):
        return json.loads([l for l in text.splitlines() if l.startswith("RESULT ")][-1][len("RESULT "):])

    assert result(proc.stdout) == result(plain.stdout)
    assert result(plain.stdout)["unique_graphs"] == 1 and result(plain.stdout)["recompiles"] == 0
    assert status["step_mode"] == "forward" and status["steps_completed"] >= 4


HOOK_COUNT = """
import torch
from torch import nn
from torch.nn.modules import module as nn_module

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
with torch.no_grad():
    while True:
        model(torch.randn(3, 8)).tolist()
        print("global hooks", len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks), flush=True)
"""


def test_the_bare_run_times_requests_without_global_hooks(tmp_path):
    """Once the stepping module is known, the bare run hooks it alone: PyTorch's slow call path
    for every module (what global hooks cost) stays out of the timed requests."""
    proc, status = launch(tmp_path, HOOK_COUNT, CaptureConfig(warmup_steps=1, window_steps=3, bare=True))
    assert proc.returncode == 0, proc.stderr
    counts = [line.split()[2:] for line in proc.stdout.splitlines() if line.startswith("global hooks")]
    assert counts[0] != ["0", "0"] and counts[-1] == ["0", "0"]  # undecided at the first request only
    assert status["step_mode"] == "forward" and {"1", "2", "3"} <= set(status["step_wall_ns"])


SEQ2SEQ = """
import torch
from transformers import BartConfig, BartForConditionalGeneration

torch.manual_seed(0)
model = BartForConditionalGeneration(BartConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,
    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
    max_position_embeddings=64, forced_bos_token_id=None)).eval()
model.generation_config.pad_token_id = 1
ids = torch.randint(3, 64, (2, 6))
with torch.no_grad():
    while True:
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, num_beams=1)
"""


def test_seq2seq_generate_marks_the_decoder_forwards_not_the_encoder(tmp_path):
    pytest.importorskip("transformers")
    proc, status = launch(tmp_path, SEQ2SEQ, CaptureConfig(warmup_steps=2, window_steps=2, bare=True))
    assert proc.returncode == 0, proc.stderr
    assert status["step_mode"] == "generate"
    # generate() calls the encoder once, then the model once per new token: 4 marks per call
    for k in ("2", "3"):
        assert len(status["generate_forwards"][k]["wall_ns"]) == 4
    assert status["root_parameters"]["kv_bytes_per_position"] is None  # encoder-decoder: not modelled


CALL_TARGET = """
import json
import torch
from torch import nn

model = nn.Linear(4, 2).eval()
with torch.no_grad():
    for i in range(100):
        json.dumps(model(torch.randn(3, 4)).tolist())  # the "request handler" named by --steps-from
"""


def test_steps_from_a_named_function(tmp_path):
    proc, status = launch(tmp_path, CALL_TARGET, CaptureConfig(steps_from="call:json.dumps", warmup_steps=1,
                                                                window_steps=3, bare=True))
    assert proc.returncode == 0, proc.stderr
    assert status["step_mode"] == "call" and status["stopped_after_window"] == 4


@pytest.mark.parametrize("target,message", [("call:json.no_such_function", "not a function"),
                                            ("call:nomodule_xyz.handler", "no importable module"),
                                            ("call:handler", "use call:package.module.function")])
def test_a_bad_call_target_is_one_clear_error(tmp_path, target, message):
    proc, status = launch(tmp_path, CALL_TARGET, CaptureConfig(steps_from=target, bare=True))
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr
