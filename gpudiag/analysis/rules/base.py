"""What every rule family shares: the :class:`Recommendation` a rule returns, the
:class:`RuleContext` it reads, and the evidence lines of the kernels with most time.

Every rule returns at most one :class:`Recommendation` with a stable ``rule_id``, the evidence
(which kernels, ops or API calls, and how much time per measured step), the expected saving per
step with how it was estimated, and how to apply the fix. The report lists them by saving.
Thresholds are gpudiag's choices unless a source is named; each is stated in the rule.

The families (:mod:`~gpudiag.analysis.rules.kernels`, :mod:`~gpudiag.analysis.rules.host`,
:mod:`~gpudiag.analysis.rules.ncu`, :mod:`~gpudiag.analysis.rules.inference`,
:mod:`~gpudiag.analysis.rules.distributed`, :mod:`~gpudiag.analysis.rules.expert`) import this
module; :mod:`~gpudiag.analysis.rules.registry` imports the families. Nothing here imports a family.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from gpudiag.analysis.attribution.families import kernel_label
from gpudiag.analysis.attribution.labels import distinct_labels
from gpudiag.analysis.roofline.peaks import DevicePeaks


@dataclass
class Recommendation:
    rule_id: str
    title: str
    saving_ns_per_step: float
    estimate: str  # how the saving was estimated
    evidence: list[str]
    how_to_fix: str
    saving_percent_of_step: float | None = None
    saving_estimated: bool = True  # False: "not estimated" (0 ns), never silenced for its size
    throughput_gain: dict | None = None  # GD-BATCH-HEADROOM: batch factor -> samples/s factor
    change_estimates: dict | None = None  # trial change -> its own predicted saving (ns/step), costs included
    graph_floor: dict | None = None  # GD-OVERHEAD-BOUND in a loop of forwards: host_floor.graph_floor_ns's inputs
    # The time per step (ns) the rule's evidence covers: a change cannot save more of it, so a trial
    # that saves more is not credited to the rule (gpudiag.trials.ranking.credited); None: the whole step
    covers_ns_per_step: float | None = None


@dataclass
class RuleContext:
    """What the rules look at, all restricted to the measured steps of one process.

    km: kernels with attribution and class columns (duration_ns, name, short_name, family,
    kernel_class, evidence, math_path, efficiency, phase, module, op, op_args, step, grid_*);
    detail: the detail step's kernels (op and op_args set); api: runtime API calls with ``step``;
    memcpy: copies with ``step``; idle: GPU-idle intervals with ``step``, ``host_bound``,
    ``at_step_start`` (idle before the step's first kernel) and, where split
    (:mod:`gpudiag.analysis.steps.host_work`), ``launch_bound_ns`` and ``host_compute_ns``;
    host_stretches: the host-compute stretches inside them (that module's columns); n_steps (steady-state steps);
    step_ns (their mean step time: outlier steps are left out, gpudiag.analysis.steps.outliers);
    peaks; ncu (may be empty); measured_steps (their indices). From the launcher's status and the
    rest of the analysis (defaults: unknown): peak_memory_bytes (step -> bytes), device_memory_bytes,
    cudnn_benchmark, autocast_dtype, compiled (report["compiled"]), candidates (all fusion
    candidates), bare_inflation_ns (profiled - bare median step time)."""

    km: pd.DataFrame
    detail: pd.DataFrame
    api: pd.DataFrame
    memcpy: pd.DataFrame
    idle: pd.DataFrame
    n_steps: int
    step_ns: float
    peaks: DevicePeaks
    ncu: pd.DataFrame = field(default_factory=pd.DataFrame)
    measured_steps: list[int] = field(default_factory=list)
    peak_memory_bytes: dict[int, int] = field(default_factory=dict)
    device_memory_bytes: float | None = None
    cudnn_benchmark: bool | None = None
    autocast_dtype: str | None = None
    compiled: dict | None = None
    candidates: list[dict] = field(default_factory=list)
    bare_inflation_ns: float | None = None
    phase_host_ns: dict[str, float] = field(default_factory=dict)  # phase -> host time per step (gpudiag's ranges)
    outside_modules: dict | None = None  # host_floor.outside_modules: the step's time outside every forward
    inference: dict | None = None  # steps are requests: step_mode, root_parameters (gpudiag.analysis.steps.serving)
    distributed: dict | None = None  # DDP settings and backward() calls per step (gpudiag.analysis.rules.distributed)
    communication_ns: float = 0.0  # collective kernel time per step (the rules see km without collectives)
    collectives: pd.DataFrame = field(default_factory=pd.DataFrame)  # the collective kernels taken out of km
    host_stretches: pd.DataFrame = field(default_factory=pd.DataFrame)  # host_work.split_host_idle's, measured steps


def top_evidence(df: pd.DataFrame, n_steps: int, k: int = 3) -> list[str]:
    """Evidence lines for the ``k`` kernels of ``df`` with most time: label, µs per step, launches
    per step (``n_steps`` measured steps)."""
    g = df.groupby("name").agg(ns=("duration_ns", "sum"), short=("short_name", "first"), launches=("duration_ns", "size"))
    g = g.sort_values("ns", ascending=False).head(k)
    # Listed kernels that share a label (CUTLASS calls every GEMM "Kernel2") get the tokens of their
    # names that tell them apart among these k, the rule the report's tables apply to theirs
    # (gpudiag.renderers.labels).
    labels = distinct_labels({"top_kernels": [{"name": name, "label": kernel_label(name, row.short)}
                                              for name, row in g.iterrows()]})
    return [f"{labels[name]}: {row.ns / n_steps / 1e3:.0f} µs/step ({row.launches / n_steps:.0f} launches)"
            for name, row in g.iterrows()]
