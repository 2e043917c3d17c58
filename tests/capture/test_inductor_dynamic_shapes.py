"""A dynamic-shape compiled graph's GEMMs get their shapes too: the call sites record their sizes as
symbol expressions, each graph run records the symbols' values in its NVTX range, and the analysis
binds them. One child process compiles a small MLP with ``dynamic=True`` on CPU and runs it at two batch
sizes, forward and backward (the oracle: the batch sizes and layer widths written here); a second
child runs the same without gpudiag, to check that recording adds no recompilation and changes no result.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from gpudiag import nvtx_names
from gpudiag.analysis.attribution.compiled import attribute_compiled, bound_payload
from gpudiag.analysis.attribution.ranges import attribute
from gpudiag.analysis.roofline.costmodel import op_cost

pytest.importorskip("torch")
from test_inductor_provenance import WHOLE, _capture, _ranges_from_events  # noqa: E402
from test_run import _child_env  # noqa: E402

FEATURES = [(16, 32), (32, 8)]  # (in, out) of the two Linear layers

SCRIPT = '''
import json, sys
import torch
from torch import nn
from gpudiag.capture import inductor_provenance

class Recorder:
    def __init__(self):
        self.events = []
    def push(self, text):
        self.events.append(["push", text])
    def pop(self):
        self.events.append(["pop"])

rec = Recorder()
if sys.argv[2] == "record":
    inductor_provenance.install(rec)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
compiled = torch.compile(model, dynamic=True)
losses = []
for batch in (6, 10, 6):
    x = torch.randn(batch, 16, generator=torch.Generator().manual_seed(batch))
    loss = compiled(x).square().mean()
    loss.backward()
    losses.append(loss.item())
from torch._dynamo.utils import counters
out = {"events": rec.events, "losses": losses, "frames": dict(counters["stats"])}
if sys.argv[2] == "record":
    out["provenance"] = inductor_provenance.collect()
json.dump(out, open(sys.argv[1], "w"))
'''


def _child(folder, mode: str) -> dict:
    script = folder / "dynamic_mlp.py"
    script.write_text(SCRIPT)
    out = folder / f"{mode}.json"
    proc = subprocess.run([sys.executable, str(script), str(out), mode], cwd=folder, env=_child_env(),
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dynamic")
    return SimpleNamespace(recorded=_child(folder, "record"), plain=_child(folder, "plain"))


def _extern_costs(provenance) -> list[dict]:
    return [s["cost"] for g in provenance["graphs"].values() for s in g["kernels"] if s["kind"] == "extern"]


def test_recording_adds_no_recompilation_and_changes_no_result(run):
    assert run.recorded["losses"] == run.plain["losses"]
    assert run.recorded["frames"] == run.plain["frames"]


def test_call_sites_record_symbolic_sizes_and_each_run_its_values(run):
    costs = _extern_costs(run.recorded["provenance"])
    assert costs and all(c is not None and c.get("symbols") for c in costs), costs
    symbols = {s for c in costs for s in c["symbols"]}
    graph_texts = [e[1] for e in run.recorded["events"] if e[0] == "push" and e[1].startswith(nvtx_names.GRAPH)]
    # forward and backward per run, three runs (batch 6, 10, 6)
    assert len(graph_texts) == 6, graph_texts
    for text, batch in zip(graph_texts, [6, 6, 10, 10, 6, 6]):
        values = dict(part.split("=") for part in text.split()[2:])
        assert set(values) == symbols and set(values.values()) == {str(batch)}, (text, batch)


def test_every_run_s_matmuls_get_their_own_batch_s_flops(run):
    """The analysis binds each run's values: at batch b the forward's two matmuls do 2 b 16 32 and
    2 b 32 8 FLOPs; the backward the second layer's input gradient (2 b 8 32) and both weight gradients
    (2 32 b 16, 2 8 b 32); the first layer's input gradient is not computed (x needs none)."""
    ranges = _ranges_from_events(run.recorded["events"])
    launches, corr = [], 0
    graphs = run.recorded["provenance"]["graphs"]
    for text, start, _ in ranges:
        t = start + 1
        for site in graphs[text[len(nvtx_names.GRAPH):].split()[0]]["kernels"]:
            corr += 1
            launches.append((t, site["name"] if site["kind"] != "extern" else "sgemm_64x64_nn", 10 * t, corr))
            t += 1
    kernels, api, nvtx = _capture(ranges, launches)
    att, _ = attribute_compiled(kernels, attribute(kernels, api, nvtx, WHOLE), nvtx, run.recorded["provenance"])
    gemm = att[kernels["name"].eq("sgemm_64x64_nn").to_numpy()]
    assert gemm["compiled_op"].ne("").all() and gemm["compiled_op_call"].nunique() == len(gemm)
    flops = sorted(op_cost(o, a).flop for o, a in zip(gemm["compiled_op"], gemm["compiled_op_args"]))
    (i1, o1), (i2, o2) = FEATURES
    per_run = lambda b: [2 * b * i1 * o1, 2 * b * i2 * o2, 2 * b * o2 * i2, 2 * o2 * b * i2, 2 * o1 * b * i1]  # noqa: E731
    assert flops == sorted(f for b in (6, 10, 6) for f in per_run(b))


