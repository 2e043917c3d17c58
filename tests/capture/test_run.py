"""Tests of the capture stage: NVTX instrumentation, step modes, the launcher, nsys discovery, the
ncu pass's failure paths with a fake ``ncu`` and ``gpudiag profile`` end to end with a fake ``nsys``.

All of this runs on a CPU-only torch. ``instrument.install`` registers global torch hooks that are
never removed, so every scenario that installs them runs in a child Python process; the pytest
process itself never calls ``install``.
"""

from __future__ import annotations

import json
import time
import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudiag import nvtx_names
from gpudiag.capture import nsys, steps_core
from gpudiag.capture import ncu as ncu_mod
from gpudiag.capture.instrument import CaptureConfig, detect_step_mode
from gpudiag.capture.run import capture_ncu
from gpudiag.cli.main import cli

pytest.importorskip("torch")  # the scripts these tests run (or import) use torch

from conftest import ROOT

REPO_ROOT = ROOT
SWIN_EXPORT = REPO_ROOT / "examples" / "swin_t_train_bf16.sqlite.xz"
CHILD_TIMEOUT_S = 120


# ---- helpers: child processes --------------------------------------------------------------------

def _child_env(**extra: str) -> dict:
    """Environment for child Pythons: this checkout's gpudiag first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _run_python(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_child_env(), capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S)


# The driver installs the instrumentation with a recording NVTX backend, runs a user script as
# __main__ (so its ``gpudiag.step()`` calls and source-based step detection are real), calls
# finish() and writes {"events": [...], "summary": {...}} as JSON.
# Events: ["push", text], ["pop"], ["start", text, id], ["end", id]; in nvtx mode the user's own
# torch.cuda.nvtx calls (stubbed, CPU torch has none) are recorded as ["user_push", text], ["user_pop"].
DRIVER = """
import json, sys
import torch
from gpudiag.capture import instrument

config_json, script_path, out_path = sys.argv[1:4]

class Recorder:
    def __init__(self):
        self.events = []
        self.next_id = 0
    def push(self, text):
        self.events.append(["push", text])
    def pop(self):
        self.events.append(["pop"])
    def start(self, text):
        self.next_id += 1
        self.events.append(["start", text, self.next_id])
        return self.next_id
    def end(self, range_id):
        self.events.append(["end", range_id])

rec = Recorder()
# CPU torch raises on NVTX; stand-ins for the user's own ranges (the nvtx:REGEX mode wraps these).
torch.cuda.nvtx.range_push = lambda msg: rec.events.append(["user_push", msg])
torch.cuda.nvtx.range_pop = lambda: rec.events.append(["user_pop"])

config = instrument.CaptureConfig.from_json(config_json)
with open(script_path) as f:
    source = f.read()
instrument.install(config, source, nvtx=rec)
exec(compile(source, script_path, "exec"), {"__name__": "__main__"})
summary = instrument.finish()
with open(out_path, "w") as f:
    json.dump({"events": rec.events, "summary": summary}, f)
