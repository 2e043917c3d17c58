"""Collective communication of one process: time per step, exposed time, per collective.

Definitions (docs/architecture.md, "Multi-GPU runs"):

- *Communication kernels*: class ``communication`` (family from the name: NCCL/RCCL, MSCCL,
  NVSHMEM, custom all-reduce; :mod:`gpudiag.analysis.families`). A kernel belongs to the step whose
  window holds its launch call (as every kernel, :mod:`gpudiag.analysis.attribution`).
- *Exposed communication* of a step: the union of the step's communication kernel intervals minus
  the union of all compute (non-communication) kernel intervals of the same process on the same
  GPU, whatever step launched them; ns. Copies do not hide communication (they share the links).
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

from gpudiag.analysis.families import COMMUNICATION
from gpudiag.analysis.timeline import covered_ns, merge_intervals

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


def exposed_ns(comm_s: np.ndarray, comm_e: np.ndarray, busy_s: np.ndarray, busy_e: np.ndarray) -> int:
    """Length (ns) of the union of intervals [comm_s, comm_e) not covered by the union of
    [busy_s, busy_e) (all ns arrays, any order)."""
    c_s, c_e = merge_intervals(np.asarray(comm_s), np.asarray(comm_e))
    if len(c_s) == 0:
        return 0
    b_s, b_e = merge_intervals(np.asarray(busy_s), np.asarray(busy_e))
    return int((c_e - c_s).sum() - covered_ns(b_s, b_e, c_s, c_e).sum())


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
    per_step = []
    for step, g in comm.groupby("step"):
        exposed = union = 0
        for device, d in g.groupby("device_id"):  # compute hides communication only on its own GPU
            c = compute[compute["device_id"] == device]
            starts, ends = d["start_ns"].to_numpy(), d["end_ns"].to_numpy()
            exposed += exposed_ns(starts, ends, c["start_ns"].to_numpy(), c["end_ns"].to_numpy())
            union += exposed_ns(starts, ends, np.array([], np.int64), np.array([], np.int64))
        per_step.append({"step": int(step), "kernel_ns": float(g["duration_ns"].sum()), "busy_ns": float(union),
                         "exposed_ns": float(exposed)})
    kernel_ns = sum(s["kernel_ns"] for s in per_step) / n_steps
    busy = sum(s["busy_ns"] for s in per_step) / n_steps
    exposed = sum(s["exposed_ns"] for s in per_step) / n_steps
    by = comm.assign(collective=comm["name"].map({n: collective_of(n) for n in comm["name"].unique()}))
    collectives = [{"collective": str(c), "count_per_step": len(g) / n_steps,
                    "time_ns_per_step": float(g["duration_ns"].sum()) / n_steps,
                    "kernels": sorted(g["name"].unique().tolist())[:5],
                    "bytes_per_call": None, "algbw_bytes_per_s": None, "busbw_bytes_per_s": None}
                   for c, g in by.groupby("collective")]
    return {"kernel_ns_per_step": kernel_ns, "busy_ns_per_step": busy, "exposed_ns_per_step": exposed,
            "overlapped_ns_per_step": busy - exposed,
            "exposed_percent_of_step": 100.0 * exposed / step_ns if step_ns else None,
            "definition": ("exposed = union of a step's communication kernels minus the union of the compute "
                           "(non-communication) kernels on the same GPU"),
            "per_step": per_step,
            "collectives": sorted(collectives, key=lambda c: -c["time_ns_per_step"]),
            "bytes_note": BYTES_UNKNOWN}
