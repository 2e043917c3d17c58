"""The first stage: an nsys export (and an Nsight Compute report) into a run database, and the run
database's frames that every later stage reads.

``ingest`` loads an export into a run database; :func:`read_tables` reads it back for
:func:`gpudiag.analysis.pipeline.analyse`. This module imports no other stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import sqlite_utils

from gpudiag import store
from gpudiag.analysis.errors import AnalysisError
from gpudiag.sources.ncu import read_ncu
from gpudiag.sources.nsys_sqlite import read_export


def ingest(export_path: Path, db_path: Path, source_name: str | None = None,
           ncu_path: Path | None = None) -> sqlite_utils.Database:
    """Read the nsys SQLite export at ``export_path`` (and, if given, the Nsight Compute report at
    ``ncu_path``, into table ``ncu_kernels``) into a new run database at ``db_path``.
    Raises :class:`gpudiag.sources.nsys_sqlite.ExportError` for a file that is not an export and
    :class:`gpudiag.sources.ncu.NcuError` for an unreadable ncu report."""
    export = read_export(export_path)
    ncu = read_ncu(ncu_path) if ncu_path else None
    kernels = export.kernels.copy()
    kernels.insert(0, "kernel_id", np.arange(len(kernels), dtype=np.int64))
    tables = {"kernels": kernels, "runtime_api": export.runtime_api, "memcpy": export.memcpy,
              "memset": export.memset, "sync": export.sync, "nvtx_ranges": export.nvtx_ranges,
              "devices": export.devices}
    if ncu is not None:
        tables["ncu_kernels"] = ncu
    return store.create_run_db(db_path, tables, {"source": source_name or export_path.name,
                                                 "ncu_source": ncu_path.name if ncu_path else None,
                                                 "missing": export.missing, "environment": export.environment,
                                                 "dropped_rows": export.dropped, "rows_read": export.rows_read})


class Tables(NamedTuple):
    """The run database's frames an analysis reads (after :func:`gpudiag.analysis.ranks.processes.one_process`, one process's rows)."""
    kernels: pd.DataFrame
    runtime_api: pd.DataFrame
    nvtx: pd.DataFrame
    devices: pd.DataFrame
    memcpy: pd.DataFrame
    memset: pd.DataFrame


def read_tables(db: sqlite_utils.Database, meta: dict, warnings: list[str]) -> Tables:
    """The run database's frames (an empty ``nvtx`` with its columns); raises :class:`AnalysisError`
    when the export holds no kernel."""
    kernels = store.read_table(db, "kernels")
    runtime_api = store.read_table(db, "runtime_api")
    nvtx = store.read_table(db, "nvtx_ranges")
    devices = store.read_table(db, "devices")
    memcpy, memset = store.read_table(db, "memcpy"), store.read_table(db, "memset")
    if kernels.empty:
        odd = (meta.get("dropped_rows") or {}).get("kernels")
        if odd:  # every kernel row was odd: say so rather than "no kernels"
            raise AnalysisError(f"all {(meta.get('rows_read') or {}).get('kernels', '?')} kernel rows hold impossible values "
                                f"({', '.join(f'{r}: {n}' for r, n in odd.items())}): export the report again")
        raise AnalysisError("the export holds no CUDA kernels: was the script run on a GPU with CUDA tracing on (nsys --trace=cuda)?")
    if nvtx.empty:
        nvtx = pd.DataFrame(columns=["start_ns", "end_ns", "text", "global_tid", "global_pid", "event_type", "domain_id"])
    if runtime_api.empty:
        warnings.append("no CUDA API calls in the export: steps, modules and host-bound idle time cannot be attributed")
    return Tables(kernels, runtime_api, nvtx, devices, memcpy, memset)