"""

# A tiny CPU training loop: batch 5, Linear(4, 8) -> GELU -> Linear(8, 2), AdamW.
TRAIN_LOOP = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(5, 4)

def train_step():
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def run_instrumented(tmp_path: Path, script_body: str, config: CaptureConfig) -> tuple[list, dict]:
    """Run ``TRAIN_LOOP + script_body`` instrumented in a child process; (events, finish() summary)."""
    driver = _write(tmp_path / "driver.py", DRIVER)
    script = _write(tmp_path / "user_script.py", TRAIN_LOOP + textwrap.dedent(script_body))
    out = tmp_path / "events.json"
    proc = _run_python([str(driver), config.to_json(), str(script), str(out)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    return data["events"], data["summary"]


# ---- helpers: reading recorded events ------------------------------------------------------------

def pushed(events: list, prefix: str) -> list[str]:
    """Texts of the push ranges starting with ``prefix``, in order."""
    return [e[1] for e in events if e[0] == "push" and e[1].startswith(prefix)]


def step_spans(events: list) -> dict[str, tuple[int, int | None]]:
    """Step range text -> (index of its start event, index of its end event or None)."""
    spans, by_id = {}, {}
    for i, e in enumerate(events):
        if e[0] == "start":
            spans[e[1]] = (i, None)
            by_id[e[2]] = e[1]
        elif e[0] == "end":
            text = by_id.pop(e[1])
            spans[text] = (spans[text][0], i)
    return spans


def push_pop_pairs(events: list) -> list[tuple[int, int, list[str]]]:
    """(push index, matching pop index, stack of enclosing push texts) for every push.

    Asserts that pushes and pops balance: no pop without a push, nothing left open."""
    stack, pairs = [], []
    for i, e in enumerate(events):
        if e[0] == "push":
            stack.append(i)
        elif e[0] == "pop":
            assert stack, f"pop without push at event {i}"
            start = stack.pop()
            pairs.append((start, i, [events[j][1] for j in stack]))
    assert not stack, f"unclosed push ranges: {[events[j][1] for j in stack]}"
    return sorted(pairs)


# ---- instrumentation, optimizer step mode --------------------------------------------------------

@pytest.fixture(scope="module")
def optimizer_capture(tmp_path_factory):
    """4 training steps with steps from optimizer.step(), warm-up 1, so the detail step is 1."""
    tmp = tmp_path_factory.mktemp("optimizer_capture")
    config = CaptureConfig(steps_from="auto", warmup_steps=1)
    return run_instrumented(tmp, "for _ in range(4):\n    train_step()\n", config)


def test_summary_reports_optimizer_mode_and_completed_steps(optimizer_capture):
    """finish() summarises the capture: mode detected from the script, 4 steps ended by optimizer.step()."""
    _, summary = optimizer_capture
    summary = dict(summary)
    # host wall time of steps 1-3 (step k from boundary k-1 to k); no CUDA here, so no GPU times
    assert set(summary.pop("step_wall_ns")) == {"1", "2", "3"} and summary.pop("step_gpu_ns") == {}
    # one loss per step, each the value backward() was called on (no window: nothing stopped)
    assert set(summary.pop("losses")) == {"0", "1", "2", "3"}
    window = {k: summary.pop(k) for k in ("window_steps", "window_complete", "run_to_end", "capture_range",
                                          "capture_started_step", "window_start_unix_s", "steps_regex")}
    assert summary.pop("samples_per_step") == 5  # the batch: dimension 0 of the first module input
    assert summary.pop("first_input_shape") == [5, 4]  # the tensor that batch was read from: x of (5, 4)
    # start-up before step 0 and the warm-up step before the first measured one: host times
    assert summary.pop("startup_ns") > 0 and summary.pop("warmup_ns") > 0
    # training: no inference outputs kept, no stepping module (steps come from the optimizer)
    assert summary.pop("outputs") == {} and summary.pop("root_parameters") is None
    # one backward() per step, and no DistributedDataParallel (GD-DDP-NO-SYNC reads both)
    assert summary.pop("backward_calls") == {"0": 1, "1": 1, "2": 1, "3": 1} and summary.pop("ddp") is None and summary.pop("fsdp") is None
    # one optimizer.step() and one micro-batch per step, no closure (issue 45)
    assert summary.pop("optimizer_calls") == summary.pop("micro_batches") == {"0": 1, "1": 1, "2": 1, "3": 1}
    assert summary.pop("closure_calls") == {}
    assert window["window_steps"] is None and window["window_complete"] is False and window["capture_range"] is False
    assert window["steps_regex"] is None and window["window_start_unix_s"] is not None  # step 1 opened
    assert summary == {"step_mode": "optimizer", "steps_completed": 4, "detail_step": 1, "warmup_steps": 1,
                       "peak_memory_bytes_per_step": {},  # no CUDA on this machine: nothing to record
                       "compile": None,  # torch.compile never used
                       "cudnn_benchmark": False, "autocast_dtype": "off"}  # PyTorch's defaults, no autocast


def test_step_ranges_cover_the_loop_and_last_one_is_the_tail(optimizer_capture):
    """Steps 0..3 are started and ended in order, each next one opening where the previous ends;
    step 4 (opened by the last optimizer.step()) is ended by finish() and followed by the tail mark."""
    events, _ = optimizer_capture
    spans = step_spans(events)
    assert list(spans) == [f"{nvtx_names.STEP}{k}" for k in range(5)]
    for k in range(4):
        start, end = spans[f"{nvtx_names.STEP}{k}"]
        next_start, _ = spans[f"{nvtx_names.STEP}{k + 1}"]
        assert end is not None and start < end < next_start
        # nothing is recorded between one step's end and the next one's start
        assert next_start == end + 1
    _, last_end = spans[f"{nvtx_names.STEP}4"]
    assert last_end is not None
    assert events[last_end + 1:] == [["push", nvtx_names.TAIL], ["pop"]]
    # step 0 opens at the first forward, before anything else is recorded
    assert events[0][0] == "start"


def test_module_ranges_are_qualified_and_nested(optimizer_capture):
    """Each forward pushes the root as "Sequential|Sequential" and children as "<path>|<class>",
    nested inside the root, once per step."""
    events, _ = optimizer_capture
    modules = pushed(events, nvtx_names.MODULE)
    root = nvtx_names.MODULE + "Sequential|Sequential"
    children = [nvtx_names.MODULE + n for n in ("0|Linear", "1|GELU", "2|Linear")]
    assert modules == [root, *children] * 4
    for start, _, enclosing in push_pop_pairs(events):
        if events[start][1] in children:
            assert enclosing[-1] == root


def test_push_pop_balanced(optimizer_capture):
    """Every push range is popped, in LIFO order, and step start/end ids all match."""
    events, _ = optimizer_capture
    push_pop_pairs(events)
    started = [e[2] for e in events if e[0] == "start"]
    ended = [e[1] for e in events if e[0] == "end"]
    assert sorted(started) == sorted(ended) and len(set(started)) == len(started)


def test_phase_ranges_once_per_step(optimizer_capture):
    """backward and optimizer phases are pushed once per step, inside that step's range."""
    events, _ = optimizer_capture
    spans = step_spans(events)
    for phase in ("backward", "optimizer"):
        text = nvtx_names.PHASE + phase
        positions = [i for i, e in enumerate(events) if e == ["push", text]]
        assert len(positions) == 4
        for k, pos in enumerate(positions):
            start, end = spans[f"{nvtx_names.STEP}{k}"]
            assert start < pos < end, f"{text} #{k} outside step {k}"


