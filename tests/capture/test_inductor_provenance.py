"""Inductor provenance: which module each kernel of a ``torch.compile``d graph came from.

One child process (hooks are global) compiles a tiny model with Inductor on CPU, forward and
backward, with gpudiag's module instrumentation and the provenance recorder sharing one recording
NVTX backend; every test below reads that one run (one Inductor compile in the whole file). The
oracle is the model's structure written here: which module holds which op, on which source line,
in which order the Linear layers run forward and backward. Inductor on CPU emits C++ kernels
(``cpp_fused_*``) and extern calls (``extern_kernels.addmm``); the names on a GPU differ (Triton),
the mechanism does not.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from gpudiag import nvtx_names
from gpudiag.analysis.attribution.ranges import Steps, attribute
from gpudiag.analysis.attribution.compiled import Prefix, align_call, attribute_compiled, resolve_site
from gpudiag.capture import inductor_provenance as ip

pytest.importorskip("torch")  # the scripts these tests run (or import) use torch

from test_run import _child_env, push_pop_pairs  # noqa: E402

TIMEOUT_S = 400

# Each op on its own line, tagged, so the oracle knows the source line of every op.
SCRIPT = '''
import json, sys
import torch
from torch import nn
from gpudiag.capture import inductor_provenance, instrument

class Recorder:
    def __init__(self):
        self.events, self.pushes = [], 0
    def push(self, text):
        self.pushes += 1
        if self.pushes == FAIL_AT_PUSH:  # a broken NVTX backend once: the script must not notice
            raise RuntimeError("nvtx down")
        self.events.append(["push", text])
    def pop(self):
        self.events.append(["pop"])
    def start(self, text):
        self.events.append(["start", text]); return 0
    def end(self, range_id):
        self.events.append(["end"])

rec = Recorder()
FAIL_AT_PUSH = -1
instrument.install(instrument.CaptureConfig(op_ranges=False), nvtx=rec)
inductor_provenance.install(rec)
lazy = "torch._inductor.output_code" not in sys.modules  # patched on import, not before

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x):
        h = self.ln(x)  # LINE:ln
        h = self.fc1(h)  # LINE:fc1
        h = torch.nn.functional.gelu(h)  # LINE:gelu
        h = self.fc2(h)  # LINE:fc2
        return x + h  # LINE:residual

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.blocks(x))  # LINE:head

torch.manual_seed(0)
eager = Net()
model = torch.compile(eager)
x = torch.randn(6, 16)
losses = []
for step in range(3):
    if step == 2:
        FAIL_AT_PUSH = rec.pushes + 2  # the 2nd push of step 2: its first graph range
    loss = model(x).square().mean()
    loss.backward()
    losses.append(loss.item())
eager_loss = eager(x).square().mean().item()
instrument.finish()
paths = [p for p, _ in eager.named_modules() if p]
json.dump({"events": rec.events, "provenance": inductor_provenance.collect(), "lazy": lazy,
           "losses": losses, "eager_loss": eager_loss, "paths": paths}, open(sys.argv[1], "w"))
'''

LINEARS = ["blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1", "blocks.1.fc2", "head"]  # forward order
LNS, BLOCKS = {"blocks.0.ln", "blocks.1.ln"}, {"blocks.0", "blocks.1"}
# Which modules may hold an op whose name appears in a fused kernel's name (the model above):
# LayerNorm in the norms, GELU and the residual add in the blocks, matmuls in the Linears; a sum
# is a Linear bias gradient or a LayerNorm weight/bias gradient.
OP_HOMES = [("native_layer_norm", LNS), ("gelu", BLOCKS), ("add", BLOCKS), ("mm", set(LINEARS)),
            ("sum", set(LINEARS) | LNS)]


def _allowed(kernel_name: str) -> set[str]:
    return set().union(*(homes for op, homes in OP_HOMES if op in kernel_name))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inductor")
    script = folder / "tiny_model.py"
    script.write_text(SCRIPT)
    out = folder / "out.json"
    proc = subprocess.run([sys.executable, str(script), str(out)], cwd=folder, env=_child_env(),
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(out.read_text())
    lines = {m.group(1): f"{script}:{i}" for i, text in enumerate(SCRIPT.splitlines(), 1)
             if (m := re.search(r"# LINE:(\w+)", text))}
    return SimpleNamespace(**data, lines=lines)


def _graph(run, kind: str) -> dict:
    found = [g for g in run.provenance["graphs"].values() if g["kind"] == kind]
    assert len(found) == 1, [g["kind"] for g in run.provenance["graphs"].values()]
    return found[0]


def test_forward_and_backward_graphs_recorded_without_changing_results(run):
    prov = run.provenance
    assert run.lazy and prov["fresh_compile"]
    assert not [w for w in prov["warnings"] if "nvtx down" not in w], prov["warnings"]
    fwd, bwd = _graph(run, "forward"), _graph(run, "backward")
    assert fwd["compile_id"] == bwd["compile_id"] and fwd["generated"] and bwd["generated"]
    # No optimizer: every step computes the same loss, the compiled one equal to eager's.
    assert run.losses == [run.losses[0]] * 3 and run.losses[0] == pytest.approx(run.eager_loss, rel=1e-5)


def test_every_kernel_maps_to_a_module_allowed_by_the_model(run):
    for kind in ("forward", "backward"):
        for rec in _graph(run, kind)["kernels"]:
            assert rec["module"] is not None, rec
            assert set(rec["modules"]) <= set(run.paths), rec
            allowed = _allowed(rec["name"]) if rec["kind"] != "extern" else set(LINEARS)
            assert rec["module"] in allowed and set(rec["modules"]) <= allowed, (kind, rec)
            assert rec["source"] in run.lines.values(), rec


def test_forward_kernels_follow_the_model_structure(run):
    kernels = _graph(run, "forward")["kernels"]
    mms = [k for k in kernels if k["kind"] == "extern"]
    assert [k["module"] for k in mms] == LINEARS
    assert [k["module_class"] for k in mms] == ["Linear"] * 5
    assert [k["source"] for k in mms] == [run.lines[n] for n in ("fc1", "fc2", "fc1", "fc2", "head")]
    norms = [k for k in kernels if "native_layer_norm" in k["name"]]
    assert [k["module"] for k in norms] == ["blocks.0.ln", "blocks.1.ln"]
    assert {k["source"] for k in norms} == {run.lines["ln"]}
    gelus = [k for k in kernels if "gelu" in k["name"]]
    assert [(k["module"], k["source"]) for k in gelus] == [("blocks.0", run.lines["gelu"]), ("blocks.1", run.lines["gelu"])]
    assert all(any("native_layer_norm" in op for op in k["ops"]) for k in norms)


def test_backward_kernels_follow_the_model_structure(run):
    kernels = _graph(run, "backward")["kernels"]
    mms = [k["module"] for k in kernels if k["kind"] == "extern"]
    assert list(dict.fromkeys(mms)) == LINEARS[::-1]  # gradients flow from the head back
    assert all(1 <= mms.count(m) <= 2 for m in LINEARS)  # grad input and/or grad weight
    # x needs no gradient, so blocks.0.ln's backward is only its weight/bias sums, which Inductor
    # fuses with blocks.1.ln's: that kernel holds both norms (its `modules`), the primary is one.
    norm_bwd = [k for k in kernels if "native_layer_norm_backward" in k["name"]]
    assert all(k["module"] in LNS for k in norm_bwd) and LNS <= set().union(*(k["modules"] for k in norm_bwd))
    gelu_bwd = [k["module"] for k in kernels if "gelu_backward" in k["name"]]
    assert sorted(gelu_bwd) == sorted(BLOCKS)


def test_one_balanced_graph_range_per_graph_call(run):
    pairs = push_pop_pairs(run.events)  # asserts balance, with the module and step ranges around
    graph_ranges = [(run.events[i][1], stack) for i, _, stack in pairs if run.events[i][1].startswith(nvtx_names.GRAPH)]
    fwd_id = next(k for k, g in run.provenance["graphs"].items() if g["kind"] == "forward")
    bwd_id = next(k for k, g in run.provenance["graphs"].items() if g["kind"] == "backward")
    calls = {k: g["calls"] for k, g in run.provenance["graphs"].items()}
    assert calls == {fwd_id: 3, bwd_id: 3}
    # Step 2's forward push failed (NVTX backend raised): that call ran without a range, once.
    texts = [t for t, _ in graph_ranges]
    assert texts == [nvtx_names.GRAPH + i for i in (fwd_id, bwd_id, fwd_id, bwd_id, bwd_id)]
    assert any("nvtx down" in w for w in run.provenance["warnings"])
    for text, stack in graph_ranges:  # forward runs inside the model's module range
        assert (nvtx_names.MODULE + "Net|Net" in stack) == (text == nvtx_names.GRAPH + fwd_id)


# ---- the analysis: synthetic captures ----------------------------------------------------------

TID, PID = 7, 1 << 24
WHOLE = Steps(pd.DataFrame({"step": [0], "start_ns": [0], "end_ns": [10 ** 12]}), "test", "whole")


def _capture(ranges: list[tuple[str, int, int]], launches: list[tuple[int, str, int, int]]):
    """(kernels, runtime_api, nvtx) of one thread: ranges (text, start, end); launches (API call
    start, kernel name, GPU start, correlation id; one API call per correlation id)."""
    nvtx = pd.DataFrame([{"text": t, "start_ns": s, "end_ns": e, "global_tid": TID, "global_pid": PID}
                         for t, s, e in ranges])
    kernels = pd.DataFrame([{"kernel_id": i, "start_ns": g, "end_ns": g + 100, "duration_ns": 100,
                             "global_pid": PID, "correlation_id": c, "name": n, "short_name": n}
                            for i, (_, n, g, c) in enumerate(launches)])
    api = pd.DataFrame([{"global_pid": PID, "correlation_id": c, "start_ns": a, "end_ns": a + 1,
                         "global_tid": TID, "name": "cudaLaunchKernel"} for a, _, _, c in launches])
    return kernels, api.drop_duplicates("correlation_id"), nvtx


def _analyse(ranges, launches, provenance):
    kernels, api, nvtx = _capture(ranges, launches)
    return attribute_compiled(kernels, attribute(kernels, api, nvtx, WHOLE), nvtx, provenance)


def _ranges_from_events(events: list) -> list[tuple[str, int, int]]:
    """Push/pop events -> ranges, event i at time 1000 * i."""
    stack, out = [], []
    for i, e in enumerate(events):
        if e[0] == "push":
            stack.append((e[1], 1000 * i))
        elif e[0] == "pop":
            text, start = stack.pop()
            out.append((text, start, 1000 * i))
    return out


def test_analysis_maps_the_recorded_run(run):
    """Kernels made from the child's own graphs and ranges: Inductor's kernels by name, each extern
    call as one or two library kernels (a GEMM and a split-K reduction), plus eager kernels outside
    the compiled runs; every compiled kernel lands on its call site's module and line."""
    ranges = _ranges_from_events(run.events)
    launches, expected, corr = [], [], 0
    for text, start, end in ranges:
        if not text.startswith(nvtx_names.GRAPH):
            continue
        sites = run.provenance["graphs"][text[len(nvtx_names.GRAPH):]]["kernels"]
        t = start + 1
        for n, site in enumerate(sites):
            names = [site["name"]] if site["kind"] != "extern" else (
                ["sm80_xmma_gemm_f32f32", "splitKreduce_kernel"] if n % 2 else ["ampere_sgemm_64x64_nn"])
            for name in names:
                corr += 1
                launches.append((t, name, 10 * t, corr))
                expected.append((corr, site["module"], site["source"]))
                t += 1
        assert t < end
    for t in (1, ranges[-1][2] + 5):  # eager kernels outside every compiled run
        corr += 1
        launches.append((t, "vectorized_elementwise_kernel", 10 * t, corr))
    out, summary = _analyse(ranges, launches, run.provenance)
    got = out.set_index(out["kernel_id"] + 1)  # kernel_id i has correlation id i + 1
    for c, module, source in expected:
        assert got.loc[c, "module"] == module and got.loc[c, "source_line"] == source, (c, module)
        assert got.loc[c, "compiled_mapping"] in ("name", "order")
    assert summary["mapped_percent"] == 100 and summary["module_percent"] == 100
    assert summary["graphs"] == 2 and summary["graphs_recorded"] == 2
    assert summary["compiled_percent_of_kernel_time"] == pytest.approx(100 * len(expected) / len(launches), abs=0.01)
    outside = out[out["graph"] < 0]
    assert len(outside) == 2 and set(outside["compiled_mapping"]) == {""}


