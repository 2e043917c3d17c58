"""Steps and phases inside framework loops (issue 45): work a closure given to
``optimizer.step(closure)`` launches (forward, loss, backward) is not the optimizer's, and with
gradient accumulation a step is one optimizer step over k micro-batches.

The oracle is the NVTX nesting itself, read by a stack written here: every aten op of the detail
step is an NVTX range, and the analysis gives a kernel the phase of the outermost phase range open
at its launch (:func:`gpudiag.analysis.attribution.ranges.attribute`). An op that runs with the
optimizer range open is counted as optimizer work; the tests check which ops those are, on plain
torch closures, LBFGS and Lightning's automatic optimization, and the micro-batch counts the
launcher reports under Lightning, the Hugging Face Trainer and Accelerate, all on CPU tensors.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from gpudiag import nvtx_names
from gpudiag.capture.instrument import CaptureConfig

pytest.importorskip("torch")

from test_launch import _require  # noqa: E402 - after the skip: the helpers need torch
from test_run import DRIVER, TRAIN_LOOP, _run_python, _write  # noqa: E402
from test_window import launch  # noqa: E402

OPTIMIZER = nvtx_names.PHASE + "optimizer"
# aten ops of a Linear -> GELU -> Linear forward, an MSE-style loss and their backward: none of them
# is an optimizer's update (torch.optim's single-tensor and foreach paths use add_, mul_, addcmul_,
# lerp_, sqrt, div_ and their _foreach_ forms)
MODEL_OPS = {"aten::addmm", "aten::gelu", "aten::gelu_backward", "aten::mm", "aten::mse_loss",
             "aten::mse_loss_backward", "aten::linear", "aten::relu", "aten::threshold_backward"}


def run_instrumented(tmp_path, body: str, config: CaptureConfig) -> tuple[list, dict]:
    """``body`` run as __main__ under test_run's recording driver (events, finish() summary); the
    tiny model and input of test_run's loop are defined first, its optimizer is not (an optimizer
    built and never stepped would delay the first step boundary)."""
    driver = _write(tmp_path / "driver.py", DRIVER)
    prelude = TRAIN_LOOP.split("opt = ")[0]
    script = _write(tmp_path / "user_script.py", prelude + "x = torch.randn(5, 4)\n" + textwrap.dedent(body))
    out = tmp_path / "events.json"
    proc = _run_python([str(driver), config.to_json(), str(script), str(out)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    return data["events"], data["summary"]


def ops_with_open_ranges(events: list) -> list[tuple[str, tuple[str, ...]]]:
    """(op name, the push/pop ranges open around it, outermost first) for each op range: the NVTX
    stack replayed from the recorded events (push appends, pop removes the last)."""
    stack: list[str] = []
    out = []
    for event in events:
        if event[0] == "push":
            if event[1].startswith(nvtx_names.OP):
                out.append((json.loads(event[1][len(nvtx_names.OP):])["op"], tuple(stack)))
            stack.append(event[1])
        elif event[0] == "pop":
            stack.pop()
    assert not stack, "unbalanced push/pop"
    return out


def split_by_optimizer(events: list) -> tuple[set[str], set[str]]:
    """(ops run with the optimizer range open, ops run inside a closure range)."""
    ops = ops_with_open_ranges(events)
    return ({op for op, open_ in ops if OPTIMIZER in open_},
            {op for op, open_ in ops if nvtx_names.CLOSURE in open_})


# the closure every loop below gives its optimizer: zero_grad, forward, loss, backward
CLOSURE = """
def closure():
    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    return loss
"""

CLOSURE_LOOP = """
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
""" + CLOSURE + """
for _ in range(6):
    opt.step(CALL)
"""


@pytest.mark.parametrize("call", ["closure", "closure=closure"])
def test_a_closures_forward_and_backward_are_not_optimizer_work(tmp_path, call):
    config = CaptureConfig(warmup_steps=1, detail_step=2)
    events, summary = run_instrumented(tmp_path, CLOSURE_LOOP.replace("CALL", call), config)
    in_optimizer, in_closure = split_by_optimizer(events)
    assert {"aten::addmm", "aten::gelu", "aten::gelu_backward", "aten::mm"} <= in_closure
    assert not in_optimizer & MODEL_OPS, in_optimizer & MODEL_OPS
    assert in_optimizer, "the SGD update itself stays in the optimizer phase"
    assert not in_optimizer & in_closure
    # one step per optimizer.step(), one micro-batch each: the closure's backward
    assert summary["steps_completed"] == 6
    assert set(summary["micro_batches"].values()) == {1}
    assert set(summary["closure_calls"].values()) == {1}


LBFGS_LOOP = """
opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
""" + CLOSURE + """
for _ in range(4):
    opt.step(closure)