def test_op_ranges_only_on_detail_step(optimizer_capture):
    """Per-op ranges are recorded in step 1 (= warmup_steps), and in no other step."""
    events, _ = optimizer_capture
    start, end = step_spans(events)[f"{nvtx_names.STEP}1"]
    op_positions = [i for i, e in enumerate(events) if e[0] == "push" and e[1].startswith(nvtx_names.OP)]
    assert op_positions, "no op ranges recorded"
    assert all(start < i < end for i in op_positions)
    assert not any(e[0] == "push" and e[1].startswith(nvtx_names.OUT) for e in events[:start] + events[end:])


def test_op_ranges_carry_json_with_shapes(optimizer_capture):
    """Op range texts are JSON {"op", "in"}; Linear shows up as aten::addmm with described inputs."""
    events, _ = optimizer_capture
    payloads = [json.loads(t[len(nvtx_names.OP):]) for t in pushed(events, nvtx_names.OP)]
    assert all(set(p) == {"op", "in"} and p["op"].startswith("aten::") for p in payloads)
    # tensors carry their storage address after "@" (for the dependency analysis); compare without it
    addmms = [[re.sub(r"@[0-9a-f]+$", "", t) for t in p["in"]] for p in payloads if p["op"] == "aten::addmm"]
    assert all(re.search(r"@[0-9a-f]+$", t) for p in payloads if p["op"] == "aten::addmm" for t in p["in"])
    # forward of Linear(4, 8) then Linear(8, 2) on a batch of 5: bias, input, transposed weight
    assert ["float32[8]", "float32[5,4]", "float32[4,8]"] in addmms
    assert ["float32[2]", "float32[5,8]", "float32[8,2]"] in addmms
    ops = {p["op"] for p in payloads}
    assert "aten::gelu" in ops and "aten::gelu_backward" in ops  # backward ops are seen too
    # the AdamW update of the detail step is recorded as well
    assert any(op.startswith("aten::") and ("addcdiv" in op or "lerp" in op) for op in ops)


def test_each_op_range_ends_with_nested_empty_out_range(optimizer_capture):
    """Right before an op range's pop: push("gpudiag:out <json>"), pop() — outputs as JSON."""
    events, _ = optimizer_capture
    op_pairs = [(s, e) for s, e, _ in push_pop_pairs(events) if events[s][1].startswith(nvtx_names.OP)]
    assert op_pairs
    for start, end in op_pairs:
        out_push, out_pop = events[end - 2], events[end - 1]
        assert out_push[0] == "push" and out_push[1].startswith(nvtx_names.OUT), events[start:end + 1]
        assert out_pop == ["pop"]
        json.loads(out_push[1][len(nvtx_names.OUT):])
    addmm_outs = [re.sub(r"@[0-9a-f]+", "", events[e - 2][1]) for s, e in op_pairs if '"op":"aten::addmm"' in events[s][1]]
    assert nvtx_names.OUT + '"float32[5,8]"' in addmm_outs


def test_switches_turn_module_and_op_ranges_off(tmp_path):
    """module_ranges=False and op_ranges=False leave only steps and phases; no detail step."""
    config = CaptureConfig(steps_from="optimizer", warmup_steps=0, module_ranges=False, op_ranges=False)
    events, summary = run_instrumented(tmp_path, "for _ in range(2):\n    train_step()\n", config)
    assert summary["detail_step"] is None and summary["steps_completed"] == 2
    assert not pushed(events, nvtx_names.MODULE) and not pushed(events, nvtx_names.OP)
    assert len(pushed(events, nvtx_names.PHASE)) == 4
    push_pop_pairs(events)