def _site(name, module, kind="cpp", cls="X", root="self", source="m.py:1"):
    return {"name": name, "kind": kind, "module": module, "module_class": cls, "root": root,
            "modules": {module: 1}, "source": source, "ops": []}


SUBMODULE_PROV = {"graphs": {
    "0": {"compile_id": "1/0", "kind": "forward", "generated": True, "calls": 1, "kernels": [
        _site("triton_per_fused_native_layer_norm_0", "0.ln", cls="LayerNorm"),
        _site("extern_kernels.mm", "0.fc1", kind="extern", cls="Linear"),
        _site("triton_poi_fused_gelu_1", "0"),
        _site("extern_kernels.mm", "0.fc2", kind="extern", cls="Linear"),
        _site("triton_poi_fused_add_2", "")]},
    "1": {"compile_id": "1/0", "kind": "backward", "generated": True, "calls": 1, "kernels": [
        _site("extern_kernels.mm", "0.fc2", kind="extern"), _site("extern_kernels.mm", "0.fc1", kind="extern"),
        _site("triton_poi_fused_gelu_backward_0", "0")]},
}}


def test_submodule_compile_joins_paths_forward_and_backward():
    """model.blocks = torch.compile(model.blocks): paths are relative to `blocks`; the forward run
    sits in the `blocks` range, the backward run (no module range) takes the forward's."""
    ranges = [(nvtx_names.MODULE + "Net|Net", 0, 1000), (nvtx_names.MODULE + "blocks|Sequential", 10, 900),
              (nvtx_names.GRAPH + "0", 20, 800), (nvtx_names.PHASE + "backward", 2000, 3000),
              (nvtx_names.GRAPH + "1", 2010, 2900)]
    names = ["triton_per_fused_native_layer_norm_0", "gemm", "triton_poi_fused_gelu_1", "gemm",
             "triton_poi_fused_add_2", "gemm_a", "gemm_b", "triton_poi_fused_gelu_backward_0"]
    api = [30, 40, 50, 60, 70, 2020, 2030, 2040]
    out, summary = _analyse(ranges, [(a, n, a * 10, i + 1) for i, (a, n) in enumerate(zip(api, names))], SUBMODULE_PROV)
    assert list(out["module"]) == ["blocks.0.ln", "blocks.0.fc1", "blocks.0", "blocks.0.fc2", "blocks",
                                   "blocks.0.fc2", "blocks.0.fc1", "blocks.0"]
    assert list(out["module_class"])[:2] == ["LayerNorm", "Linear"] and out["module_class"][4] == "Sequential"
    assert list(out["graph"]) == [0] * 5 + [1] * 3 and summary["mapped_percent"] == 100


