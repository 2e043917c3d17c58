"""GPU timeline: step times, busy and idle time, host-bound gaps, launch delays.

Definitions (docs/architecture.md has the picture):

- A step's *GPU window* runs from the end of the previous step's last GPU activity to the end of
  its own last activity (activities attributed by launch call, see attribution). Its length is the
  step time: the period at which steps complete on the GPU, idle time between steps included. The
  first step's window starts at its first activity.
- *Busy* time is the union of kernel, memcpy and memset intervals inside the window (not the sum:
  concurrent streams count once). *Idle* = step time - busy.
- An idle interval of the whole GPU is *host-bound* when the activity that ends it was launched
  after the interval began: the launch queue was empty and the GPU waited for the host
  (design.md: overhead time, attributed to the kernel that waited).
- Per stream, a gap between consecutive kernels is host-bound when the later kernel's launch call
  ended after the earlier kernel finished.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpudiag.analysis.attribution.ranges import launch_calls
from gpudiag.sources import int_keys


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals [start, end) as sorted disjoint (starts, ends) arrays (ns)."""
    if len(starts) == 0:
        return np.array([], dtype=np.int64), np.array([], dtype=np.int64)
    s, e = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    if not int_keys.is_sorted(s):  # an export's rows mostly are: no sorted copies of 13.5 M API calls then
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    new_block = np.ones(len(s), dtype=bool)
    np.greater(s[1:], run_end[:-1], out=new_block[1:])
    # the temporaries go before the blocks' arrays are made: 13.5 M API calls' running end is 108 MB
    # of the report's peak (docs/scale.md)
    del run_end
    first = np.flatnonzero(new_block)
    del new_block
    # a block's rows are contiguous in start order: its end is their largest (reduceat, not ufunc.at: 10x faster)
    return s[first], np.maximum.reduceat(e, first)