def test_explicit_detail_step(tmp_path):
    """detail_step overrides warmup_steps as the step that gets op ranges."""
    config = CaptureConfig(steps_from="optimizer", warmup_steps=0, detail_step=2)
    events, summary = run_instrumented(tmp_path, "for _ in range(3):\n    train_step()\n", config)
    assert summary["detail_step"] == 2
    start, end = step_spans(events)[f"{nvtx_names.STEP}2"]
    op_positions = [i for i, e in enumerate(events) if e[0] == "push" and e[1].startswith(nvtx_names.OP)]
    assert op_positions and all(start < i < end for i in op_positions)


# ---- step modes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("steps_from, source, expected", [
    ("auto", "import gpudiag\nfor b in data:\n    train(b)\n    gpudiag.step()\n", "call"),
    ("auto", "from gpudiag import step\nstep()\n", "call"),
    ("auto", "import gpudiag\nfor b in data:\n    serve(b)\n    gpudiag.step(samples=len(b))\n", "call"),
    ("auto", "for b in data:\n    loss.backward()\n    opt.step()\n", "optimizer"),
    ("auto", "", "optimizer"),
    ("optimizer", "gpudiag.step()", "optimizer"),
    ("call", "", "call"),
    ("nvtx:^it", "", "nvtx"),
])
def test_detect_step_mode(steps_from, source, expected):
    """auto picks "call" when the script calls gpudiag.step(), else "optimizer"; explicit modes stay."""
    assert detect_step_mode(CaptureConfig(steps_from=steps_from), source) == expected


@pytest.mark.parametrize("steps_from", ["bogus", "nvtx", "", "nvtx:("])
def test_detect_step_mode_rejects_bad_values(steps_from):
    """An unknown mode or an invalid nvtx: regex is a ValueError naming the value."""
    with pytest.raises(ValueError, match=re.escape(repr(steps_from))):
        detect_step_mode(CaptureConfig(steps_from=steps_from), "")


def test_step_outside_capture_is_a_no_op():
    """gpudiag.step() does nothing when no capture is installed (scripts may call it always)."""
    import gpudiag

    assert steps_core.current() is None
    gpudiag.step()
    assert steps_core.current() is None


def test_call_mode_steps_come_from_gpudiag_step(tmp_path):
    """With gpudiag.step() in the script, only its 3 calls end steps, not the 6 optimizer steps."""
    body = """
    import gpudiag
    for _ in range(3):
        train_step()
        train_step()
        gpudiag.step()
    """
    events, summary = run_instrumented(tmp_path, body, CaptureConfig(warmup_steps=1))
    assert summary["step_mode"] == "call" and summary["steps_completed"] == 3
    spans = step_spans(events)
    assert list(spans) == [f"{nvtx_names.STEP}{k}" for k in range(4)]
    assert all(end is not None for _, end in spans.values())
    assert events[-2:] == [["push", nvtx_names.TAIL], ["pop"]]
    # each call-mode step holds two optimizer phases
    start, end = spans[f"{nvtx_names.STEP}1"]
    assert events[start:end].count(["push", nvtx_names.PHASE + "optimizer"]) == 2


def test_nvtx_mode_uses_the_users_ranges(tmp_path):
    """With steps_from="nvtx:REGEX", no step ranges are injected; the user's matching ranges are
    counted as steps and the detail one gets the op ranges."""
    body = """
    for i in range(3):
        torch.cuda.nvtx.range_push(f"iter {i}")
        torch.cuda.nvtx.range_push("data")  # does not match: not a step
        torch.cuda.nvtx.range_pop()
        train_step()
        torch.cuda.nvtx.range_pop()
    """
    events, summary = run_instrumented(tmp_path, body, CaptureConfig(steps_from="nvtx:^iter ", warmup_steps=1))
    assert summary["step_mode"] == "nvtx" and summary["steps_completed"] == 3
    assert not any(e[0] in ("start", "end") for e in events)
    assert not pushed(events, nvtx_names.TAIL)
    user = [i for i, e in enumerate(events) if e[0] == "user_push" and e[1].startswith("iter ")]
    pops = [i for i, e in enumerate(events) if e[0] == "user_pop"]
    start, end = user[1], pops[3]  # "iter 1" and its pop (each iteration pops "data" then "iter i")
    op_positions = [i for i, e in enumerate(events) if e[0] == "push" and e[1].startswith(nvtx_names.OP)]
    assert op_positions and all(start < i < end for i in op_positions)
    assert len(pushed(events, nvtx_names.MODULE)) == 4 * 3


# ---- launcher ------------------------------------------------------------------------------------

