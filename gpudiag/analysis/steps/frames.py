"""The frames every later stage reads, per step: the step table with its warm-up, detail, measured
and outlier flags, the GPU activities with their step, the kernel frame (attribution, class and
launch statistics side by side) and the API calls of the measured steps.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from gpudiag.analysis.attribution.ranges import Steps, run_flags, window_index
from gpudiag.analysis.ingest import Tables
from gpudiag.analysis.steps import outliers
from gpudiag.analysis.steps.launches import in_measured_steps
from gpudiag.analysis.steps.timeline import gpu_activities, step_table
from gpudiag.script_status import ScriptStatus


# What made gpudiag's step ranges, by the launcher's step_mode (gpudiag.capture.instrument).
STEP_SOURCES = {"optimizer": "optimizer.step()", "call": "gpudiag.step() or --steps-from call:",
                "forward": "calls of the outermost module", "generate": "generate() calls"}


def named_source(steps: Steps, status: ScriptStatus | dict | None) -> Steps:
    """``steps`` with the launcher's own step source named where its status recorded one: a
    generate() loop's steps are not "optimizer.step() or gpudiag.step()"."""
    mode = (ScriptStatus.of(status) or ScriptStatus()).step_mode
    if steps.kind != "gpudiag" or mode not in STEP_SOURCES:
        return steps
    return dataclasses.replace(steps, source=steps.source.replace("optimizer.step() or gpudiag.step()",
                                                                  STEP_SOURCES[mode]))


def detail_step(status: ScriptStatus | dict | None, attribution: pd.DataFrame) -> int | None:
    """The step recorded with per-op ranges: the launcher's, else the step most op calls fall in."""
    detail_step = (ScriptStatus.of(status) or ScriptStatus()).detail_step
    if detail_step is None and (attribution["op_call"] >= 0).any():
        detail_step = int(attribution.loc[attribution["op_call"] >= 0, "step"].mode().iloc[0])
    return detail_step


def activities(t: Tables, steps: Steps, attribution: pd.DataFrame | None = None) -> pd.DataFrame:
    """Kernels, copies and memsets (:func:`gpu_activities`) with ``step``: the step window holding
    the launch call (-1 for none; the GPU start where the whole capture is one step). The kernels'
    launch calls are taken from ``attribution`` (one row per kernel) when given."""
    activities = gpu_activities(t.kernels, t.memcpy, t.memset, t.runtime_api,
                                attribution[["api_start_ns", "api_end_ns", "api_tid"]] if attribution is not None else None)
    when = activities["api_start_ns"].to_numpy(dtype=float)
    if steps.kind == "whole":
        when = np.where(np.isnan(when), activities["start_ns"].to_numpy(dtype=float), when)
    widx = window_index(steps.table["start_ns"].to_numpy(), steps.table["end_ns"].to_numpy(), when)
    activities["step"] = np.where(widx >= 0, steps.table["step"].to_numpy()[np.maximum(widx, 0)], -1)
    return activities


def step_frame(steps: Steps, activities: pd.DataFrame, warmup_steps: int, detail_step: int | None,
                warnings: list[str]) -> pd.DataFrame:
    """The step table (:func:`step_table`: times in ns) with the warm-up, detail, measured and
    outlier flags."""
    # several launcher runs in one capture: each run has its own warm-up and detail step
    st = outliers.flag_outliers(run_flags(step_table(steps.table, activities, warmup_steps, detail_step), steps,
                                          warmup_steps, detail_step))
    if len(st) and not st["warmup"].any() and warmup_steps > 0:
        warnings.append(f"only {len(st)} step(s), not more than the {warmup_steps} warm-up steps: "
                        "the statistics include them (capture more steps, or lower --warmup-steps)")
    return st


def kernel_frame(kernels: pd.DataFrame, attribution: pd.DataFrame, classes: pd.DataFrame,
                  launches: pd.DataFrame) -> pd.DataFrame:
    """``kernels`` with their attribution, classification and launch statistics (queue delay, ns).
    The three frames have one row per kernel, in the same order."""
    # Columns are moved over as they are, indexed like ``kernels``: to_numpy() would turn each text
    # column into Python objects and pandas would turn them back (1.87 s of 1 M kernels, 0.01 s now)
    k = kernels.assign(**{c: attribution[c].set_axis(kernels.index) for c in (
                              "step", "phase", "module", "module_class", "op", "op_args", "op_call", "graph", "api_start_ns")},
                       **{c: classes[c].set_axis(kernels.index) for c in (
                              "family", "kernel_class", "evidence", "intensity", "ridge", "efficiency", "config_key", "flop",
                              "bytes", "math_path", "achieved_flop_per_s", "achieved_bytes_per_s", "basis",
                              "confidence") if c in classes})
    k["queue_delay_ns"] = launches["queue_delay_ns"].to_numpy()
    k["shorter_than_launch"] = launches["shorter_than_launch"].to_numpy()
    return k


# The columns of the API calls the measured steps' readers use (the rules, the host floor, the
# launch counts): return_value and global_pid are left out of the copy (5 M kernels: 13.5 M calls,
# 0.6 GiB copied with every column; docs/scale.md).
MEASURED_API_COLUMNS = ["start_ns", "end_ns", "global_tid", "correlation_id", "name"]


def measured_api(runtime_api: pd.DataFrame, steps: Steps, measured_ids: set) -> pd.DataFrame:
    """The API calls of the measured steps (columns :data:`MEASURED_API_COLUMNS` where present,
    times in ns), with ``step``."""
    # API calls of the measured steps, once: the rules and the launch counts both read them
    if runtime_api.empty:
        return runtime_api
    api = runtime_api[[c for c in MEASURED_API_COLUMNS if c in runtime_api]]
    start = api["start_ns"]  # int64 as is (window_index compares slices as floats): no float copy of every call
    return in_measured_steps(api, start.to_numpy() if start.dtype == np.int64 else start.to_numpy(dtype=float),
                             steps.table, measured_ids)


def micro_batches(status: ScriptStatus | dict | None, steps: Steps, measured_ids: set) -> dict | None:
    """What one step holds, from the launcher's counts (:func:`gpudiag.capture.training_steps.
    micro_batches`), medians over the measured steps that have them: ``per_step`` (k: an optimizer
    step over k micro-batches, gradient accumulation when k > 1), ``closure_evaluations`` (closures
    ``optimizer.step(closure)`` ran: Lightning's automatic optimization, LBFGS) and
    ``optimizer_calls``. None when the status has no counts for the measured steps (an export made
    without gpudiag), or when the steps are not the launcher's optimizer steps numbered as it
    numbered them (``--steps-from``, the user's own step ranges, several runs in one capture)."""
    status = ScriptStatus.of(status) or ScriptStatus()
    if steps.kind != "gpudiag" or steps.runs is not None or status.step_mode != "optimizer":
        return None
    def median_of(key: str) -> float | None:
        values = [v for k, v in (getattr(status, key) or {}).items() if int(k) in measured_ids]
        return float(np.median(values)) if values else None

    per_step = median_of("micro_batches")
    if per_step is None:
        return None
    return {"per_step": per_step, "closure_evaluations": median_of("closure_calls") or 0.0,
            "optimizer_calls": median_of("optimizer_calls")}
