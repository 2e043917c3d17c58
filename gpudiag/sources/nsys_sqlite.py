"""Reader for Nsight Systems SQLite exports (``nsys export --type sqlite``).

Facts about the format this relies on (checked on nsys 2025.3 exports, see docs/architecture.md):
names are ids into ``StringIds``; NVTX text is in ``text`` or via ``textId``; timestamps are ns;
``correlationId`` is unique only per process, so API calls and GPU work join on
(``globalPid``, ``correlationId``) with ``globalPid = globalTid & 0xFFFFFFFFFF000000``; tables exist
only when they have rows, and columns vary between versions, so every table and column is optional.

Every function returns plain pandas DataFrames with snake_case columns and unit-suffixed names.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from gpudiag.sources import columnar, names, row_checks

PID_MASK = 0xFFFFFFFFFF000000  # globalTid -> globalPid (NVIDIA nsys export documentation)

# NVTX event types (ENUM_NSYS_EVENT_TYPE): push/pop range, start/end range.
NVTX_PUSHPOP = 59
NVTX_STARTEND = 60


class ExportError(ValueError):
    """The file is not a readable nsys SQLite export; the message names the file and the fix."""


@dataclass
class NsysExport:
    """The tables gpudiag uses from one export, plus what was missing from it."""

    path: Path
    kernels: pd.DataFrame
    runtime_api: pd.DataFrame
    memcpy: pd.DataFrame
    memset: pd.DataFrame
    sync: pd.DataFrame
    nvtx_ranges: pd.DataFrame
    devices: pd.DataFrame
    environment: dict = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    dropped: dict = field(default_factory=dict)  # table -> {reason: rows} (gpudiag.sources.row_checks)
    rows_read: dict = field(default_factory=dict)  # table -> rows before any was dropped


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


# nsys writes a table only when it has rows; these are expected in any CUDA capture, so their
# absence is worth saying. Others (memcpy, memset, synchronization) are simply empty.
CORE_TABLES = {"CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "TARGET_INFO_GPU", "StringIds"}

_API = {"start": "start_ns", "end": "end_ns", "globalTid": "global_tid", "correlationId": "correlation_id",
        "nameId": "name_id", "returnValue": "return_value"}
# The columns read from each table (source -> output name). A column missing from the export is
# named in ``missing`` (a report warning); scripts/fuzz_report.py reads this map to know which
# damage a report must notice.
READ_COLUMNS: dict[str, dict[str, str]] = {
    "CUPTI_ACTIVITY_KIND_KERNEL": {
        "start": "start_ns", "end": "end_ns", "deviceId": "device_id", "contextId": "context_id",
        "streamId": "stream_id", "correlationId": "correlation_id", "globalPid": "global_pid",
        "demangledName": "name_id", "shortName": "short_name_id", "gridX": "grid_x", "gridY": "grid_y",
        "gridZ": "grid_z", "blockX": "block_x", "blockY": "block_y", "blockZ": "block_z",
        "registersPerThread": "registers_per_thread", "staticSharedMemory": "static_smem_bytes",
        "dynamicSharedMemory": "dynamic_smem_bytes", "localMemoryPerThread": "local_mem_per_thread_bytes",
        "graphNodeId": "graph_node_id"},
    "CUPTI_ACTIVITY_KIND_RUNTIME": _API,
    "CUPTI_ACTIVITY_KIND_DRIVER": _API,
    "CUPTI_ACTIVITY_KIND_MEMCPY": {
        "start": "start_ns", "end": "end_ns", "deviceId": "device_id", "streamId": "stream_id",
        "correlationId": "correlation_id", "globalPid": "global_pid", "bytes": "bytes",
        "copyKind": "copy_kind_id", "srcKind": "src_kind_id", "dstKind": "dst_kind_id"},
    "CUPTI_ACTIVITY_KIND_MEMSET": {
        "start": "start_ns", "end": "end_ns", "deviceId": "device_id", "streamId": "stream_id",
        "correlationId": "correlation_id", "globalPid": "global_pid", "bytes": "bytes"},
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": {
        "start": "start_ns", "end": "end_ns", "globalPid": "global_pid", "correlationId": "correlation_id",
        "syncType": "sync_type_id", "streamId": "stream_id"},
    "NVTX_EVENTS": {
        "start": "start_ns", "end": "end_ns", "text": "text", "textId": "text_id",
        "globalTid": "global_tid", "eventType": "event_type", "domainId": "domain_id"},
    "TARGET_INFO_GPU": {
        "id": "device_id", "name": "name", "smCount": "sm_count",
        "memoryBandwidth": "memory_bandwidth_bytes_per_s", "clockRate": "clock_rate_hz",
        "l2CacheSize": "l2_cache_bytes", "totalMemory": "total_memory_bytes",
        "computeMajor": "compute_major", "computeMinor": "compute_minor"},
    "StringIds": {"id": "id", "value": "value"},
}
# GPU work joins its launch call on (process, correlation id) and belongs to one process: a row
# without either cannot be placed (gpudiag.sources.row_checks.required).
PLACED_BY = ["global_pid", "correlation_id"]


def _select(conn, table: str, wanted: dict[str, str], tables: set[str], missing: list[str],
            where: str = "") -> pd.DataFrame:
    """SELECT the ``wanted`` source columns (source -> output name) that exist; absent columns come
    back as NULL and are listed in ``missing`` as ``table.column`` (absent core tables as ``table``)."""
    if table not in tables:
        if table in CORE_TABLES:
            missing.append(table)
        return pd.DataFrame(columns=list(wanted.values()))
    sql, rows = _select_sql(conn, table, wanted, where, missing)
    return columnar.read_sql(conn, sql, rows_hint=rows)


def _select_sql(conn, table: str, wanted: dict[str, str], where: str = "",
                missing: list[str] | None = None) -> tuple[str, int]:
    """(the SELECT of :func:`_select` on ``table``, an existing table; its rowid bound, a row count hint)."""
    have = _columns(conn, table)
    parts = []
    for src, dst in wanted.items():
        if src in have:
            parts.append(f'"{src}" AS "{dst}"')
        else:
            parts.append(f'NULL AS "{dst}"')
            if missing is not None:
                missing.append(f"{table}.{src}")
    rows = conn.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()[0]  # cheap: the last key of the b-tree
    return f"SELECT {', '.join(parts)} FROM {table} {where}", rows or 0


# The large tables, read by other threads while this one checks the rows of the ones before
# (columnar.prefetch: connectorx reads with the GIL released); in the order _read_export reads them.
PREFETCHED = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER", "NVTX_EVENTS")


def _prefetch(conn, tables: set[str], nvtx_where: str) -> None:
    """Start reading :data:`PREFETCHED` tables in the background (:func:`columnar.prefetch`)."""
    for table in PREFETCHED:
        if table in tables:
            columnar.prefetch(conn, *_select_sql(conn, table, READ_COLUMNS[table], nvtx_where if table == "NVTX_EVENTS" else ""))


def _strings(conn, tables: set[str], missing: list[str], dropped: dict) -> pd.Series:
    """StringIds as a Series text-by-id (ids that are NULL or given twice counted, see row_checks)."""
    df = _select(conn, "StringIds", READ_COLUMNS["StringIds"], tables, missing)
    return row_checks.id_lookup(df["id"], df["value"], "StringIds", dropped)


def _resolve(ids: pd.Series, strings: pd.Series, table: str = "names", dropped: dict | None = None,
             placeholder: str | None = None) -> pd.Series:
    """Names of ``ids``; ids missing from StringIds are counted under ``table`` in ``dropped``."""
    return row_checks.resolve_ids(ids, strings, table, "names not in StringIds (rows kept)",
                              {} if dropped is None else dropped, placeholder)


def _enum(conn, tables: set[str], table: str) -> pd.Series:
    if table not in tables:
        return pd.Series(dtype=object)
    df = _select(conn, table, {"id": "id", "label": "label"}, tables, [])
    return row_checks.id_lookup(df["id"], df["label"], table, {})


SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")  # Nsight Systems' own report formats, not SQLite


def _export_command(path: Path) -> str:
    """The nsys command that makes the export ``path`` stands for (REPORT where its name says nothing)."""
    stem = path.stem if path.suffix in (".sqlite", *REPORT_SUFFIXES) else "REPORT"
    return f"nsys export --type sqlite -o {stem}.sqlite {stem}.nsys-rep"


# Compressed files by their first bytes (each format's magic number): (magic, format, suffix, the
# command that decompresses beside the file and keeps it, the one that writes to stdout).
COMPRESSED = ((b"\x1f\x8b", "gzip", ".gz", "gunzip -k", "gunzip -c"), (b"\xfd7zXZ\x00", "xz", ".xz", "unxz -k", "unxz -c"),
              (b"\x28\xb5\x2f\xfd", "zstd", ".zst", "unzstd", "unzstd -c"), (b"BZh", "bzip2", ".bz2", "bunzip2 -k", "bunzip2 -c"))
ZIP_MAGIC = b"PK\x03\x04"


def _compressed_message(path: Path, head: bytes) -> str | None:
    """Why ``path`` (whose first bytes are ``head``) is read as no SQLite file when it is a
    compressed one (gzip, xz, zstd, bzip2, a zip archive), with the command that decompresses it;
    None for any other content."""
    if head.startswith(ZIP_MAGIC):
        return f"{path}: a zip archive, not an SQLite file; unzip it (unzip {path}) and pass the .sqlite export inside"
    for magic, kind, suffix, keep, to_stdout in COMPRESSED:
        if head.startswith(magic):
            if path.suffix == suffix:  # profile.sqlite.gz -> profile.sqlite, beside it
                how = f"{keep} {path}, then pass {path.with_suffix('')}"
            else:
                target = path.with_name(f"{path.stem}.unpacked.sqlite")
                how = f"{to_stdout} {path} > {target}, then pass {target}"
            return f"{path}: {kind}-compressed, not an SQLite file; decompress it first: {how}"
    return None


def _not_sqlite_message(path: Path, head: bytes) -> str | None:
    """Why ``path`` (whose first bytes are ``head``) is not an SQLite export, with the fix; None if
    it starts like an SQLite file. Checked before sqlite3 opens it: sqlite3 takes an empty file for
    an empty database."""
    export = _export_command(path)
    if path.suffix in REPORT_SUFFIXES:
        if not head:
            return f"{path}: empty file (0 bytes): nothing was captured into it; capture again with nsys profile, then run: {export}"
        return f"{path}: an Nsight Systems report, not its SQLite export; export it first: {export}, then pass {path.stem}.sqlite"
    if not head:
        return f"{path}: empty file (0 bytes); pass an nsys SQLite export, made with: {export}"
    if not head.startswith(SQLITE_MAGIC):
        return _compressed_message(path, head) or f"{path}: not an SQLite file; pass an nsys SQLite export, made with: {export}"
    return None


class ExportConnection(sqlite3.Connection):
    """A read-only connection to an export. ``fast_read``: whether other readers (connectorx) may
    open the file it reads, as :func:`gpudiag.sources.columnar.read_sql` does; closing it removes
    the private copy it may read (:func:`open_export`)."""

    fast_read = True
    _cleanup = None

    def close(self) -> None:
        super().close()
        if self._cleanup is not None:
            self._cleanup()


def _journal(path: Path, suffix: str) -> Path | None:
    """``path``'s ``-wal`` or ``-journal`` file (``suffix``) if it exists and holds bytes."""
    side = path.with_name(path.name + suffix)
    try:
        return side if side.is_file() and side.stat().st_size > 0 else None
    except OSError:
        return None


