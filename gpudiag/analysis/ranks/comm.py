"""Collective communication of one process: time per step, exposed time, per collective.

Definitions (docs/architecture.md, "Multi-GPU runs"):

- *Communication kernels*: class ``communication`` (family from the name: NCCL/RCCL, MSCCL,
  NVSHMEM, custom all-reduce; :mod:`gpudiag.analysis.attribution.families`). A kernel belongs to the step whose
  window holds its launch call (as every kernel, :mod:`gpudiag.analysis.attribution.ranges`).
- *Exposed communication* of a step: the union of the step's communication kernel intervals minus
  the union of all compute (non-communication) kernel intervals of the same process on the same
  GPU, whatever step launched them; ns. Copies do not hide communication (they share the links).
- *Transfer and wait*: an NCCL kernel starts when its rank launches it and spins until every
  rank of the communicator has arrived (NCCL user guide, "Troubleshooting": a collective blocks
  until all ranks call it), so its duration holds the wait for the last rank. In an export of
  several ranks, the kernels of one collective call overlap in time on every rank; gpudiag pairs
  them (same collective, overlapping, nearest end) and takes the transfer part of each as
  end - (latest start among the paired kernels): the call cannot move data before the last rank
  arrives. ``wait`` = duration - transfer. This assumes every rank takes part in each collective
  (one data-parallel group, as DDP and FSDP on a node): kernels of one collective that overlap
  each other on one rank show several process groups (tensor or pipeline parallel), whose calls
  cannot be told apart without NCCL's communicator ids, and then no kernel is split. *Exposed transfer*: the union of the transfer parts
  ([end - transfer, end)) not covered by compute, as exposed communication. With one process in
  the export, transfer is unknown (null) and rules fall back to exposed communication.
- *Bandwidths* (nccl-tests, doc/PERFORMANCE.md): algbw = S / t with S the operation's size in
  bytes (for AllGather and ReduceScatter the whole gathered buffer), t its duration; busbw = algbw
  x a factor of the rank count n that makes it comparable with the link's peak: AllReduce
  2(n-1)/n, ReduceScatter, AllGather and AllToAll (n-1)/n, Broadcast, Reduce, Send/Recv 1.
  Bytes come from NCCL's NVTX payloads or kernel arguments; the run database holds neither yet,
  so ``bytes_per_call`` is null and the report says why.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpudiag.analysis.attribution.families import COMMUNICATION
from gpudiag.analysis.steps.timeline import covered_ns, merge_intervals

# nccl-tests doc/PERFORMANCE.md: busbw = algbw x factor(n)
BUSBW_FACTOR = {
    "AllReduce": lambda n: 2 * (n - 1) / n,
    "ReduceScatter": lambda n: (n - 1) / n,
    "AllGather": lambda n: (n - 1) / n,
    "AllToAll": lambda n: (n - 1) / n,
    "Broadcast": lambda n: 1.0,
    "Reduce": lambda n: 1.0,
    "SendRecv": lambda n: 1.0,
}
_NCCL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+?)(?:_|\(|$)")
_OTHER = ((re.compile(r"all_?reduce|cross_device_reduce", re.I), "AllReduce"),
          (re.compile(r"all_?gather", re.I), "AllGather"), (re.compile(r"reduce_?scatter", re.I), "ReduceScatter"),
          (re.compile(r"all_?to_?all", re.I), "AllToAll"))
# The run database table of the collectives' transfer parts paired across ranks (kernel_id,
# transfer_ns; paired kernels only), written by the analysis of a several-process run before the
# ranks are analysed one by one: a rank's analysis reads it instead of pairing every rank again.
TRANSFER_TABLE = "kernel_transfer"
BYTES_UNKNOWN = ("bytes unknown: the run database keeps neither NCCL's NVTX payloads nor kernel arguments, "
                 "so algorithm and bus bandwidth are not computed")


def collective_of(name: str) -> str:
    """The collective a communication kernel runs, from its name: ``AllReduce`` for
    ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` and ``ncclKernel_AllReduce_RING_LL_Sum_float``,
    ``SendRecv``, ``AllGather``...; for other libraries a name match, else the name itself."""
    m = _NCCL.search(name or "")
    if m:
        return m.group(1)
    return next((label for pattern, label in _OTHER if pattern.search(name or "")), (name or "")[:60])


def bandwidths(collective: str, size_bytes: float, seconds: float, n_ranks: int) -> tuple[float, float] | None:
    """(algbw, busbw) in bytes/s by nccl-tests' definitions (module doc), or None when the size,
    the time or the collective's factor is unknown. ``size_bytes``: S, ``n_ranks``: n >= 1."""
    factor = BUSBW_FACTOR.get(collective)
    if not size_bytes or not seconds or seconds <= 0 or factor is None or n_ranks < 1:
        return None
    algbw = size_bytes / seconds
    return algbw, algbw * factor(n_ranks)


def peer_transfer_ns(kernels: pd.DataFrame, is_comm: np.ndarray) -> pd.Series:
    """Transfer part (ns) of each communication kernel of a several-process export (module doc),
    indexed like ``kernels`` (start_ns, end_ns, duration_ns, global_pid, name; ``is_comm`` a bool
    mask); NaN for other kernels and for a collective with no overlapping peer kernel (one process, or
    its peers outside the capture), and for every kernel when one process ran two kernels of the
    same collective at once (several process groups)."""
    out = pd.Series(np.nan, index=kernels.index, dtype=float)
    comm = kernels[is_comm]
    if comm.empty or comm["global_pid"].nunique() < 2:
        return out
    comm = comm.assign(collective=comm["name"].map({n: collective_of(n) for n in comm["name"].unique()}))
    if _several_groups(comm):
        return out
    for _, same in comm.groupby("collective"):
        latest = same["start_ns"].to_numpy(dtype=np.int64).copy()
        paired = np.zeros(len(same), dtype=bool)
        for pid, mine in same.groupby("global_pid"):
            mine_at = same.index.get_indexer(mine.index)
            for _, peer in same[same["global_pid"] != pid].groupby("global_pid"):
                peer = peer.sort_values("end_ns")
                start, end = _overlapping_peer(mine, peer)
                hit = ~np.isnan(start)
                latest[mine_at[hit]] = np.maximum(latest[mine_at[hit]], start[hit].astype(np.int64))
                paired[mine_at] |= hit
        ends, durations = same["end_ns"].to_numpy(), same["duration_ns"].to_numpy(dtype=float)
        transfer = np.clip(ends - latest, 0, durations).astype(float)
        out.loc[same.index[paired]] = transfer[paired]
    return out


def _several_groups(comm: pd.DataFrame) -> bool:
    """Whether one process ran two kernels of the same collective at once (module doc)."""
    for _, mine in comm.groupby(["global_pid", "collective"]):
        ordered = mine.sort_values("start_ns")
        if (ordered["start_ns"].to_numpy()[1:] < ordered["end_ns"].cummax().to_numpy()[:-1]).any():
            return True
    return False


def _overlapping_peer(mine: pd.DataFrame, peer: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """For each kernel of ``mine``, the (start, end) of the kernel of ``peer`` (sorted by end) that
    overlaps it with the nearest end; NaN where none overlaps."""
    p_start, p_end = peer["start_ns"].to_numpy(dtype=float), peer["end_ns"].to_numpy(dtype=float)
    m_start, m_end = mine["start_ns"].to_numpy(dtype=float), mine["end_ns"].to_numpy(dtype=float)
    at = np.searchsorted(p_end, m_end)
    best_start, best_end = np.full(len(mine), np.nan), np.full(len(mine), np.nan)
    best_gap = np.full(len(mine), np.inf)
    for cand in (at - 1, at):
        ok = (cand >= 0) & (cand < len(p_end))
        c = np.clip(cand, 0, max(len(p_end) - 1, 0))
        overlaps = ok & (p_start[c] < m_end) & (p_end[c] > m_start)
        gap = np.abs(p_end[c] - m_end)
        take = overlaps & (gap < best_gap)
        best_start[take], best_end[take], best_gap[take] = p_start[c][take], p_end[c][take], gap[take]
    return best_start, best_end


def exposed_ns(comm_s: np.ndarray, comm_e: np.ndarray, busy_s: np.ndarray, busy_e: np.ndarray) -> int:
    """Length (ns) of the union of intervals [comm_s, comm_e) not covered by the union of
    [busy_s, busy_e) (all ns arrays, any order)."""
    c_s, c_e = merge_intervals(np.asarray(comm_s), np.asarray(comm_e))
    if len(c_s) == 0:
        return 0
    b_s, b_e = merge_intervals(np.asarray(busy_s), np.asarray(busy_e))
    return int((c_e - c_s).sum() - covered_ns(b_s, b_e, c_s, c_e).sum())


def exposed_transfer_ns(comm: pd.DataFrame, compute: pd.DataFrame) -> int:
    """Exposed transfer (ns) of the collective kernels ``comm`` (end_ns, duration_ns, optional
    ``transfer_ns``: a kernel without one counts whole) against ``compute`` (start_ns, end_ns),
    both of one GPU: the union of [end - transfer, end) not covered by compute (module doc)."""
    transfer = comm["transfer_ns"].fillna(comm["duration_ns"]) if "transfer_ns" in comm else comm["duration_ns"]
    ends = comm["end_ns"].to_numpy()
    return exposed_ns((ends - transfer.to_numpy()).astype(np.int64), ends,
                      compute["start_ns"].to_numpy(), compute["end_ns"].to_numpy())


def _step_exposure(step: int, g: pd.DataFrame, compute: pd.DataFrame, split: bool) -> dict:
    """One step's communication kernels ``g``: their time, union and exposed part (ns); with
    ``split``, also their transfer, wait and exposed transfer (module doc)."""
    out = {"step": step, "kernel_ns": float(g["duration_ns"].sum()), "busy_ns": 0.0, "exposed_ns": 0.0}
    if split:
        out.update(transfer_ns=float(g["transfer_ns"].sum()), exposed_transfer_ns=0.0)
        out["wait_ns"] = out["kernel_ns"] - out["transfer_ns"]
    none = np.array([], np.int64)
    for device, d in g.groupby("device_id"):  # compute hides communication only on its own GPU
        c = compute[compute["device_id"] == device]
        c_s, c_e = c["start_ns"].to_numpy(), c["end_ns"].to_numpy()
        starts, ends = d["start_ns"].to_numpy(), d["end_ns"].to_numpy()
        out["exposed_ns"] += exposed_ns(starts, ends, c_s, c_e)
        out["busy_ns"] += exposed_ns(starts, ends, none, none)
        if split:
            out["exposed_transfer_ns"] += exposed_transfer_ns(d, c)
    return {key: float(v) if key != "step" else v for key, v in out.items()}


def communication(k: pd.DataFrame, measured_ids: set, n_steps: int, step_ns: float) -> dict | None:
    """report.json's ``communication`` for one process, None when it ran no communication kernel in
    the measured steps. ``k``: all its kernels (start_ns, end_ns, duration_ns, device_id, name,
    step, kernel_class); ``measured_ids``: steady-state steps (``n_steps`` of them, mean step
    ``step_ns``). All times ns per measured step: ``kernel_ns_per_step`` (sum of durations),
    ``busy_ns_per_step`` (their union), ``exposed_ns_per_step``, ``overlapped_ns_per_step`` (busy -
    exposed), ``per_step`` and ``collectives`` (count and time per step each)."""
    is_comm = (k["kernel_class"] == COMMUNICATION).to_numpy()
    comm = k[is_comm & k["step"].isin(measured_ids).to_numpy()]
    if comm.empty or not n_steps:
        return None
    compute = k[~is_comm]
    split = "transfer_ns" in comm and comm["transfer_ns"].notna().all()
    per_step = [_step_exposure(int(step), g, compute, split) for step, g in comm.groupby("step")]
    kernel_ns = sum(s["kernel_ns"] for s in per_step) / n_steps
    busy = sum(s["busy_ns"] for s in per_step) / n_steps
    exposed = sum(s["exposed_ns"] for s in per_step) / n_steps
    transfer = {"transfer_ns_per_step": None, "wait_ns_per_step": None, "exposed_transfer_ns_per_step": None}
    if split:
        transfer = {key: sum(s[key.replace("_per_step", "")] for s in per_step) / n_steps for key in transfer}
    by = comm.assign(collective=comm["name"].map({n: collective_of(n) for n in comm["name"].unique()}))
    collectives = [{"collective": str(c), "count_per_step": len(g) / n_steps,
                    "time_ns_per_step": float(g["duration_ns"].sum()) / n_steps,
                    "kernels": sorted(g["name"].unique().tolist())[:5],
                    "bytes_per_call": None, "algbw_bytes_per_s": None, "busbw_bytes_per_s": None}
                   for c, g in by.groupby("collective")]
    return {"kernel_ns_per_step": kernel_ns, "busy_ns_per_step": busy, "exposed_ns_per_step": exposed,
            "overlapped_ns_per_step": busy - exposed, **transfer,
            "exposed_percent_of_step": 100.0 * exposed / step_ns if step_ns else None,
            "definition": ("exposed = union of a step's communication kernels minus the union of the compute "
                           "(non-communication) kernels on the same GPU; transfer = each kernel's part after the last "
                           "rank reached the collective, the rest is wait for other ranks (null with one process)"),
            "per_step": per_step,
            "collectives": sorted(collectives, key=lambda c: -c["time_ns_per_step"]),
            "bytes_note": BYTES_UNKNOWN}