def test_cuda_graph_replay_orders_by_gpu_start():
    """Under CUDA graphs one cudaGraphLaunch (one correlation id) launches every kernel of the run;
    their order is the GPU's, whatever the rows' order."""
    prov = {"graphs": {"0": {"compile_id": "0/0", "kind": "inference", "generated": True, "kernels": [
        _site("k_a", "a"), _site("extern_kernels.mm", "b", kind="extern"), _site("k_c", "c")]}}}
    launches = [(50, "k_c", 700, 1), (50, "gemm", 600, 1), (50, "k_a", 500, 1)]
    out, _ = _analyse([(nvtx_names.MODULE + "M|M", 0, 100), (nvtx_names.GRAPH + "0", 10, 90)], launches, prov)
    assert list(out["module"]) == ["c", "b", "a"] and set(out["compiled_mapping"]) == {"name", "order"}


def test_unmappable_kernels_keep_their_nvtx_module():
    ranges = [(nvtx_names.MODULE + "M|M", 0, 100), (nvtx_names.GRAPH + "0", 10, 90)]
    launches = [(20, "k_unknown", 200, 1), (30, "k_a", 300, 2)]
    out, summary = _analyse(ranges, launches, None)  # no provenance at all
    assert list(out["module"]) == ["M", "M"] and set(out["compiled_mapping"]) == {"unmapped"}
    assert summary["mapped_percent"] == 0 and summary["module_percent"] == 100 and summary["warnings"]
    prov = {"graphs": {"0": {"compile_id": "0/0", "kernels": [_site("k_a", "a"), _site("k_b", None)]}}}
    out, summary = _analyse(ranges, launches + [(40, "k_b", 400, 3)], prov)
    assert list(out["module"]) == ["M", "a", "M"]
    assert list(out["compiled_mapping"]) == ["unmapped", "name", "unmapped"]
    assert summary["mapped_percent"] == pytest.approx(100 / 3, abs=0.01)
    assert summary["unmapped_top"][0]["ns"] == 100


