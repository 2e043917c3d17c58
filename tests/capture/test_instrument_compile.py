"""gpudiag's instrumentation must not change a ``torch.compile``d script: same losses, same graphs,
no added graph break or recompilation (Dynamo's own counters are the oracle), and balanced NVTX
ranges with module ranges only outside compiled code.

Each scenario runs twice in child processes (hooks are global): plain ``python script.py``, then
under the real launcher ``python -m gpudiag.capture.launch``. Dynamo runs on CPU tensors; most
scenarios use the ``aot_eager`` backend (Dynamo + AOTAutograd, what decides graphs and breaks) to
keep CI fast, one uses Inductor itself and one compiled autograd. ``mode="reduce-overhead"``/``max-autotune`` differ only
in Inductor's code generation and CUDA graphs: they are checked on the GPU (benchmarks/zoo).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpudiag import nvtx_names
from gpudiag.capture.instrument import CaptureConfig

pytest.importorskip("torch")  # the scripts these tests run (or import) use torch

from test_run import DRIVER, _child_env, push_pop_pairs, pushed  # noqa: E402

TIMEOUT_S = 300

MODEL = """
import json, sys
import torch
from torch import nn

torch.manual_seed(0)

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc1(self.ln(x)))
        if BREAK:
            print("a graph break the user wrote")
        return x + self.fc2(h)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.blocks(x))
"""

LOOP = """
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x, y = torch.randn(6, 16), torch.randint(0, 3, (6,))
losses = []
for step in range(5):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
from torch._dynamo.utils import counters
result = {"losses": losses, "graph_breaks": sum(counters["graph_break"].values()),
          "unique_graphs": counters["stats"]["unique_graphs"], "frames": counters["frames"]["ok"],
          "recompiles": sum(counters["recompiles"].values())}
print("RESULT " + json.dumps(result))
"""

SCENARIOS = {
    "whole_model": ("BREAK = False", "model = torch.compile(Net(), backend='aot_eager')"),
    "submodule": ("BREAK = False", "model = Net()\nmodel.blocks = torch.compile(model.blocks, backend='aot_eager')"),
    "user_graph_break": ("BREAK = True", "model = torch.compile(Net(), backend='aot_eager')"),
    "inductor": ("BREAK = False", "model = torch.compile(Net())"),
    # compiled autograd: Dynamo also traces the backward graph (where gpudiag's backward phase
    # wrapper and module hooks must stay out of it as well)
    "compiled_autograd": ("BREAK = False", "torch._dynamo.config.compiled_autograd = True\n"
                                           "model = torch.compile(Net(), backend='aot_eager')"),
}


def _script(tmp_path: Path, scenario: str) -> Path:
    flag, build = SCENARIOS[scenario]
    path = tmp_path / f"{scenario}.py"
    path.write_text(flag + "\n" + MODEL + "\n" + build + "\n" + LOOP)
    return path


def _result(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_child_env(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)


@pytest.mark.parametrize("scenario,bare", [(s, False) for s in SCENARIOS] + [("whole_model", True)])
def test_profiled_compiled_script_is_unchanged(tmp_path, scenario, bare):
    """Same losses (bit for bit: same code, same order), same Dynamo counters with and without
    the launcher; the launcher's status reports Dynamo's numbers; the op ranges of the detail step
    (step 2, a compiled step) do not make Dynamo recompile. The bare run too: it keeps its forward
    hooks once Dynamo compiled with them (removing them would compile a second graph)."""
    script = _script(tmp_path, scenario)
    plain = _result(_run([str(script)], tmp_path))
    config = CaptureConfig(warmup_steps=2, bare=bare).to_json()
    status_path = tmp_path / "status.json"
    profiled_proc = _run(["-m", "gpudiag.capture.launch", "--config", config, "--status", str(status_path),
                          str(script)], tmp_path)
    profiled = _result(profiled_proc)
    # Frames may differ by the two hook frames torch calls around a compiled model's forward:
    # Dynamo traces them to an empty frame (no graph, hence the equal unique_graphs below).
    assert profiled["frames"] - plain["frames"] in (0, 2)
    for key in ("losses", "graph_breaks", "unique_graphs", "recompiles"):
        assert profiled[key] == plain[key], key
    assert "global hooks" not in profiled_proc.stderr  # torch's wrapper warning is gpudiag's to expect
    compiled = json.loads(status_path.read_text())["compile"]
    assert compiled["graph_breaks"] == plain["graph_breaks"] and compiled["unique_graphs"] == plain["unique_graphs"]
    assert compiled["recompiles"] == plain["recompiles"] == 0
    if scenario == "user_graph_break":
        assert plain["graph_breaks"] >= 1 and "print" in compiled["graph_break_reasons"][0]["reason"]
    else:
        assert plain["graph_breaks"] == 0


def _recorded(tmp_path: Path, scenario: str) -> list:
    driver = tmp_path / "driver.py"
    # runpy, as the launcher does, so that Dynamo's guards find the script's globals in __main__
    run_line = 'exec(compile(source, script_path, "exec"), {"__name__": "__main__"})'
    assert run_line in DRIVER
    driver.write_text(textwrap.dedent(DRIVER).replace(
        run_line, 'import runpy; runpy.run_path(script_path, run_name="__main__")'))
    out = tmp_path / "events.json"
    proc = _run([str(driver), CaptureConfig(warmup_steps=2).to_json(), str(_script(tmp_path, scenario)),
                 str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())["events"]


def test_whole_model_compiled_gets_one_module_range_per_call(tmp_path):
    """The compiled model's wrapper is named as the model ("Net|Net"); modules inside the compiled
    region push nothing (their hooks are traced as no-ops); ranges balance; the detail step still
    records aten op ranges (the compiled graph's own ops and the optimizer's)."""
    events = _recorded(tmp_path, "whole_model")
    push_pop_pairs(events)  # asserts balance
    modules = pushed(events, nvtx_names.MODULE)
    assert modules and set(modules) == {nvtx_names.MODULE + "Net|Net"}
    assert len(modules) == 5  # one forward per step
    assert pushed(events, nvtx_names.OP)


def test_compiled_submodule_keeps_the_users_paths(tmp_path):
    """With only ``model.blocks`` compiled, the eager modules keep their ranges and the compiled
    wrapper is named by the user's path ("blocks|Sequential"), with no "_orig_mod" in any path."""
    events = _recorded(tmp_path, "submodule")
    push_pop_pairs(events)
    modules = set(pushed(events, nvtx_names.MODULE))
    assert modules == {nvtx_names.MODULE + t for t in ("Net|Net", "blocks|Sequential", "head|Linear")}
