"""Ctrl-C during ``gpudiag profile``: SIGINT sent to the gpudiag process alone (as a terminal's
Ctrl-C reaches it; nsys runs in its own process group) while the fake nsys of
``tests/fake_nsys.py`` runs a training loop. gpudiag passes the signal on to nsys's group, nsys
still writes its report, which is exported and analysed; the run directory records the
interruption and the exit code is 130. A second Ctrl-C aborts a tool that does not stop."""

from __future__ import annotations

import json
import lzma
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # the scripts these tests run use torch, and so do these tests

from fake_nsys import FIXTURE, child_env, make_fake_nsys  # noqa: E402

TIMEOUT_S = 300
# Trains until interrupted; touches READY after its third step (steps end at optimizer.step()).
LOOP = """
import pathlib, sys, time
import torch
from torch import nn

model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(3, 4)
step = 0
while True:
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
    step += 1
    if step == 3:
        pathlib.Path(sys.argv[1]).touch()
    time.sleep(0.02)
"""


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not path.exists():
        assert proc.poll() is None, f"gpudiag ended before {path.name}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {path.name} after {TIMEOUT_S} s"
        time.sleep(0.2)


def _start_profile(tmp_path: Path, *options: str, **env: str) -> tuple[subprocess.Popen, Path, Path]:
    """``python -m gpudiag profile loop.py READY -o run --nsys FAKE OPTIONS`` in its own session
    (the signals of the test reach it alone); (process, run dir, ready file)."""
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    ready, run_dir = tmp_path / "ready", tmp_path / "run"
    cmd = [sys.executable, "-m", "gpudiag", "profile", str(script), "-o", str(run_dir),
           "--nsys", str(make_fake_nsys(tmp_path)), *options, "--", str(ready)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(**env),
                            start_new_session=True)
    return proc, run_dir, ready


def _finish(proc: subprocess.Popen) -> str:
    try:
        return proc.communicate(timeout=TIMEOUT_S)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _kernel_count(sqlite_path: Path) -> int:
    with sqlite3.connect(sqlite_path) as conn:
        return conn.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]


@pytest.fixture(scope="module")
def fixture_kernels(tmp_path_factory) -> int:
    """Kernel rows of the export the fake nsys writes, counted by SQL on the committed file."""
    plain = tmp_path_factory.mktemp("fixture") / "export.sqlite"
    plain.write_bytes(lzma.decompress(FIXTURE.read_bytes()))
    return _kernel_count(plain)


def test_ctrl_c_during_capture_keeps_exports_and_reports_it(tmp_path, fixture_kernels):
    """Ctrl-C while the script trains under nsys: exit 130; nsys got the signal and still wrote its
    report; it was exported (after the interruption, complete) and analysed; script_status.json,
    report.json and the terminal say the run was interrupted during profiling."""
    proc, run_dir, ready = _start_profile(tmp_path, "--no-bare-run")
    _wait_for(ready, proc)
    os.kill(proc.pid, signal.SIGINT)
    out = _finish(proc)
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    assert any(line.startswith("interrupted") for line in out.splitlines()), out

    status = json.loads((run_dir / "script_status.json").read_text())
    assert status["interrupted"]["stage"] == "profiling" and status["interrupted"]["signal"] == "SIGINT"
    assert status["exit_code"] == 130 and status["exception"].startswith("KeyboardInterrupt")
    assert status["steps_completed"] >= 3  # the loop was interrupted after READY, not before
    assert (run_dir / "profile.nsys-rep").read_text() == "fake nsys report; stopped by SIGINT: True\n"

    log = (run_dir / "gpudiag.log").read_text()
    assert log.index("KeyboardInterrupt") < log.index(" export --type sqlite")  # exported after the stop
    assert _kernel_count(run_dir / "profile.sqlite") == fixture_kernels

    report = json.loads((run_dir / "report.json").read_text())
    assert report["script"]["interrupted"]["stage"] == "profiling"
    assert any("KeyboardInterrupt" in w for w in report["warnings"])


def test_ctrl_c_during_bare_run_stops_before_the_capture(tmp_path):
    """Ctrl-C during the bare run (before nsys): exit 130, the run directory records where it
    stopped, and nsys never ran."""
    proc, run_dir, ready = _start_profile(tmp_path)
    _wait_for(ready, proc)
    os.kill(proc.pid, signal.SIGINT)
    out = _finish(proc)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "interrupted during bare timing" in out
    status = json.loads((run_dir / "script_status.json").read_text())
    assert status["interrupted"]["stage"] == "bare timing" and not status["interrupted"]["stage_finished"]
    assert json.loads((run_dir / "bare_status.json").read_text())["exit_code"] == 130
    assert " profile --trace" not in (run_dir / "gpudiag.log").read_text()
    assert not (run_dir / "profile.nsys-rep").exists()


def test_second_ctrl_c_aborts_a_tool_that_does_not_stop(tmp_path):
    """nsys ignores the first Ctrl-C and hangs: the second kills its process group; exit 130,
    the interruption recorded, nothing exported, and the fake nsys process is gone."""
    stuck, pidfile = tmp_path / "stuck", tmp_path / "nsys.pid"
    proc, run_dir, ready = _start_profile(tmp_path, "--no-bare-run", FAKE_NSYS_STUCK=str(stuck),
                                          FAKE_NSYS_PIDFILE=str(pidfile))
    _wait_for(ready, proc)
    os.kill(proc.pid, signal.SIGINT)
    _wait_for(stuck, proc)
    os.kill(proc.pid, signal.SIGINT)
    out = _finish(proc)
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    status = json.loads((run_dir / "script_status.json").read_text())
    assert status["interrupted"]["stage"] == "profiling"
    assert not (run_dir / "profile.nsys-rep").exists() and not (run_dir / "profile.sqlite").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)


CUDA_LOOP = LOOP.replace("model = nn.Linear(4, 2)", "model = nn.Linear(256, 256).cuda()").replace(
    "x = torch.randn(3, 4)", "x = torch.randn(64, 256, device='cuda')")


@pytest.mark.skipif(shutil.which("nsys") is None or not torch.cuda.is_available(),
                    reason="needs Nsight Systems (nsys on PATH) and a CUDA GPU")
def test_ctrl_c_with_the_real_nsys(tmp_path):
    """The first test with NVIDIA's nsys instead of the fake one: Ctrl-C while a CUDA loop trains.
    nsys must stop the application, still write its report, and gpudiag export and analyse it;
    the kernel count comes from nsys's own export, read with SQL."""
    script = tmp_path / "loop.py"
    script.write_text(CUDA_LOOP)
    ready, run_dir = tmp_path / "ready", tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "gpudiag", "profile", str(script), "-o", str(run_dir),
                             "--no-bare-run", "--", str(ready)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    _wait_for(ready, proc)
    time.sleep(2.0)  # a few hundred more steps under the profiler
    os.kill(proc.pid, signal.SIGINT)
    out = _finish(proc)
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    status = json.loads((run_dir / "script_status.json").read_text())
    assert status["interrupted"]["stage"] == "profiling" and status["steps_completed"] >= 3
    assert (run_dir / "profile.nsys-rep").stat().st_size > 0
    assert _kernel_count(run_dir / "profile.sqlite") > 3 * 3  # forward, backward, optimizer per step
    report = json.loads((run_dir / "report.json").read_text())
    assert report["script"]["interrupted"]["stage"] == "profiling"