def run_launcher(tmp_path: Path, source: str, *script_args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``python -m gpudiag.capture.launch --config '{}' --status FILE script.py ARGS``;
    (completed process, status JSON)."""
    script = _write(tmp_path / "script.py", source)
    status = tmp_path / "status.json"
    proc = _run_python(["-m", "gpudiag.capture.launch", "--config", "{}", "--status", str(status),
                        str(script), *script_args], cwd=tmp_path)
    return proc, json.loads(status.read_text())


def test_launcher_normal_script(tmp_path):
    """A script that trains 3 steps exits 0; its argv is passed through (option-like args too) and
    the status records exit code 0 and the steps seen."""
    source = TRAIN_LOOP + """
import json, sys
with open("argv.json", "w") as f:
    json.dump({"argv": sys.argv[1:], "name": __name__}, f)
for _ in range(3):
    train_step()
"""
    args = ["--lr", "0.1", "--status", "mine", "--", "positional"]
    proc, status = run_launcher(tmp_path, source, *args)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "argv.json").read_text()) == {"argv": args, "name": "__main__"}
    assert status["exit_code"] == 0 and status["exception"] is None and status["traceback"] is None
    assert status["script"] == "script.py" and status["args"] == args
    assert status["steps_completed"] == 3 and status["step_mode"] == "optimizer"
    assert status["detail_step"] == 2 and status["warmup_steps"] == 2
    assert status["ended_unix_s"] >= status["started_unix_s"]


def test_launcher_keeps_sys_exit_code(tmp_path):
    """sys.exit(3) in the script makes the launcher exit 3 and the status say so, without an exception."""
    proc, status = run_launcher(tmp_path, "import sys\nsys.exit(3)\n")
    assert proc.returncode == 3
    assert status["exit_code"] == 3 and status["exception"] is None


def test_launcher_sys_exit_message(tmp_path):
    """sys.exit("message") exits 1 and the message is printed, as plain Python does."""
    proc, status = run_launcher(tmp_path, "import sys\nsys.exit('fatal: bad input')\n")
    assert proc.returncode == 1 and status["exit_code"] == 1
    assert "fatal: bad input" in proc.stderr


def test_launcher_script_exception(tmp_path):
    """An uncaught exception exits 1; the status keeps the exception text and traceback, and the
    traceback is printed too."""
    source = """
    def main():
        raise RuntimeError("boom <&>")

    main()
    """
    proc, status = run_launcher(tmp_path, source)
    assert proc.returncode == 1
    assert status["exit_code"] == 1
    assert status["exception"] == "RuntimeError: boom <&>"
    assert status["traceback"].startswith("Traceback")
    assert "in main" in status["traceback"] and "RuntimeError: boom <&>" in status["traceback"]
    assert "RuntimeError: boom <&>" in proc.stderr
    assert status["steps_completed"] == 0


# ---- locating nsys -------------------------------------------------------------------------------

def _executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def no_nsys_anywhere(tmp_path, monkeypatch):
    """No $GPUDIAG_NSYS, an empty PATH and no known install folders."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.delenv("GPUDIAG_NSYS", raising=False)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(nsys, "KNOWN_GLOBS", ())


def test_locate_nsys_explicit_not_executable(tmp_path, no_nsys_anywhere):
    """--nsys naming a file that is not executable (or missing) is refused, naming the option."""
    plain = tmp_path / "nsys"
    plain.write_text("not a program")
    for candidate in (plain, tmp_path / "missing"):
        with pytest.raises(nsys.ToolNotFound, match="--nsys") as info:
            nsys.locate_nsys(str(candidate))
        assert str(candidate) in str(info.value)


def test_locate_nsys_explicit_wins(tmp_path, monkeypatch, no_nsys_anywhere):
    """An executable --nsys is returned even when $GPUDIAG_NSYS is set."""
    explicit = _executable(tmp_path / "explicit-nsys")
    monkeypatch.setenv("GPUDIAG_NSYS", str(_executable(tmp_path / "env-nsys")))
    assert nsys.locate_nsys(str(explicit)) == explicit


def test_locate_nsys_from_env(tmp_path, monkeypatch, no_nsys_anywhere):
    """$GPUDIAG_NSYS naming an executable file is returned; a bad one is refused, naming the variable."""
    exe = _executable(tmp_path / "my-nsys")
    monkeypatch.setenv("GPUDIAG_NSYS", str(exe))
    assert nsys.locate_nsys() == exe
    monkeypatch.setenv("GPUDIAG_NSYS", str(tmp_path / "missing"))
    with pytest.raises(nsys.ToolNotFound, match=re.escape("$GPUDIAG_NSYS")):
        nsys.locate_nsys()


def test_locate_nsys_from_path_and_known_globs(tmp_path, monkeypatch, no_nsys_anywhere):
    """nsys on PATH is found; failing that, the newest match of the known install folders."""
    for version in ("2023.4.1", "2024.6.2"):
        (tmp_path / "opt" / version / "bin").mkdir(parents=True)
        _executable(tmp_path / "opt" / version / "bin" / "nsys")
    monkeypatch.setattr(nsys, "KNOWN_GLOBS", (str(tmp_path / "opt" / "*" / "bin" / "nsys"),))
    assert nsys.locate_nsys() == tmp_path / "opt" / "2024.6.2" / "bin" / "nsys"
    on_path = tmp_path / "path-bin"
    on_path.mkdir()
    _executable(on_path / "nsys")
    monkeypatch.setenv("PATH", str(on_path))
    assert nsys.locate_nsys() == on_path / "nsys"


def test_locate_nsys_not_found_says_how_to_install(no_nsys_anywhere):
    """With nothing anywhere, the error says how to install nsys or point at it."""
    with pytest.raises(nsys.ToolNotFound) as info:
        nsys.locate_nsys()
    message = str(info.value)
    assert "not found" in message and "install Nsight Systems" in message
    assert "--nsys" in message and "$GPUDIAG_NSYS" in message


# ---- the ncu pass: failures leave the nsys report standing -------------------------------------------

NCU_PERMISSION_OUTPUT = ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
                         "Performance Counters on the target device 0.")


