"""The transfer/wait split of collectives (gpudiag.analysis.ranks.comm.peer_transfer_ns) on the real
2-GPU NCCL captures (tests/fixtures/nccl, H100 x 2, 2026-11-25), kernel by kernel, without the rest
of the analysis (fast enough for the mutation runs, scripts/mutation.sh). Oracle: the k-th kernel of
each collective on each rank, paired by launch order in SQL (NCCL requires every rank to issue a
communicator's collectives in the same order); transfer = end - the later start of the pair."""

from __future__ import annotations

import lzma
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpudiag.analysis.ranks.comm import collective_of, peer_transfer_ns

from conftest import FIXTURES

NCCL = FIXTURES / "nccl"


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """name -> every kernel of the capture (start_ns, end_ns, duration_ns, global_pid, name,
    correlation_id), read with SQL."""
    cache = {}

    def get(name: str) -> pd.DataFrame:
        if name not in cache:
            export = tmp_path_factory.mktemp(name) / "profile.sqlite"
            with lzma.open(NCCL / name / "profile.sqlite.xz") as src, open(export, "wb") as dst:
                shutil.copyfileobj(src, dst)
            with sqlite3.connect(export) as db:
                cache[name] = pd.read_sql_query(
                    'SELECT k.start AS start_ns, k."end" AS end_ns, k."end" - k.start AS duration_ns, '
                    "k.globalPid AS global_pid, s.value AS name, k.correlationId AS correlation_id "
                    "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON k.demangledName = s.id", db)
        return cache[name]

    return get


def _oracle(k: pd.DataFrame) -> pd.Series:
    comm = k[k["name"].str.startswith("ncclDevKernel")]
    comm = comm.assign(collective=comm["name"].map(collective_of)).sort_values("correlation_id")
    comm["k"] = comm.groupby(["global_pid", "collective"]).cumcount()
    arrival = comm.groupby(["collective", "k"])["start_ns"].transform("max")
    return (comm["end_ns"] - arrival).clip(lower=0).astype(float)


@pytest.mark.parametrize("name", ["gpt_ddp_shm", "gpt_fsdp_shm", "vit_fsdp_shm"])
def test_transfer_of_every_collective_kernel_matches_the_ordered_pairs(kernels, name):
    k = kernels(name)
    is_comm = k["name"].str.startswith("ncclDevKernel").to_numpy()
    got = peer_transfer_ns(k, is_comm)
    assert got[~is_comm].isna().all()
    expected = _oracle(k)
    assert got[is_comm].notna().all()
    np.testing.assert_allclose(got.loc[expected.index].to_numpy(), expected.to_numpy())
    # a kernel's transfer is never longer than the kernel, and somebody waits in every capture
    assert (got[is_comm] <= k.loc[is_comm, "duration_ns"]).all()
    assert (got[is_comm] < k.loc[is_comm, "duration_ns"]).any()


def test_one_process_or_no_peer_leaves_the_transfer_unknown(kernels):
    k = kernels("gpt_ddp_shm")
    is_comm = k["name"].str.startswith("ncclDevKernel").to_numpy()
    first = k["global_pid"] == k["global_pid"].iloc[0]
    alone = peer_transfer_ns(k[first], is_comm[first.to_numpy()])
    assert alone.isna().all() and len(alone) == first.sum()
    # rank 1's kernels moved an hour later: no kernel of rank 0 overlaps them, nothing is paired
    shifted = k.copy()
    shifted.loc[~first, ["start_ns", "end_ns"]] += 3_600 * 10**9
    assert peer_transfer_ns(shifted, is_comm).isna().all()


