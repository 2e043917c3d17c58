"""The default ``--try-budget``, in a module of its own: the CLI reads it for its help without
importing the trials' statistics (numpy), so ``gpudiag --help`` stays light."""

# With the profile's ~45 s, a script of 50 ms steps is done in about 3 minutes (issue 45's goal):
# about 10 runs of ~12 s each (start-up, warm-up, window; benchmarks/trial_wall.py), the top
# predicted changes and one or two generic ones; report.json's trials_budget says what it bought.
DEFAULT_BUDGET_S = 135.0
