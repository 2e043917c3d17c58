"""The options shared by the workflows that analyse a capture (profile, report, the library)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_WORKER_MEMORY = "4GiB"  # the same as gpudiag.analysis.ranks.engine's (not imported: --help stays fast)


@dataclass
class AnalysisOptions:
    """How a capture is analysed. ``steps_from``: None for gpudiag's step ranges, else a step source
    (auto, optimizer, call, forward, generate, nvtx:REGEX); ``warmup_steps``: None for the run's own
    setting (its status file), else that many leading steps are left out of the statistics. Where
    the ranks of a several-process job are analysed (:mod:`gpudiag.analysis.ranks.engine`):
    ``dask`` on Dask if installed (else a process pool), ``scheduler`` a dask.distributed
    scheduler's address (None: a local cluster), ``worker_memory`` a local Dask worker's memory
    limit (None: the engine's default)."""

    steps_from: str | None
    warmup_steps: int | None
    dask: bool = False
    scheduler: str | None = None
    worker_memory: str | None = None
