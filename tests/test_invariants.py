"""The report invariants (gpudiag/analysis/invariants.py): they hold on every committed real
capture, and each one fires on a report that breaks it."""

from __future__ import annotations

import copy

import pytest

from gpudiag.analysis import invariants

from conftest import EXPORTS


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_every_committed_capture_satisfies_every_invariant(analysed, name):
    _, report = analysed(name)
    assert report["invariants"] == {}
    assert not any(w.startswith("invariant ") for w in report["warnings"])


@pytest.fixture
def gpt2(analysed):
    _, report = analysed("gpt2_train_bf16")
    report = copy.deepcopy(report)
    report["warnings"] = []
    return report


@pytest.mark.parametrize("breakage,invariant", [
    (lambda r: r.update(gpu_busy_percent=-1.3), "gpu_busy_within_0_100"),
    (lambda r: r["steps"]["step_time_ns"].update(median=0.0), "step_times_positive"),
    (lambda r: r["breakdown_percent"].update(idle=r["breakdown_percent"]["idle"] + 3), "breakdown_sums_to_100"),
    (lambda r: r["recommendations"][0].update(saving_percent_of_step=56943.0), "savings_within_the_step"),
    (lambda r: r["fusion_candidates"][0].update(saving_ns_per_step=1e12), "savings_within_the_step"),
])
def test_each_invariant_fires_with_one_warning(gpt2, breakage, invariant):
    breakage(gpt2)
    report = invariants.check(gpt2)
    assert list(report["invariants"]) == [invariant]
    assert len(report["warnings"]) == 1 and report["warnings"][0].startswith(f"invariant {invariant} violated")
