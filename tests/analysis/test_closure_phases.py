"""The attribution's phases of a closure ``optimizer.step(closure)`` ran (issue 45), on the NVTX
ranges a real instrumented run recorded on CPU (test_run's recording driver): every op of the
detail step becomes one kernel launched inside its op range, the ranges get timestamps in event
order, and :func:`gpudiag.analysis.attribution.ranges.attribute` gives each kernel its phase.

The oracle is the launcher's own nesting, replayed by a stack in the test
(``test_closure_steps.split_by_optimizer``): the optimizer's kernels are the ops run with the
optimizer range open and outside every closure. The same run with the closure ranges taken out
(the nesting an export made before them has: the optimizer range open around the whole closure)
must give the same optimizer kernels.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpudiag import nvtx_names
from gpudiag.analysis.attribution.ranges import Steps, attribute
from gpudiag.capture.instrument import CaptureConfig

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capture"))

from test_closure_steps import CLOSURE_LOOP, ops_with_open_ranges, run_instrumented, split_by_optimizer  # noqa: E402

OPTIMIZER = nvtx_names.PHASE + "optimizer"


def without_closure_ranges(events: list) -> list:
    """The events as the launcher wrote them before closure ranges: each ``pop (optimizer), push
    closure`` before a closure and each ``pop (closure), push optimizer`` after it taken out, so
    the optimizer range stays open around the closure."""
    out, stack, i = [], [], 0
    while i < len(events):
        event, following = events[i], events[i + 1] if i + 1 < len(events) else None
        if event == ["pop"] and following == ["push", nvtx_names.CLOSURE]:
            i += 2  # the optimizer range stays open; no closure range
            continue
        if event == ["pop"] and stack[-1:] == [nvtx_names.CLOSURE] and following == ["push", OPTIMIZER]:
            stack.pop()
            i += 2
            continue
        if event[0] == "push":
            stack.append(event[1])
        elif event[0] == "pop":
            stack.pop()
        out.append(event)
        i += 1
    return out


def _open(events: list) -> list[str]:
    stack: list[str] = []
    for event in events:
        if event[0] == "push":
            stack.append(event[1])
        elif event[0] == "pop":
            stack.pop()
    return stack


def frames(events: list) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[str]]:
    """(kernels, runtime_api, nvtx, op names): event i happens at 10·i ns; the ranges are pushed
    on thread 7; each op range launches one kernel 1 ns after it opens, from thread 7, except
    inside a backward() range: from thread 8, as autograd's device thread launches the backward
    kernels on a GPU while the thread that called backward() waits."""
    stack, ranges, ops = [], [], []
    for i, event in enumerate(events):
        t = 10 * i
        if event[0] == "push":
            stack.append((event[1], t))
            if event[1].startswith(nvtx_names.OP):
                in_backward = any(text == nvtx_names.PHASE + "backward" for text, _ in stack)
                ops.append((json.loads(event[1][len(nvtx_names.OP):])["op"], t + 1, 8 if in_backward else 7))
        elif event[0] == "pop":
            text, start = stack.pop()
            ranges.append((text, start, t))
    nvtx = pd.DataFrame(ranges, columns=["text", "start_ns", "end_ns"]).assign(global_tid=7)
    n = len(ops)
    kernels = pd.DataFrame({"kernel_id": np.arange(n), "global_pid": 0, "correlation_id": np.arange(n)})
    api = pd.DataFrame({"global_pid": 0, "correlation_id": np.arange(n), "start_ns": [t for _, t, _ in ops],
                        "end_ns": [t + 1 for _, t, _ in ops], "global_tid": [tid for _, _, tid in ops],
                        "name": "cudaLaunchKernel"})
    return kernels, api, nvtx, [op for op, _, _ in ops]


def optimizer_ops(events: list) -> set[str]:
    kernels, api, nvtx, names = frames(events)
    whole = Steps(pd.DataFrame({"step": [0], "start_ns": [0], "end_ns": [10 * len(events)]}), "test", "gpudiag")
    phases = attribute(kernels, api, nvtx, whole)["phase"].astype(str).to_numpy()
    return {op for op, phase in zip(names, phases) if phase == "optimizer"}


@pytest.fixture(scope="module")
def closure_events(tmp_path_factory):
    events, _ = run_instrumented(tmp_path_factory.mktemp("closure"), CLOSURE_LOOP.replace("CALL", "closure"),
                                 CaptureConfig(warmup_steps=1, detail_step=2))
    return events


def test_the_optimizer_phase_holds_only_the_update(closure_events):
    in_optimizer, in_closure = split_by_optimizer(closure_events)
    assert optimizer_ops(closure_events) == in_optimizer - in_closure
    assert "aten::addmm" not in optimizer_ops(closure_events)


def test_an_export_without_closure_ranges_reads_the_same(closure_events):
    old = without_closure_ranges(closure_events)
    assert nvtx_names.CLOSURE not in {e[1] for e in old if e[0] == "push"}
    assert _open(old) == []
    in_optimizer, in_closure = split_by_optimizer(closure_events)
    # the old nesting puts the closure's forward and backward inside the optimizer range ...
    old_optimizer, _ = split_by_optimizer(old)
    assert {"aten::addmm", "aten::mm"} <= old_optimizer
    # ... and the attribution still gives the optimizer only its update, except the closure's ops
    # outside every module and backward() (the loss, gpudiag's copy of it), which nothing places
    unplaced = {op for op, open_ in ops_with_open_ranges(closure_events) if nvtx_names.CLOSURE in open_
                and not any(r.startswith(nvtx_names.MODULE) or r == nvtx_names.PHASE + "backward" for r in open_)}
    assert optimizer_ops(old) - unplaced == (in_optimizer - in_closure) - unplaced
    assert not optimizer_ops(old) & {"aten::addmm", "aten::mm", "aten::gelu", "aten::gelu_backward"}


def test_micro_batches_from_a_real_status_and_only_for_the_launchers_steps():
    """The H200 status of the HF Trainer BERT run (``gradient_accumulation_steps=2``, 2026-11-28):
    two micro-batches per measured step; none for steps found another way (the counts are keyed
    by the launcher's own step numbers)."""
    import lzma

    from gpudiag.analysis.steps import frames as step_frames

    path = (Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "framework_suite" / "h200-2026-11-28"
            / "call1-fw-gpu1" / "hf_trainer_bert" / "script_status.json.xz")
    status = json.loads(lzma.open(path).read())
    table = pd.DataFrame({"step": range(22), "start_ns": range(0, 220, 10), "end_ns": range(10, 230, 10)})
    measured = set(range(3, 22))
    mine = step_frames.micro_batches(status, Steps(table, "gpudiag", "gpudiag"), measured)
    assert mine == {"per_step": 2.0, "closure_evaluations": 0.0, "optimizer_calls": 1.0}
    assert step_frames.micro_batches(status, Steps(table, "user ranges", "nvtx"), measured) is None
    assert step_frames.micro_batches({**status, "step_mode": "call"}, Steps(table, "gpudiag", "gpudiag"), measured) is None


def test_the_optimizer_phases_host_time_leaves_the_closure_out(closure_events):
    """The optimizer phase's host time (what GD-UNFUSED-OPTIMIZER's host saving reads): on the old
    nesting it is the optimizer ranges less the backward() and module ranges inside them. The
    oracle, from the same run's new nesting: the optimizer ranges' own time, plus the closure's
    time outside every module and backward() (the loss, zero_grad), which nothing places."""
    from gpudiag.analysis.rules.host_floor import phase_ranges_ns

    def host(events):
        nvtx = frames(events)[2]
        table = pd.DataFrame({"step": [0], "start_ns": [0], "end_ns": [10 * len(events)]})
        return phase_ranges_ns(nvtx, table, {0}), nvtx

    (new, new_nvtx), (old, old_nvtx) = host(closure_events), host(without_closure_ranges(closure_events))
    closures = new_nvtx[new_nvtx["text"] == nvtx_names.CLOSURE]
    placed = new_nvtx[new_nvtx["text"].str.startswith(nvtx_names.MODULE)
                      | (new_nvtx["text"] == nvtx_names.PHASE + "backward")]
    inside = [(placed["start_ns"] >= c.start_ns) & (placed["end_ns"] <= c.end_ns) for c in closures.itertuples()]
    unplaced_ns = float((closures["end_ns"] - closures["start_ns"]).sum()) - sum(
        _union_ns(placed[m]) for m in inside)
    old_ranges = old_nvtx[old_nvtx["text"] == OPTIMIZER]
    old_raw = float((old_ranges["end_ns"] - old_ranges["start_ns"]).sum())
    assert old["optimizer"] < old_raw
    # the new nesting's split optimizer ranges, plus the closure pops and pushes (10 ns per event)
    assert new["optimizer"] <= old["optimizer"] <= new["optimizer"] + unplaced_ns + 40 * len(closures)


def _union_ns(ranges: pd.DataFrame) -> float:
    """Length of the union of [start, end) intervals, ns."""
    total, end = 0.0, -np.inf
    for start, stop in sorted(zip(ranges["start_ns"], ranges["end_ns"])):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total