"""


def test_lbfgs_evaluates_its_closure_several_times_in_one_step(tmp_path):
    """LBFGS calls the closure up to ``max_iter`` times per step: all of it outside the optimizer
    phase, one step and one micro-batch per ``optimizer.step()``."""
    events, summary = run_instrumented(tmp_path, LBFGS_LOOP, CaptureConfig(warmup_steps=1, detail_step=1))
    in_optimizer, in_closure = split_by_optimizer(events)
    assert not in_optimizer & MODEL_OPS and {"aten::addmm", "aten::mm"} <= in_closure
    assert summary["steps_completed"] == 4
    assert max(summary["closure_calls"].values()) > 1  # evaluated several times in a step
    assert set(summary["micro_batches"].values()) == {1}


LIGHTNING = """
import lightning as L

class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1))
    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

if __name__ == "__main__":
    L.seed_everything(0, verbose=False)
    data = torch.utils.data.TensorDataset(torch.randn(96, 4), torch.randn(96, 1))
    trainer = L.Trainer(max_steps=5, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=ACCUMULATE)
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=8))
    print("GLOBAL_STEP", trainer.global_step)
"""


@pytest.mark.parametrize("accumulate", [1, 3])
def test_lightning_automatic_optimization_closure_and_accumulation(tmp_path, accumulate):
    """Lightning runs training_step and backward inside ``optimizer.step(closure)`` (the stepping
    batch) and calls the closure directly on the batches it accumulates: steps are the trainer's
    global steps, each of ``accumulate_grad_batches`` micro-batches, and no forward or backward op
    is optimizer work."""
    _require("lightning")
    events, summary = run_instrumented(tmp_path, LIGHTNING.replace("ACCUMULATE", str(accumulate)),
                                       CaptureConfig(warmup_steps=1, detail_step=2))
    in_optimizer, in_closure = split_by_optimizer(events)
    assert {"aten::addmm", "aten::mse_loss_backward"} <= in_closure
    assert not in_optimizer & MODEL_OPS, in_optimizer & MODEL_OPS
    assert summary["steps_completed"] == 5  # max_steps optimizer steps
    assert set(summary["micro_batches"].values()) == {accumulate}


MANUAL = """
import lightning as L

class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.net = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1))
    def training_step(self, batch, _):
        opt = self.optimizers()
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

if __name__ == "__main__":
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=8))
"""


def test_lightning_manual_optimization(tmp_path):
    _require("lightning")
    events, summary = run_instrumented(tmp_path, MANUAL, CaptureConfig(warmup_steps=1, detail_step=2))
    in_optimizer, _ = split_by_optimizer(events)
    assert in_optimizer and not in_optimizer & MODEL_OPS
    assert summary["steps_completed"] == 4 and set(summary["micro_batches"].values()) == {1}


HF_TRAINER = """
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

torch.manual_seed(0)
config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=32, num_labels=2)
model = BertForSequenceClassification(config)
g = torch.Generator().manual_seed(1)
data = [{"input_ids": torch.randint(0, 64, (16,), generator=g), "labels": int(i % 2)} for i in range(96)]
args = TrainingArguments(output_dir="out", max_steps=5, per_device_train_batch_size=4, report_to=[],
                         save_strategy="no", use_cpu=True, seed=0, gradient_accumulation_steps=ACCUMULATE)
trainer = Trainer(model=model, args=args, train_dataset=data)
trainer.train()
print("GLOBAL_STEP", trainer.state.global_step)
"""


def test_hf_trainer_gradient_accumulation(tmp_path):
    """HF ``Trainer(gradient_accumulation_steps=3)``: one step per optimizer step (its global
    step), three micro-batches each, through the real launcher."""
    _require("accelerate")
    proc, status = launch(tmp_path, HF_TRAINER.replace("ACCUMULATE", "3"), CaptureConfig(warmup_steps=1, bare=True))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GLOBAL_STEP 5" in proc.stdout and status["steps_completed"] == 5
    assert set(status["micro_batches"].values()) == {3} and set(status["optimizer_calls"].values()) == {1}


ACCELERATE = """
import torch
from torch import nn
from accelerate import Accelerator

