"""Many ranks on Dask (issue 25, part 3): N rank exports made from the real ranks of a 2-rank job,
with injected stragglers, ingested into one run database and analysed on a local
``dask.distributed`` cluster (or ``--scheduler``'s):

    python benchmarks/ranks_dask.py [--ranks 64] [--stragglers 3] [--stretch 1.3] [--inject stretch|late]
                                    [--workers 2] [--worker-memory 4GiB] [--scheduler ADDRESS] [--source EXPORT]

The job: tests/fixtures/nccl/gpt_ddp_shm (GPT DDP, 2 ranks on 2 H100s, one export of 2 processes).
Rank ``r`` is a copy of real rank ``r % 2`` in an export of its own (the other process's rows
deleted), with its OS pid moved by ``1000 * r`` and its timestamps by ``r`` µs (its collectives
still overlap the others'). Two ways to inject a straggler:

- ``--inject stretch`` (default): its whole timeline (kernels, API calls, NVTX ranges) is stretched
  by ``--stretch`` about the capture's start, as tests/multi_gpu_exports.py's ``two_ranks`` does:
  its steps take that much longer (found by the ranks table's median step). Its collectives then
  no longer line up with the others', which a real synchronous job would not allow.
- ``--inject late``: it arrives late at every collective, as a rank whose compute before the
  collective is slower does in a real job: each of its NCCL kernels starts ``--stretch - 1`` of
  the kernel's duration later and ends as before (the others wait for it; steps stay in lockstep),
  found by the collectives' waits (the report's ``straggler``).

Prints the wall times (ingest, analysis), the
peak RSS of each Dask worker process and of this (driver) process, and whether the injected
stragglers are the ranks the report finds slowest.
"""

from __future__ import annotations

import argparse
import json
import logging
import lzma
import resource
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from gpudiag.analysis.ingest import ingest_many  # noqa: E402
from gpudiag.analysis.pipeline import analyse  # noqa: E402
from gpudiag.analysis.ranks.engine import RankEngine  # noqa: E402

SOURCE = ROOT / "tests" / "fixtures" / "nccl" / "gpt_ddp_shm" / "profile.sqlite.xz"
PID_MASK = 0xFFFFFFFFFF000000 - (1 << 64)  # globalTid -> globalPid, as a signed 64-bit SQLite integer
TIME_COLUMNS = ("start", "end", "timestamp")


def real_ranks(source: Path, folder: Path) -> list[Path]:
    """One export per process of ``source``: a copy without the other processes' rows."""
    whole = folder / "whole.sqlite"
    with lzma.open(source) if source.suffix == ".xz" else open(source, "rb") as src, open(whole, "wb") as dst:
        shutil.copyfileobj(src, dst)
    with sqlite3.connect(whole) as conn:
        pids = [r[0] for r in conn.execute("SELECT DISTINCT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY 1")]
    out = []
    for i, pid in enumerate(pids):
        target = Path(shutil.copyfile(whole, folder / f"real{i}.sqlite"))
        with sqlite3.connect(target) as conn:
            for table, cols in _tables(conn):
                if "globalPid" in cols:
                    conn.execute(f'DELETE FROM "{table}" WHERE globalPid IS NOT NULL AND globalPid != ?', (pid,))
                elif "globalTid" in cols:
                    conn.execute(f'DELETE FROM "{table}" WHERE globalTid IS NOT NULL AND (globalTid & ?) != ?',
                                 (PID_MASK, pid))
        with sqlite3.connect(target, isolation_level=None) as conn:
            conn.execute("VACUUM")
        out.append(target)
    whole.unlink()
    return out


def _tables(conn: sqlite3.Connection) -> list[tuple[str, set[str]]]:
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return [(n, {c[1] for c in conn.execute(f'PRAGMA table_info("{n}")')}) for n in names]


