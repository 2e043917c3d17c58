"""Communication kernels (issue 12): their own class outside the roofline, and exposed
communication checked against interval arithmetic written here on the raw export.

No committed capture has NCCL kernels (no multi-GPU capture yet), so the export is CONSTRUCTED
from a real single-GPU one (tests/fixtures/mlp_chain_b4096.sqlite.xz, H100): one real-looking
NCCL 2.2x all-reduce kernel per step on a stream of its own, half-way through the step's kernels
and running past them (tests/multi_gpu_exports.py).
"""

from __future__ import annotations

import sqlite3

import pytest
from multi_gpu_exports import NCCL_NAME, step_launches, with_collectives

from gpudiag.analysis.roofline.classify import classify
from gpudiag.analysis.ranks.comm import bandwidths, collective_of
from gpudiag.analysis.attribution.families import family_of
from gpudiag.analysis.ingest import ingest
from gpudiag.analysis.pipeline import analyse


@pytest.fixture(scope="module")
def nccl_export(tmp_path_factory, export_path):
    return with_collectives(export_path("mlp_chain_b4096"), tmp_path_factory.mktemp("comm") / "nccl.sqlite")


@pytest.fixture(scope="module")
def nccl_report(nccl_export, tmp_path_factory):
    return analyse(ingest(nccl_export, tmp_path_factory.mktemp("comm_db") / "run.sqlite"))


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [tuple(x) for x in out]


def _minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Length of union(a) not covered by union(b), by brute-force clipping."""
    total = 0
    for s, e in _union(a):
        covered = sum(max(0, min(e, be) - max(s, bs)) for bs, be in _union(b))
        total += (e - s) - covered
    return total


def oracle(path) -> dict[int, tuple[int, int]]:
    """Per step number: (NCCL kernel time, exposed NCCL time), from the raw export: a kernel belongs
    to the step range holding its launch call's start; exposed = NCCL intervals not covered by any
    other kernel of the capture (one process, one GPU)."""
    conn = sqlite3.connect(path)
    names = dict(conn.execute("SELECT id, value FROM StringIds"))
    kernels = [(s, e, names[n]) for s, e, n in conn.execute('SELECT start, "end", demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL')]
    compute = [(s, e) for s, e, n in kernels if n != NCCL_NAME]
    nccl = {(s, e) for s, e, n in kernels if n == NCCL_NAME}
    out = {}
    for text, launched in step_launches(conn):
        mine = [(s, e) for s, e, _, _ in launched if (s, e) in nccl]
        out[int(text.split()[-1])] = (sum(e - s for s, e in mine), _minus(mine, compute))
    return out


def test_collective_names_are_communication():
    """NCCL 2.2x and 2.1x kernel names, NVSHMEM and vLLM's custom all-reduce are family
    communication; ATen's reduce kernels are not."""
    for name in (NCCL_NAME, "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm *, unsigned long, ncclWork *)",
                 "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "nvshmemi_transfer_kernel",
                 "void vllm::cross_device_reduce_1stage<float, 2>(...)"):
        assert family_of(name) == "communication", name
    assert family_of("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(...)") == "reduce"
    assert collective_of(NCCL_NAME) == "AllReduce"
    assert collective_of("ncclKernel_AllGather_RING_LL_Sum_int8_t(...)") == "AllGather"
    assert collective_of("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)") == "SendRecv"


def test_bus_bandwidth_follows_nccl_tests():
    """busbw = algbw x 2(n-1)/n for all-reduce, (n-1)/n for all-gather (nccl-tests PERFORMANCE.md)."""
    alg, bus = bandwidths("AllReduce", 1 << 30, 0.01, 8)
    assert alg == pytest.approx((1 << 30) / 0.01) and bus == pytest.approx(alg * 14 / 8)
    assert bandwidths("AllGather", 1 << 20, 1e-3, 2)[1] == pytest.approx((1 << 20) / 1e-3 / 2)
    assert bandwidths("AllReduce", None, 0.01, 8) is None  # bytes unknown: no bandwidth