def test_align_call_gaps_and_repeats():
    sites = ["k0", "extern_kernels.mm", "k1", "extern_kernels.mm", "extern_kernels.mm", "k0"]
    m = align_call(["k0", "g", "k1", "g", "g2", "k0"], sites)
    assert [(x.sites, x.how) for x in m] == [((0,), "name"), ((1,), "order"), ((2,), "name"),
                                             ((3,), "order"), ((4,), "order"), ((5,), "name")]
    m = align_call(["k0", "g", "r", "k1"], ["k0", "extern_kernels.mm", "k1"])  # GEMM + split-K reduce
    assert [x.sites for x in m] == [(0,), (1,), (1,), (2,)]
    m = align_call(["k0", "k0", "k0"], ["k0", "k0"])  # more launches than sites: autotuning
    assert {x.how for x in m} == {"coarse"} and m[0].sites == (0, 1)
    m = align_call(["g", "g", "g"], ["extern_kernels.mm", "extern_kernels.bmm"])
    assert {x.sites for x in m} == {(0, 1)}
    sites_rec = [_site("extern_kernels.mm", "blocks.0.fc1"), _site("extern_kernels.bmm", "blocks.0.attn")]
    assert resolve_site(m[0], sites_rec, Prefix("Net", "Net", True))[::3] == ("blocks.0", "coarse")
    sites_rec[1]["module"] = "head"
    assert resolve_site(m[0], sites_rec, Prefix("Net", "Net", True))[3] == "unmapped"
    assert align_call([], []) == [] and [x.how for x in align_call(["a"], [])] == ["unmapped"]


