"""Which Nsight Compute row measured which launch (gpudiag.analysis.roofline.ncu_pairing): the alignment
against a plain dynamic programme written here, and the pairing on a real capture whose ncu run launched
one GEMM with another kernel, checked against the shapes Inductor traced."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import ROOT
from gpudiag.analysis.roofline.ncu_pairing import GAP, align, pair_rows

sys.path.insert(0, str(ROOT / "benchmarks"))
import roofline_accuracy  # noqa: E402

VIT = ROOT / "tests" / "fixtures" / "roofline48" / "compiled" / "vit_compiled"


def _least_cost(a: list[float], b: list[float], gap: float) -> float:
    """The textbook edit-distance recurrence, cell by cell (the oracle)."""
    d = [[0.0] * (len(a) + 1) for _ in range(len(b) + 1)]
    for j in range(len(a) + 1):
        d[0][j] = j * gap
    for i in range(1, len(b) + 1):
        d[i][0] = i * gap
        for j in range(1, len(a) + 1):
            d[i][j] = min(d[i - 1][j - 1] + abs(np.log(b[i - 1] / a[j - 1])), d[i - 1][j] + gap, d[i][j - 1] + gap)
    return d[-1][-1]


def _cost_of(pairs: np.ndarray, a: list[float], b: list[float], gap: float) -> float:
    paired = pairs >= 0
    used = pairs[paired]
    assert (np.diff(used) > 0).all()  # order kept, no launch paired twice
    pair_cost = sum(abs(np.log(b[i] / a[j])) for i, j in enumerate(pairs) if j >= 0)
    return pair_cost + gap * ((len(b) - paired.sum()) + (len(a) - paired.sum()))


durations = st.lists(st.floats(1e3, 1e6), min_size=0, max_size=9)


@settings(max_examples=200, deadline=None)
@given(durations, durations)
def test_the_alignment_has_the_least_cost(a, b):
    pairs = align(np.array(a), np.array(b))
    assert len(pairs) == len(b)
    assert _cost_of(pairs, a, b, GAP) == pytest.approx(_least_cost(a, b, GAP), rel=1e-9, abs=1e-9)


def test_a_launch_the_ncu_run_did_not_make_is_left_out():
    """One block of the compiled ViT's persistent nvjet configuration: four launches a step (27, 22,
    9 and 18 us), of which the ncu run made three (the 9 us weight gradient ran with another kernel)."""
    launches = np.array([27264.0, 22176.0, 8896.0, 17728.0, 27712.0, 23328.0, 8992.0, 18112.0])
    rows = np.array([28192.0, 22656.0, 18816.0, 28544.0, 23840.0, 19104.0])
    assert align(launches, rows).tolist() == [0, 1, 3, 4, 5, 7]
    # the ordinal pairing it replaces gave row 2 (11.2 GFLOP) to the 3.7 GFLOP launch, and so on
    row = pair_rows(np.zeros(8, int), np.arange(8.0), launches, np.zeros(6, int), rows)
    assert row.tolist() == [0, 1, -1, 2, 3, 4, -1, 5]


def test_launches_outside_a_step_take_the_row_nearest_in_duration():
    row = pair_rows(np.array([1, 1, 1, 2]), np.full(4, np.nan), np.array([10e3, 31e3, 100e3, 5e3]),
                    np.array([1, 1]), np.array([11e3, 30e3]))
    assert row.tolist() == [0, 1, -1, -1]  # 100 us: over twice the nearest row; config 2: no row


def test_ncu_numbers_go_to_the_launches_that_did_the_same_work():
    """On the compiled ViT-S fixture (one gpudiag profile --ncu run, H200): every contraction launch
    that takes an ncu row does the work Inductor's traced shapes give it, within 20 % (the ordinal
    pairing gave 17.5 % of the contraction time the FLOPs of another GEMM, 2x to 4x off), except cuDNN's
    patch-embedding convolution backward (ncu counts 1.84x its 2MNK: its own algorithm)."""
    both, _ = roofline_accuracy.compared(VIT)
    c = both[both["family_est"].isin(["gemm", "attention"]) & (both["flop_est"] > 0)]
    ratio = c["flop_ncu"] / c["flop_est"]
    assert len(c) > 100 and ratio.between(0.8, 1.2).all(), c.loc[~ratio.between(0.8, 1.2), ["name_est", "flop_est", "flop_ncu"]]
    nvjet = both[both["name_est"].str.contains("192x192_64x3_2x1_v_bz_coopB_NNN")]
    # its 3.7 GFLOP launches were made by another kernel under ncu: none of them takes a row
    assert (nvjet["flop_est"] < 5e9).sum() == 0 and len(nvjet) >= 12


def test_rows_without_durations_pair_in_order():
    """Without durations the order alone decides: the n-th row goes to the n-th launch of every step
    (ncu's launch cap ended the rows), the launches after them take none."""
    row = pair_rows(np.zeros(6, int), np.array([0, 1, 2, 0, 1, 2.0]), np.full(6, 5e3), np.zeros(2, int),
                    np.full(2, np.nan))
    assert row.tolist() == [0, 1, -1, 0, 1, -1]
