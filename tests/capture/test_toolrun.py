"""What ``gpudiag profile`` prints: nsys's progress bars and status lines reach the run's log only;
the terminal gets one line per stage (a spinner on a real terminal), the script's own output and
the tools' warnings. Runs ``python -m gpudiag profile`` as a child process with the fake nsys of
``tests/fake_nsys.py`` (real nsys output formats, a real committed export)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fake_nsys import EXPORT_REDRAWS, REPORT_REDRAWS, WARNING, child_env, make_fake_nsys
from gpudiag.capture.toolrun import ToolLines

TIMEOUT_S = 300
SCRIPT = 'print("step 0 loss 1.0")\nprint()\nprint("[epoch 1] training done")\n'
# Lines copied from a real gpudiag.log (ResNet-50 under nsys 2025.3 on the H100, 2026-11-23).
REAL_TOOL_LINES = ["Collecting data...\n", "Generating '/tmp/nsys-report-35da.qdstrm'\n",
                   "[1/1] [0%                          ] profile.nsys-rep\n",
                   "[1/1] [==21%                       ] profile.nsys-rep\n",
                   "[1/1] [========================100%] profile.nsys-rep\n", "Generated:\n",
                   "\t/tmp/gpudiag-zoo-runs/resnet50/profile.nsys-rep\n",
                   "Processing 117642 events: [=====================================96%   ]\n",
                   "Processing 117642 events: [================================================100%]\n"]
REAL_SCRIPT_LINES = ["step 19 loss 3.9600\n", "median_step_ms 46.653\n",
                     "resnet50_train: batch 64 x 3 x 224 x 224, device cuda, channels_last=False, compile=False\n"]


def test_tool_lines_are_told_from_the_scripts():
    """Every real nsys status/progress line is the tool's (terminal gets nothing); every real
    script line passes unchanged; blank lines before a bar are dropped, before script output kept."""
    sorter = ToolLines()
    assert [sorter.for_terminal(line) for line in REAL_TOOL_LINES] == [""] * len(REAL_TOOL_LINES)
    assert [sorter.for_terminal(line) for line in REAL_SCRIPT_LINES] == REAL_SCRIPT_LINES
    assert sorter.for_terminal("\n") == "" and sorter.for_terminal(REAL_TOOL_LINES[2]) == ""
    assert sorter.for_terminal("\n") == "" and sorter.for_terminal("done\n") == "\ndone\n"
    # a tab-indented line is the tool's only right after "Generated:"
    assert sorter.for_terminal("\tindented script output\n") == "\tindented script output\n"


@pytest.fixture()
def profile_run(tmp_path):
    """(run_dir, command prefix) for ``python -m gpudiag profile`` with the fake nsys."""
    pytest.importorskip("torch")  # the bare run starts the script under gpudiag's launcher, which needs torch
    nsys = make_fake_nsys(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    return run_dir, [sys.executable, "-m", "gpudiag", "profile", str(script), "-o", str(run_dir), "--nsys", str(nsys),
                     "--no-bare-run"]


def _check_log(run_dir: Path) -> None:
    """The log keeps each bar once, in its last state, and nsys's status lines."""
    log = (run_dir / "gpudiag.log").read_text()
    export_bars = [line for line in log.splitlines() if line.startswith("Processing 1000 events: [")]
    report_bars = [line for line in log.splitlines() if line.startswith("[1/1] [")]
    assert len(export_bars) == 1 and export_bars[0].endswith("100%]"), export_bars  # of EXPORT_REDRAWS
    assert len(report_bars) == 1 and "100%]" in report_bars[0], report_bars  # of REPORT_REDRAWS
    assert "Collecting data..." in log and "Generated:" in log and WARNING in log


def test_not_a_terminal_gets_one_line_per_stage(profile_run):
    """stdout a pipe: no progress bar or nsys status line (the fake printed EXPORT_REDRAWS +
    REPORT_REDRAWS redraws), each stage line once, the script's output and nsys's warning kept."""
    run_dir, cmd = profile_run
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert EXPORT_REDRAWS + REPORT_REDRAWS > 100
    assert "%]" not in out and "Processing 1000 events" not in out and "\r" not in out
    assert "Collecting data" not in out and "Generat" not in out and ".qdstrm" not in out
    for stage in ("[1/3] profiling", "[2/3] exporting", "[3/3] analysing"):
        assert out.count(stage) == 1, out
    assert "step 0 loss 1.0\n\n[epoch 1] training done\n" in proc.stdout and WARNING in proc.stdout
    assert "report.html" in proc.stdout
    _check_log(run_dir)


def _run_in_terminal(cmd: list[str]) -> tuple[int, str]:
    """Run ``cmd`` with stdout and stderr on a pseudo-terminal; (exit code, what it showed)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=child_env(TERM="xterm", COLUMNS="400"))
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return proc.wait(timeout=TIMEOUT_S), b"".join(chunks).decode(errors="replace")


def test_terminal_gets_a_spinner_per_stage(profile_run):
    """stdout a terminal: each stage's line, then its closing "done in N s" line from the rich
    spinner; still no progress bar of nsys."""
    run_dir, cmd = profile_run
    code, shown = _run_in_terminal([*cmd, "--no-analysis"])
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)  # rich's colours and cursor moves
    assert code == 0, text
    assert re.search(r"\[1/3\] profiling .*? under Nsight Systems: done in \d+\.\d s", text, re.S), text
    assert re.search(r"\[2/3\] exporting.*?\[2/3\] exporting profile\.nsys-rep to SQLite: done in \d+\.\d s", text, re.S), text
    assert "Processing 1000 events" not in text and "%]" not in text and "Collecting data" not in text
    assert "[epoch 1] training done" in text and WARNING in text
    _check_log(run_dir)
