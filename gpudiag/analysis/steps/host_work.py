"""What the host did while the GPU waited for it: launch-bound idle against host compute.

A host-bound idle interval (:func:`gpudiag.analysis.steps.timeline.idle_intervals`: the launch
queue was empty) is split by what the thread that launched the activity ending it was doing,
read from that thread's CUDA runtime/driver calls (the export's CUPTI API trace):

- **launch-bound**: the thread was inside CUDA calls, or in the short stretches between them in
  which eager PyTorch dispatches the next op (a few to a few tens of µs between launch calls).
  CUDA graphs and torch.compile remove it.
- **host compute**: the thread went more than :data:`HOST_COMPUTE_STRETCH_NS` without any CUDA
  call, outside the model's own execution: CPU work such as making inputs on the CPU, tokenizing,
  Python logic between model calls, post-processing ``.tolist()`` results. CUDA graphs do not
  remove it; overlapping it with GPU work (GPU-side inputs, DataLoader workers, a background
  thread) does.

A stretch is the time between two consecutive calls of the thread (their union: driver calls nest
inside runtime calls). A stretch longer than the threshold counts as host compute for the part of
it inside the idle interval, unless it lies inside the model's forward, backward, optimizer step or
a compiled graph's run as gpudiag's ranges record them (:func:`in_model`: framework work, which
CUDA graphs removed on a measured capture); the rest of the interval is launch-bound, so the two
add up to the interval. Times are ns throughout.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpudiag import nvtx_names
from gpudiag.analysis.attribution.ranges import innermost_range, window_index
from gpudiag.analysis.steps.launches import rows_at
from gpudiag.analysis.steps.timeline import merge_intervals
from gpudiag.sources import int_keys
from gpudiag.sources.nsys_sqlite import NVTX_PUSHPOP

# A stretch of the launching thread with no CUDA call longer than this is host compute, ns.
# Source: 1 ms is 170 eager launches at 5.9 µs each (an eager small op's host cost measured on an
# H200, docs/notes/h200_measured_peaks.json), so no op's dispatch fills it; on the committed
# eager captures (H100/H200, traced, with gpudiag's module ranges) the longest stretch inside
# host-bound idle was 0.68 ms (ResNet-50), and the CPU-side input making of
# examples/input_pipeline_train.py --practice bad took 24-37 ms (docs/notes/measurements.md,
# 2026-11-26).
HOST_COMPUTE_STRETCH_NS = 1_000_000
_OPEN = 2**61  # before a thread's first call and after its last: a stretch of unknown, long length

STRETCH_COLUMNS = {"step": "int64", "at_step_start": bool, "start_ns": "int64", "end_ns": "int64",
                   "ns": "int64", "stretch_ns": "int64", "tid": "Int64", "call_before": object,
                   "call_after": object, "where": object}


def split_host_idle(idle: pd.DataFrame, runtime_api: pd.DataFrame, nvtx: pd.DataFrame,
                    threshold_ns: int = HOST_COMPUTE_STRETCH_NS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stage 4's split of host-bound GPU idle (module docstring; threshold: :data:`HOST_COMPUTE_STRETCH_NS`).

    ``idle``: GPU-idle intervals with host_bound, next_api_tid, step and at_step_start;
    ``runtime_api``: the process's CUDA calls (start_ns, end_ns, global_tid, name); ``nvtx``: its
    NVTX ranges. Returns (``idle`` with ``launch_bound_ns`` and ``host_compute_ns``, which add up to
    duration_ns on host-bound intervals and are 0 on the others, and ``host_compute_stretches``;
    one row per host-compute stretch inside an interval, :data:`STRETCH_COLUMNS`: its part in the
    interval (start_ns, end_ns, ns), the whole stretch (stretch_ns), the thread, the CUDA calls
    before and after it and ``where``, the innermost NVTX range on the thread around it). A
    host-bound interval whose launching thread is unknown stays launch-bound, and so does a long
    stretch inside the model's own execution (:func:`in_model`)."""
    idle = idle.copy(deep=False)  # new columns only: the caller's frame is not changed, and not copied (5 M: 0.28 GB)
    long = _long_stretches(idle, runtime_api, threshold_ns)
    long = long[~in_model(long, nvtx)] if len(long) else long
    gap = long["gap"].to_numpy(dtype=np.int64)
    hc = np.bincount(gap, weights=long["ns"].to_numpy(dtype=float), minlength=len(idle)).astype(np.int64)
    host = idle["host_bound"].to_numpy(dtype=bool)
    idle["host_compute_ns"] = hc
    idle["launch_bound_ns"] = np.where(host, idle["duration_ns"].to_numpy(dtype=np.int64) - hc, 0)
    idle["host_compute_stretches"] = np.bincount(gap, minlength=len(idle))
    long = long.assign(step=idle["step"].to_numpy()[gap], at_step_start=idle["at_step_start"].to_numpy()[gap])
    long["where"] = where(long, nvtx) if len(long) else []
    return idle, long[list(STRETCH_COLUMNS)].astype(STRETCH_COLUMNS).reset_index(drop=True)


