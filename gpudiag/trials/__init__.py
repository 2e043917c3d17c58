"""Trials: gpudiag applies its top recommendations to the user's own script, one at a time, and
measures each change bare (no profiler) over the same step window as the baseline bare run.

- :mod:`gpudiag.trials.changes`: the changes, applied inside the user's process by the launcher;
- :mod:`gpudiag.trials.plan`: which changes to try, from the report's recommendations;
- :mod:`gpudiag.trials.results`: a trial's result from the baseline's and the trial's statuses;
- :mod:`gpudiag.trials.runner`: runs the trials within a time budget and adds them to the report.
"""
