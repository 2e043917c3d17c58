"""The statistics of a trial: how much a change saves per step, how sure that is, and when the
answer is "inconclusive".

Inputs are runs: one list of measured step times (ns) per process, for the unchanged script (the
baselines, run interleaved with the trials: :mod:`gpudiag.trials.runner`) and for the changed one.

- saving = median of the pooled baseline steps − median of the pooled trial steps (ns per step);
  the median, as everywhere in gpudiag (METHOD.md: step times after warm-up, median), since step
  times have long right tails (a garbage collection, a host hiccup).
- its 95 % confidence interval: percentile bootstrap (Efron & Tibshirani 1993, *An Introduction
  to the Bootstrap*, ch. 13), steps resampled with replacement within each run, each run keeping
  its number of steps (several samples, each resampled on its own: Davison & Hinkley 1997,
  *Bootstrap Methods and their Application*, ch. 3); :data:`RESAMPLES` resamples, seeded, so a
  report is reproducible from its statuses.
- a two-sided Mann–Whitney U p-value on the pooled steps, the CI gate's test
  (:mod:`gpudiag.analysis.gate`: rank-based, no normality assumed).
- the baselines' spread: max − min of the baseline runs' medians (ns). Resampling steps within
  runs sees only the noise inside a process; a host-bound script also moves between processes (a
  serving loop on the H100 ran 4.89, 7.92 and 6.26 ms per request in three processes,
  docs/inference.md), which no number of steps inside one run reveals.

Verdict (:func:`verdict`): "measured" when the interval excludes zero and the baselines' spread is
smaller than the saving's size; else "inconclusive", with the reason. A slowdown that meets both is
"measured" too (a negative saving).

Early decision (:func:`early_decision`): whether runs still planned for a change (its repeat, the
baseline after it) can be left out. The verdict is always computed from the runs that were made;
this only says when more runs cannot make, or are very unlikely to unmake, a measured win.
"""

from __future__ import annotations

import numpy as np

CONFIDENCE = 0.95
# Bootstrap resamples: Efron & Tibshirani (1993) advise about 1000 or more for the endpoints of a
# percentile interval, against 25-200 for a standard error; 2000 take a few ms per trial.
RESAMPLES = 2000
SEED = 0  # a fixed seed: the same statuses give the same interval in every report
# The early look's interval (:func:`early_decision`): stricter than the verdict's 95 %, as group
# sequential designs spend little of the error rate on an early look (O'Brien & Fleming 1979,
# Biometrics 35:549-556; Jennison & Turnbull 2000, *Group Sequential Methods*, ch. 2).
EARLY_CONFIDENCE = 0.99
# Baseline runs before a win may be decided early: issue 34's server ran 10.9 and 11.9 ms in two
# baselines and 6.57 ms in the third; from the first two, its 6.58 ms trial looked a clear win.
MIN_BASELINES_FOR_WIN = 3
MIN_BASELINES_TO_STOP = 2  # a "no win" needs a spread to be told (one run: "spread unknown")
# Baseline runs before a change's own next run may be left out, whatever the decision: the "no win"
# proof covers baselines to come, not the change's next process, and a change's speed can move
# between its processes (bf16 autocast on ConvNeXt: 26 to 16.5 ms over five, docs/trials_proof.md,
# note 4). A lone change (A B A B A) is therefore always run twice.
MIN_BASELINES_FOR_REPEAT = 3


def pooled_median(runs: list[list[float]]) -> float:
    """The median of all steps of ``runs`` (lists of step times, ns) together. Raises ValueError
    when there is no step."""
    steps = [v for run in runs for v in run]
    if not steps:
        raise ValueError("no measured step to take a median of")
    return float(np.median(steps))


def saving(baselines: list[list[float]], trials: list[list[float]]) -> float:
    """Median baseline step − median trial step, in ns (positive: the change saves time)."""
    return pooled_median(baselines) - pooled_median(trials)


def _resampled_medians(runs: list[list[float]], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """The pooled median of ``resamples`` bootstrap copies of ``runs``: each run's steps drawn with
    replacement, as many as it has (shape ``(resamples,)``)."""
    drawn = []
    for run in runs:
        values = np.asarray(run, dtype=float)
        if values.size:
            drawn.append(values[rng.integers(0, values.size, size=(resamples, values.size))])
    return np.median(np.concatenate(drawn, axis=1), axis=1)


def bootstrap_interval(baselines: list[list[float]], trials: list[list[float]], confidence: float = CONFIDENCE,
                       resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float]:
    """(low, high) percentile-bootstrap interval of :func:`saving`, ns, at ``confidence`` (Efron &
    Tibshirani 1993, ch. 13): the ``(1 − confidence) / 2`` and ``(1 + confidence) / 2`` quantiles
    of the saving over ``resamples`` resamples, steps drawn within each run. Raises ValueError when
    either side has no step."""
    if not any(baselines) or not any(trials):
        raise ValueError("a bootstrap interval needs steps on both sides")
    rng = np.random.default_rng(seed)
    diffs = _resampled_medians(baselines, rng, resamples) - _resampled_medians(trials, rng, resamples)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(diffs, [tail, 1.0 - tail])
    return float(low), float(high)


def p_value(baseline_steps: list[float], trial_steps: list[float]) -> float:
    """Two-sided Mann–Whitney U p-value of two sets of step times (``scipy.stats.mannwhitneyu``),
    as the CI gate computes it (:mod:`gpudiag.analysis.gate`); 1.0 when it cannot be computed
    (fewer than two steps on a side, or every step the same)."""
    from scipy.stats import mannwhitneyu

    a, b = np.asarray(baseline_steps, dtype=float), np.asarray(trial_steps, dtype=float)
    if a.size < 2 or b.size < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0 and a[0] == b[0]):
        return 1.0
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


