"""Running the trials: a fresh baseline bare run, then one bare run per change, each over the
trial window, within the ``--try-budget``; one progress line each on the terminal.

The baseline is run just before the trials and once more after them, when the budget allows: the
first process started after an nsys capture runs slow (H100, 2026-11-25, a host-bound generate
loop: 250 ms before the capture, 384 ms in the first run after it, 260 ms in the next;
benchmarks/probes/after_nsys_slowdown.sh). The trials compare with the later baseline when the
two differ by more than :data:`BASELINE_DRIFT`, else with both runs' steps together.
"""

from __future__ import annotations

import dataclasses
import shlex
import statistics
import time
from pathlib import Path

from gpudiag.capture.instrument import CaptureConfig
from gpudiag.capture.run import run_bare
from gpudiag.trials import results

TRIAL_WINDOW_STEPS = 10  # measured steps per trial: "warm-up plus a few measured steps"
# Warm-up steps for compiled changes: step 0 runs eager (the root is compiled at its first call),
# step 1 compiles, and CUDA graph trees record on a later call before they replay
# (torch.compile's cudagraph_trees: warm-up run, record, then replay).
COMPILE_WARMUP_STEPS = 4
DEFAULT_BUDGET_S = 300.0
BASELINE_DRIFT = 0.10  # relative difference of the two baseline medians taken as a drift (gpudiag's choice)


def _bare(*args, **kwargs) -> tuple[int, dict]:
    """:func:`run_bare`, its status read as one process's (a launched job's ranks merged)."""
    code, status = run_bare(*args, **kwargs)
    return code, results.job_view(status)


def trial_config(config: CaptureConfig, change: str | None) -> CaptureConfig:
    """The bare config of a trial (``change``) or of its baseline (None): the capture's warm-up
    (at least :data:`COMPILE_WARMUP_STEPS` for every run, so all compare the same steps) and a
    window of at most :data:`TRIAL_WINDOW_STEPS`."""
    window = min(config.window_steps or TRIAL_WINDOW_STEPS, TRIAL_WINDOW_STEPS)
    return dataclasses.replace(config, bare=True, capture_range=False, run_to_end=False, trial=change,
                               warmup_steps=max(config.warmup_steps, COMPILE_WARMUP_STEPS), window_steps=window,
                               detail_step=None)


def _ms(ns) -> str:
    return "–" if ns is None else f"{ns / 1e6:.2f} ms"


def progress_line(i: int, n: int, result: dict) -> str:
    """``[try 1/3] compile: 31.20 -> 17.00 ms/step (-45.5 %); predicted -28.50 ms`` or the reason."""
    head = f"[try {i}/{n}] {result['change']}: "
    if result.get("saving_ns") is None:
        return head + f"{result['status']} ({result.get('error') or ''})"
    predicted = result.get("predicted_saving_ns")
    tail = f"; predicted -{_ms(predicted)}" if predicted is not None else ""
    flag = " CHANGES RESULTS" if result["status"] == "changes results" else ""
    return (head + f"{_ms(result['baseline_step_ns'])} -> {_ms(result['trial_step_ns'])}/step "
            f"({-result['saving_percent']:+.1f} %){tail}{flag}")