def covered_ns(m_s: np.ndarray, m_e: np.ndarray, w_s: np.ndarray, w_e: np.ndarray) -> np.ndarray:
    """Length of the union (given as merged disjoint intervals) inside each window [w_s, w_e)."""
    if len(m_s) == 0:
        return np.zeros(len(w_s), dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(m_e - m_s)])  # covered length before block i

    def covered_before(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(m_s, t, side="right")  # blocks starting at or before t
        partial = np.where(i > 0, np.minimum(t, m_e[np.maximum(i - 1, 0)]) - m_s[np.maximum(i - 1, 0)], 0)
        return cum[np.maximum(i - 1, 0)] * (i > 0) + np.maximum(partial, 0)

    w_s, w_e = np.asarray(w_s, np.int64), np.asarray(w_e, np.int64)
    return covered_before(w_e) - covered_before(w_s)


ACTIVITY_KINDS = pd.CategoricalDtype(["kernel", "memcpy", "memset"])


def _kinds(kind: str, n: int) -> pd.Categorical:
    """``n`` rows of ``kind`` as one byte each (5 M kernels as text: 78 MB of the report's peak, docs/scale.md)."""
    return pd.Categorical.from_codes(np.full(n, ACTIVITY_KINDS.categories.get_loc(kind), dtype=np.int8),
                                     dtype=ACTIVITY_KINDS)


def gpu_activities(kernels: pd.DataFrame, memcpy: pd.DataFrame, memset: pd.DataFrame,
                   runtime_api: pd.DataFrame, kernel_calls: pd.DataFrame | None = None) -> pd.DataFrame:
    """All GPU work as one table sorted by start: start_ns, end_ns, kind (kernel/memcpy/memset,
    :data:`ACTIVITY_KINDS`),
    stream_id, global_pid, correlation_id, kernel_id (NaN for copies), and the launch call's
    api_start_ns / api_end_ns / api_tid (the launching thread; NaN where the export has none).
    ``kernel_calls``: the kernels' own launch calls where the caller has them (columns
    api_start_ns, api_end_ns, api_tid, one row per kernel in order: :func:`launch_calls` of
    ``kernels``, as the attribution holds them); then only the copies' and memsets' calls are
    looked up."""
    cols = ["start_ns", "end_ns", "stream_id", "global_pid", "correlation_id"]
    parts = [kernels[cols + ["kernel_id"]].assign(kind=_kinds("kernel", len(kernels)))]
    for name, df in (("memcpy", memcpy), ("memset", memset)):
        if not df.empty:
            parts.append(df[cols].assign(kind=_kinds(name, len(df)), kernel_id=np.nan))
    act = pd.concat(parts, ignore_index=True)
    if kernel_calls is None:
        calls = [launch_calls(act, runtime_api)]
    else:  # a row's call does not depend on the other rows joined with it (launch_calls keeps each id's first call)
        calls = [kernel_calls] + ([launch_calls(act.iloc[len(kernels):], runtime_api)] if len(act) > len(kernels) else [])
    for c in ("api_start_ns", "api_end_ns"):
        act[c] = np.concatenate([part[c].to_numpy() for part in calls])
    # thread ids as integers (nullable): ids tagged with a file index (ingest_many) exceed 2**53
    act["api_tid"] = pd.concat([part["api_tid"].astype("Int64") for part in calls], ignore_index=True).array
    return act.sort_values("start_ns", kind="stable", ignore_index=True)


def step_table(steps: pd.DataFrame, activities: pd.DataFrame, warmup_steps: int, detail_step: int | None) -> pd.DataFrame:
    """One row per step with: step, cpu_start_ns, cpu_end_ns, gpu_start_ns, gpu_end_ns,
    window_start_ns, step_time_ns (GPU window), busy_ns, idle_ns, kernels, kernel_ns (sum of kernel
    durations), warmup (bool), detail (bool, the step recorded with op ranges), measured (in the
    statistics). ``activities`` carries a ``step`` column (from the launch call). Steps with no GPU
    work are dropped. Window ends never move backwards (a step that finishes before its
    predecessor's last work on another stream gets a zero-length window, not a negative one)."""
    a = activities[activities["step"] >= 0]
    g = a.groupby("step")
    k = a[a["kind"] == "kernel"].groupby("step")
    per = pd.DataFrame({"gpu_start_ns": g["start_ns"].min(), "gpu_end_ns": g["end_ns"].max(),
                        "kernels": k.size(), "kernel_ns": (k["end_ns"].sum() - k["start_ns"].sum())})
    per[["kernels", "kernel_ns"]] = per[["kernels", "kernel_ns"]].fillna(0).astype(np.int64)
    t = steps.set_index("step").rename(columns={"start_ns": "cpu_start_ns", "end_ns": "cpu_end_ns"}).join(per, how="inner")
    t = t.sort_index()
    t["gpu_end_ns"] = t["gpu_end_ns"].cummax()
    window_start = t["gpu_end_ns"].shift(1)
    window_start.iloc[:1] = t["gpu_start_ns"].iloc[:1]
    t["window_start_ns"] = window_start.astype(np.int64)
    t["step_time_ns"] = t["gpu_end_ns"] - t["window_start_ns"]
    m_s, m_e = merge_intervals(activities["start_ns"].to_numpy(), activities["end_ns"].to_numpy())
    t["busy_ns"] = covered_ns(m_s, m_e, t["window_start_ns"].to_numpy(), t["gpu_end_ns"].to_numpy())
    t["idle_ns"] = t["step_time_ns"] - t["busy_ns"]
    position = np.arange(len(t))
    t["warmup"] = position < warmup_steps
    t["detail"] = t.index.to_numpy() == (detail_step if detail_step is not None else -10**9)
    t["measured"] = ~t["warmup"] & ~t["detail"]
    if not t["measured"].any():  # a capture of only warm-up steps: report them rather than nothing
        t["warmup"] = False
        t["measured"] = ~t["detail"] if (~t["detail"]).any() else True
    return t.reset_index()


def idle_intervals(activities: pd.DataFrame) -> pd.DataFrame:
    """Intervals where the whole GPU was idle, between consecutive merged busy blocks:
    start_ns, end_ns, duration_ns, host_bound (bool), next_kernel_id (the kernel that ended the
    idle time; NaN when a copy or memset did) and next_api_tid (the thread whose call launched the
    activity that ended it; NaN without one)."""
    m_s, m_e = merge_intervals(activities["start_ns"].to_numpy(), activities["end_ns"].to_numpy())
    if len(m_s) < 2:  # typed: a boolean mask of object dtype would select columns, not rows
        return pd.DataFrame({"start_ns": pd.Series(dtype=np.int64), "end_ns": pd.Series(dtype=np.int64),
                             "duration_ns": pd.Series(dtype=np.int64), "host_bound": pd.Series(dtype=bool),
                             "next_kernel_id": pd.Series(dtype=float), "next_api_tid": pd.Series(dtype="Int64")})
    gaps = pd.DataFrame({"start_ns": m_e[:-1], "end_ns": m_s[1:]})
    # The activity that ends a gap is the first row (in row order) to start at the next block's start:
    # the leftmost of the stable start order (the rows are sorted by start already: the sort is cheap)
    start = activities["start_ns"].to_numpy()
    order = np.argsort(start, kind="stable")
    nxt = order[np.searchsorted(start[order], m_s[1:], side="left")]
    gaps["duration_ns"] = gaps["end_ns"] - gaps["start_ns"]
    gaps["host_bound"] = (activities["api_end_ns"].to_numpy()[nxt] > gaps["start_ns"].to_numpy())
    gaps["next_kernel_id"] = activities["kernel_id"].to_numpy()[nxt]
    gaps["next_api_tid"] = activities["api_tid"].array.take(nxt)
    return gaps


def stream_gaps(kernels: pd.DataFrame, attribution: pd.DataFrame) -> pd.DataFrame:
    """Gaps between consecutive kernels on each stream (of each device): kernel_id (the later
    kernel), stream_id, gap_ns (> 0 only), host_bound (its launch call ended after the previous
    kernel finished)."""
    k = kernels[["kernel_id", "device_id", "stream_id", "start_ns", "end_ns"]].assign(
        api_end_ns=attribution["api_end_ns"].to_numpy())
    k = k.sort_values(["device_id", "stream_id", "start_ns"], kind="stable")
    prev_end = k.groupby(["device_id", "stream_id"])["end_ns"].shift(1)
    k["gap_ns"] = k["start_ns"] - prev_end
    k["host_bound"] = k["api_end_ns"] > prev_end
    return k[k["gap_ns"] > 0][["kernel_id", "stream_id", "gap_ns", "host_bound"]].reset_index(drop=True)


def launch_stats(kernels: pd.DataFrame, attribution: pd.DataFrame) -> pd.DataFrame:
    """Per kernel: queue_delay_ns (kernel start - launch call start) and shorter_than_launch
    (kernel duration < its launch call's duration: the host cannot keep such kernels fed)."""
    api_dur = attribution["api_end_ns"].to_numpy(dtype=float) - attribution["api_start_ns"].to_numpy(dtype=float)
    return pd.DataFrame({
        "kernel_id": kernels["kernel_id"].to_numpy(),
        "queue_delay_ns": kernels["start_ns"].to_numpy(dtype=float) - attribution["api_start_ns"].to_numpy(dtype=float),
        "shorter_than_launch": kernels["duration_ns"].to_numpy(dtype=float) < api_dur,
    })
