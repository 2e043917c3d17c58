"""Multi-GPU test exports CONSTRUCTED from real single-GPU captures (no multi-GPU capture is
committed yet: issue 12's device part needs two GPUs).

- :func:`with_collectives`: a copy of a real export with one real-looking NCCL 2.2x all-reduce
  kernel (and its ``cudaLaunchKernel`` call) inserted per step, on a stream of its own, starting
  half-way through the step's kernels and lasting ``length`` x their span: it overlaps the compute
  kernels of the second half and runs past the last one (so part of it is exposed).
- :func:`two_ranks`: the rows of a real export twice in one file, the second copy as another
  process (``globalPid``/``globalTid`` moved by :data:`PID_DELTA` pids) on another GPU
  (``deviceId`` + 1), optionally slowed down by ``stretch`` (every timestamp of the copy scaled
  about the capture's start: a straggler whose steps are ``stretch`` times longer).
"""

from __future__ import annotations

import lzma
import shutil
import sqlite3
from pathlib import Path

NCCL_NAME = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NCCL_SHORT = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
PID_DELTA = 7 << 24  # pids live in bits 24.. of globalPid/globalTid
TIME_COLUMNS = ("start", "end", "timestamp")


def copy_export(source: Path, target: Path) -> Path:
    """``source`` (.sqlite or .sqlite.xz) copied to ``target`` as plain SQLite."""
    if source.suffix == ".xz":
        with lzma.open(source) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        shutil.copyfile(source, target)
    return target


def _string_id(conn: sqlite3.Connection, text: str) -> int:
    row = conn.execute("SELECT id FROM StringIds WHERE value = ?", (text,)).fetchone()
    if row:
        return row[0]
    new = conn.execute("SELECT MAX(id) + 1 FROM StringIds").fetchone()[0]
    conn.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (new, text))
    return new


def step_launches(conn: sqlite3.Connection) -> list[tuple[str, list[tuple]]]:
    """Per ``gpudiag:step`` range: (text, [(kernel start, end, launch start, launch globalTid), ...]),
    the kernels whose launch call started inside the range."""
    ranges = conn.execute("SELECT start, \"end\", text FROM NVTX_EVENTS WHERE text LIKE 'gpudiag:step %' ORDER BY start").fetchall()
    rows = conn.execute("SELECT k.start, k.\"end\", r.start, r.globalTid FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                        "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId ORDER BY k.start").fetchall()
    return [(text, [r for r in rows if lo <= r[2] < hi]) for lo, hi, text in ranges]


def with_collectives(source: Path, target: Path, length: float = 0.8) -> Path:
    """Write ``target``: ``source`` plus one NCCL all-reduce kernel per step (see module doc)."""
    copy_export(source, target)
    with sqlite3.connect(target) as conn:
        name, short = _string_id(conn, NCCL_NAME), _string_id(conn, NCCL_SHORT)
        launch = _string_id(conn, "cudaLaunchKernel_v7000")
        cols = [c[1] for c in conn.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")]
        template = dict(zip(cols, conn.execute("SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()))
        stream = conn.execute("SELECT MAX(streamId) + 1 FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        corr = conn.execute("SELECT MAX(correlationId) + 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
        grid = conn.execute("SELECT MAX(gridId) + 1 FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        event_class = conn.execute("SELECT eventClass FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1").fetchone()[0]
        for i, (_, launched) in enumerate(step_launches(conn)):
            if not launched:
                continue
            first, last = min(r[0] for r in launched), max(r[1] for r in launched)
            start = first + (last - first) // 2
            end = start + int(length * (last - first))
            before = max((r for r in launched if r[0] <= start), key=lambda r: r[0])  # launched with that kernel
            conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, \"end\", eventClass, globalTid, correlationId, "
                         "nameId, returnValue) VALUES (?, ?, ?, ?, ?, ?, 0)",
                         (before[2], before[2] + 4_000, event_class, before[3], corr + i, launch))
            row = {**template, "start": start, "end": end, "streamId": stream, "correlationId": corr + i,
                   "demangledName": name, "shortName": short, "mangledName": None, "gridX": 2, "gridY": 1, "gridZ": 1,
                   "blockX": 640, "blockY": 1, "blockZ": 1, "gridId": grid + i, "graphNodeId": None}
            conn.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                         [row[c] for c in cols])
    return target


def two_ranks(source: Path, target: Path, stretch: float = 1.0) -> Path:
    """Write ``target``: ``source`` as rank 0 plus a copy as rank 1 (see module doc)."""
    copy_export(source, target)
    with sqlite3.connect(target) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        t0 = conn.execute("SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
        for table in names:
            cols = [c[1] for c in conn.execute(f'PRAGMA table_info("{table}")')]
            # the process's own activity (CUDA, NVTX) and the GPU list; not files, strings or enums
            if not (table.startswith("CUPTI_ACTIVITY_KIND_") or table in ("NVTX_EVENTS", "TARGET_INFO_GPU")):
                continue
            if table == "TARGET_INFO_GPU":  # the second GPU: same model, next id
                exprs = [f'"{c}" + 1' if c in ("id", "deviceId") else f'"{c}"' for c in cols]
            else:
                exprs = [f'"{c}" + {PID_DELTA}' if c in ("globalPid", "globalTid") else
                         '"deviceId" + 1' if c == "deviceId" else
                         f'CAST({t0} + ("{c}" - {t0}) * {stretch} AS INTEGER)' if c in TIME_COLUMNS and stretch != 1.0 else
                         f'"{c}"' for c in cols]
            conn.execute(f'INSERT INTO "{table}" ({", ".join(chr(34) + c + chr(34) for c in cols)}) '
                         f'SELECT {", ".join(exprs)} FROM "{table}"')
    return target


PID_MASK = 0xFFFFFFFFFF000000  # globalTid -> globalPid (nsys export documentation)


def split_ranks(source: Path, folder: Path) -> list[Path]:
    """One export per process of the several-process export ``source`` (.sqlite or .sqlite.xz), as
    ``nsys profile`` run per rank would write them: ``folder``/rank<i>.sqlite, a copy of ``source``
    without the rows of the other processes (every table with a ``globalPid`` or ``globalTid``
    column; rows with neither kept). The copies keep the capture's clock (its start time)."""
    whole = copy_export(source, folder / "whole.sqlite")
    with sqlite3.connect(whole) as conn:
        pids = [r[0] for r in conn.execute("SELECT DISTINCT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY globalPid")]
    out = []
    for i, pid in enumerate(pids):
        target = shutil.copyfile(whole, folder / f"rank{i}.sqlite")
        with sqlite3.connect(target) as conn:
            for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
                cols = {c[1] for c in conn.execute(f'PRAGMA table_info("{table}")')}
                if "globalPid" in cols:
                    conn.execute(f'DELETE FROM "{table}" WHERE globalPid IS NOT NULL AND globalPid != ?', (pid,))
                elif "globalTid" in cols:
                    conn.execute(f'DELETE FROM "{table}" WHERE globalTid IS NOT NULL AND (globalTid & ?) != ?',
                                 (PID_MASK - (1 << 64), pid))
        out.append(Path(target))
    whole.unlink()
    return out
