"""Scripts as users start them: ``python -m package.module`` (with relative imports), DataLoader
worker processes, argparse and ``sys.exit``, HF ``Trainer`` and PyTorch Lightning: same results
under gpudiag's launcher as without it (on CPU tensors; the hooks are the same on a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.capture.instrument import CaptureConfig

pytest.importorskip("torch")  # the scripts these tests run (or import) use torch

from test_run import TRAIN_LOOP, _child_env, _write, fake_nsys, profile_cli  # noqa: E402, F401 - fake_nsys is a fixture

PACKAGE_MAIN = TRAIN_LOOP + """
import argparse, sys
from . import helper  # a relative import works only when run as a module

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2)
args = parser.parse_args()
for _ in range(args.steps):
    train_step()
print("steps done", helper.NAME, sys.argv[0].endswith("train.py"))
sys.exit(7)
"""


def _package(tmp_path: Path) -> Path:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    _write(pkg / "__init__.py", "")
    _write(pkg / "helper.py", "NAME = 'helper'\n")
    _write(pkg / "train.py", PACKAGE_MAIN)
    return pkg


def test_profile_a_module_as_python_m_runs_it(tmp_path, fake_nsys, monkeypatch):
    """`gpudiag profile -m mypkg.train -- --steps 3`: relative imports resolve, argparse gets the
    arguments, sys.argv[0] is the module's file, and the module's sys.exit code is gpudiag's."""
    _package(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = profile_cli("-m", "mypkg.train", "-o", str(tmp_path / "run"), "--nsys", str(fake_nsys), "--", "--steps", "3")
    assert result.exit_code == 7, result.output
    assert "steps done helper True" in result.output
    status = json.loads((tmp_path / "run" / "script_status.json").read_text())
    assert status["steps_completed"] == 3 and status["exit_code"] == 7
    assert status["bare_run"]["steps_completed"] == 3  # the bare run ran the module the same way


def test_a_missing_module_is_a_one_line_usage_error(tmp_path, fake_nsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = profile_cli("-m", "no_such_module_here", "-o", str(tmp_path / "run"), "--nsys", str(fake_nsys))
    assert result.exit_code == 2
    assert "-m no_such_module_here: no module named 'no_such_module_here'" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()
    neither = profile_cli("--nsys", str(fake_nsys))
    assert neither.exit_code == 2 and "give SCRIPT (a Python file) or -m MODULE" in neither.output


DATALOADER = """
import sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
losses = []
if __name__ == "__main__":
    for x, y in DataLoader(data, batch_size=16, num_workers=2, shuffle=False):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 6))
    print("LOSSES", losses)
"""


def test_dataloader_workers_run_the_same_under_the_launcher(tmp_path):
    """Worker processes start (fork) inside the launcher's process; the losses equal a plain run's."""
    plain, launched, status = _plain_and_launched(tmp_path, DATALOADER, "loader.py")
    assert launched == plain and status["steps_completed"] == 4


HF_TRAINER = """
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

torch.manual_seed(0)
config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=32, num_labels=2)
model = BertForSequenceClassification(config)
g = torch.Generator().manual_seed(1)
data = [{"input_ids": torch.randint(0, 64, (16,), generator=g), "labels": int(i % 2)} for i in range(32)]
args = TrainingArguments(output_dir="out", max_steps=4, per_device_train_batch_size=8, logging_steps=1,
                         report_to=[], save_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0)
trainer = Trainer(model=model, args=args, train_dataset=data)
trainer.train()
print("LOSSES", [round(h["loss"], 5) for h in trainer.state.log_history if "loss" in h])
"""

LIGHTNING = """
import torch
import lightning as L
from torch import nn

class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.losses = []
    def training_step(self, batch, _):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses.append(round(loss.item(), 6))
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

if __name__ == "__main__":
    L.seed_everything(0, verbose=False)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    module = Module()
    trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    print("LOSSES", module.losses)
"""


def _require(module: str) -> None:
    """Skip without ``module`` outside CI; in CI (``CI`` set, the test extra installs it) it must import."""
    if not os.environ.get("CI"):
        pytest.importorskip(module)


def _plain_and_launched(tmp_path: Path, source: str, name: str) -> tuple[str, str, dict]:
    script = _write(tmp_path / name, source)

    def run(args: list[str]) -> str:
        proc = subprocess.run([sys.executable, *args], cwd=tmp_path, env=_child_env(), capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [line for line in proc.stdout.splitlines() if line.startswith("LOSSES")][0]

    plain = run([str(script)])
    launched = run(["-m", "gpudiag.capture.launch", "--config", CaptureConfig(warmup_steps=1).to_json(),
                    "--status", str(tmp_path / "status.json"), str(script)])
    return plain, launched, json.loads((tmp_path / "status.json").read_text())


def test_hf_trainer_runs_the_same_under_the_launcher(tmp_path):
    """HF Trainer (through accelerate's optimizer wrapper): same losses, one step per optimizer step."""
    _require("accelerate")
    plain, launched, status = _plain_and_launched(tmp_path, HF_TRAINER, "hf_train.py")
    assert launched == plain and status["steps_completed"] == 4


def test_lightning_runs_the_same_under_the_launcher(tmp_path):
    """PyTorch Lightning (optimizer step through a closure): same losses, one step per optimizer step."""
    _require("lightning")
    plain, launched, status = _plain_and_launched(tmp_path, LIGHTNING, "lit_train.py")
    assert launched == plain and status["steps_completed"] == 4
