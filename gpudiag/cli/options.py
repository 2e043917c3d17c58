"""Options shared by the commands that analyse a capture (``profile`` and ``report``)."""

from __future__ import annotations

import functools
import re

import click

from gpudiag.app.options import DEFAULT_WORKER_MEMORY, AnalysisOptions


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


_BYTES = re.compile(r"^\s*\d+(\.\d+)?\s*([kmgtp]i?b?|b)?\s*$", re.IGNORECASE)


def _memory(ctx, param, value: str | None) -> str | None:
    if value is not None and not _BYTES.match(value):
        raise click.BadParameter(f"{value!r}: a size such as 4GiB, 500MB or 2000000000 (bytes)")
    return value


def rank_options(func):
    """Adds ``--scheduler`` and ``--worker-memory`` (where the ranks of a several-process job are
    analysed: Dask) to a command that takes ``options``, and sets them on it."""

    @click.option("--scheduler", default=None, metavar="ADDRESS",
                  help="Analyse the ranks on this running dask.distributed cluster (tcp://HOST:8786); its workers "
                       "must see the output folder's run.sqlite at the same path [default: a local Dask cluster of "
                       "processes, one per CPU; without Dask installed, a local process pool].")
    @click.option("--worker-memory", default=DEFAULT_WORKER_MEMORY, show_default=True, callback=_memory, metavar="SIZE",
                  help="Memory limit of each local Dask worker; a worker analyses one rank at a time, and the "
                       "number of workers is cut to what fits in the machine's memory.")
    @functools.wraps(func)
    def wrapper(*args, scheduler, worker_memory, options, **kwargs):
        options.dask, options.scheduler, options.worker_memory = True, scheduler, worker_memory
        return func(*args, options=options, **kwargs)

    return wrapper
