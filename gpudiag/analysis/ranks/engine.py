"""Where the per-rank analyses run: on Dask (``dask.distributed``) when it is installed, else in a
local process pool (:func:`gpudiag.analysis.ranks.processes.analyse_processes`).

Each task is :func:`gpudiag.analysis.ranks.processes.analyse_one` with the run database's *path*
and one process id: a worker reads that process's rows from the file itself
(:func:`gpudiag.analysis.ranks.processes.process_copy`), so no frame travels to it and its memory
is one rank's analysis. ``analyse`` (the pipeline's function, passed in: this stage never imports
the pipeline) travels by reference, as its module path; workers import it.

- Default: a ``LocalCluster`` of processes started for the call (one thread each, at most one per
  CPU and as many as ``memory_limit`` fits in the machine's memory), closed after it.
- ``scheduler``: the address of a running ``dask.distributed`` scheduler (``tcp://host:8786``); its
  workers keep their own memory limit, and must read the run database at the same path (a shared
  filesystem for workers on other machines).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from gpudiag.analysis.errors import AnalysisError
from gpudiag.analysis.ranks import processes

INSTALL = 'pip install "gpudiag[ranks]"  (or: pip install "dask[distributed]")'
DEFAULT_WORKER_MEMORY = "4GiB"
CONNECT_TIMEOUT_S = 10


class EngineError(AnalysisError):
    """Dask cannot be used as asked: not installed, or no scheduler at the address given."""


@dataclass(frozen=True)
class RankEngine:
    """How the per-rank analyses run (module doc). ``scheduler``: a Dask scheduler's address, None
    for a local cluster; ``worker_memory``: a local worker's memory limit (Dask's ``memory_limit``:
    "4GiB", "500MB" or bytes; a worker past it is restarted by its nanny); ``workers``: local workers
    (None: min(ranks, CPUs, what fits in memory)); ``dask``: False to use the process pool even
    where Dask is installed."""

    scheduler: str | None = None
    worker_memory: str = DEFAULT_WORKER_MEMORY
    workers: int | None = None
    dask: bool = True


def dask_installed() -> bool:
    """Whether ``dask.distributed`` can be imported."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


def check_scheduler(address: str) -> None:
    """Raises :class:`EngineError` (one line: the fix) unless Dask is installed and a scheduler
    answers at ``address`` within :data:`CONNECT_TIMEOUT_S` seconds."""
    with _DaskClient(RankEngine(scheduler=address), 1):
        pass


def analyse_ranks(run_db: str, pids: list[int], options: dict, engine: RankEngine | None,
                  analyse: Callable[..., dict]) -> dict[int, dict]:
    """global_pid -> report (or {"error": text}) of each of ``pids`` (processes of the run database
    file ``run_db``), analysed with ``analyse(..., **options)`` where ``engine`` says (module doc).
    Without Dask, or with ``engine.dask`` False, a process pool of ``engine.workers`` processes.
    Raises :class:`EngineError` for a scheduler that cannot be reached or Dask not installed when
    ``engine.scheduler`` is set."""
    engine = engine or RankEngine()
    if not engine.scheduler and (not engine.dask or len(pids) <= 1 or not dask_installed()):
        return processes.analyse_processes(run_db, pids, options, engine.workers, analyse)
    with _DaskClient(engine, len(pids)) as client:  # EngineError first where Dask is missing
        from distributed import as_completed

        futures = client.map(processes.analyse_one, [run_db] * len(pids), [int(p) for p in pids],
                             options=options, analyse=analyse, pure=False)
        pid_of = {f.key: int(p) for p, f in zip(pids, futures)}
        out = {}
        for future in as_completed(futures):  # each report fetched when done, then dropped from its worker
            out[pid_of[future.key]] = _result(future)
            future.release()
        return {int(p): out[int(p)] for p in pids}


def _result(future) -> dict:
    """A task's report; a rank whose worker died (past its memory limit, killed) is an error row."""
    from distributed import KilledWorker

    try:
        return future.result()
    except KilledWorker as exc:
        return {"error": f"its Dask worker died ({exc}): raise --worker-memory, or analyse fewer ranks per worker"}


def _probe(address: str) -> None:
    """Raises :class:`EngineError` (one line naming ``address``) unless something answers Dask's
    protocol there within :data:`CONNECT_TIMEOUT_S` seconds."""
    import asyncio

    from distributed.comm import connect

    async def knock() -> None:
        comm = await connect(address, timeout=f"{CONNECT_TIMEOUT_S}s")
        await comm.close()

    try:
        asyncio.run(knock())
    except (OSError, TimeoutError, ValueError, TypeError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else "no detail"
        raise EngineError(f"--scheduler {address}: no Dask scheduler answered there ({type(exc).__name__}: {detail}); "
                          "start one (dask scheduler) or pass its tcp://HOST:PORT") from None


class _DaskClient:
    """A ``dask.distributed.Client``, to ``engine.scheduler`` or to a local cluster started for
    ``ranks`` ranks; closes what it opened (a context manager)."""

    def __init__(self, engine: RankEngine, ranks: int):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise EngineError(f"--scheduler needs Dask, which is not installed: {INSTALL}") from None
        self.cluster = None
        if engine.scheduler:
            _probe(engine.scheduler)  # a Client that fails to connect hangs and complains when collected
            self.client = Client(engine.scheduler, timeout=f"{CONNECT_TIMEOUT_S}s")
            return
        self.cluster = LocalCluster(n_workers=local_workers(ranks, engine), threads_per_worker=1, processes=True,
                                    memory_limit=engine.worker_memory, dashboard_address=":0",
                                    silence_logs=logging.ERROR)
        self.client = Client(self.cluster)

    def __enter__(self):
        return self.client

    def __exit__(self, *exc):
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def local_workers(ranks: int, engine: RankEngine) -> int:
    """Workers of a local cluster: ``engine.workers``, else one per rank, at most one per CPU and
    at most as many as ``engine.worker_memory`` fits in the machine's memory; at least 1."""
    if engine.workers:
        return engine.workers
    from dask.utils import parse_bytes

    limit = parse_bytes(engine.worker_memory)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else limit
    return max(1, min(ranks, os.cpu_count() or 1, total // max(limit, 1)))
