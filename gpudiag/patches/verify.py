"""A patch verified by running it: the patched copy of the script's folder runs bare, interleaved
with the unchanged script (A B A B A), with the trials' launcher config, window and statistics
(:func:`gpudiag.trials.runner.trial_config`, :func:`gpudiag.trials.results.trial_result`), and
its saving is set against the trial's (docs/patches.md, "Verification").
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from gpudiag.capture.run import run_bare
from gpudiag.patches.make import CHANGES_DIR, Patch
from gpudiag.trials import results
from gpudiag.trials.runner import MIN_LEFT_S, rank0_decides, runs_agree, trial_config

ORDER = ("baseline", "patched", "baseline", "patched", "baseline")  # A B A B A: as a lone trial runs
VERIFIED = "verified"
NOT_VERIFIED = "not verified"


def scratch_copy(patch: Patch, run_dir: Path) -> Path:
    """``RUN_DIR/changes/<change>/src``: the script's folder with the patched files written, its
    other ``.py`` files copied (the script imports them from its own folder) and every other entry
    linked (data the script finds next to itself). Returns the folder."""
    source = Path(patch.script_dir)
    dest = Path(run_dir) / CHANGES_DIR / patch.change / "src"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    patched = {f["path"]: f["after"] for f in patch.files}
    for entry in source.iterdir():
        target = dest / entry.name
        if entry.name in patched:
            target.write_text(patched[entry.name], encoding="utf-8", newline="")
        elif entry.suffix == ".py" and entry.is_file():
            shutil.copy2(entry, target)
        else:
            os.symlink(entry.resolve(), target)
    return dest


def _percent_interval(record: dict) -> list[float] | None:
    ci, base = record.get("saving_ci_ns"), record.get("baseline_step_ns")
    if not ci or not base:
        return None
    return [100.0 * ci[0] / base, 100.0 * ci[1] / base]


def judge(patched: dict, trial: dict) -> tuple[str, str]:
    """(status, why in words) of a patch from its runs' record ``patched`` and the trial's record,
    both :func:`gpudiag.trials.results.trial_result` records: "verified" when the patched runs
    measured a saving whose interval lies above zero and not below the trial's (as % of each one's
    baseline step: overlapping it, or above it, which the reason says); else "failed", "changes
    results", "slower", "inconclusive" or "saves less than its trial"."""
    state = patched.get("status")
    if state in ("failed", "over budget", "not applicable", "skipped"):
        return "failed", patched.get("error") or state
    if state == "changes results":
        return "changes results", "the patched script's results differ from the unchanged script's beyond the tolerance"
    mine, theirs = _percent_interval(patched), _percent_interval(trial)
    if mine is None:
        return "failed", "the patched runs measured no saving"
    text = f"[{mine[0]:.1f}, {mine[1]:.1f}] %"
    against = f" against the trial's [{theirs[0]:.1f}, {theirs[1]:.1f}] %" if theirs else ""
    if mine[1] < 0.0:
        return "slower", f"the patched script is slower: {text}"
    if mine[0] <= 0.0 or state != "measured":
        return "inconclusive", f"the patched saving {text} is not told from zero" + (
            f" ({patched['verdict_reason']})" if patched.get("verdict_reason") else "")
    if theirs is not None and mine[1] < theirs[0]:
        return "saves less than its trial", text + against
    if theirs is not None and mine[0] > theirs[1]:
        # more than the trial measured is no reason to distrust the patch (issue 46: a patch is never
        # verified when it fails, changes results or saves less); said, not hidden
        return VERIFIED, f"{text}, more than the trial's [{theirs[0]:.1f}, {theirs[1]:.1f}] %"
    return VERIFIED, text + against


def verify(patch: Patch, script: Path | str, script_args: list[str], run_dir: Path, config, trial: dict,
           budget_s: float, echo=print, autocast_dtype: str | None = None) -> dict:
    """Run the patched copy against the unchanged script (:data:`ORDER`) within ``budget_s``
    seconds and return the verification: status (:func:`judge`), why, saving_percent and
    saving_ci_percent of the patched runs, the trial's, runs made, and the patched runs' record.
    Never raises for a failing run."""
    run_dir = Path(run_dir)
    copy = scratch_copy(patch, run_dir) / Path(script).name
    bare = trial_config(config, None)
    started = time.monotonic()
    runs: dict[str, list] = {"baseline": [], "patched": []}
    codes, longest = [], 0.0
    for n, kind in enumerate(ORDER):
        left = budget_s - (time.monotonic() - started)
        # under torchrun each rank's gpudiag verifies too: every rank stops where rank 0 stops
        if rank0_decides(f"verify-{patch.change}-{n}", ("budget", {}) if left <= max(MIN_LEFT_S, 0.75 * longest)
                         else None):
            echo(f"[patch] {patch.change}: the verification budget ran out after {n} runs")
            break
        began = time.monotonic()
        code, status = run_bare(copy if kind == "patched" else script, script_args, run_dir, bare,
                                f"patch_{patch.change}_{n + 1}_{kind}.json", timeout_s=left)
        longest = max(longest, time.monotonic() - began)
        runs[kind].append(results.job_view(status))
        if kind == "patched":
            codes.append(code)
        times = results.step_times(results.job_view(status))[0]
        echo(f"[patch] {patch.change}: {'patched' if kind == 'patched' else 'unchanged'} script, "
             + (f"{sorted(times)[len(times) // 2] / 1e6:.2f} ms/step" if times else f"no measured steps (exit code {code})"))
    entry = {"change": patch.change, "rule_id": None, "origin": "patch", "predicted_saving_ns": None}
    usable = [s for s in runs["baseline"] if results.step_times(s)[0]]
    if not runs["patched"] or not usable:
        return {"status": NOT_VERIFIED if not runs["patched"] else "failed",
                "why": "no patched run was made" if not runs["patched"] else "the unchanged script measured no steps",
                "runs": {k: len(v) for k, v in runs.items()}}
    record = results.trial_result(entry, usable, runs["patched"], codes[-1], time.monotonic() - started,
                                  comparable=bool(runs_agree(usable, {})),
                                  autocast_dtype=autocast_dtype)
    status, why = judge(record, trial)
    return {"status": status, "why": why, "saving_percent": record.get("saving_percent"),
            "saving_ci_percent": _percent_interval(record), "trial_saving_percent": trial.get("saving_percent"),
            "trial_ci_percent": _percent_interval(trial), "runs": {k: len(v) for k, v in runs.items()},
            "record": {k: record.get(k) for k in ("status", "baseline_step_ns", "trial_step_ns", "saving_ns",
                                                   "saving_ci_ns", "verdict", "verdict_reason", "result_difference",
                                                   "error", "method")}}
