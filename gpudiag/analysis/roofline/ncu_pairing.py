"""Which Nsight Compute row measured which kernel launch of the nsys capture.

Nsight Compute replays the launches of one step of a second run of the script (``gpudiag profile
--ncu``: the detail step; an export made without gpudiag: whatever the user profiled). Its rows carry
the kernel name and launch configuration, not the op or the shapes, so a row is paired with a launch
of the same configuration (:data:`gpudiag.analysis.roofline.classify.CONFIG_COLUMNS`). A configuration
does not pin down the work (a GEMM's grid ignores K; a persistent nvjet kernel launches one CTA per SM
whatever the shape), and the second run need not launch the same kernels: cuBLASLt ran one of a
compiled ViT-S's weight gradients (3.7 GFLOP, 9 us) with another kernel under ncu, so pairing the n-th
row with the n-th launch gave every later launch of that configuration the numbers of another GEMM
(tests/fixtures/roofline48/compiled/vit_compiled: 16 launches a step, 12 ncu rows).

So the rows of a configuration are aligned with its launches in one step, in order, by duration: an
edit-distance alignment whose pair cost is |log(ncu duration / launch duration)| and whose gap cost
is :data:`GAP` (:func:`align`). A launch no row was aligned with takes the row of its configuration
nearest to it in duration, within a factor of two, or none (:func:`pair_rows`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# The duration of a launch and of ncu's replay of the same work differ by under a factor of two: on the
# compiled fixtures (tests/fixtures/roofline48/compiled, H200, 2026-11-29; one process for both), over
# the 243 launches whose configuration ncu replayed as often as the step launched it, |log(ncu / nsys)|
# had a 99th percentile of 0.66 and a maximum of 0.75 (2 us split-K reductions: ncu flushes the caches
# and adds about 2 us to a short kernel). An unpaired row or launch costs what such a pair does.
GAP = float(np.log(2.0))
# Above so many cells the alignment (a float64 matrix of rows x launches) is skipped and every launch
# takes its nearest row: 10 M cells are 80 MB.
MAX_CELLS = 10_000_000
_TIE = 1e-9  # two alignment costs this close are equal (float rounding of the running minimum)


def align(launch_ns: np.ndarray, row_ns: np.ndarray, gap: float = GAP) -> np.ndarray:
    """For each ncu row (``row_ns``, durations in ns, in replay order) the index of the launch
    (``launch_ns``, in launch order) it is paired with, or -1: the order-keeping alignment of least
    total cost, a pair costing |log(row / launch)| and a row or launch left unpaired ``gap``. A
    non-positive or NaN duration pairs at no cost (the order alone decides)."""
    n, m = len(launch_ns), len(row_ns)
    if n == 0 or m == 0:
        return np.full(m, -1, dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        la, lb = np.log(np.asarray(launch_ns, float)), np.log(np.asarray(row_ns, float))

    def cost(i: int, j: slice | int = slice(None)) -> np.ndarray:  # row i against launches j; unknown: 0
        c = np.abs(la[j] - lb[i])
        return np.where(np.isfinite(c), c, 0.0)

    columns = np.arange(n + 1) * gap
    d = np.empty((m + 1, n + 1))
    d[0] = columns
    for i in range(1, m + 1):
        best = np.minimum(d[i - 1, :-1] + cost(i - 1), d[i - 1, 1:] + gap)  # pair, or leave the row unpaired
        best = np.concatenate(([i * gap], best))
        d[i] = np.minimum.accumulate(best - columns) + columns  # or leave launches unpaired
    pairs = np.full(m, -1, dtype=np.int64)
    i, j = m, n
    while i > 0 and j > 0:  # of equal alignments, the one leaving the last launches unpaired (ncu's launch cap)
        if abs(d[i, j] - (d[i, j - 1] + gap)) <= _TIE:
            j -= 1
        elif abs(d[i, j] - (d[i - 1, j - 1] + cost(i - 1, j - 1))) <= _TIE:
            pairs[i - 1] = j - 1
            i, j = i - 1, j - 1
        else:
            i -= 1
    return pairs


def _nearest(duration_ns: np.ndarray, row_ns: np.ndarray) -> np.ndarray:
    """Per launch, the index of the row nearest in log duration, or -1 beyond a factor of two."""
    with np.errstate(divide="ignore", invalid="ignore"):
        x, r = np.log(duration_ns.astype(float)), np.log(row_ns.astype(float))
    order = np.argsort(r)
    ranked = r[order]
    right = np.clip(np.searchsorted(ranked, x), 0, len(ranked) - 1)
    left = np.clip(right - 1, 0, len(ranked) - 1)
    pick = np.where(np.abs(ranked[left] - x) <= np.abs(ranked[right] - x), left, right)
    near = np.abs(ranked[pick] - x) <= GAP
    return np.where(near, order[pick], -1)


def pair_rows(config_key: np.ndarray, ordinal: np.ndarray, duration_ns: np.ndarray,
              row_config: np.ndarray, row_ns: np.ndarray) -> np.ndarray:
    """Per kernel launch, the index (into the ncu rows) of the row that measured its work, or -1.

    ``config_key``, ``ordinal`` (the n-th launch of its configuration within its step; NaN outside
    a step) and ``duration_ns`` per launch; ``row_config`` and ``row_ns`` per ncu row, in replay
    order. A configuration's rows are aligned (:func:`align`) with its launches by ordinal, each
    ordinal's duration the median over the steps; every launch of an aligned ordinal takes its row,
    the others their configuration's row nearest in duration within a factor of two (none beyond)."""
    out = np.full(len(config_key), -1, dtype=np.int64)
    launches = pd.DataFrame({"cfg": config_key, "ordinal": ordinal, "duration": duration_ns.astype(float)})
    rows = pd.DataFrame({"cfg": row_config, "duration": row_ns.astype(float), "row": np.arange(len(row_config))})
    stepped = launches.dropna(subset=["ordinal"])
    by_ordinal = stepped.groupby(["cfg", "ordinal"])["duration"].median()
    launches_of = launches.groupby("cfg").indices  # positions in ``launches``
    for cfg, mine in rows.groupby("cfg", sort=False):
        here = launches_of.get(cfg)
        if here is None:
            continue
        row_index, row_duration = mine["row"].to_numpy(), mine["duration"].to_numpy()
        out[here] = np.where((near := _nearest(launches["duration"].to_numpy()[here], row_duration)) >= 0,
                             row_index[near], -1)
        if cfg not in by_ordinal.index.get_level_values(0):
            continue
        reference = by_ordinal.loc[cfg]
        if len(reference) * len(mine) > MAX_CELLS:
            continue
        pairs = align(reference.to_numpy(), row_duration)
        aligned = pd.Series(row_index[pairs >= 0], index=reference.index[pairs[pairs >= 0]])
        taken = aligned.reindex(launches["ordinal"].to_numpy()[here]).to_numpy()
        out[here] = np.where(np.isfinite(taken), np.nan_to_num(taken, nan=-1), out[here]).astype(np.int64)
    return out
