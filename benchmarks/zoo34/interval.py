"""The saving of each hand change, with a 95 % bootstrap interval, from the runs hand.sh made.

    python benchmarks/zoo34/interval.py HAND_DIR [--reps 10000] [--seed 0]

HAND_DIR/runs.tsv (written by hand.sh) lists the runs in the order they ran: ``index``, ``arm``
(``baseline`` or the change's name), ``log`` (file name in HAND_DIR), ``median_ms``, ``rc``. Each
log holds the script's ``STEP_TIMES_MS [...]`` line: the per-step times of that run's measured
steps (CUDA events, after its warm-up).

For each arm: each run's median step time, and the arm's step time = the median of its runs'
medians (runs are separate processes, so run-to-run drift is part of the noise). The saving of a
change = baseline step time - the change's step time (positive: faster), also in % of the
baseline. Its 95 % interval is a two-level (cluster) bootstrap: for each replicate, draw the arm's
runs with replacement, within each drawn run draw its steps with replacement, take each run's
median and the median of those; the interval is the 2.5th and 97.5th percentiles of the
replicates' savings. Also printed: the saving of the pooled per-step medians (all steps of an arm
together), for comparison.

Writes HAND_DIR/interval.json and prints one line per change.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

import numpy as np

STEP_TIMES = re.compile(r"^STEP_TIMES_MS \[([^\]]*)\]", re.M)


def step_times(log: Path) -> list[float] | None:
    """The per-step times a run printed (the last STEP_TIMES_MS line), None when it printed none."""
    try:
        found = STEP_TIMES.findall(log.read_text(errors="replace"))
    except OSError:
        return None
    if not found:
        return None
    values = [float(v) for v in found[-1].replace(",", " ").split()]
    return values or None


def read_runs(hand_dir: Path) -> dict[str, list[list[float]]]:
    """{arm: [per-step times of each of its runs that printed any]}, arms in first-run order."""
    arms: dict[str, list[list[float]]] = {}
    with open(hand_dir / "runs.tsv", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            times = step_times(hand_dir / row["log"])
            arms.setdefault(row["arm"], [])
            if times:
                arms[row["arm"]].append(times)
    return arms


def _arm_replicates(runs: list[list[float]], reps: int, rng: np.random.Generator) -> np.ndarray:
    """``reps`` bootstrap replicates of the arm's step time (median of resampled runs' medians)."""
    run_medians = np.empty((len(runs), reps))
    for i, times in enumerate(runs):
        t = np.asarray(times, dtype=float)
        draws = t[rng.integers(0, len(t), size=(reps, len(t)))]
        run_medians[i] = np.median(draws, axis=1)
    pick = rng.integers(0, len(runs), size=(reps, len(runs)))
    return np.median(run_medians[pick, np.arange(reps)[:, None]], axis=1)


def arm_time(runs: list[list[float]]) -> float:
    return float(np.median([np.median(r) for r in runs]))


def compare(baseline: list[list[float]], change: list[list[float]], reps: int = 10000, seed: int = 0) -> dict:
    """Saving of ``change`` against ``baseline`` (lists of runs' per-step times), ms and % with 95 % intervals."""
    rng = np.random.default_rng(seed)
    a, b = arm_time(baseline), arm_time(change)
    ra, rb = _arm_replicates(baseline, reps, rng), _arm_replicates(change, reps, rng)
    saving, percent = ra - rb, 100.0 * (ra - rb) / ra
    pooled_a, pooled_b = float(np.median(np.concatenate(baseline))), float(np.median(np.concatenate(change)))
    return {
        "baseline_ms": a, "change_ms": b,
        "saving_ms": a - b, "saving_ms_ci95": [float(np.percentile(saving, 2.5)), float(np.percentile(saving, 97.5))],
        "saving_percent": 100.0 * (a - b) / a,
        "saving_percent_ci95": [float(np.percentile(percent, 2.5)), float(np.percentile(percent, 97.5))],
        "pooled_saving_ms": pooled_a - pooled_b,
        "baseline_runs": len(baseline), "change_runs": len(change),
        "baseline_run_medians_ms": [float(np.median(r)) for r in baseline],
        "change_run_medians_ms": [float(np.median(r)) for r in change],
        "steps_per_run": sorted({len(r) for r in baseline + change}),
        "method": "median of runs' medians; 95 % interval: two-level bootstrap (runs, then steps within runs), "
                  f"{reps} replicates",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hand_dir", type=Path)
    parser.add_argument("--reps", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    arms = read_runs(args.hand_dir)
    baseline = arms.pop("baseline", [])
    result = {"hand_dir": str(args.hand_dir), "changes": {}}
    if not baseline:
        print(f"{args.hand_dir}: no baseline run printed STEP_TIMES_MS", file=sys.stderr)
    for arm, runs in arms.items():
        if not baseline or not runs:
            result["changes"][arm] = {"error": "no runs with step times" + ("" if baseline else " in the baseline")}
            print(f"{arm}: not computed ({result['changes'][arm]['error']})")
            continue
        r = result["changes"][arm] = compare(baseline, runs, args.reps, args.seed)
        lo, hi = r["saving_ms_ci95"]
        plo, phi = r["saving_percent_ci95"]
        print(f"{arm}: baseline {r['baseline_ms']:.3f} ms -> {r['change_ms']:.3f} ms; saving {r['saving_ms']:.3f} ms "
              f"[{lo:.3f}, {hi:.3f}] = {r['saving_percent']:.1f} % [{plo:.1f}, {phi:.1f}] "
              f"({r['baseline_runs']}+{r['change_runs']} runs; pooled-steps saving {r['pooled_saving_ms']:.3f} ms)")
    (args.hand_dir / "interval.json").write_text(json.dumps(result, indent=1))
    return 0 if baseline and all("error" not in v for v in result["changes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
