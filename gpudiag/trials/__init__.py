"""Trials: gpudiag applies changes (its top recommendations, then changes no rule predicted that
apply to the run) to the user's script, one at a time, and measures each bare (no profiler) over
a step window, interleaved with runs of the unchanged script.

- :mod:`gpudiag.trials.changes`: the changes, applied inside the user's process by the launcher;
- :mod:`gpudiag.trials.plan`: which changes to try, from the report;
- :mod:`gpudiag.trials.results`: a trial's record from the baseline runs' and the trial runs' statuses;
- :mod:`gpudiag.trials.stats`: the saving, its bootstrap interval, p-value and verdict;
- :mod:`gpudiag.trials.ranking`: the trials joined to the recommendations;
- :mod:`gpudiag.trials.runner`: runs the trials within a time budget.
"""
