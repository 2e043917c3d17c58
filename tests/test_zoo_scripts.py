"""Smoke tests of the workload zoo (benchmarks/zoo): each script's tiny config on the CPU.

The transformers scripts run for real (``--tiny --device cpu --steps 4``; torch.compile with the
``aot_eager`` backend, which traces with dynamo and AOTAutograd but generates no code). The two
torchvision scripts (resnet50_train.py, vit_inference.py) are only byte-compiled here: torchvision
from PyPI does not import beside the CPU build of torch this suite runs on, and installing it would
replace torch. They run on the GPU machine (benchmarks/zoo/run_zoo.sh), and here too wherever
torchvision happens to import. compare_losses.py and run_zoo.sh are checked without running a model.
"""

from __future__ import annotations

import importlib.util
import math
import os
import py_compile
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

ZOO = ROOT / "benchmarks" / "zoo"
SCRIPTS = ["llama_train.py", "resnet50_train.py", "bert_compile_train.py", "gpt2_decode_graphs.py", "vit_inference.py"]
STEPS = 4
STEP_LINE = re.compile(r"^step (\d+) (loss|checksum) (\S+)", re.M)


def importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def run_tiny(script: str, *extra: str) -> str:
    """Run a zoo script's tiny config on the CPU; returns its stdout (fails the test on a non-zero exit)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, str(ZOO / script), "--tiny", "--device", "cpu", "--steps", str(STEPS), *extra],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, f"{script} {extra} exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    return proc.stdout


def check_output(stdout: str, kind: str) -> list[float]:
    """One finite ``step N <kind> X`` line per step, in order, and a final ``median_step_ms X``."""
    steps = STEP_LINE.findall(stdout)
    assert [int(n) for n, _, _ in steps] == list(range(STEPS)), stdout
    assert {k for _, k, _ in steps} == {kind}, stdout
    values = [float(v) for _, _, v in steps]
    assert all(math.isfinite(v) for v in values), stdout
    median = re.findall(r"^median_step_ms (\S+)$", stdout, re.M)
    assert len(median) == 1 and float(median[0]) > 0, stdout
    return values


@pytest.mark.parametrize("script", SCRIPTS)
def test_zoo_script_byte_compiles(script, tmp_path):
    py_compile.compile(str(ZOO / script), cfile=str(tmp_path / (script + "c")), doraise=True)


needs_transformers = pytest.mark.skipif(not importable("transformers"),
                                        reason="transformers is not installed (pip install transformers)")
needs_torchvision = pytest.mark.skipif(
    not importable("torchvision"),
    reason="torchvision is not installed: it does not import beside the CPU torch of this suite, so "
           "resnet50_train.py and vit_inference.py are only byte-compiled here (run them on the GPU machine)")


@needs_transformers
def test_llama_train_tiny():
    losses = check_output(run_tiny("llama_train.py"), "loss")
    assert losses[-1] < losses[0]  # the same batch every step: AdamW lowers its loss


@needs_transformers
def test_bert_compile_train_tiny():
    losses = check_output(run_tiny("bert_compile_train.py", "--backend", "aot_eager"), "loss")
    assert 0 < losses[0] < 2  # two labels: about log 2 at random init


@needs_transformers
def test_gpt2_decode_tiny_compiled():
    stdout = run_tiny("gpt2_decode_graphs.py", "--backend", "aot_eager")
    check_output(stdout, "checksum")
    # transformers 5.x takes the StaticCache path; an older one may fall back to the window loop, and says why
    assert re.search(r"cache (static|window \(StaticCache not usable: .+\))", stdout), stdout


@needs_transformers
def test_gpt2_decode_tiny_window_eager():
    stdout = run_tiny("gpt2_decode_graphs.py", "--eager", "--cache", "window")
    check_output(stdout, "checksum")
    assert "cache window," in stdout


@needs_torchvision
@pytest.mark.parametrize("script,extra,kind", [("resnet50_train.py", (), "loss"),
                                               ("resnet50_train.py", ("--channels-last",), "loss"),
                                               ("vit_inference.py", (), "checksum")])
def test_torchvision_scripts_tiny(script, extra, kind):
    check_output(run_tiny(script, *extra), kind)


def load_compare_losses():
    spec = importlib.util.spec_from_file_location("zoo_compare_losses", ZOO / "compare_losses.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_log(path: Path, values, kind="loss", extra="") -> Path:
    lines = ["some header", "W1123 a warning"] + [f"step {i} {kind} {v}{extra}" for i, v in enumerate(values)]
    path.write_text("\n".join(lines + ["median_step_ms 12.5", "gpudiag: report written"]) + "\n")
    return path


def test_compare_losses_match_and_mismatch(tmp_path, capsys):
    compare = load_compare_losses()
    a = write_log(tmp_path / "a.log", [10.0, 9.5, 9.0])
    assert compare.main([str(a), str(write_log(tmp_path / "b.log", [10.0, 9.52, 9.05]))]) == 0
    assert "MATCH" in capsys.readouterr().out
    # beyond 2 % on a later step
    assert compare.main([str(a), str(write_log(tmp_path / "c.log", [10.0, 9.5, 8.0]))]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "8.000000" in out and "9.000000" in out  # both values printed
    # step 0 is held to the tighter tolerance
    assert compare.main([str(a), str(write_log(tmp_path / "d.log", [10.1, 9.5, 9.0]))]) == 1
    # a missing step is a mismatch
    assert compare.main([str(a), str(write_log(tmp_path / "e.log", [10.0, 9.5]))]) == 1
    capsys.readouterr()


def test_compare_losses_checksums_and_crashed_runs(tmp_path, capsys):
    compare = load_compare_losses()
    a = write_log(tmp_path / "a.log", [0.5, 0.25], kind="checksum", extra=" tokens 1,2")
    b = write_log(tmp_path / "b.log", [0.5, 0.25], kind="checksum", extra=" tokens 1,2")
    assert compare.main([str(a), str(b)]) == 0
    # a loss log against a checksum log
    assert compare.main([str(a), str(write_log(tmp_path / "c.log", [0.5, 0.25]))]) == 1
    # no step lines at all (the run crashed before printing): exit 2
    (tmp_path / "crash.log").write_text("Traceback (most recent call last):\nRuntimeError: boom\n")
    assert compare.main([str(a), str(tmp_path / "crash.log")]) == 2
    assert compare.main([str(a), str(tmp_path / "missing.log")]) == 2
    capsys.readouterr()


def test_run_zoo_script_parses_and_lists_workloads():
    assert subprocess.run(["bash", "-n", str(ZOO / "run_zoo.sh")]).returncode == 0
    listed = subprocess.run(["bash", str(ZOO / "run_zoo.sh"), "--list"], capture_output=True, text=True, check=True).stdout
    names = {line.split()[0]: line.split()[1] for line in listed.splitlines()}
    assert {"llama", "resnet50", "bert_compile", "gpt2_decode", "vit"} <= set(names)
    assert set(names.values()) == set(SCRIPTS)
