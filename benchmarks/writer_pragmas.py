"""The run database writer's SQLite settings, measured (issue 36: the writer is the critical path).

    taskset -c 0,1 python benchmarks/writer_pragmas.py RUN.sqlite OUT_DIR [--rounds 2]

Reads the four large tables of an existing run database (``kernels_coded``, ``runtime_api_coded``,
``kernel_attribution``, ``kernel_class``) and writes them again into fresh files through the ADBC
SQLite driver, as ``gpudiag.store`` does (slices of 1 M rows, one transaction per table), with the
default settings, a 64 KiB page, ``synchronous=OFF`` with ``journal_mode=OFF``, and both; prints each
variant's seconds per table and the file size. Results: docs/scale.md, benchmarks/data/scale/.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import time
from pathlib import Path

import adbc_driver_sqlite.dbapi as adbc
import pandas as pd
import pyarrow as pa
import sqlite_utils

from gpudiag import store

TABLES = ("kernels_coded", "runtime_api_coded", "kernel_attribution", "kernel_class")
NO_SYNC = ("PRAGMA synchronous=OFF", "PRAGMA journal_mode=OFF")


def write(tables: dict[str, pd.DataFrame], arrow: dict[str, pa.Table], path: Path,
          page_size: int | None = None, pragmas: tuple[str, ...] = (), rowid_key: bool = False,
          kernel_id_index: bool = False) -> dict[str, float]:
    """Seconds per table to write ``arrow`` into a fresh ``path`` (tables created from ``tables``' schema).
    With ``kernel_id_index``, ``kernels_coded`` gets its unique ``kernel_id`` index after its rows (timed
    with them), as the store makes it; with ``rowid_key``, ``kernel_id`` is every table's INTEGER
    PRIMARY KEY instead."""
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as con:
        if page_size:
            con.execute(f"PRAGMA page_size={page_size}")  # before the first table: it fixes the file's page
        for name, df in tables.items():
            sql = pd.io.sql.get_schema(df, name, con=con)
            con.execute(sql.replace('"kernel_id" INTEGER', '"kernel_id" INTEGER PRIMARY KEY') if rowid_key else sql)
    seconds = {}
    with adbc.connect(str(path), autocommit=True) as conn, conn.cursor() as cur:
        for pragma in pragmas:  # outside a transaction: SQLite refuses synchronous inside one
            cur.execute(pragma)
            if cur.description:
                cur.fetchall()
        for name, table in arrow.items():
            start = time.perf_counter()
            cur.execute("BEGIN")
            for offset in range(0, table.num_rows, 1_000_000):
                cur.adbc_ingest(name, table.slice(offset, 1_000_000), mode="append")
            cur.execute("COMMIT")
            if name == "kernels_coded" and kernel_id_index and not rowid_key:
                cur.execute("CREATE UNIQUE INDEX kernels_coded_kernel_id ON kernels_coded (kernel_id)")
            seconds[name] = round(time.perf_counter() - start, 2)
    return seconds


def arguments_and_tables(description: str) -> tuple[argparse.Namespace, dict[str, pd.DataFrame]]:
    """The command line (RUN.sqlite OUT_DIR [--rounds N]) and the four large tables of RUN.sqlite."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("run_db", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    con = store.queryable(sqlite_utils.Database(args.run_db))  # schema 3: two of the four are Parquet in the file
    return args, {t: pd.read_sql_query(f"SELECT * FROM {t}", con) for t in TABLES}


def main() -> None:
    args, tables = arguments_and_tables(__doc__.splitlines()[0])
    arrow = {t: pa.Table.from_pandas(df, preserve_index=False) for t, df in tables.items()}
    print(", ".join(f"{t} {df.shape[0]} x {df.shape[1]}" for t, df in tables.items()))
    variants = {"default": {}, "page 64 KiB": {"page_size": 65536}, "synchronous and journal off": {"pragmas": NO_SYNC},
                "both": {"page_size": 65536, "pragmas": NO_SYNC}}
    for round_ in range(args.rounds):  # variants alternate within a round: drift hits them alike
        for name, kwargs in variants.items():
            path = args.out / "variant.sqlite"
            seconds = write(tables, arrow, path, **kwargs)
            print(f"round {round_ + 1}, {name}: {sum(seconds.values()):.2f} s {seconds}, "
                  f"{os.path.getsize(path) >> 20} MiB", flush=True)
            path.unlink()


if __name__ == "__main__":
    main()
