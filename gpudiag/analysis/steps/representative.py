"""How representative the profile is: step times under the profiler vs without it, and the
overhead-bound numbers corrected for the difference (the comparison is here; the corrections, made
after the rules, are :mod:`gpudiag.analysis.findings.bare_run`).

Tracing every CUDA API call costs host time (measured on the H200: a compiled HF BERT step
23.8 ms bare, ~39 ms under ``nsys profile``; GPU-bound ResNet-50 steps ~1 %; shared/design.md). In
a host-bound step that host time becomes GPU idle with an empty launch queue, which is exactly what
the overhead-bound verdict measures. ``gpudiag profile`` therefore runs the script a second time
without nsys, NVTX or module hooks (:func:`gpudiag.capture.run.capture_bare`) and records each
step's GPU time (CUDA events recorded at the step boundaries, never waited on: ``step_gpu_ns``)
and host wall-clock time (``step_wall_ns``) in both runs.

Method (docs/representativeness.md): inflation = median profiled step time - median bare step
time, over the measured steps both runs completed (same step indices, same boundaries, CUDA
events where both runs have them, else host wall-clock time). Host-bound idle can shrink by at most the host time tracing added, so the
corrected host-bound idle is max(0, host-bound idle - inflation), and GD-OVERHEAD-BOUND is
re-judged on it against the bare step time; when it no longer passes its threshold it moves to
``suppressed`` with the reason. Other numbers are GPU times (kernel durations change ~1 % under
tracing) and stay as measured, flagged when the inflation exceeds 5 %.
"""

from __future__ import annotations

import numpy as np

from gpudiag.script_status import ScriptStatus


def _measured_ids(report: dict) -> list[int]:
    return [int(s["step"]) for s in report["steps"]["per_step"] if s.get("measured")]


STEP_KEYS = ("step_gpu_ns", "step_wall_ns")  # a launcher status's per-step times, best method first


def step_times(status: ScriptStatus | dict) -> tuple[list[float], str]:
    """(measured step times in ns, method) of one launcher status: steps at or after its
    ``warmup_steps``, within its window when it had one; CUDA events at the step boundaries
    (``step_gpu_ns``) where the status has them, else host wall-clock time (``step_wall_ns``).
    Read by the ranks' bare runs (:mod:`gpudiag.analysis.ranks.processes`) and by the trials
    (:mod:`gpudiag.trials.results`). Raises :class:`gpudiag.errors.UserError` for a dict that is no status."""
    status = ScriptStatus.of(status)
    warmup = int(status.warmup_steps or 0)
    last = None if status.window_steps is None else warmup + int(status.window_steps) - 1
    for key, method in zip(STEP_KEYS, ("CUDA events", "host wall-clock time")):
        times = [float(v) for k, v in (getattr(status, key) or {}).items()
                 if int(k) >= warmup and (last is None or int(k) <= last) and v and v > 0]
        if times:
            return times, method
    return [], ""


def _times(status: ScriptStatus | None, ids: list[int], key: str) -> dict[int, float]:
    times = (getattr(status, key) if status is not None else None) or {}
    return {i: float(times[str(i)]) for i in ids if str(i) in times and times[str(i)] > 0}


def _paired(status: ScriptStatus, bare_status: ScriptStatus, ids: list[int]) -> tuple[dict, dict, str]:
    """Per-step times of both runs by the best method both have: CUDA events at the step
    boundaries (GPU time, right even when the host runs ahead), else host wall-clock time."""
    for key, method in (("step_gpu_ns", "CUDA events recorded (never waited on) at the same step boundaries"),
                        ("step_wall_ns", "host wall-clock time between the same step boundaries")):
        profiled, bare = _times(status, ids, key), _times(bare_status, ids, key)
        if set(profiled) & set(bare):
            return profiled, bare, method
    return {}, {}, ""


def compare_bare(report: dict) -> dict | None:
    """Bare vs profiled step time of ``report`` (whose ``script`` holds the launcher's status with
    ``step_wall_ns`` and ``bare_run``). Returns None when no bare run was made, else a dict with
    ``bare_step_time_ns`` / ``profiled_step_time_ns`` (medians, ns), ``inflation_ns``,
    ``inflation_percent``, ``steps_compared`` and ``bare_samples_ns`` (one per compared step), or
    with ``unavailable`` (the reason) when the two runs share no measured step."""
    status = ScriptStatus.of(report.get("script") or {})
    bare_status = status.bare_run
    if bare_status is None:
        return None
    ids = _measured_ids(report)
    profiled, bare, method = _paired(status, bare_status, ids)
    common = sorted(set(profiled) & set(bare))
    if not common:
        return {"unavailable": "the run without the profiler completed none of the measured steps "
                               f"(exit code {bare_status.exit_code}; see gpudiag.log)"}
    bare_med = float(np.median([bare[i] for i in common]))
    prof_med = float(np.median([profiled[i] for i in common]))
    return {
        "bare_step_time_ns": bare_med,
        "profiled_step_time_ns": prof_med,
        "inflation_ns": prof_med - bare_med,
        "inflation_percent": 100.0 * (prof_med - bare_med) / bare_med,
        "steps_compared": common,
        "bare_samples_ns": [bare[i] for i in common],
        # per-step savings are means over the steady state: their share is of the mean bare step
        # (a loader that keeps up with every other batch alternates 15 and 75 ms steps: median 15 ms)
        "bare_mean_step_time_ns": float(np.mean([bare[i] for i in common])),
        "method": f"{method}, median over the measured steps both runs completed (docs/representativeness.md)",
    }