def _recovery_needed(path: Path, head: bytes) -> str | None:
    """What SQLite would write beside ``path`` (whose first 20 bytes are ``head``) to read it, even
    read-only: "wal" for a WAL-mode export with a WAL file (its index, the -shm, is made or
    rebuilt), "wal-empty" for one without (SQLite would make -wal and -shm files), "journal" for
    a rollback journal beside it (rolled back if hot); None when nothing."""
    if head[18:20] == b"\x02\x02":  # file format write/read version 2: WAL mode (SQLite file format)
        return "wal" if _journal(path, "-wal") else "wal-empty"
    return "journal" if _journal(path, "-journal") else None


def _recovered_copy(path: Path) -> tuple[Path, Path] | None:
    """(copy, its folder): ``path`` and its ``-wal``/``-journal`` copied into a new temporary folder
    and recovered there by SQLite (the WAL checkpointed, a hot journal rolled back), so that what
    the export's last committed state holds is read while the user's files are only read. None when
    SQLite cannot recover the copy. Raises :class:`ExportError` when the copy cannot be written."""
    folder = Path(tempfile.mkdtemp(prefix="gpudiag-export-"))
    copy = folder / "export.sqlite"
    try:
        shutil.copyfile(path, copy)
        for suffix in ("-wal", "-journal"):
            side = _journal(path, suffix)
            if side:
                shutil.copyfile(side, copy.with_name(copy.name + suffix))
        conn = sqlite3.connect(copy)
        try:
            conn.execute("PRAGMA journal_mode=DELETE").fetchone()  # recovers, then leaves a plain file
        finally:
            conn.close()
        return copy, folder
    except OSError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise ExportError(f"{path}: its journal must be replayed on a copy, which cannot be written in {folder.parent} "
                          f"({exc.strerror}); free space there or set TMPDIR to a folder with room") from None
    except sqlite3.DatabaseError:
        shutil.rmtree(folder, ignore_errors=True)
        return None