def _long_stretches(idle: pd.DataFrame, runtime_api: pd.DataFrame, threshold_ns: int) -> pd.DataFrame:
    """The stretches over ``threshold_ns`` of each host-bound interval's launching thread inside it
    (:func:`_stretches_in`), with ``gap`` (the interval's position in ``idle``) and ``tid``."""
    tids = idle["next_api_tid"].astype("Int64")
    known = idle["host_bound"].to_numpy(dtype=bool) & tids.notna().to_numpy()
    # a mask per launching thread (a few threads), not a groupby of every call
    call_tids = runtime_api["global_tid"].to_numpy() if len(runtime_api) and known.any() else np.array([])
    parts = []
    for tid in pd.unique(tids[known]):
        rows = np.flatnonzero(known & (tids == tid).fillna(False).to_numpy())
        calls = np.flatnonzero(call_tids == int(tid))
        if len(calls):  # only the columns read, and a slice where the thread made every call (rows_at)
            found = _stretches_in(rows_at(idle, rows), rows_at(runtime_api[["start_ns", "end_ns", "name"]], calls),
                                  threshold_ns)
            parts.append(found.assign(gap=rows[found["gap"].to_numpy(dtype=np.int64)], tid=int(tid)))
    columns = ["gap", "tid", "start_ns", "end_ns", "ns", "stretch_ns", "call_before", "call_after"]
    return pd.concat(parts, ignore_index=True)[columns] if parts else pd.DataFrame(
        {c: pd.Series(dtype=object if c.startswith("call") else "int64") for c in columns})


def _stretches_in(gaps: pd.DataFrame, calls: pd.DataFrame, threshold_ns: int) -> pd.DataFrame:
    """The stretches over ``threshold_ns`` of one thread (its ``calls``) that meet each of ``gaps``: gap
    (position in ``gaps``), start_ns, end_ns and ns (the part inside the gap), stretch_ns (the whole
    stretch between the two calls), call_before, call_after (their names; None at either end)."""
    starts, ends = calls["start_ns"].to_numpy(), calls["end_ns"].to_numpy()
    valid = ~(pd.isna(starts) | pd.isna(ends))
    if valid.all() and int_keys.is_sorted(starts):  # the usual export: no sorted copies of every call (5 M kernels: ~1 GiB)
        order = np.arange(len(starts))
        c_s, c_e = starts.astype(np.int64, copy=False), ends.astype(np.int64, copy=False)
    else:
        ok = np.flatnonzero(valid)
        order = ok[np.argsort(starts[ok], kind="stable")]  # positions in start order
        c_s, c_e = starts[order].astype(np.int64), ends[order].astype(np.int64)
    l_s, l_e = _long_free_time(*merge_intervals(c_s, c_e), threshold_ns)
    a, b = gaps["start_ns"].to_numpy(dtype=np.int64), gaps["end_ns"].to_numpy(dtype=np.int64)
    lo = np.searchsorted(l_e, a, side="right")  # the first long stretch ending after the gap starts
    n = np.maximum(np.searchsorted(l_s, b, side="left") - lo, 0)  # ... up to the last starting before it ends
    gap = np.repeat(np.arange(len(gaps)), n)
    k = lo[gap] + np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    start, end = np.maximum(l_s[k], a[gap]), np.minimum(l_e[k], b[gap])
    # the call that ends right before a stretch: the last call starting at or before its start
    before = np.searchsorted(c_s, l_s[k], side="right") - 1
    after = np.searchsorted(c_s, l_e[k], side="left")
    return pd.DataFrame({
        "gap": gap, "start_ns": start, "end_ns": end, "ns": end - start,
        "stretch_ns": np.minimum(l_e[k], _OPEN) - np.maximum(l_s[k], -_OPEN),
        "call_before": np.where(l_s[k] > -_OPEN, _names_at(calls, order, before), None) if len(order) else None,
        "call_after": np.where(l_e[k] < _OPEN, _names_at(calls, order, after), None) if len(order) else None})