@pytest.mark.parametrize("name, collective", [
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "AllGather"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "ReduceScatter"),
    ("ncclDevKernel_Broadcast_RING_LL", "Broadcast"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float", "AllReduce"),
    ("ncclDevKernel_SendRecv", "SendRecv"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(...)", "AllReduce"),
    ("void custom_all_reduce_kernel<float>(...)", "AllReduce"),
    ("msccl_allgather_kernel", "AllGather"),
    ("nvshmem_reduce_scatter_block", "ReduceScatter"),
    ("deep_ep::all_to_all_dispatch", "AllToAll"),
    ("my_library_barrier_kernel", "my_library_barrier_kernel"),
    ("", ""),
])
def test_collective_from_kernel_names(name, collective):
    """NCCL's own names (2.19+ ``ncclDevKernel_<Collective>_…``, older ``ncclKernel_…``, taken from
    the captures above and NCCL's sources); other libraries by a name match; else the name."""
    assert collective_of(name) == collective


def test_collective_names_of_the_captures(kernels):
    """Every NCCL kernel name in the 2-GPU captures: the collective is the name's second token."""
    for name in set(kernels("gpt_fsdp_shm")["name"]) | set(kernels("gpt_ddp_shm")["name"]):
        if name.startswith("ncclDevKernel_"):
            assert collective_of(name) == name.split("(")[0].split("_")[1]


@pytest.mark.parametrize("collective, factor", [("AllReduce", 2 * 3 / 4), ("ReduceScatter", 3 / 4), ("AllGather", 3 / 4),
                                                ("AllToAll", 3 / 4), ("Broadcast", 1.0), ("Reduce", 1.0),
                                                ("SendRecv", 1.0)])
def test_bus_bandwidth_factor_of_every_collective(collective, factor):
    """nccl-tests doc/PERFORMANCE.md, 4 ranks: algbw = S / t, busbw = algbw x factor."""
    from gpudiag.analysis.ranks.comm import bandwidths

    algbw, busbw = bandwidths(collective, 8e9, 0.5, 4)
    assert algbw == pytest.approx(16e9) and busbw == pytest.approx(16e9 * factor)


@pytest.mark.parametrize("args", [("AllReduce", 0, 1.0, 2), ("AllReduce", 1e6, 0.0, 2), ("AllReduce", 1e6, -1.0, 2),
                                  ("AllReduce", 1e6, 1.0, 0), ("Barrier", 1e6, 1.0, 2)])
def test_no_bandwidth_without_size_time_ranks_or_factor(args):
    from gpudiag.analysis.ranks.comm import bandwidths

    assert bandwidths(*args) is None


def _union(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _uncovered(a, b) -> int:
    """Length of union(a) not covered by union(b), clipping by brute force."""
    ub = _union(b)
    return sum((e - s) - sum(max(0, min(e, be) - max(s, bs)) for bs, be in ub) for s, e in _union(a))


@pytest.mark.parametrize("name", ["gpt_ddp_shm", "gpt_fsdp_shm"])
def test_communication_of_one_rank_against_interval_arithmetic(kernels, name):
    """report.json's communication for each rank, the capture cut in two steps at its middle:
    kernel time, transfer, wait, exposed and exposed transfer per step, and per collective,
    against sums and brute-force interval arithmetic written here (compute = every other kernel of
    the rank, in either step)."""
    from gpudiag.analysis.ranks.comm import communication

    k = kernels(name)
    is_comm = k["name"].str.startswith("ncclDevKernel").to_numpy()
    middle = (k["start_ns"].min() + k["start_ns"].max()) // 2
    k = k.assign(transfer_ns=peer_transfer_ns(k, is_comm), step=(k["start_ns"] >= middle).astype(int), device_id=0,
                 kernel_class=np.where(is_comm, "communication", "compute"))
    for _, rank in k.groupby("global_pid"):
        span = float(rank["end_ns"].max() - rank["start_ns"].min())
        got = communication(rank, {0, 1}, 2, span / 2)
        comm, compute = rank[rank["kernel_class"] == "communication"], rank[rank["kernel_class"] == "compute"]
        busy = list(zip(compute["start_ns"], compute["end_ns"]))
        per_step = {}
        for step, c in comm.groupby("step"):
            spans = list(zip(c["start_ns"], c["end_ns"]))
            tails = list(zip(c["end_ns"] - c["transfer_ns"].astype(np.int64), c["end_ns"]))
            per_step[step] = (_uncovered(spans, []), _uncovered(spans, busy), _uncovered(tails, busy))
        assert got["kernel_ns_per_step"] == comm["duration_ns"].sum() / 2
        assert got["transfer_ns_per_step"] == pytest.approx(comm["transfer_ns"].sum() / 2)
        assert got["wait_ns_per_step"] == pytest.approx((comm["duration_ns"].sum() - comm["transfer_ns"].sum()) / 2)
        assert got["busy_ns_per_step"] == sum(v[0] for v in per_step.values()) / 2
        assert got["exposed_ns_per_step"] == sum(v[1] for v in per_step.values()) / 2
        assert got["exposed_transfer_ns_per_step"] == sum(v[2] for v in per_step.values()) / 2
        assert got["overlapped_ns_per_step"] == got["busy_ns_per_step"] - got["exposed_ns_per_step"]
        assert got["exposed_percent_of_step"] == pytest.approx(100 * got["exposed_ns_per_step"] / (span / 2))
        assert [(s["step"], s["busy_ns"], s["exposed_ns"], s["exposed_transfer_ns"]) for s in got["per_step"]] == \
            [(step, *v) for step, v in sorted(per_step.items())]
        by = comm.assign(collective=comm["name"].map(collective_of)).groupby("collective")
        assert {c["collective"]: (c["count_per_step"], c["time_ns_per_step"], c["kernels"]) for c in got["collectives"]} == \
            {c: (len(g) / 2, g["duration_ns"].sum() / 2, sorted(g["name"].unique())[:5]) for c, g in by}
        assert [c["time_ns_per_step"] for c in got["collectives"]] == sorted(
            (c["time_ns_per_step"] for c in got["collectives"]), reverse=True)
        assert all(c["bytes_per_call"] is None and c["busbw_bytes_per_s"] is None for c in got["collectives"])


def test_communication_without_peers_has_no_split(kernels):
    """One rank alone: transfer, wait and exposed transfer are null; the exposed time is still there."""
    from gpudiag.analysis.ranks.comm import communication

    k = kernels("gpt_ddp_shm")
    rank = k[k["global_pid"] == k["global_pid"].iloc[0]]
    is_comm = rank["name"].str.startswith("ncclDevKernel").to_numpy()
    rank = rank.assign(transfer_ns=peer_transfer_ns(rank, is_comm), step=0, device_id=0,
                       kernel_class=np.where(is_comm, "communication", "compute"))
    got = communication(rank, {0}, 1, 1e9)
    assert got["transfer_ns_per_step"] is None and got["wait_ns_per_step"] is None
    assert got["exposed_transfer_ns_per_step"] is None and got["exposed_ns_per_step"] > 0
    assert "wait_ns" not in got["per_step"][0]
    assert communication(rank, {5}, 1, 1e9) is None  # no collective in the measured steps


def test_bandwidth_of_a_single_rank():
    """n = 1 is a valid communicator: an all-reduce moves nothing over the bus (factor 0)."""
    from gpudiag.analysis.ranks.comm import bandwidths

    assert bandwidths("AllReduce", 1e6, 1.0, 1) == (1e6, 0.0)
    assert bandwidths("Broadcast", 1e6, 1.0, 1) == (1e6, 1e6)


def test_several_process_groups_are_not_split(kernels):
    """A rank running two all-reduces at once (a second process group, e.g. tensor parallel): its
    calls cannot be paired without communicator ids, so no kernel is split."""
    k = kernels("gpt_ddp_shm")
    is_comm = k["name"].str.startswith("ncclDevKernel").to_numpy()
    first = k.index[is_comm & (k["global_pid"] == k["global_pid"].iloc[0]).to_numpy()][0]
    extra = k.loc[[first]].assign(start_ns=k.at[first, "start_ns"] + 1, correlation_id=-1)
    both = pd.concat([k, extra], ignore_index=True)
    assert peer_transfer_ns(both, np.append(is_comm, True)).isna().all()


def test_three_ranks_wait_for_the_last_of_them(kernels):
    """A third rank (rank 1's kernels again, each arriving a quarter of its duration later): every
    call's transfer starts at the latest of the three starts."""
    k = kernels("gpt_ddp_shm")
    pids = k["global_pid"].unique()
    third = k[k["global_pid"] == pids[1]].assign(global_pid=pids.max() + (1 << 24))  # a pid of its own
    third["start_ns"] += third["duration_ns"] // 4
    third["duration_ns"] = third["end_ns"] - third["start_ns"]
    both = pd.concat([k, third], ignore_index=True)
    is_comm = both["name"].str.startswith("ncclDevKernel").to_numpy()
    got = peer_transfer_ns(both, is_comm)[is_comm]
    assert got.notna().all() and len(got) == 3 * len(got) // 3
    np.testing.assert_allclose(got.to_numpy(), _oracle(both).loc[got.index].to_numpy())


def test_back_to_back_kernels_are_one_group():
    """Two all-reduces of one rank, the second starting where the first ends, are one process
    group's calls in a row: they are split (paired with the other rank's)."""
    k = pd.DataFrame({"start_ns": [0, 100, 10, 110], "end_ns": [100, 200, 100, 200], "global_pid": [1, 1, 2, 2],
                      "name": ["ncclDevKernel_AllReduce_Sum_f32_RING_LL"] * 4})
    k["duration_ns"] = k["end_ns"] - k["start_ns"]
    assert peer_transfer_ns(k, np.ones(4, bool)).tolist() == [90.0, 90.0, 90.0, 90.0]


def test_exposure_sums_over_the_ranks_gpus_and_counts_a_lone_kernel():
    """A process with collectives on two GPUs: compute hides them only on its own GPU, and the
    per-GPU exposed times add up; a single collective kernel is counted (interval arithmetic here)."""
    from gpudiag.analysis.ranks.comm import communication, exposed_ns

    assert exposed_ns(np.array([0]), np.array([100]), np.array([50]), np.array([70])) == 80
    k = pd.DataFrame({"start_ns": [0, 0, 0, 0], "end_ns": [100, 60, 100, 30], "device_id": [0, 0, 1, 1],
                      "kernel_class": ["communication", "compute", "communication", "compute"],
                      "name": ["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "gemm"] * 2, "step": 0,
                      "transfer_ns": [50.0, np.nan, 80.0, np.nan]})
    k["duration_ns"] = k["end_ns"] - k["start_ns"]
    got = communication(k, {0}, 1, 100.0)
    assert got["busy_ns_per_step"] == 200 and got["exposed_ns_per_step"] == 40 + 70
    assert got["exposed_transfer_ns_per_step"] == 40 + 70 and got["transfer_ns_per_step"] == 130


def _frame(rows):
    k = pd.DataFrame(rows, columns=["global_pid", "start_ns", "end_ns"]).assign(
        name="ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    return k.assign(duration_ns=k["end_ns"] - k["start_ns"])


def test_pairing_boundaries():
    """Kernels that only touch (one ends where the other starts) are not one call; a rank whose
    calls overlap each other anywhere in the capture (here its 2nd and 3rd) is several groups; a
    rank missing one call still pairs the others with the ranks that made it."""
    touching = _frame([(1, 0, 100), (2, 100, 200)])
    assert peer_transfer_ns(touching, np.ones(2, bool)).isna().all()
    later = _frame([(1, 0, 10), (1, 20, 40), (1, 30, 50), (2, 0, 10), (2, 20, 40), (2, 30, 50)])
    assert peer_transfer_ns(later, np.ones(6, bool)).isna().all()
    # rank 3 did not make the second call: ranks 1 and 2 still pair it between themselves
    missing = _frame([(1, 0, 100), (1, 200, 300), (2, 10, 100), (2, 220, 300), (3, 30, 100)])
    assert peer_transfer_ns(missing, np.ones(5, bool)).tolist() == [70.0, 80.0, 70.0, 80.0, 70.0]


def test_no_collective_interval_exposes_nothing():
    from gpudiag.analysis.ranks.comm import exposed_ns

    empty = np.array([], np.int64)
    assert exposed_ns(empty, empty, np.array([0]), np.array([10])) == 0


def test_communication_fields_and_types():
    """The JSON report's fields: step numbers stay integers, times are floats, every collective
    lists at most five kernel names; a zero-length step gives no share."""
    from gpudiag.analysis.ranks.comm import communication

    names = [f"ncclDevKernel_AllReduce_Sum_f32_RING_LL_{i}" for i in range(7)]
    k = pd.DataFrame({"start_ns": range(0, 700, 100), "end_ns": range(50, 750, 100), "device_id": 0,
                      "kernel_class": "communication", "name": names, "step": 3})
    k = k.assign(duration_ns=k["end_ns"] - k["start_ns"], transfer_ns=10.0)
    got = communication(k, {3}, 1, 0.0)
    assert got["exposed_percent_of_step"] is None
    (step,) = got["per_step"]
    assert isinstance(step["step"], int) and all(isinstance(v, float) for key, v in step.items() if key != "step")
    (allreduce,) = got["collectives"]
    assert allreduce["kernels"] == sorted(names)[:5] and allreduce["count_per_step"] == 7
    assert set(allreduce) == {"collective", "count_per_step", "time_ns_per_step", "kernels", "bytes_per_call",
                              "algbw_bytes_per_s", "busbw_bytes_per_s"}
    assert {"definition", "bytes_note"} <= set(got) and "transfer" in got["definition"]
    assert got["bytes_note"].startswith("bytes unknown")


def test_unknown_names_are_cut_to_sixty_characters():
    assert collective_of("x" * 100) == "x" * 60
