"""Options shared by the commands that analyse a capture (``profile`` and ``report``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import click


@dataclass
class AnalysisOptions:
    steps_from: str | None  # None: gpudiag's step ranges, else user ranges named step/iteration
    warmup_steps: int | None  # None: the run's own setting (its status file), else 2


def analysis_options(func):
    """Adds ``--steps-from`` and ``--warmup-steps`` and passes them as one ``options`` argument."""

    @click.option("--steps-from", default=None, metavar="SOURCE",
                  help="Where steps come from: auto, optimizer, forward (each call of the outermost model), "
                       "generate (each generate() call), call (gpudiag.step()), call:package.module.function (each "
                       "call of that function) or nvtx:REGEX (the user's own "
                       "NVTX ranges whose text matches REGEX). auto: gpudiag.step() or step ranges, then the "
                       "optimizer, then generate(), then forward calls.")
    @click.option("--warmup-steps", type=click.IntRange(min=0), default=None,
                  help="Leading steps excluded from the statistics [default: the run's setting, else 2].")
    @functools.wraps(func)
    def wrapper(*args, steps_from, warmup_steps, **kwargs):
        return func(*args, options=AnalysisOptions(steps_from=steps_from, warmup_steps=warmup_steps), **kwargs)

    return wrapper