def run_trials(script: Path | str, script_args: list[str], run_dir: Path, config: CaptureConfig, chosen: list[dict],
               profiled_status: dict, budget_s: float = DEFAULT_BUDGET_S, echo=print) -> list[dict]:
    """Run the baseline, each chosen change (:func:`gpudiag.trials.plan.choose`) and the baseline
    again, bare; returns the trial records (:func:`results.trial_result`), compared with
    :func:`reference_baseline`. One progress line per run. Never raises for a failing trial;
    Ctrl-C raises :class:`~gpudiag.capture.toolrun.Interrupted` after the running trial stopped."""
    start = time.monotonic()
    base_config = trial_config(config, None)
    echo(f"[try] baseline: the script bare over {base_config.window_steps} steps after {base_config.warmup_steps} "
         "warm-up steps (--try none skips the trials)")
    code, baseline = _bare(script, script_args, run_dir, base_config, "trial_baseline.json", timeout_s=budget_s)
    if not results.step_times(baseline)[0]:
        echo(f"[try] no trials: the baseline run measured no steps (exit code {code}; see {run_dir / 'gpudiag.log'})")
        return [results.trial_result(c, baseline, {}, None, 0.0) | {"status": "skipped",
                "error": "the baseline run measured no steps"} for c in chosen]
    comparable = results.deterministic(baseline, profiled_status)
    runs = []
    for i, entry in enumerate(chosen, 1):
        left = budget_s - (time.monotonic() - start)
        if left <= 5:
            runs.append((entry, None, None, 0.0, False))
            echo(f"[try {i}/{len(chosen)}] {entry['change']}: over budget (--try-budget {budget_s:.0f} s)")
            continue
        began = time.monotonic()
        change = entry["change"]
        is_args = change.startswith("args:")
        code, status = _bare(script, shlex.split(change[5:]) if is_args else script_args, run_dir,
                                trial_config(config, None if is_args else change),
                                f"trial_{'args' if is_args else change}.json", timeout_s=left)
        elapsed = time.monotonic() - began
        runs.append((entry, status, code, elapsed, elapsed >= left))
        echo(progress_line(i, len(chosen), results.trial_result(
            entry, baseline, status, code, elapsed, timed_out=elapsed >= left, comparable=comparable,
            autocast_dtype=profiled_status.get("autocast_dtype"))))
    later = _second_baseline(script, script_args, run_dir, config, budget_s - (time.monotonic() - start))
    reference, note = reference_baseline(baseline, later)
    if comparable is None and later is not None:  # inference: the two baselines' outputs say it
        diff = results.output_difference(baseline, later)
        comparable = None if diff is None else diff["relative"] <= results.TOLERANCE["fp32"]
    echo(f"[try] {note}")
    runs_ns = unchanged_runs(profiled_status.get("bare_run"), baseline, later)
    spread = (max(runs_ns) - min(runs_ns)) / min(runs_ns) if len(runs_ns) > 1 and min(runs_ns) > 0 else None
    if spread is not None and spread > BASELINE_DRIFT:
        echo(f"[try] the unchanged script measured {' / '.join(f'{v / 1e6:.2f}' for v in runs_ns)} ms in separate "
             f"runs ({100 * spread:.0f} % apart): a saving smaller than that spread is run-to-run noise")
    records = []
    for entry, status, code, elapsed, timed_out in runs:
        if status is None:
            record = results.trial_result(entry, reference, {}, None, 0.0) | {
                "status": "over budget", "error": f"the --try-budget of {budget_s:.0f} s was spent before it"}
        else:
            record = results.trial_result(entry, reference, status, code, elapsed, timed_out=timed_out,
                                          comparable=comparable,
                                          autocast_dtype=profiled_status.get("autocast_dtype"))
        records.append(record | {"baseline_note": note} | spread_fields(record, runs_ns, spread))
    return records


def unchanged_runs(bare: dict | None, first: dict, later: dict | None) -> list[float]:
    """Median step time (ns) of each run of the unchanged script: the bare run made before the
    capture, the trials' baseline and the baseline after them, where each measured steps."""
    out = []
    for status in (results.job_view(bare or {}), first, later):
        times = results.step_times(status or {})[0] if status else []
        if times:
            out.append(statistics.median(times))
    return out


def spread_fields(record: dict, runs_ns: list[float], spread: float | None) -> dict:
    """``baseline_runs_ns`` and ``within_spread``: whether the trial's saving is smaller than the
    spread between runs of the unchanged script (METHOD.md: time the same version twice; a
    difference smaller than that spread is noise). Measured on the H100, 2026-11-25: a host-bound
    serving loop ran 4.89, 7.92 and 6.26 ms per request in three processes (docs/inference.md)."""
    saving = record.get("saving_percent")
    within = None if spread is None or saving is None or record.get("per") == "sample" else abs(saving) < 100 * spread
    return {"baseline_runs_ns": runs_ns, "baseline_spread_percent": None if spread is None else 100 * spread,
            "within_spread": within}


def _second_baseline(script, script_args, run_dir, config, left_s: float) -> dict | None:
    """The baseline once more after the trials, when at least a minute of the budget is left."""
    if left_s < 60:
        return None
    _code, status = _bare(script, script_args, run_dir, trial_config(config, None), "trial_baseline_after.json",
                             timeout_s=left_s)
    return status if results.step_times(status)[0] else None


def reference_baseline(first: dict, later: dict | None) -> tuple[dict, str]:
    """The baseline the trials compare with, and a note saying which: the later run when the two
    medians differ by more than :data:`BASELINE_DRIFT` (the first run after a capture runs slow),
    else both runs' measured steps together (a status with those step times, the first's losses)."""
    if later is None:
        return first, "one baseline run, before the trials"
    (times_a, key), (times_b, _) = results.step_times(first), results.step_times(later)
    a, b = statistics.median(times_a), statistics.median(times_b)
    if abs(a - b) > BASELINE_DRIFT * b:
        return later, (f"baseline before the trials {a / 1e6:.2f} ms, after them {b / 1e6:.2f} ms: "
                       "the later one is used (the first run after a capture runs slow)")
    field = "step_gpu_ns" if key == "CUDA events" else "step_wall_ns"
    pooled = {"warmup_steps": 0, "window_steps": None, "losses": first.get("losses") or {},
              "outputs": first.get("outputs") or {},
              "samples_per_step": first.get("samples_per_step"),
              field: {str(i): v for i, v in enumerate([*times_a, *times_b])}}
    return pooled, f"baselines before and after the trials ({a / 1e6:.2f} / {b / 1e6:.2f} ms), their steps together"
