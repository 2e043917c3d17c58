"""Step detection at its boundaries (issue 24's surviving mutations): back-to-back user ranges,
repeated step numbers ([0, 0], [0, 1, 1]) that start new runs, and the exact window of the
whole-capture fallback. Frames are written here by hand; the expected windows are interval
arithmetic done in the test."""

from __future__ import annotations

import pandas as pd
import pytest

from gpudiag import nvtx_names
from gpudiag.analysis.attribution.ranges import find_steps, gpudiag_steps, window_index


def _nvtx(rows: list[tuple[str, int, int]]) -> pd.DataFrame:
    return pd.DataFrame({"text": [r[0] for r in rows], "start_ns": [r[1] for r in rows], "end_ns": [r[2] for r in rows]})


def _kernels(spans: list[tuple[int, int]]) -> pd.DataFrame:
    return pd.DataFrame({"start_ns": [s for s, _ in spans], "end_ns": [e for _, e in spans]})


def test_back_to_back_user_ranges_are_all_steps():
    """A step range that starts exactly where the previous one ends is a step of its own (a
    strict '>' in the outermost-range filter would drop it); a range nested inside one is not."""
    nvtx = _nvtx([("step 0", 100, 200), ("step 1", 200, 300), ("step 2", 300, 450), ("step inner", 310, 320)])
    steps = find_steps(nvtx, _kernels([(120, 130)]))
    assert steps.kind == "nvtx"
    assert steps.table[["step", "start_ns", "end_ns"]].values.tolist() == [[0, 100, 200], [1, 200, 300], [2, 300, 450]]


def test_a_kernel_launched_at_a_shared_boundary_belongs_to_the_later_step():
    """Windows are [start, end): a launch at 200 is in step 1, not step 0; at 450 in none."""
    assert window_index(pd.Series([100, 200, 300]).to_numpy(), pd.Series([200, 300, 450]).to_numpy(),
                        pd.Series([100, 199, 200, 449, 450]).to_numpy()).tolist() == [0, 0, 1, 2, -1]


def _gpudiag(numbers: list[int]) -> pd.DataFrame:
    return _nvtx([(f"{nvtx_names.STEP}{n}", 1000 * i, 1000 * i + 900) for i, n in enumerate(numbers)])


def test_a_repeated_step_number_starts_a_new_run():
    for numbers, runs in (([0, 0], [0, 1]), ([0, 1, 1], [0, 0, 1]), ([0, 1, 2, 0, 1], [0, 0, 0, 1, 1])):
        steps = gpudiag_steps(_gpudiag(numbers), _nvtx([]))
        assert steps.runs is not None, numbers
        assert steps.runs["run"].tolist() == runs and steps.runs["run_step"].tolist() == numbers
        assert steps.table["step"].tolist() == list(range(len(numbers)))  # renumbered in time order


def test_one_run_keeps_the_launcher_numbers():
    steps = gpudiag_steps(_gpudiag([1, 2, 3, 4]), _nvtx([]))  # a step-window capture starts at step 1
    assert steps.runs is None and steps.table["step"].tolist() == [1, 2, 3, 4]
    assert steps.table[["start_ns", "end_ns"]].values.tolist() == [[0, 900], [1000, 1900], [2000, 2900], [3000, 3900]]


def test_whole_capture_window_is_exact():
    """No step ranges: one window from the earliest launch call or kernel to one past the last
    kernel's end, so that the last kernel (launched at its start) is inside [start, end)."""
    kernels = _kernels([(500, 700), (800, 1234)])
    api = pd.DataFrame({"start_ns": [420, 790], "end_ns": [430, 795]})
    steps = find_steps(_nvtx([]), kernels, runtime_api=api)
    assert steps.kind == "whole"
    assert steps.table[["step", "start_ns", "end_ns"]].values.tolist() == [[0, 420, 1235]]
    assert int(steps.table["end_ns"].iloc[0] - steps.table["start_ns"].iloc[0]) == 815
    without_api = find_steps(_nvtx([]), kernels)
    assert without_api.table[["start_ns", "end_ns"]].values.tolist() == [[500, 1235]]


@pytest.mark.parametrize("numbers, warmup, detail, flags", [
    # two runs of steps 0..3, warm-up 1, detail step 2 (the launcher's number) in each run
    ([0, 1, 2, 3, 0, 1, 2, 3], 1, 2, ["w", "m", "d", "m", "w", "m", "d", "m"]),
    ([0, 1, 2, 0, 1, 2], 2, None, ["w", "w", "m", "w", "w", "m"]),
    # runs of warm-up steps only: reported rather than nothing (warm-up dropped, detail kept out)
    ([0, 1, 0, 1], 2, 1, ["m", "d", "m", "d"]),
    ([0, 0], 1, 0, ["d", "d"]),
])
def test_each_run_has_its_own_warmup_and_detail_step(numbers, warmup, detail, flags):
    """Several launcher runs in one capture: per run, the first ``warmup`` steps are warm-up and the
    step with the detail step's launcher number is its detail step; the rest are measured."""
    from gpudiag.analysis.attribution.ranges import run_flags

    steps = gpudiag_steps(_gpudiag(numbers), _nvtx([]))
    st = pd.DataFrame({"step": steps.table["step"], "warmup": False, "detail": False, "measured": True})
    detail_step = None if detail is None else int(steps.table["step"][numbers.index(detail)])
    out = run_flags(st, steps, warmup, detail_step)
    got = ["d" if d else "w" if w else "m" if m else "?" for w, d, m in zip(out["warmup"], out["detail"], out["measured"])]
    assert got == flags
    if flags == ["d", "d"]:  # only detail steps: every step is measured rather than none
        assert out["measured"].all()