# ---- the recorder's pure parts -----------------------------------------------------------------

@pytest.mark.parametrize("dynamo_path, expected", [
    ("L['self'].blocks.0.fc1", ("self", "blocks.0.fc1")),
    ("L['self'].blocks[0].fc1", ("self", "blocks.0.fc1")),
    ("L['self']._modules['blocks']._modules['0']", ("self", "blocks.0")),
    ("G['model'].layers['enc']", ("model", "layers.enc")),
    ("L['model']", ("model", "")),
    ("self.head", ("self", "head")),
])
def test_module_path(dynamo_path, expected):
    assert ip.module_path(dynamo_path) == expected


def _node(module=None, fwd_module=None, trace=None, op=None):
    meta = {}
    if module is not None:
        meta["nn_module_stack"] = {"k": ("L['self']." + module, type("Linear", (), {}))} if module else {}
    if fwd_module is not None:
        meta["fwd_nn_module_stack"] = {"k": ("L['self']." + fwd_module, type("LayerNorm", (), {}))}
    if trace:
        meta["stack_trace"] = trace
    if op:
        meta["original_aten"] = op
    return SimpleNamespace(meta=meta)


def test_kernel_record_prefers_backward_nodes_and_user_lines():
    trace = 'File "/x/model.py", line 3, in forward\n    h = self.ln(x)\n'
    nodes = [_node(module="blocks.1.ln", trace=trace), _node(module="blocks.1.ln"), _node(module="blocks.1.ln"),
             _node(fwd_module="blocks.0.ln", trace='File "/x/model.py", line 9, in forward\n',
                   op="aten.native_layer_norm_backward.default"), _node()]
    rec = ip.kernel_record("cpp_fused_native_layer_norm_backward_4", nodes, is_extern=False)
    assert rec["module"] == "blocks.0.ln" and rec["module_class"] == "LayerNorm" and rec["root"] == "self"
    assert rec["modules"] == {"blocks.1.ln": 3, "blocks.0.ln": 1} and rec["source"] == "/x/model.py:9"
    assert rec["ops"] == ["aten.native_layer_norm_backward.default"] and rec["kind"] == "cpp"
    empty = ip.kernel_record("extern_kernels.mm", [_node(module="")], is_extern=True)
    assert empty["module"] == "" and empty["kind"] == "extern"  # the compiled frame's own code
    assert ip.kernel_record("k", [SimpleNamespace(meta={})], False)["module"] is None