def test_a_symbol_without_a_value_gives_no_cost():
    args = json.dumps({"op": "aten::mm", "in": ["float32[s3,16]", "float32[16,32]"], "out": "float32[s3,32]",
                       "symbols": ["s3"]})
    assert bound_payload(args, "", {}) == ""
    assert bound_payload(args, "s3=4", {}) == '{"op":"aten::mm","in":["float32[4,16]","float32[16,32]"],"out":"float32[4,32]"}'
    odd = args.replace("s3,16", "__import__('os'),16")
    assert bound_payload(odd, "s3=4", {}) == ""
    assert np.isclose(op_cost("aten::mm", bound_payload(args, "s3=4", {})).flop, 2 * 4 * 16 * 32)


def test_a_dynamic_graph_s_runs_share_one_host_work_label():
    from gpudiag.analysis.steps.host_work import _label

    assert _label(nvtx_names.GRAPH + "3 s33=8") == _label(nvtx_names.GRAPH + "3 s33=10") == "compiled graph 3"
    assert _label(nvtx_names.GRAPH + "3") == "compiled graph 3"


def test_a_dynamic_gpt2_run_on_the_h200_gets_each_step_s_shapes(tmp_path):
    """GPT-2 (3 layers) under torch.compile, sequence lengths 256, 320, 384 in turn (benchmarks/roofline48/
    workloads.py gpt2_dynamic, `gpudiag profile` on an nvidia-h200, 2026-11-29): Inductor recompiled its
    graphs with a symbolic length. Every GEMM and attention kernel of the compiled runs in the 11 captured
    steps is classed from shapes, and every bound shape holds its own step's tokens (8 x T) or length T
    (the oracle: the script's schedule, step s has T = (256, 320, 384)[s % 3])."""
    import lzma
    import re
    import shutil

    from conftest import ROOT
    from gpudiag import store
    from gpudiag.analysis.ingest import ingest
    from gpudiag.analysis.pipeline import analyse

    fixture = ROOT / "tests" / "fixtures" / "roofline48" / "profiled" / "gpt2_dynamic"
    with lzma.open(fixture / "profile.sqlite.xz") as f, open(tmp_path / "p.sqlite", "wb") as g:
        shutil.copyfileobj(f, g)
    status = json.loads((fixture / "script_status.json").read_text())
    db = ingest(tmp_path / "p.sqlite", tmp_path / "run.sqlite")
    analyse(db, status=status, warmup_steps=status.get("warmup_steps", 2))
    a = store.read_table(db, "kernel_attribution")[["kernel_id", "step", "graph", "compiled_op_args"]]
    c = store.read_table(db, "kernel_class")[["kernel_id", "family", "evidence"]]
    k = a.merge(c, on="kernel_id")
    compiled = k[k["family"].isin(["gemm", "attention"]) & (k["graph"] >= 0) & k["step"].notna()]
    assert compiled["step"].nunique() >= 10 and compiled["evidence"].eq("shapes").all()
    costed = compiled[compiled["compiled_op_args"].astype(str) != ""]
    assert len(costed) > 300
    for step, args in zip(costed["step"], costed["compiled_op_args"].astype(str)):
        t = (256, 320, 384)[int(step) % 3]
        dims = {int(x) for shape in re.findall(r"\[([\d,]+)\]", args) for x in shape.split(",")}
        assert 8 * t in dims or t in dims, (step, args)