def run_capture_ncu(tmp_path: Path) -> tuple[Path | None, list[str], Path]:
    """``capture_ncu`` on a script that would leave a marker file if it ever ran; (result, echoed
    messages, run dir). The ncu used is whatever $GPUDIAG_NCU names."""
    marker = tmp_path / "script_ran"
    script = _write(tmp_path / "train.py", f"open({str(marker)!r}, 'w').close()\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    messages: list[str] = []
    result = capture_ncu(script, [], run_dir, CaptureConfig(), detail_step=2, kernel_names=["ampere_bf16_gemm"],
                         max_kernels=10, echo=messages.append)
    assert not marker.exists(), "the fake ncu must not run the user's script"
    return result, messages, run_dir


def test_capture_ncu_permission_error_echoes_the_fix(tmp_path, monkeypatch):
    """ncu refused the performance counters (ERR_NVGPUCTRPERM, exit 1): None, and the echoed hint
    says how to lift the restriction; the ncu output is kept in gpudiag.log."""
    fake = _executable(tmp_path / "ncu", f"#!/bin/sh\necho '{NCU_PERMISSION_OUTPUT}'\nexit 1\n")
    monkeypatch.setenv("GPUDIAG_NCU", str(fake))
    result, messages, run_dir = run_capture_ncu(tmp_path)
    assert result is None
    assert messages[-1] == ncu_mod.PERMISSION_HINT
    assert "NVreg_RestrictProfilingToAdminUsers" in messages[-1]
    assert not any("wrote no report" in m for m in messages)
    log = (run_dir / "gpudiag.log").read_text()
    assert f"$ {fake} " in log and NCU_PERMISSION_OUTPUT in log


def test_capture_ncu_without_report_says_so(tmp_path, monkeypatch):
    """ncu exits 0 but writes no profile.ncu-rep (no kernel matched): None and a message saying so."""
    monkeypatch.setenv("GPUDIAG_NCU", str(_executable(tmp_path / "ncu")))
    result, messages, run_dir = run_capture_ncu(tmp_path)
    assert result is None
    assert "wrote no report" in messages[-1] and str(run_dir / "gpudiag.log") in messages[-1]
    assert not (run_dir / "profile.ncu-rep").exists()


def test_capture_ncu_not_executable_is_skipped(tmp_path, monkeypatch):
    """$GPUDIAG_NCU naming a file that is not executable: None, one "--ncu skipped" message naming
    it, and nothing run (no log written)."""
    plain = tmp_path / "ncu"
    plain.write_text("#!/bin/sh\nexit 0\n")  # no execute bit
    monkeypatch.setenv("GPUDIAG_NCU", str(plain))
    result, messages, run_dir = run_capture_ncu(tmp_path)
    assert result is None
    assert len(messages) == 1 and messages[0].startswith("--ncu skipped")
    assert "$GPUDIAG_NCU" in messages[0] and str(plain) in messages[0]
    assert not (run_dir / "gpudiag.log").exists()


# ---- gpudiag profile end to end with a fake nsys ---------------------------------------------------

FAKE_NSYS = """
import lzma, shutil, subprocess, sys

FIXTURE = {fixture!r}


def fail(message):
    sys.stderr.write("fake nsys: " + message + "\\n")
    sys.exit(97)


args = sys.argv[1:]
if args[:1] == ["profile"]:
    # nsys profile [options] --output BASE <python> -m gpudiag.capture.launch ...
    if "--output" not in args:
        fail("profile without --output")
    at = args.index("--output")
    base, command = args[at + 1], args[at + 2:]
    if command[1:3] != ["-m", "gpudiag.capture.launch"]:
        fail("unexpected profiled command: " + repr(command))
    code = subprocess.run(command).returncode
    with open(base + ".nsys-rep", "wb") as f:
        f.write(b"fake nsys report\\n")
    sys.exit(code)
if args[:1] == ["export"]:
    # nsys export --type sqlite --force-overwrite true --output OUT REPORT
    if args[1:5] != ["--type", "sqlite", "--force-overwrite", "true"] or args[5] != "--output":
        fail("unexpected export arguments: " + repr(args))
    out, report = args[6], args[7]
    open(report, "rb").close()  # the report must exist
    with lzma.open(FIXTURE) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    sys.exit(0)
fail("unexpected command: " + repr(args))
"""


@pytest.fixture(scope="module")
def fake_nsys(tmp_path_factory) -> Path:
    """An executable ``nsys`` that runs the profiled command and exports the Swin-T fixture.

    It checks plumbing only: the command lines gpudiag builds, the script's run, exit code and
    status, and that the export reaches the report. The export is NOT derived from what the script
    ran (a CPU machine has no CUDA trace to make one from): the analysed numbers are the fixture's
    and are tested against real captures elsewhere (test_attribution, test_timeline, test_classify)."""
    assert SWIN_EXPORT.is_file(), SWIN_EXPORT
    shebang = f"#!{sys.executable}" if len(sys.executable) < 120 and " " not in sys.executable else "#!/usr/bin/env python3"
    path = tmp_path_factory.mktemp("fake-nsys") / "nsys"
    return _executable(path, shebang + "\n" + FAKE_NSYS.format(fixture=str(SWIN_EXPORT)))


def profile_cli(*args: str, env: dict | None = None):
    """Invoke ``gpudiag profile ARGS`` in-process (the script itself runs in nsys's child)."""
    return CliRunner().invoke(cli, ["profile", *args], env=env)


RUN_DIR_FILES = {"profile.nsys-rep", "profile.sqlite", "script_status.json", "gpudiag.log",
                 "run.sqlite", "report.html", "report.json"}


def test_profile_end_to_end(tmp_path, fake_nsys):
    """Plumbing: a script training 3 CPU steps gives exit 0, a complete run directory, the script's
    own status (3 steps, from the launcher) in report.json, the nsys commands in gpudiag.log and
    script args passed through after --. The analysed steps are the fake export's, not the script's."""
    script = _write(tmp_path / "train.py", TRAIN_LOOP + """
import sys
assert sys.argv[1:] == ["--epochs", "1"], sys.argv
for _ in range(3):
    train_step()
print("training done")
""")
    run_dir = tmp_path / "run"
    started = time.perf_counter()
    result = profile_cli(str(script), "-o", str(run_dir), "--nsys", str(fake_nsys), "--", "--epochs", "1")
    wall_s = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    assert RUN_DIR_FILES <= {p.name for p in run_dir.iterdir()}
    # each stage's wall time, in the order run, within the command's own wall time (measured here)
    times = json.loads((run_dir / "stage_times.json").read_text())
    stages, parts = times["stages_s"], times["analysing_parts_s"]
    assert list(stages)[:4] == ["bare timing", "profiling", "exporting", "analysing"]
    assert all(v >= 0 for v in (*stages.values(), *parts.values())) and sum(stages.values()) <= wall_s
    assert list(parts) == ["reading the export", "analysis", "report files"] and sum(parts.values()) <= stages["analysing"]
    line = next(x for x in result.output.splitlines() if x.startswith("time by stage: "))
    assert line.startswith(f"time by stage: bare timing {stages['bare timing']:.1f} s, profiling ")
    assert f"analysing {stages['analysing']:.1f} s (reading the export {parts['reading the export']:.1f} s, " in line
    # the script ended inside the profiling stage: the line (written after the analysis) gives the report's delay
    # after it, at least the export and the analysis; the file, rewritten after any trials, at least that too
    shown = float(re.search(r"; the report came (\d+\.\d) s after the script ended$", line).group(1))
    after = times["report_after_script_s"]
    assert stages["exporting"] + stages["analysing"] - 0.05 <= shown <= after + 0.05
    assert after <= sum(stages.values()) - stages["bare timing"] + 1.0
    assert "report.html" in result.output and "training done" in result.output
    for stage in ("[1/3]", "[2/3]", "[3/3]"):
        assert stage in result.output
    status = json.loads((run_dir / "script_status.json").read_text())
    assert status["exit_code"] == 0 and status["steps_completed"] == 3
    report = json.loads((run_dir / "report.json").read_text())
    assert report["script"]["steps_completed"] == 3 and report["script"]["args"] == ["--epochs", "1"]
    assert not any("failed" in w for w in report["warnings"])
    log = (run_dir / "gpudiag.log").read_text()
    assert f"$ {fake_nsys} profile" in log and f"$ {fake_nsys} export" in log
    assert "--trace=cuda,nvtx " in log and "osrt" not in log and "training done" in log
    # the bare run: the script once more, without nsys (its output in the log only), step wall
    # times of steps 1 and 2 (step k runs from optimizer.step() k-1 to k) in both statuses
    assert log.count("training done") == 2 and result.output.count("training done") == 1
    assert '"bare": true' in log and "[bare]" in result.output
    assert set(status["step_wall_ns"]) == set(status["bare_run"]["step_wall_ns"]) == {"1", "2"}
    assert status["bare_run"]["exit_code"] == 0
    # the fake export's measured steps are not the script's: the report says it cannot compare
    assert "unavailable" in report["representativeness"]


def test_profile_no_bare_run(tmp_path, fake_nsys):
    script = _write(tmp_path / "train.py", TRAIN_LOOP + "for _ in range(3):\n    train_step()\n")
    run_dir = tmp_path / "run"
    result = profile_cli(str(script), "-o", str(run_dir), "--nsys", str(fake_nsys), "--no-bare-run")
    assert result.exit_code == 0, result.output
    assert "[bare]" not in result.output and not (run_dir / "bare_status.json").exists()
    assert json.loads((run_dir / "report.json").read_text())["representativeness"] is None


def test_profile_crashing_script_still_reports(tmp_path, fake_nsys):
    """A script that crashes after a step: exit 1, report.html and report.json still written, and
    report.json warns that the script failed, quoting the exception."""
    script = _write(tmp_path / "crash.py", TRAIN_LOOP + """
train_step()
raise RuntimeError("planted crash")
""")
    run_dir = tmp_path / "run"
    result = profile_cli(str(script), "-o", str(run_dir), "--nsys", str(fake_nsys))
    assert result.exit_code == 1, result.output
    assert "exited with code 1" in result.output
    assert (run_dir / "report.html").is_file() and (run_dir / "report.json").is_file()
    report = json.loads((run_dir / "report.json").read_text())
    failed = [w for w in report["warnings"] if "script failed" in w]
    assert len(failed) == 1 and "RuntimeError: planted crash" in failed[0]
    assert report["script"]["exit_code"] == 1


def test_profile_refuses_non_empty_run_dir_without_force(tmp_path, fake_nsys):
    """An existing non-empty run dir: exit 2 and a one-line error naming --force, nothing touched;
    with --force (nsys taken from $GPUDIAG_NSYS this time) it is replaced and the run works."""
    script = _write(tmp_path / "train.py", TRAIN_LOOP + "train_step()\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stale = run_dir / "stale.txt"
    stale.write_text("old run")

    result = profile_cli(str(script), "-o", str(run_dir), "--nsys", str(fake_nsys))
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--force" in lines[0] and str(run_dir) in lines[0]
    assert "Traceback" not in result.output
    assert [p.name for p in run_dir.iterdir()] == ["stale.txt"]

    result = profile_cli(str(script), "-o", str(run_dir), "--force", env={"GPUDIAG_NSYS": str(fake_nsys)})
    assert result.exit_code == 0, result.output
    assert not stale.exists()
    assert RUN_DIR_FILES <= {p.name for p in run_dir.iterdir()}


def test_profile_missing_script(tmp_path, fake_nsys):
    """A script path that does not exist: exit 2, a clear one-line message, no run dir created."""
    missing = tmp_path / "nope.py"
    run_dir = tmp_path / "run"
    result = profile_cli(str(missing), "-o", str(run_dir), "--nsys", str(fake_nsys))
    assert result.exit_code == 2
    assert "no such script" in result.output and str(missing) in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not run_dir.exists()


@pytest.mark.parametrize("steps_from", ["bogus", "nvtx:("])
def test_profile_bad_steps_from_is_a_user_error(tmp_path, fake_nsys, steps_from):
    """A bad --steps-from (unknown mode or invalid regex) is a one-line error, exit 2, no traceback."""
    script = _write(tmp_path / "train.py", "print('never runs')\n")
    run_dir = tmp_path / "run"
    result = profile_cli(str(script), "-o", str(run_dir), "--nsys", str(fake_nsys), "--steps-from", steps_from)
    assert result.exit_code == 2, result.output
    assert "--steps-from" in result.output and "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an escaped exception
    assert not run_dir.exists()


def test_profile_without_nsys_says_how_to_install(tmp_path, no_nsys_anywhere):
    """No nsys anywhere: exit 2 with the install hint, before any run dir is created."""
    script = _write(tmp_path / "train.py", "print('never runs')\n")
    run_dir = tmp_path / "run"
    result = profile_cli(str(script), "-o", str(run_dir))
    assert result.exit_code == 2
    assert "install Nsight Systems" in result.output and "Traceback" not in result.output
    assert not run_dir.exists()