def test_graph_from_another_process_gets_a_fresh_id():
    """A CompiledFxGraph unpickled from a cache written by an earlier profiled run carries that
    run's tag: it is not trusted, the graph gets an id here, marked as not generated here."""
    state = ip._State(nvtx=None, fresh_compile=True)
    compiled = SimpleNamespace()
    compiled.__dict__[ip._GRAPH_ATTR] = (object(), 5, nvtx_names.GRAPH + "5")
    token, gid, text, sources = ip._graph_of(state, compiled)
    assert token is state.token and gid == 0 and text == nvtx_names.GRAPH + "0" and sources == {}
    assert state.graphs[0]["generated"] is False and ip._graph_of(state, compiled)[1] == 0


# (in, out) features of the model's Linear layers, forward order (SCRIPT above): the oracle of the shapes
LINEAR_FEATURES = [(16, 32), (32, 16), (16, 32), (32, 16), (16, 3)]
BATCH = 6


def _dims(site) -> tuple[int, ...]:
    """The sorted (M, N, K) of a recorded matmul site, from its payload's input shapes."""
    shapes = [[int(x) for x in t.split("[")[1].rstrip("]").split(",")] for t in site["cost"]["in"]
              if isinstance(t, str) and "[" in t]
    a, b = shapes[-2], shapes[-1]  # mm (a, b); addmm (bias, a, b)
    assert a[1] == b[0], site["cost"]
    return tuple(sorted((a[0], b[1], a[1])))


def test_extern_matmuls_record_their_shapes(run):
    """Each extern call of a Linear records its contraction with Inductor's traced shapes: forward
    x W^T (batch, in, out); backward the input gradient (batch, out -> in) and the weight gradient
    (out x in over the batch), for every Linear but none for the C++ kernels."""
    forward, backward = _graph(run, "forward"), _graph(run, "backward")
    fwd = sorted(_dims(s) for s in forward["kernels"] if s["kind"] == "extern")
    assert fwd == sorted(tuple(sorted((BATCH, i, o))) for i, o in LINEAR_FEATURES)
    bwd = sorted(_dims(s) for s in backward["kernels"] if s["kind"] == "extern")
    assert bwd == sorted(2 * [tuple(sorted((BATCH, i, o))) for i, o in LINEAR_FEATURES])
    assert all(s["cost"]["op"] in ("aten::mm", "aten::addmm") for g in (forward, backward)
               for s in g["kernels"] if s["kind"] == "extern")
    assert all(s["cost"] is None for g in (forward, backward) for s in g["kernels"] if s["kind"] == "cpp")