def replica(real: Path, target: Path, rank: int, stretch: float, late: float = 0.0) -> Path:
    """``real`` as rank ``rank``: OS pid + 1000 * rank, timestamps + rank µs, stretched by ``stretch``;
    each NCCL kernel starting ``late`` of its duration later."""
    shutil.copyfile(real, target)
    pid_delta, shift = (1000 * rank) << 24, 1000 * rank
    with sqlite3.connect(target) as conn:
        t0 = conn.execute("SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
        for table, cols in _tables(conn):
            if not (table.startswith("CUPTI_ACTIVITY_KIND_") or table == "NVTX_EVENTS"):
                continue
            sets = [f'"{c}" = "{c}" + {pid_delta}' for c in ("globalPid", "globalTid") if c in cols]
            sets += [f'"{c}" = CAST({t0} + ("{c}" - {t0}) * {stretch} AS INTEGER) + {shift}' for c in TIME_COLUMNS
                     if c in cols]
            if sets:
                conn.execute(f'UPDATE "{table}" SET {", ".join(sets)}')
        if late:
            conn.execute(f'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start + CAST((("end" - start) * {late}) AS INTEGER) '
                         "WHERE demangledName IN (SELECT id FROM StringIds WHERE value LIKE 'nccl%')")
    return target


def straggler_ranks(n: int, count: int) -> list[int]:
    """``count`` ranks spread over ``n`` (never rank 0)."""
    return sorted({max(1, (2 * k + 1) * n // (2 * count)) for k in range(count)})


def peak_rss_bytes() -> int:
    """This process's peak resident set (bytes; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run(args: argparse.Namespace, folder: Path) -> dict:
    reals = real_ranks(Path(args.source), folder)
    slow = straggler_ranks(args.ranks, args.stragglers)
    t = time.perf_counter()
    stretch = lambda r: args.stretch if r in slow and args.inject == "stretch" else 1.0  # noqa: E731
    late = lambda r: args.stretch - 1.0 if r in slow and args.inject == "late" else 0.0  # noqa: E731
    exports = [replica(reals[r % len(reals)], folder / f"rank{r:03d}.sqlite", r, stretch(r), late(r))
               for r in range(args.ranks)]
    made_s = time.perf_counter() - t
    from distributed import Client, LocalCluster

    cluster = None if args.scheduler else LocalCluster(
        n_workers=args.workers, threads_per_worker=1, processes=True, memory_limit=args.worker_memory,
        dashboard_address=":0", silence_logs=logging.ERROR)
    address = args.scheduler or cluster.scheduler_address
    try:
        t = time.perf_counter()
        db = ingest_many(exports, folder / "run.sqlite")
        ingest_s = time.perf_counter() - t
        ingest_rss = peak_rss_bytes()
        t = time.perf_counter()
        report = analyse(db, ranks_engine=RankEngine(scheduler=address))
        analyse_s = time.perf_counter() - t
        with Client(address) as client:
            workers = client.run(peak_rss_bytes)
    finally:
        if cluster is not None:
            cluster.close()
    rows = report["ranks"]["ranks"]
    order = [r["pid"] for r in sorted(rows, key=lambda r: -(r["step_time_ns_median"] or 0))]
    pid_rank = {r["pid"]: i for i, r in enumerate(sorted(rows, key=lambda r: r["global_pid"]))}  # file order = rank
    by_step = sorted(pid_rank[p] for p in order[:len(slow)])
    named = pid_rank.get(report["ranks"]["straggler"]["pid"]) if report["ranks"]["straggler"] else None
    errors = [r for r in rows if r.get("error")]
    return {"ranks": args.ranks, "workers": len(workers), "worker_memory_limit": args.worker_memory,
            "inject": args.inject, "injected_stragglers": slow, "slowest_by_median_step": by_step,
            "stragglers_found": by_step == slow if args.inject == "stretch" else named in slow,
            "report_straggler_rank": named,
            "straggler_text": (report["ranks"]["straggler"] or {}).get("text"),
            "rank_errors": len(errors), "make_exports_s": round(made_s, 1), "ingest_s": round(ingest_s, 1),
            "analyse_s": round(analyse_s, 1),
            "run_db_bytes": (folder / "run.sqlite").stat().st_size,
            "worker_peak_rss_bytes": sorted(workers.values()), "driver_peak_rss_bytes": peak_rss_bytes(),
            "driver_peak_rss_bytes_after_ingest": ingest_rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--stragglers", type=int, default=3)
    parser.add_argument("--stretch", type=float, default=1.3)
    parser.add_argument("--inject", choices=("stretch", "late"), default="stretch")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker-memory", default="4GiB")
    parser.add_argument("--scheduler", default=None, help="a running scheduler's address [default: a local cluster]")
    parser.add_argument("--source", default=str(SOURCE), help="a 2-rank export (one export of several processes)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpudiag-ranks-") as tmp:
        print(json.dumps(run(args, Path(tmp)), indent=1))


if __name__ == "__main__":
    main()