def _connect(path: Path, head: bytes) -> ExportConnection:
    """A read-only connection that writes nothing beside ``path``: the file itself; for an export
    SQLite would have to recover (:func:`_recovery_needed`), a recovered private copy, or the file
    opened immutable (read as it is) when the WAL is empty or the copy cannot be recovered."""
    uri = path.resolve().as_uri() + "?mode=ro"  # as_uri escapes # and ?
    need = _recovery_needed(path, head)
    copied = _recovered_copy(path) if need in ("wal", "journal") else None
    if copied:
        conn = sqlite3.connect(copied[0].as_uri() + "?mode=ro", uri=True, factory=ExportConnection)
        conn._cleanup = weakref.finalize(conn, shutil.rmtree, copied[1], ignore_errors=True)
        return conn
    conn = sqlite3.connect(uri + ("&immutable=1" if need else ""), uri=True, factory=ExportConnection)
    conn.fast_read = not need  # connectorx would open the user's file as SQLite does, writing beside it
    return conn


def _locked(exc: BaseException) -> bool:
    """Whether SQLite failed because another connection holds a lock on the file (a writer that
    has not finished: nsys export, sqlite3), not because the file is damaged."""
    text = str(exc).lower()
    return "database is locked" in text or "database is busy" in text  # also as pandas and connectorx word it


