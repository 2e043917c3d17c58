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
from gpudiag.sources import names
from gpudiag.sources.ncu import read_ncu
from gpudiag.sources.nsys_sqlite import read_export, session_start_ns


# Export columns no stage of the analysis reads: written to the run database, then dropped from the
# frames kept in memory (store.create_run_db's ``released``; 5 M kernels: 0.27 GB, docs/scale.md).
UNREAD_COLUMNS = {"kernels": ("context_id", "static_smem_bytes", "dynamic_smem_bytes", "local_mem_per_thread_bytes"),
                  "runtime_api": ("return_value",)}


def ingest(export_path: Path, db_path: Path, source_name: str | None = None,
           ncu_path: Path | None = None, background: bool = False) -> sqlite_utils.Database:
    """Read the nsys SQLite export at ``export_path`` (and, if given, the Nsight Compute report at
    ``ncu_path``, into table ``ncu_kernels``) into a new run database at ``db_path``; with
    ``background``, its tables are written while the caller goes on (:func:`gpudiag.store.create_run_db`:
    ``store.flush`` or ``store.close`` waits; :func:`gpudiag.analysis.pipeline.analyse` flushes).
    Raises :class:`gpudiag.sources.nsys_sqlite.ExportError` for a file that is not an export and
    :class:`gpudiag.sources.ncu.NcuError` for an unreadable ncu report."""
    export = read_export(export_path)
    ncu = read_ncu(ncu_path) if ncu_path else None
    kernels = export.kernels.copy(deep=False)  # copy-on-write: only the new column is added, nothing copied
    kernels.insert(0, "kernel_id", np.arange(len(kernels), dtype=np.int64))
    tables = {"kernels": kernels, "runtime_api": export.runtime_api, "memcpy": export.memcpy,
              "memset": export.memset, "sync": export.sync, "nvtx_ranges": export.nvtx_ranges,
              "devices": export.devices}
    if ncu is not None:
        tables["ncu_kernels"] = ncu
    return store.create_run_db(db_path, tables, {"source": source_name or export_path.name,
                                                 "ncu_source": ncu_path.name if ncu_path else None,
                                                 "missing": export.missing, "environment": export.environment,
                                                 "dropped_rows": export.dropped, "rows_read": export.rows_read},
                                 background=background, released=UNREAD_COLUMNS)


# Several exports of one job (one per rank): each file's index is written into bits 52..62 of its
# globalPid/globalTid. nsys keeps the thread id in bits 0..23, the OS pid in bits 24..47 and a
# hardware id in bits 48.. (small: 1 in the exports seen); bits 0..51 are kept, so the OS pid reads
# the same and two ranks that reused a pid on two machines (or one, in turn) stay two processes.
FILE_SHIFT = 52
MAX_FILES = 1 << (63 - FILE_SHIFT)  # the tag stays below int64's sign bit
_ID_COLUMNS = ("global_pid", "global_tid")
_TIME_COLUMNS = ("start_ns", "end_ns")


def ingest_many(export_paths: list[Path], db_path: Path, source_name: str | None = None,
                background: bool = False) -> sqlite_utils.Database:
    """Read several nsys SQLite exports of one job (one per rank, as ``nsys profile`` run per rank
    under torchrun writes them) into one run database at ``db_path``, as if one export held them all.

    Process ids are made distinct per file: file ``i`` (in the order given) gets ``i`` in bits
    52..62 of every ``global_pid``/``global_tid`` (:data:`FILE_SHIFT`; the OS pid, bits 24..47,
    is kept). Timestamps (ns) are moved onto one clock: each file's by its capture's start
    (``utcEpochNs``) less the earliest file's, so that one collective's kernels overlap across ranks
    (the transfer/wait split pairs them). Correlation ids are per process, so they need no change;
    ``kernel_id`` numbers the kernels of all files in start order (kernels and NVTX ranges are
    sorted by start, as one export's are); the GPU list keeps one row per ``device_id``.
    ``background``: as :func:`ingest`'s. Raises :class:`ValueError` for more than :data:`MAX_FILES` files and
    :class:`gpudiag.sources.nsys_sqlite.ExportError` for a file that is not an export."""
    if len(export_paths) > MAX_FILES:
        raise ValueError(f"{len(export_paths)} exports: at most {MAX_FILES} can be analysed together")
    starts = [session_start_ns(p) for p in export_paths]
    origin = min((s for s in starts if s is not None), default=None)
    parts = [_tagged(read_export(p), i, (s - origin) if s is not None and origin is not None else 0)
             for i, (p, s) in enumerate(zip(export_paths, starts))]
    names.encode(parts)  # one dictionary for the files' names: the concatenated columns keep their codes
    tables = {name: pd.concat([t[name] for t in parts if not t[name].empty] or [parts[0][name]], ignore_index=True)
              for name in store.EXPORT_TABLES}
    tables["devices"] = tables["devices"].drop_duplicates("device_id").reset_index(drop=True) \
        if "device_id" in tables["devices"] else tables["devices"]
    # one time order over all files, as one export's reader gives it (kernel_id = order by start)
    for name in ("kernels", "nvtx_ranges"):
        tables[name] = tables[name].sort_values("start_ns", kind="stable").reset_index(drop=True)
    tables["kernels"].insert(0, "kernel_id", np.arange(len(tables["kernels"]), dtype=np.int64))
    meta = parts[0]["meta"]
    for part in parts[1:]:
        meta["missing"] = sorted(set(meta["missing"]) | set(part["meta"]["missing"]))
        for key in ("rows_read", "dropped_rows"):
            meta[key] = _summed(meta[key], part["meta"][key])
    files = [p.name for p in export_paths]
    return store.create_run_db(db_path, tables, {**meta, "source": source_name or f"{len(files)} exports: {', '.join(files)}",
                                                 "ncu_source": None, "sources": files}, background=background,
                                 released=UNREAD_COLUMNS)


def _tagged(export, index: int, shift_ns: int) -> dict:
    """The tables of one export of :func:`ingest_many` (file ``index``'s tag in the process ids,
    timestamps moved by ``shift_ns``), and its ``meta``."""
    out = {}
    for name in store.EXPORT_TABLES:
        df = getattr(export, name).copy()
        for col in _ID_COLUMNS:
            if col in df and len(df):
                ids = df[col].astype("Int64")
                df[col] = ids % (1 << FILE_SHIFT) + index * (1 << FILE_SHIFT)
        for col in _TIME_COLUMNS:
            if shift_ns and col in df and len(df):
                df[col] = df[col] + shift_ns
        out[name] = df
    out["meta"] = {"missing": list(export.missing), "environment": export.environment,
                   "dropped_rows": dict(export.dropped), "rows_read": dict(export.rows_read)}
    return out


def _summed(a: dict, b: dict) -> dict:
    """Two counters (nested dicts of numbers, such as ``rows_read``) added key by key."""
    out = dict(a)
    for key, value in b.items():
        out[key] = _summed(out.get(key) or {}, value) if isinstance(value, dict) else (out.get(key) or 0) + value
    return out


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
    kernels = store.read_table(db, "kernels", without=UNREAD_COLUMNS["kernels"])
    runtime_api = store.read_table(db, "runtime_api", without=UNREAD_COLUMNS["runtime_api"])
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