def _long_free_time(m_s: np.ndarray, m_e: np.ndarray, threshold_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the free time between the union's blocks (``m_s``, ``m_e``: merged, in
    order; open at both ends, :data:`_OPEN`) longer than ``threshold_ns``, in order. The free
    intervals are ([-_OPEN, m_e...], [m_s..., _OPEN]) pair by pair; only the long ones are copied out
    (5 M kernels: the two arrays of every free interval were 216 MB at the report's peak)."""
    n = len(m_s)
    long = np.empty(n + 1, dtype=bool)
    long[0] = (int(m_s[0]) if n else _OPEN) + _OPEN > threshold_ns
    long[n] = _OPEN - (int(m_e[-1]) if n else -_OPEN) > threshold_ns
    np.greater(m_s[1:] - m_e[:-1], threshold_ns, out=long[1:n])
    open_start, open_end = np.array([-_OPEN], dtype=np.int64), np.array([_OPEN], dtype=np.int64)
    return (np.concatenate([open_start[:int(long[0])], m_e[long[1:]]]),
            np.concatenate([m_s[long[:n]], open_end[:int(long[n])]]))


def _names_at(calls: pd.DataFrame, order: np.ndarray, i: np.ndarray) -> np.ndarray:
    """The names (objects; NaN where missing) of the calls at positions ``i`` of the start order
    ``order`` (clipped to it): only these rows become Python objects, not every call's."""
    return calls["name"].iloc[order[np.clip(i, 0, len(order) - 1)]].astype(object).to_numpy()


def in_model(stretches: pd.DataFrame, nvtx: pd.DataFrame) -> np.ndarray:
    """Per stretch (start_ns, end_ns, tid): whether its middle lies inside the model's own
    execution as gpudiag's ranges record it: a module's forward on the stretch's thread, or a
    phase (``backward()``, ``optimizer.step()``) or a compiled graph's run on any thread (autograd
    launches the backward from its own thread). Such a stretch is framework work between the
    model's launches (Dynamo's guards, AOTAutograd's wrappers, the autograd engine, the optimizer's
    Python), counted launch-bound: on BERT training under torch.compile (H100, tests/fixtures/zoo)
    stretches of 1-3 ms in them made 6.9 of the 21.9 ms/step of host-bound idle, and CUDA graphs
    (mode max-autotune) took the step from 25.7 to 11.6 ms, about its kernel time: that idle went
    too (docs/notes/measurements.md, 2026-11-26). All False without gpudiag's ranges."""
    if stretches.empty or nvtx.empty or "text" not in nvtx:
        return np.zeros(len(stretches), dtype=bool)
    text = nvtx["text"].astype(str)
    middle = (stretches["start_ns"].to_numpy(dtype=float) + stretches["end_ns"].to_numpy(dtype=float)) / 2
    modules = nvtx[text.str.startswith(nvtx_names.MODULE) & nvtx["end_ns"].notna()].reset_index(drop=True)
    inside = innermost_range(modules, middle, stretches["tid"].to_numpy(dtype=float)) >= 0 if len(modules) else \
        np.zeros(len(stretches), dtype=bool)
    spans = nvtx[(text.str.startswith(nvtx_names.PHASE) | text.str.startswith(nvtx_names.GRAPH)) & nvtx["end_ns"].notna()]
    if len(spans):
        lo, hi = merge_intervals(spans["start_ns"].to_numpy(dtype=np.int64), spans["end_ns"].to_numpy(dtype=np.int64))
        inside |= window_index(lo, hi, middle) >= 0
    return inside


def where(stretches: pd.DataFrame, nvtx: pd.DataFrame) -> list[str | None]:
    """Per stretch (start_ns, end_ns, tid), the innermost push/pop NVTX range open on its thread at
    its middle, as a short label ("module layers.0|Block", "phase optimizer", or the user's own
    range text); None outside every range. Start/end ranges (gpudiag's steps) need not nest on a
    thread and are left out where the export records the event type."""
    if not len(nvtx):
        return [None] * len(stretches)
    # one mask, then the three columns the search reads: not two copies of every range's columns
    # (a 5 M-kernel capture with gpudiag's ranges holds 3.6 M of them, docs/scale.md)
    keep = (nvtx["end_ns"].notna() & nvtx["global_tid"].notna()).to_numpy()
    if "event_type" in nvtx and nvtx["event_type"][keep].notna().any():
        keep = keep & (nvtx["event_type"] == NVTX_PUSHPOP).to_numpy()
    rows = np.flatnonzero(keep)
    if not len(rows):
        return [None] * len(stretches)
    middle = (stretches["start_ns"].to_numpy(dtype=float) + stretches["end_ns"].to_numpy(dtype=float)) / 2
    inner = innermost_range(nvtx[["start_ns", "end_ns", "global_tid"]].iloc[rows].reset_index(drop=True), middle,
                            stretches["tid"].to_numpy(dtype=float))
    labels = np.full(len(inner), None, dtype=object)
    found = inner >= 0
    if found.any():  # only the texts shown become Python objects
        labels[found] = [_label(t) for t in nvtx["text"].iloc[rows[inner[found]]].to_numpy(dtype=object)]
    return labels.tolist()


def _label(text) -> str | None:
    """An NVTX range's text as the report names it: gpudiag's module, phase and graph prefixes
    shortened, any text cut to 80 characters; None for a range without text (NULL in the export)."""
    if not isinstance(text, str):
        return None
    if text.startswith(nvtx_names.GRAPH):  # one label per graph, whatever a dynamic-shape run's sizes
        return "compiled graph " + text[len(nvtx_names.GRAPH):].split(" ")[0][:60]
    for prefix, name in ((nvtx_names.MODULE, "module "), (nvtx_names.PHASE, "phase ")):
        if text.startswith(prefix):
            return (name + text[len(prefix):])[:80]
    return text[:80]