def run_medians(runs: list[list[float]]) -> list[float]:
    """Each run's median step time (ns), for runs with steps."""
    return [float(np.median(run)) for run in runs if len(run)]


def spread(runs: list[list[float]]) -> tuple[float | None, float | None]:
    """(max − min of the runs' medians in ns, that as a fraction of the smallest median); (None,
    None) for fewer than two runs with steps: one run says nothing of the run-to-run spread."""
    medians = run_medians(runs)
    if len(medians) < 2:
        return None, None
    width = max(medians) - min(medians)
    return width, (width / min(medians) if min(medians) > 0 else None)


def verdict(saving_ns: float, interval_ns: tuple[float, float], spread_ns: float | None) -> tuple[str, str | None]:
    """("measured", None) when the interval excludes zero and the baselines' spread (ns) is
    smaller than ``|saving_ns|``; else ("inconclusive", the reason in words)."""
    low, high = interval_ns
    if low <= 0.0 <= high:
        return "inconclusive", (f"the 95 % interval of the saving, {_ms(low)} to {_ms(high)} ms, includes zero")
    if spread_ns is None:
        return "inconclusive", "one baseline run only: the run-to-run spread of the unchanged script is unknown"
    if spread_ns >= abs(saving_ns):
        return "inconclusive", (f"baselines disagree by {_ms(spread_ns)} ms, more than the saving "
                                f"({_ms(saving_ns)} ms)")
    return "measured", None


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f}"


def compare(baselines: list[list[float]], trials: list[list[float]]) -> dict:
    """Every statistic of one trial (ns): saving_ns, saving_ci_ns [low, high], p_value,
    baseline_runs_ns / trial_runs_ns (each run's median), baseline_spread_ns,
    baseline_spread_percent, verdict ("measured" or "inconclusive"), verdict_reason (None when
    measured). Raises ValueError when either side has no step."""
    value = saving(baselines, trials)
    interval = bootstrap_interval(baselines, trials)
    width, relative = spread(baselines)
    decided, reason = verdict(value, interval, width)
    return {"saving_ns": value, "saving_ci_ns": [interval[0], interval[1]],
            "p_value": p_value([v for r in baselines for v in r], [v for r in trials for v in r]),
            "baseline_runs_ns": run_medians(baselines), "trial_runs_ns": run_medians(trials),
            "baseline_spread_ns": width, "baseline_spread_percent": None if relative is None else 100.0 * relative,
            "verdict": decided, "verdict_reason": reason}


def payback(cost_s: float | None, saving_ns: float, decided: str) -> float | None:
    """Steps (requests, at inference) that repay a one-time cost of ``cost_s`` seconds at
    ``saving_ns`` per step: cost ÷ saving; 0 when the change costs nothing up front; None unless
    the saving is measured (conclusive) and positive."""
    if cost_s is None or decided != "measured" or saving_ns <= 0:
        return None
    return max(cost_s, 0.0) / (saving_ns / 1e9)


def early_decision(baselines: list[list[float]], trials: list[list[float]]) -> str | None:
    """"no win", "win" or None (undecided), from the runs so far (lists of step times, ns).

    - "no win" (from :data:`MIN_BASELINES_TO_STOP` baseline runs): the change's pooled median is
      at or above the fastest baseline run's median ``lo``. No baseline run to come can then make
      it a measured win: a pooled median lies within its runs' medians [lo', hi'] (each run has
      at most half its steps above its own median), so saving' = M' − T ≤ hi' − lo' = spread'
      whenever T ≥ lo ≥ lo'. Slowdowns are all here.
    - "win" (from :data:`MIN_BASELINES_FOR_WIN` baseline runs): the :data:`EARLY_CONFIDENCE`
      interval's low end exceeds (M − lo) + 3 × spread, M the pooled baseline median. A next
      baseline up to one spread beyond the range so far could pull M down by at most
      (M − lo) + spread and double the spread; the interval would still clear it (gpudiag's margin,
      from this bound). A baseline further out than that (issue 34) is what the three runs guard
      against; the verdict of the runs made still decides.
    """
    medians = run_medians(baselines)
    if len(medians) < MIN_BASELINES_TO_STOP or not any(trials):
        return None
    lo, width = min(medians), max(medians) - min(medians)
    if pooled_median(trials) >= lo:
        return "no win"
    if len(medians) < MIN_BASELINES_FOR_WIN:
        return None
    low, _ = bootstrap_interval(baselines, trials, confidence=EARLY_CONFIDENCE)
    return "win" if low > (pooled_median(baselines) - lo) + 3.0 * width else None
