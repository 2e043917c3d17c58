"""Launches per step: kernel launch calls vs CUDA graph launches, and kernels run from graphs.

With CUDA graphs (``torch.compile(mode="reduce-overhead")``, a user's ``torch.cuda.graph``) one
``cudaGraphLaunch`` replays many kernels; nsys ``--cuda-graph-trace=node`` (what ``gpudiag profile``
uses) records each replayed kernel with its ``graphNodeId`` and the graph launch's correlation id,
so the kernels are attributed to the step (and to the NVTX ranges around the graph launch) like
any other. This stage counts what the host launched, per measured step.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpudiag.analysis.attribution.ranges import window_index

# The calls that block the host until the GPU catches up: GD-HOST-SYNC counts them and the outlier
# steps name them (both read this one list, here below both stages).
SYNC_APIS = re.compile(r"^(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|cudaMemcpy(_v\d+)?$|cudaMemcpy2D(_v\d+)?$)")
# CUDA runtime/driver entry points (names as nsys records them, with or without a _v suffix).
KERNEL_LAUNCH = re.compile(r"^(cudaLaunchKernel|cudaLaunchKernelExC|cudaLaunchCooperativeKernel|cuLaunchKernel|cuLaunchKernelEx|cuLaunchCooperativeKernel)(_v\d+)?$")
GRAPH_LAUNCH = re.compile(r"^(cudaGraphLaunch|cuGraphLaunch)(_v\d+)?$")


def in_measured_steps(df: pd.DataFrame, host_ns: np.ndarray, steps_table: pd.DataFrame,
                      measured_ids: set[int]) -> pd.DataFrame:
    """``df`` with a ``step`` column (the step whose host window holds each row's ``host_ns``: ns,
    NaN for none), measured steps' rows only. ``steps_table``: step, start_ns, end_ns."""
    step = window_index(steps_table["start_ns"].to_numpy(), steps_table["end_ns"].to_numpy(), host_ns,
                        labels=steps_table["step"].to_numpy())
    # filtered before the column is added: one copy of the kept rows, not two of every row (2.7 M API calls)
    keep = np.isin(step, np.fromiter(measured_ids, dtype=np.int64, count=len(measured_ids)))
    return kept_rows(df, keep).assign(step=step if keep.all() else step[keep])


def kept_rows(df: pd.DataFrame, keep: np.ndarray) -> pd.DataFrame:
    """``df[keep]`` (``keep``: a bool array per row); where every row is kept, a shallow copy that
    shares the columns (copy-on-write) instead of a copy of them: a plain export is one step, all
    of it measured (5 M kernels: the kernel frame and the API calls held twice, docs/scale.md).
    Where the kept rows are one block, a slice that shares them, as :func:`rows_at` gives."""
    if keep.all():
        return df.copy(deep=False)
    first = int(np.argmax(keep))
    last = len(keep) - int(np.argmax(keep[::-1]))  # one past the last kept row
    # one block, found without an array of the kept positions (13.5 M calls: 108 MB)
    return df.iloc[first:last] if keep[first] and keep[first:last].all() else df[keep]


def rows_at(df: pd.DataFrame, positions: np.ndarray) -> pd.DataFrame:
    """``df.iloc[positions]``; where ``positions`` are one block of consecutive rows in order (the
    API calls of the measured steps, of the one launching thread), a slice that shares the rows
    (copy-on-write) instead of a copy: a plain 5 M-kernel export's measured API calls lack only 3
    of 13.5 M calls, and the copy of them was 0.5 GB at the report's peak (docs/scale.md)."""
    if (len(positions) > 1 and positions[-1] - positions[0] == len(positions) - 1
            and (positions[1:] > positions[:-1]).all()):  # increasing over a span of their count: consecutive
        return df.iloc[int(positions[0]):int(positions[-1]) + 1]
    return df.iloc[positions]


def launch_counts(km: pd.DataFrame, api: pd.DataFrame, n: int) -> dict | None:
    """Per measured step (means): ``kernel_launch_calls`` (launch API calls), ``graph_launches``
    (cudaGraphLaunch calls), ``kernels`` (kernels that ran) and ``kernels_from_graphs`` (those
    with a graph node id). ``km``: the measured steps' kernels (``graph_node_id`` column optional);
    ``api``: the measured steps' API calls (:func:`in_measured_steps`); ``n``: how many measured
    steps. None when there is none."""
    if not n:
        return None
    node = km["graph_node_id"] if "graph_node_id" in km else pd.Series(np.nan, index=km.index)
    from_graphs = int((pd.to_numeric(node, errors="coerce").fillna(0) > 0).sum())
    names = api["name"].fillna("") if not api.empty else pd.Series(dtype=str)
    return {"kernel_launch_calls": int(names.str.match(KERNEL_LAUNCH).sum()) / n,
            "graph_launches": int(names.str.match(GRAPH_LAUNCH).sum()) / n,
            "kernels": len(km) / n, "kernels_from_graphs": from_graphs / n}
