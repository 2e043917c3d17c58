"""Running the trials: a fresh baseline bare run, then one bare run per change, each over the
trial window, within the ``--try-budget``; one progress line each on the terminal.

The baseline is run again just before the trials rather than taken from the first bare run:
measured on the H100, runs started right after an nsys capture were 14-56 % slower than the same
script run before it (docs/notes/measurements.md), and the trials run after the capture.
"""

from __future__ import annotations

import dataclasses
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
    """Run the baseline and each chosen change (:func:`gpudiag.trials.plan.choose`) bare; returns
    the trial records (:func:`results.trial_result`). Never raises for a failing trial; Ctrl-C
    raises :class:`~gpudiag.capture.toolrun.Interrupted` after the running trial stopped."""
    start = time.monotonic()
    echo(f"[try] baseline: the script bare over {trial_config(config, None).window_steps} steps after "
         f"{trial_config(config, None).warmup_steps} warm-up steps (--try none skips the trials)")
    code, baseline = run_bare(script, script_args, run_dir, trial_config(config, None), "trial_baseline.json",
                              timeout_s=budget_s)
    if not results.step_times(baseline)[0]:
        echo(f"[try] no trials: the baseline run measured no steps (exit code {code}; see {run_dir / 'gpudiag.log'})")
        return [results.trial_result(c, baseline, {}, None, 0.0) | {"status": "skipped",
                "error": "the baseline run measured no steps"} for c in chosen]
    comparable = results.deterministic(baseline, profiled_status)
    out = []
    for i, entry in enumerate(chosen, 1):
        left = budget_s - (time.monotonic() - start)
        if left <= 5:
            out.append(results.trial_result(entry, baseline, {}, None, 0.0) | {
                "status": "over budget", "error": f"the --try-budget of {budget_s:.0f} s was spent before it"})
        else:
            began = time.monotonic()
            code, status = run_bare(script, script_args, run_dir, trial_config(config, entry["change"]),
                                    f"trial_{entry['change']}.json", timeout_s=left)
            elapsed = time.monotonic() - began
            out.append(results.trial_result(entry, baseline, status, code, elapsed, timed_out=elapsed >= left,
                                            comparable=comparable, autocast_dtype=profiled_status.get("autocast_dtype")))
        echo(progress_line(i, len(chosen), out[-1]))
    return out