def test_communication_class_is_outside_the_roofline(nccl_export, nccl_report):
    """The inserted kernels are class communication with no roofline numbers, they have their own
    share of the breakdown (which still sums to 100 %), and no roofline rule names them although
    they are long small-grid kernels (GD-SMALL-GRID's condition)."""
    top = [k for k in nccl_report["top_kernels"] if k["name"] == NCCL_NAME]
    assert top and top[0]["kernel_class"] == "communication" and top[0]["family"] == "communication"
    assert top[0]["intensity_flop_per_byte"] is None and top[0]["efficiency"] is None
    bp = nccl_report["breakdown_percent"]
    assert bp["communication"] > 0 and sum(bp.values()) == pytest.approx(100.0, abs=1e-6)
    assert not any(p["name"] == NCCL_NAME for p in nccl_report["roofline_points"])
    for rec in nccl_report["recommendations"] + nccl_report["suppressed"]:
        assert not any("nccl" in line.lower() for line in rec["evidence"]), rec["rule_id"]
    # the kernels qualify for GD-SMALL-GRID (> 20 µs, 2 blocks): the rule skips them by class only
    conn = sqlite3.connect(nccl_export)
    durations = [r[0] for r in conn.execute('SELECT k."end" - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s '
                                            'ON s.id = k.demangledName WHERE s.value = ?', (NCCL_NAME,))]
    assert min(durations) > 20_000


def test_exposed_communication_matches_interval_arithmetic(nccl_export, nccl_report):
    """Per measured step, NCCL kernel time and exposed time equal the oracle's (exactly: both are
    integer ns sums); the per-step mean too, and part (not all, not none) of it is hidden."""
    comm = nccl_report["communication"]
    expected = oracle(nccl_export)
    measured = [s["step"] for s in nccl_report["steps"]["per_step"] if s["measured"]]
    assert [s["step"] for s in comm["per_step"]] == measured
    for s in comm["per_step"]:
        kernel_ns, exposed = expected[s["step"]]
        assert s["kernel_ns"] == kernel_ns and s["exposed_ns"] == exposed
    mean_exposed = sum(expected[s][1] for s in measured) / len(measured)
    assert comm["exposed_ns_per_step"] == pytest.approx(mean_exposed, rel=1e-12)
    assert 0 < comm["exposed_ns_per_step"] < comm["kernel_ns_per_step"]
    (allreduce,) = comm["collectives"]
    assert allreduce["collective"] == "AllReduce" and allreduce["count_per_step"] == 1.0
    assert allreduce["bytes_per_call"] is None and "bytes unknown" in comm["bytes_note"]


def test_no_communication_without_collectives(analysed):
    """A single-GPU capture has no communication section and a zero communication share."""
    _, report = analysed("mlp_chain_b4096")
    assert report["communication"] is None and report["breakdown_percent"]["communication"] == 0.0


def test_classify_ignores_shapes_for_collectives(nccl_report):
    """classify() gives a collective no FLOPs even when an op with shapes launched it."""
    import pandas as pd

    from gpudiag.analysis.roofline.peaks import lookup

    kernels = pd.DataFrame({"kernel_id": [0], "name": [NCCL_NAME], "duration_ns": [50_000.0], "grid_x": [2], "grid_y": [1],
                            "grid_z": [1], "block_x": [640], "block_y": [1], "block_z": [1]})
    attribution = pd.DataFrame({"step": [0], "op": ["aten::mm"], "op_args": ['{"op": "aten::mm", "in": ["bfloat16[64,64]", "bfloat16[64,64]"], "out": "bfloat16[64,64]"}'],
                                "op_call": [0]})
    peaks = lookup("NVIDIA H100 80GB HBM3", 132, None)
    assert classify(kernels.assign(name="gemm_kernel"), attribution, peaks).loc[0, "flop"] > 0  # shapes do count
    out = classify(kernels, attribution, peaks)
    assert out.loc[0, "kernel_class"] == "communication" and pd.isna(out.loc[0, "flop"])
