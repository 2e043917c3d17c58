"""The step window (``gpudiag profile --steps N``) through the real launcher, in child processes on
a CPU-only torch: a script written to train for 10,000 steps ends after warm-up + the window,
cleanly (exit code 0, its ``finally`` blocks run); ``--run-to-end`` lets it run on; user NVTX
step ranges are found without an optimizer; the loss of each step is recorded.

The capture range itself (cudaProfilerStart/Stop read by nsys) needs CUDA: checked on the device
(docs/trials_proof.md); here ``capture_range`` is on and must be harmless without CUDA.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpudiag.capture import nsys
from gpudiag.capture.instrument import CaptureConfig

from test_run import fake_nsys  # noqa: F401 - the fake nsys fixture

pytest.importorskip("torch")

from conftest import ROOT

REPO_ROOT = ROOT

LONG_TRAINING = """
import sys
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(5, 4)
steps_done = 0
try:
    for step in range(10_000):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps_done += 1
finally:
    print(f"finally ran after {steps_done} steps", flush=True)
print("loop finished")
"""

# A serving-style loop: no optimizer, no backward; each request inside the script's own NVTX range.
NVTX_LOOP = """
import torch
from torch import nn

model = nn.Linear(4, 2).eval()
x = torch.randn(3, 4)
with torch.no_grad():
    for i in range(10_000):
        torch.cuda.nvtx.range_push(f"step {i}")
        torch.cuda.nvtx.range_push("decode")  # nested: not a step
        model(x)
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_pop()
print("loop finished")
"""

# CPU torch has no NVTX: stand-ins installed before the launcher wraps them (sitecustomize runs first).
NVTX_STUB = """
import torch.cuda.nvtx as nvtx
nvtx.range_push = lambda msg: 0
nvtx.range_pop = lambda: 0
"""


def launch(tmp_path: Path, body: str, config: CaptureConfig, stub_nvtx: bool = False) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``body`` as a script under ``python -m gpudiag.capture.launch``; (process, status)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    status = tmp_path / "status.json"
    paths = [str(REPO_ROOT)]
    if stub_nvtx:
        (tmp_path / "site").mkdir(exist_ok=True)
        (tmp_path / "site" / "sitecustomize.py").write_text(NVTX_STUB)
        paths.append(str(tmp_path / "site"))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(paths), "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "gpudiag.capture.launch", "--config", config.to_json(), "--status",
                           str(status), str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return proc, json.loads(status.read_text())


def test_a_10000_step_script_ends_after_warmup_and_window(tmp_path):
    config = CaptureConfig(warmup_steps=2, window_steps=5, capture_range=True, bare=True)
    proc, status = launch(tmp_path, LONG_TRAINING, config)
    assert proc.returncode == 0, proc.stderr
    # steps 0..6 (2 warm-up + 5), then ended: the script's finally ran, the code after the loop did not
    assert status["exit_code"] == 0 and status["stopped_after_window"] == 7 and status["steps_completed"] == 7
    assert "finally ran after 6 steps" in proc.stdout and "loop finished" not in proc.stdout
    assert status["window_complete"] is True and status["exception"] is None
    # step k (k >= 1) timed from boundary k-1 to k: the window's steps 2..6 are all there
    assert {"2", "3", "4", "5", "6"} <= set(status["step_wall_ns"])
    # no CUDA here: the capture range never opened (on the GPU it opens at step 1)
    assert status["capture_started_step"] is None
    # the loss of every step, as backward() received it, recomputed here independently for step 0
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    x = torch.randn(5, 4)
    assert set(status["losses"]) == {str(k) for k in range(7)}
    assert status["losses"]["0"] == pytest.approx(model(x).square().mean().item(), rel=1e-6)


def test_run_to_end_keeps_the_script_running(tmp_path):
    body = LONG_TRAINING.replace("range(10_000)", "range(30)")
    config = CaptureConfig(warmup_steps=2, window_steps=3, run_to_end=True, bare=True)
    proc, status = launch(tmp_path, body, config)
    assert proc.returncode == 0, proc.stderr
    assert "loop finished" in proc.stdout and "stopped_after_window" not in status
    # only the window's steps are counted and timed; the 25 after it are not recorded
    assert status["steps_completed"] == 5 and max(int(k) for k in status["step_wall_ns"]) == 4
    assert set(status["losses"]) == {str(k) for k in range(5)}


def test_no_window_runs_the_whole_script(tmp_path):
    body = LONG_TRAINING.replace("range(10_000)", "range(12)")
    proc, status = launch(tmp_path, body, CaptureConfig(warmup_steps=2, bare=True))
    assert proc.returncode == 0 and "loop finished" in proc.stdout
    assert status["steps_completed"] == 12 and status["window_complete"] is False


def test_user_nvtx_steps_without_optimizer_drive_the_window(tmp_path):
    """An inference loop with its own "step N" ranges: in auto mode the launcher takes them as the
    steps (the nested "decode" range is not one), times them and stops after the window."""
    config = CaptureConfig(warmup_steps=1, window_steps=4, bare=True)
    proc, status = launch(tmp_path, NVTX_LOOP, config, stub_nvtx=True)
    assert proc.returncode == 0, proc.stderr
    assert status["step_mode"] == "nvtx" and status["steps_regex"]
    assert status["stopped_after_window"] == 5 and "loop finished" not in proc.stdout
    assert set(status["step_wall_ns"]) == {"0", "1", "2", "3", "4"}
    assert status["losses"] == {}  # no backward: nothing to record


def test_optimizer_steps_win_over_nested_step_ranges(tmp_path):
    """A training loop whose optimizer step came first keeps optimizer steps: a later range named
    "step ..." does not switch the mode."""
    body = LONG_TRAINING.replace("        opt.step()\n", "        opt.step()\n        torch.cuda.nvtx.range_push('step x'); torch.cuda.nvtx.range_pop()\n")
    proc, status = launch(tmp_path, body, CaptureConfig(warmup_steps=1, window_steps=2, bare=True), stub_nvtx=True)
    assert proc.returncode == 0, proc.stderr
    assert status["step_mode"] == "optimizer" and status["stopped_after_window"] == 3


def test_nsys_command_has_the_capture_range_only_with_a_window():
    with_window = nsys.profile_command(Path("nsys"), Path("out/profile"), ["--config", "{}", "x.py"], capture_range=True)
    assert "--capture-range=cudaProfilerApi" in with_window and "--capture-range-end=stop" in with_window
    # the options come before the application's command line
    assert with_window.index("--capture-range=cudaProfilerApi") < with_window.index("-m")
    whole = nsys.profile_command(Path("nsys"), Path("out/profile"), ["--config", "{}", "x.py"])
    assert not any(a.startswith("--capture-range") for a in whole)


def test_window_config_arithmetic():
    config = CaptureConfig(warmup_steps=3, window_steps=10)
    assert config.last_window_step == 12 and config.capture_start_step == 2
    assert CaptureConfig(warmup_steps=0, window_steps=4).capture_start_step == 0
    assert CaptureConfig().last_window_step is None


def test_profile_captures_the_whole_script_when_no_window_opens(tmp_path, fake_nsys):
    """A script with no steps at all: the bare run finds none, so the capture runs without the
    capture range (nsys would record nothing) and says so; the script's output is whole."""
    from click.testing import CliRunner

    from gpudiag.cli.main import cli

    script = tmp_path / "plain.py"
    script.write_text("print('no training here')\n")
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(cli, ["profile", str(script), "-o", str(run_dir), "--nsys", str(fake_nsys)])
    assert result.exit_code == 0, result.output
    assert "capturing the whole script" in result.output
    log = (run_dir / "gpudiag.log").read_text()
    assert "--capture-range" not in log.split("$ ")[-2]  # the nsys profile command line
