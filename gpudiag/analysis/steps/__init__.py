"""Stage 4: the step table, GPU idle, launches, per-step statistics, outlier steps, the bare run
and the per-request reading of inference runs."""