torch.manual_seed(0)
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(160, 4), torch.randn(160, 1)),
                                   batch_size=4)
model, opt, data = accelerator.prepare(model, opt, data)
updates = 0
for x, y in data:
    with accelerator.accumulate(model):
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        updates += accelerator.sync_gradients
print("UPDATES", updates)
"""


def test_accelerate_accumulate(tmp_path):
    """``accelerator.accumulate(model)`` with 4 accumulation steps: the wrapped optimizer steps
    the torch one every 4th batch; each gpudiag step holds 4 micro-batches."""
    _require("accelerate")
    proc, status = launch(tmp_path, ACCELERATE, CaptureConfig(warmup_steps=1, bare=True))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "UPDATES 10" in proc.stdout and status["steps_completed"] == 10
    assert set(status["micro_batches"].values()) == {4}


def test_closures_under_the_bare_launcher_keep_results(tmp_path):
    """The wrapped closure returns the closure's own value: LBFGS's losses match a plain run."""
    body = textwrap.dedent(LBFGS_LOOP).replace("    opt.step(closure)", "    print('LOSS', float(opt.step(closure)))")
    script = "import torch\nfrom torch import nn\ntorch.manual_seed(0)\nmodel = nn.Linear(4, 2)\nx = torch.randn(5, 4)\n" + body
    proc, status = launch(tmp_path, script, CaptureConfig(warmup_steps=1, bare=True))
    assert proc.returncode == 0, proc.stderr
    import subprocess
    import sys

    plain = subprocess.run([sys.executable, str(tmp_path / "train.py")], capture_output=True, text=True, timeout=120)
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("LOSS")] == \
        [ln for ln in plain.stdout.splitlines() if ln.startswith("LOSS")]


RAISING = """
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
calls = [0]

def closure():
    calls[0] += 1
    opt.zero_grad()
    loss = model(x).square().mean()
    if calls[0] == 3:
        raise RuntimeError("CUDA out of memory (simulated)")
    loss.backward()
    return loss

for _ in range(6):
    try:
        opt.step(closure)
    except RuntimeError:
        pass  # a caller that carries on (Lightning's batch-size finder on out-of-memory)
"""


def test_a_closure_that_raises_leaves_no_range_open(tmp_path):
    """The closure of the third step raises and the loop carries on: the pushes and pops stay
    balanced (ops_with_open_ranges asserts it) and no later op runs inside a stale optimizer range."""
    events, summary = run_instrumented(tmp_path, RAISING, CaptureConfig(warmup_steps=1, detail_step=3))
    in_optimizer, in_closure = split_by_optimizer(events)
    assert {"aten::addmm", "aten::mm"} <= in_closure and not in_optimizer & MODEL_OPS
    assert summary["steps_completed"] == 5  # the step that raised ended no step


WRAPPER = """
class Lookahead(torch.optim.Optimizer):
    # a wrapper optimizer (Lookahead, ZeRO-style): its step runs its inner optimizer's, closure included
    def __init__(self, inner):
        self.inner = inner
        super().__init__(inner.param_groups, {})
    def step(self, closure=None):
        return self.inner.step(closure)

opt = Lookahead(torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))
""" + CLOSURE + """
for _ in range(6):
    opt.step(closure)
"""


def test_a_wrapper_optimizers_closure_runs_outside_both_optimizer_ranges(tmp_path):
    events, summary = run_instrumented(tmp_path, WRAPPER, CaptureConfig(warmup_steps=1, detail_step=2))
    in_optimizer, in_closure = split_by_optimizer(events)
    assert {"aten::addmm", "aten::mm"} <= in_closure and not in_optimizer & MODEL_OPS and in_optimizer
    # one closure evaluation and one optimizer call (the wrapper's) per step: one micro-batch
    assert set(summary["closure_calls"].values()) == {1} and set(summary["micro_batches"].values()) == {1}
