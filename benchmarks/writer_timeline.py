"""(Schema 3's layout, replaced in schema 4 by SQL tables, benchmarks/derived_tables.py: run it from a
checkout of commit 8f4a6f8 or earlier.) When the analysis and the run database's writer finish, table by table (issue 36: the critical path).

    python benchmarks/writer_timeline.py EXPORT.sqlite [--work DIR] [--parquet]

Ingests ``EXPORT`` into a fresh run database written in the background (as ``gpudiag report``
does), analyses it, and prints, in seconds from the start: when ingest ended, each table the writer
thread wrote (rows, columns, its own seconds, when it ended; the derived tables' Parquet
serialization in the analysis' thread and their insert in the writer's, schema 3), when the analysis reached
``store.flush`` (its own work done, waiting for the writer) and when the writer was done. With
``--parquet``, the four large tables are then read back and written once more as uncompressed
Parquet files (pyarrow), timed the same way: the cost of the same rows in a columnar file.
Run it pinned (``taskset -c 0,1``) for the 2-core numbers of docs/scale.md.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import gpudiag.store as store

LARGE_TABLES = ("kernels", "runtime_api", "kernel_attribution", "kernel_class")


def _printed(clock: float, fn, describe):
    """``fn`` wrapped to print, after each call, its thread, ``describe(*args, result)``, its seconds
    and when it ended (seconds from ``clock``)."""
    def printed(*args):
        start = time.perf_counter()
        result = fn(*args)
        end = time.perf_counter()
        print(f"[{threading.current_thread().name}] {describe(*args, result)}, {end - start:.2f} s "
              f"(ends at {end - clock:.1f} s)", flush=True)
        return result
    return printed


def _flush_marked(clock: float):
    """store.flush wrapped to print when the analysis reaches it."""
    flush = store.flush

    def marked(db):
        print(f"analysis reached store.flush at {time.perf_counter() - clock:.1f} s", flush=True)
        flush(db)
    return marked


def parquet_times(run_db: Path, work: Path) -> None:
    """The large tables of ``run_db`` written again as uncompressed Parquet, timed."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import sqlite_utils

    from gpudiag.sources import names

    db, total = sqlite_utils.Database(run_db), 0.0
    for table in LARGE_TABLES:
        df = names.as_codes(store.read_table(db, table), table)
        start = time.perf_counter()
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), work / f"{table}.parquet", compression="none")
        total += time.perf_counter() - start
        print(f"parquet {table}: {len(df)} rows, {time.perf_counter() - start:.2f} s, "
              f"{(work / f'{table}.parquet').stat().st_size / 2**20:.0f} MiB", flush=True)
    print(f"parquet total {total:.2f} s; the run database file {run_db.stat().st_size / 2**20:.0f} MiB", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("--work", type=Path, default=None, help="folder for the run database (default: a temporary one)")
    ap.add_argument("--parquet", action="store_true", help="also time the large tables written as Parquet")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        clock = time.perf_counter()
        original = store._write, store.flush, store.parquet_parts, store._write_parts
        # the export's tables and steps (writer's thread), the derived tables' Parquet (analysis' thread)
        # and its insert (writer's thread)
        store._write = _printed(clock, store._write, lambda db, name, df, _: f"{name}: {len(df)} rows x {df.shape[1]} columns")
        store.parquet_parts = _printed(clock, store.parquet_parts, lambda df, out: f"Parquet of {len(df)} rows x "
                                       f"{df.shape[1]} columns, {sum(map(len, out)) / 2**20:.1f} MiB")
        store._write_parts = _printed(clock, store._write_parts, lambda db, name, parts, _: f"{name} (Parquet parts)")
        store.flush = _flush_marked(clock)
        from gpudiag.analysis.ingest import ingest
        from gpudiag.analysis.pipeline import analyse

        run_db = work / "run.sqlite"
        db = ingest(args.export, run_db, background=True)
        print(f"ingest done at {time.perf_counter() - clock:.1f} s", flush=True)
        analyse(db)
        store.close(db)
        print(f"writer done at {time.perf_counter() - clock:.1f} s", flush=True)
        store._write, store.flush, store.parquet_parts, store._write_parts = original
        if args.parquet:
            parquet_times(run_db, work)


if __name__ == "__main__":
    main()
