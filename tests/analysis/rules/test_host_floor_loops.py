"""The token loop's host time outside the model's forwards (host_floor.outside_modules), against
interval arithmetic written here: every nanosecond of a small integer timeline marked in or out."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudiag import nvtx_names
from gpudiag.analysis.rules.host_floor import outside_modules

ranges = st.lists(st.tuples(st.integers(0, 200), st.integers(1, 40)), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(ranges, st.integers(0, 120), st.integers(1, 120))
def test_outside_time_and_forward_count_match_a_marked_timeline(spans, step_start, step_len):
    step_end = step_start + step_len
    nvtx = pd.DataFrame({"text": [nvtx_names.MODULE + f"m{i}|M" for i in range(len(spans))] + ["user range"],
                         "start_ns": [s for s, _ in spans] + [0], "end_ns": [s + d for s, d in spans] + [500]})
    steps = pd.DataFrame({"step": [3], "start_ns": [step_start], "end_ns": [step_end]})
    inside = np.zeros(step_end, dtype=bool)
    for s, d in spans:  # the oracle: mark each nanosecond of the step a module range covers
        inside[max(s, step_start):min(s + d, step_end)] = True
    marked = inside[step_start:step_end]
    out = outside_modules(nvtx, steps, {3})
    assert out["outside_ns"] == step_len - marked.sum()
    # the outermost calls: runs of covered nanoseconds, counting those that touch the step (a range
    # that ends exactly where another starts is one interval of the union, not two)
    union = np.zeros(300, dtype=bool)
    for s, d in spans:
        union[s:s + d] = True
    edges = np.flatnonzero(np.diff(np.concatenate([[0], union.astype(int), [0]])))
    runs = list(zip(edges[::2], edges[1::2]))
    assert out["forwards_per_step"] == sum(1 for a, b in runs if b > step_start and a < step_end)


def test_no_module_ranges_no_answer():
    steps = pd.DataFrame({"step": [0], "start_ns": [0], "end_ns": [10]})
    nvtx = pd.DataFrame({"text": ["step 0"], "start_ns": [0], "end_ns": [10]})
    assert outside_modules(nvtx, steps, {0}) is None