def test_compiled_matmuls_get_shape_costs(run):
    """The analysis gives a compiled graph's GEMM kernels their call site's FLOPs (2 M N K, from the
    oracle's shapes), as eager op calls get theirs: evidence "shapes"; of an extern call launched as a
    GEMM and a split-K reduction, the GEMM takes the FLOPs and the bytes (the operands are its traffic)."""
    from gpudiag.analysis.roofline.classify import classify
    from gpudiag.analysis.roofline.peaks import DevicePeaks

    ranges = _ranges_from_events(run.events)
    launches, sites_of, corr, extern_calls = [], {}, 0, 0
    for text, start, _ in ranges:
        if not text.startswith(nvtx_names.GRAPH):
            continue
        t = start + 1
        sites = run.provenance["graphs"][text[len(nvtx_names.GRAPH):]]["kernels"]
        kinds = ["", *(s["kind"] for s in sites), ""]
        for n, site in enumerate(sites):
            # an extern call between two Inductor kernels may launch a split-K reduction too; one
            # beside another extern call launches one GEMM (else the launches' sites are ambiguous)
            alone = kinds[n] != "extern" and kinds[n + 2] != "extern"
            extern_calls += site["kind"] == "extern"
            names = [site["name"]] if site["kind"] != "extern" else (
                ["sm80_xmma_gemm_f32f32", "splitKreduce_kernel"] if alone else ["ampere_sgemm_64x64_nn"])
            for name in names:
                corr += 1
                launches.append((t, name, 10 * t, corr))
                sites_of[corr - 1] = site
                t += 1
    kernels, api, nvtx = _capture(ranges, launches)
    att, _ = attribute_compiled(kernels, attribute(kernels, api, nvtx, WHOLE), nvtx, run.provenance)
    kernels = kernels.assign(grid_x=1024, grid_y=1, grid_z=1, block_x=128, block_y=1, block_z=1,
                             duration_ns=[10_000 + 10 * i for i in range(len(kernels))])
    peaks = DevicePeaks("test", 132, 3.35e12, {"fp32": 67e12, "tf32": 495e12})
    cls = classify(kernels, att.assign(step=0), peaks)
    gemm = kernels["name"].str.contains("gemm").to_numpy()
    assert gemm.sum() == extern_calls > 0
    assert cls.loc[gemm, "evidence"].eq("shapes").all(), cls.loc[gemm, ["evidence", "flop"]]
    expected = [2.0 * np.prod(_dims(sites_of[i])) for i in np.flatnonzero(gemm)]
    np.testing.assert_allclose(cls.loc[gemm, "flop"].to_numpy(), expected)
    reduce = kernels["name"].eq("splitKreduce_kernel").to_numpy()
    assert reduce.any() and (cls.loc[reduce, "flop"] == 0).all() and (cls.loc[reduce, "bytes"] == 0).all()
    # a contraction's operands and output (an addmm's bias too) are its GEMM's traffic, fp32 here
    for i in np.flatnonzero(gemm):
        cost = sites_of[i]["cost"]
        tensors = [t for t in [*cost["in"], cost["out"]] if isinstance(t, str) and "[" in t]
        site_bytes = sum(4.0 * np.prod([int(x) for x in t.split("[")[1].rstrip("]").split(",")]) for t in tensors)
        assert cls.loc[i, "bytes"] == pytest.approx(site_bytes), (cost, cls.loc[i, "bytes"])
    cpp = kernels["name"].str.startswith("cpp").to_numpy()
    assert cls.loc[cpp, "evidence"].eq("heuristic").all()