def _unreadable(path: Path, exc: BaseException, detail: bool = False) -> ExportError:
    """The error for an export SQLite could not read: locked by a writer still running, else damaged
    (with SQLite's words when ``detail``)."""
    if _locked(exc):
        return ExportError(f"{path}: locked by another process that is still writing it (nsys export still "
                           "running?); run gpudiag again when it has finished")
    words = f" ({str(exc).splitlines()[0][-120:]})" if detail and str(exc) else ""
    return ExportError(f"{path}: a damaged SQLite file{words}; export the report again with: {_export_command(path)}")


def open_export(path: Path) -> ExportConnection:
    """Open ``path`` read-only, writing nothing beside it (an export in WAL mode or with a rollback
    journal is read from a recovered temporary copy, or immutable: see :func:`_connect`). Raises
    :class:`ExportError` if it is not an SQLite nsys export or cannot be read."""
    if not path.is_file():
        raise ExportError(f"{path}: no such file; pass an nsys SQLite export (nsys export --type sqlite) or a gpudiag run directory")
    try:
        with open(path, "rb") as f:
            head = f.read(100)  # the SQLite header
    except OSError as exc:
        raise ExportError(f"{path}: cannot be read ({exc.strerror}); check its permissions") from None
    problem = _not_sqlite_message(path, head[:len(SQLITE_MAGIC)])
    if problem:
        raise ExportError(problem)
    conn = None
    try:
        conn = _connect(path, head)
        tables = _tables(conn)
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # a damaged schema page can hold any bytes
        if conn is not None:
            conn.close()
        raise _unreadable(path, exc) from None
    if not tables & {"CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "StringIds"}:
        conn.close()
        raise ExportError(f"{path}: an SQLite file but not an nsys export (no CUPTI or NVTX tables); pass the file written by nsys export --type sqlite")
    return conn


def read_export(path: Path) -> NsysExport:
    """Read kernels, API calls, memory copies/sets, synchronizations, NVTX ranges and devices.

    Output columns (ns timestamps, bytes):
      kernels: start_ns, end_ns, duration_ns, device_id, context_id, stream_id, correlation_id,
        global_pid, name (demangled), short_name, grid_x/y/z, block_x/y/z, registers_per_thread,
        static_smem_bytes, dynamic_smem_bytes, local_mem_per_thread_bytes, graph_node_id
      runtime_api: start_ns, end_ns, global_tid, global_pid, correlation_id, name, return_value
      memcpy: start_ns, end_ns, duration_ns, device_id, stream_id, correlation_id, global_pid,
        bytes, copy_kind, src_kind, dst_kind
      memset: start_ns, end_ns, duration_ns, device_id, stream_id, correlation_id, global_pid, bytes
      sync: start_ns, end_ns, duration_ns, global_pid, correlation_id, sync_type, stream_id
      nvtx_ranges: start_ns, end_ns, text, global_tid, global_pid, event_type, domain_id
        (ranges only; marks and unfinished ranges are dropped)
      devices: device_id, name, sm_count, memory_bandwidth_bytes_per_s, clock_rate_hz,
        l2_cache_bytes, total_memory_bytes, compute_major, compute_minor
      environment (dict): driver_version, cuda_driver_version, os, cpu, nsys_version where recorded
    Raises :class:`ExportError` for a file that is not an nsys export or whose pages are damaged.
    Text that is not UTF-8 is read with U+FFFD in place of the bad bytes and counted.
    """
    for lenient in (False, True):
        try:
            export = _read_export(path, lenient)
            break
        except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
            if not lenient and "decode" in str(exc):  # "Could not decode to UTF-8 column ...": read again
                continue
            raise _unreadable(path, exc, detail=True) from None
    if not lenient:
        return export
    bad = sum(int(df[c].astype(str).str.contains("\ufffd", regex=False).sum())
              for df, c in ((export.kernels, "name"), (export.runtime_api, "name"), (export.nvtx_ranges, "text")))
    export.dropped.setdefault("text", {})["values with non-UTF-8 bytes, shown as \ufffd (rows kept)"] = bad or "some"
    return export


def _read_export(path: Path, lenient: bool) -> NsysExport:
    """:func:`read_export`; with ``lenient``, undecodable text is read with U+FFFD."""
    conn = open_export(path)
    if lenient:
        conn.text_factory = lambda b: b.decode("utf-8", errors="replace")
    try:
        tables = _tables(conn)
        missing: list[str] = []
        dropped: dict = {}
        nvtx_cols = _columns(conn, "NVTX_EVENTS") if "NVTX_EVENTS" in tables else set()
        ranges_only = (f"WHERE eventType IN ({NVTX_PUSHPOP}, {NVTX_STARTEND}) AND end IS NOT NULL"
                       if {"eventType", "end"} <= nvtx_cols else "")
        _prefetch(conn, tables, ranges_only)
        strings = _strings(conn, tables, missing, dropped)

        k = _select(conn, "CUPTI_ACTIVITY_KIND_KERNEL", READ_COLUMNS["CUPTI_ACTIVITY_KIND_KERNEL"], tables, missing)
        rows_read = {"kernels": len(k)}
        k = row_checks.drop_duplicates(row_checks.valid_times(k, "kernels", dropped, duration=True, zero_is_odd=True),
                                       "kernels", dropped)
        k = row_checks.required(k, "kernels", PLACED_BY, dropped)
        k = row_checks.numeric(k, "kernels", [c for c in k.columns if c.startswith(("grid_", "block_"))]
                               + ["device_id", "stream_id", "registers_per_thread",
                                  "static_smem_bytes", "dynamic_smem_bytes", "local_mem_per_thread_bytes",
                                  "graph_node_id"], dropped)
        k["name"] = _resolve(k.pop("name_id"), strings, "kernels", dropped, placeholder="unnamed kernel")
        k["short_name"] = names.filled(_resolve(k.pop("short_name_id"), strings), k["name"])
        k = k.sort_values("start_ns", kind="stable").reset_index(drop=True)

        api_parts = []
        for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"):
            if table not in tables:
                if table == "CUPTI_ACTIVITY_KIND_RUNTIME":
                    missing.append(table)
                continue
            part = _select(conn, table, READ_COLUMNS[table], tables, missing)
            part["name"] = _resolve(part.pop("name_id"), strings, "runtime_api", dropped)
            api_parts.append(part)
        names.encode([{"runtime_api": part} for part in api_parts])  # one dictionary: concat keeps the codes
        api = (pd.concat(api_parts, ignore_index=True) if api_parts else
               pd.DataFrame(columns=["start_ns", "end_ns", "global_tid", "correlation_id", "name", "return_value"]))
        rows_read["runtime_api"] = len(api)
        # an API call without a correlation id still places host time in a step: kept
        api = row_checks.required(row_checks.valid_times(api, "runtime_api", dropped), "runtime_api", ["global_tid"], dropped)
        api = row_checks.numeric(api, "runtime_api", ["correlation_id"], dropped)
        api["global_pid"] = _pid_of(api["global_tid"])

        mc = _select(conn, "CUPTI_ACTIVITY_KIND_MEMCPY", READ_COLUMNS["CUPTI_ACTIVITY_KIND_MEMCPY"], tables, missing)
        copy_kinds = _enum(conn, tables, "ENUM_CUDA_MEMCPY_OPER")
        mem_kinds = _enum(conn, tables, "ENUM_CUDA_MEM_KIND")
        mc["copy_kind"] = mc.pop("copy_kind_id").map(copy_kinds)
        mc["src_kind"] = mc.pop("src_kind_id").map(mem_kinds)
        mc["dst_kind"] = mc.pop("dst_kind_id").map(mem_kinds)
        rows_read["memcpy"] = len(mc)
        mc = row_checks.valid_times(mc, "memcpy", dropped, duration=True)
        mc = row_checks.numeric(row_checks.required(mc, "memcpy", PLACED_BY, dropped), "memcpy",
                                ["bytes", "device_id", "stream_id"], dropped)

        ms = _select(conn, "CUPTI_ACTIVITY_KIND_MEMSET", READ_COLUMNS["CUPTI_ACTIVITY_KIND_MEMSET"], tables, missing)
        rows_read["memset"] = len(ms)
        ms = row_checks.valid_times(ms, "memset", dropped, duration=True)
        ms = row_checks.numeric(row_checks.required(ms, "memset", PLACED_BY, dropped), "memset",
                                ["bytes", "device_id", "stream_id"], dropped)

        sy = _select(conn, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", READ_COLUMNS["CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"],
                     tables, missing)
        sy["sync_type"] = sy.pop("sync_type_id").map(_enum(conn, tables, "ENUM_CUPTI_SYNC_TYPE"))
        rows_read["sync"] = len(sy)
        sy = row_checks.numeric(row_checks.valid_times(sy, "sync", dropped, duration=True), "sync",
                                ["global_pid", "correlation_id", "stream_id"], dropped)

        nv = _select(conn, "NVTX_EVENTS", READ_COLUMNS["NVTX_EVENTS"], tables, missing, where=ranges_only)
        nv = nv.dropna(subset=["start_ns", "end_ns"])  # marks and unfinished ranges: not ranges, not odd
        rows_read["nvtx_ranges"] = len(nv)
        nv = row_checks.valid_times(nv, "nvtx_ranges", dropped)
        nv["text"] = row_checks.as_text(nv["text"], "nvtx_ranges", dropped)
        from_id = _resolve(nv.pop("text_id"), strings)
        nv["text"] = names.filled(nv["text"], from_id)
        nv["global_pid"] = _pid_of(nv["global_tid"])
        nv = nv.sort_values("start_ns", kind="stable").reset_index(drop=True)

        names.encode([{"kernels": k, "runtime_api": api, "nvtx_ranges": nv}])  # one dictionary for the run

        dev = _select(conn, "TARGET_INFO_GPU", READ_COLUMNS["TARGET_INFO_GPU"], tables, missing)
        dev = row_checks.unique_ids(dev, "devices", "device_id", dropped)
        # SM count, bandwidth and memory size feed the peaks and the rules: text there is NULL, counted
        dev = row_checks.numeric(dev, "devices", [c for c in READ_COLUMNS["TARGET_INFO_GPU"].values()
                                                  if c not in ("device_id", "name")], dropped)
        return NsysExport(path=path, kernels=k, runtime_api=api, memcpy=mc, memset=ms, sync=sy,
                          nvtx_ranges=nv, devices=dev, environment=_environment(conn, tables), missing=missing,
                          dropped=dropped, rows_read=rows_read)
    finally:
        columnar.forget_prefetched(conn)  # an error above leaves reads started: drop them
        conn.close()


ENVIRONMENT_KEYS = {"NvDriverVersion": "driver_version", "CudaDriverVersion": "cuda_driver_version",
                    "OsDescription": "os", "CpuDescription": "cpu"}


def _environment(conn, tables: set[str]) -> dict:
    """Driver, CUDA driver API version, OS and CPU of the capture machine, and the nsys version,
    where the export records them (``TARGET_INFO_SYSTEM_ENV``, ``META_DATA_EXPORT``)."""
    env = {}
    if "TARGET_INFO_SYSTEM_ENV" in tables:
        rows = conn.execute("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV WHERE name IN ({})".format(
            ",".join("?" * len(ENVIRONMENT_KEYS))), tuple(ENVIRONMENT_KEYS)).fetchall()
        env.update({ENVIRONMENT_KEYS[name]: value for name, value in rows})
    if "META_DATA_EXPORT" in tables:
        row = conn.execute("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_PRODUCT_VERSION'").fetchone()
        if row:
            env["nsys_version"] = row[0]
    return env


def read_gpu_in_use(path: Path) -> tuple[str | None, dict]:
    """(name of the GPU that ran the most kernels, environment) of an export, reading only the
    small target-info tables and one aggregate (cheap on exports of millions of kernels)."""
    conn = open_export(path)
    try:
        tables = _tables(conn)
        name = None
        if "TARGET_INFO_GPU" in tables:
            row = None
            if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
                row = conn.execute("SELECT g.name FROM TARGET_INFO_GPU g JOIN (SELECT deviceId, COUNT(*) AS n FROM "
                                   "CUPTI_ACTIVITY_KIND_KERNEL GROUP BY deviceId ORDER BY n DESC LIMIT 1) k "
                                   "ON k.deviceId = g.id").fetchone()
            row = row or conn.execute("SELECT name FROM TARGET_INFO_GPU LIMIT 1").fetchone()
            name = row[0] if row else None
        return name, _environment(conn, tables)
    finally:
        conn.close()


def session_start_ns(path: Path) -> int | None:
    """The capture's start as nanoseconds since the UTC epoch (``TARGET_INFO_SESSION_START_TIME.utcEpochNs``),
    the origin of every timestamp in the export; None when the export does not record it.
    Raises :class:`ExportError` for a file that is not an export."""
    conn = open_export(path)
    try:
        if "TARGET_INFO_SESSION_START_TIME" not in _tables(conn):
            return None
        row = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
        return int(row[0]) if row and row[0] is not None else None
    finally:
        conn.close()


def _pid_of(global_tid: pd.Series) -> pd.Series:
    """globalPid from globalTid (nsys packs the pid in the high bits)."""
    # PID_MASK clears the low 24 bits (the thread id); shifting does the same within int64.
    values = pd.to_numeric(global_tid, errors="coerce")
    # a fractional thread id, or one that int64 cannot hold (a float such as 1e300; 2**63 is the
    # first float past int64's largest value), names no thread
    values = values.where((values == values.round()) & (values.abs() < 2**63)).astype("Int64")
    return (values // (1 << 24)) * (1 << 24)


def kernel_summary(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per-kernel-name summary, the same numbers as ``nsys stats --report cuda_gpu_kern_sum``:
    time_percent, total_ns, instances, avg_ns, med_ns, min_ns, max_ns, stddev_ns, name; sorted by
    total time, descending. The median of an even count is the mean of the two middle values and
    the standard deviation is the sample one (ddof=1), as nsys computes them (checked against
    nsys 2025.3 output in tests/fixtures)."""
    g = kernels.groupby("name", sort=False)["duration_ns"]
    out = pd.DataFrame({
        "total_ns": g.sum(), "instances": g.size(), "avg_ns": g.mean(), "med_ns": g.median(),
        "min_ns": g.min(), "max_ns": g.max(), "stddev_ns": g.std(ddof=1).fillna(0.0)})
    total = out["total_ns"].sum()
    out.insert(0, "time_percent", 100.0 * out["total_ns"] / total if total else np.nan)
    return out.reset_index().sort_values(["total_ns", "name"], ascending=[False, True]).reset_index(drop=True)
