"""The run database's four large tables written as SQLite rows in other layouts, measured (issue 36).

    taskset -c 0,1 python benchmarks/writer_layouts.py RUN.sqlite OUT_DIR [--rounds 2]

Reads ``kernels_coded``, ``runtime_api_coded``, ``kernel_attribution`` and ``kernel_class`` of an
existing run database (through :func:`gpudiag.store.queryable`: schema 3 keeps the last two as
Parquet) and writes them again into fresh files through the ADBC SQLite driver, as ``gpudiag.store``
does (64 KiB pages, one transaction per table, the unique ``kernel_id`` index on ``kernels_coded``),
in four layouts, alternating within each round: as stored (``base``); every text column as an
integer code (``coded``); ``kernel_id`` as the INTEGER PRIMARY KEY instead of an index (``pk``); both.
Then the two derived tables as one table (``merged``) and without the launch call's columns, which
``runtime_api`` holds (``merged-narrow``). Prints each layout's seconds per table and the file size.
Results: docs/scale.md ("The derived tables as Parquet"), benchmarks/data/scale/.
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
LAUNCH_CALL = ["api_start_ns", "api_end_ns", "api_tid", "api_name"]


def coded(df: pd.DataFrame) -> pd.DataFrame:
    """Every text column of ``df`` as its category codes (int32)."""
    return df.assign(**{c: df[c].astype("category").cat.codes.astype("int32") for c in df.columns if df[c].dtype == object})


def write(tables: dict[str, pd.DataFrame], path: Path, pk: bool = False) -> dict[str, float]:
    """Seconds per table to write ``tables`` into a fresh ``path`` (with ``pk``: kernel_id the rowid)."""
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as con:
        con.execute(f"PRAGMA page_size={store.PAGE_SIZE}")  # before the first table: it fixes the file's page
        for name, df in tables.items():
            sql = pd.io.sql.get_schema(df, name, con=con)
            con.execute(sql.replace('"kernel_id" INTEGER', '"kernel_id" INTEGER PRIMARY KEY') if pk else sql)
    seconds = {}
    with adbc.connect(str(path), autocommit=True) as conn, conn.cursor() as cur:
        for name, df in tables.items():
            start = time.perf_counter()
            cur.execute("BEGIN")
            cur.adbc_ingest(name, pa.Table.from_pandas(df, preserve_index=False), mode="append")
            cur.execute("COMMIT")
            if name == "kernels_coded" and not pk:
                cur.execute("CREATE UNIQUE INDEX ix ON kernels_coded (kernel_id)")
            seconds[name] = round(time.perf_counter() - start, 2)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_db", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    con = store.queryable(sqlite_utils.Database(args.run_db))
    tables = {t: pd.read_sql_query(f"SELECT * FROM {t}", con) for t in TABLES}
    merged = tables["kernel_attribution"].merge(tables["kernel_class"], on="kernel_id")
    layouts = {"base": (tables, False), "coded": ({t: coded(d) for t, d in tables.items()}, False),
               "pk": (tables, True), "coded+pk": ({t: coded(d) for t, d in tables.items()}, True),
               "derived separate": ({t: tables[t] for t in TABLES[2:]}, False), "merged": ({"m": merged}, False),
               "merged-narrow": ({"m": merged.drop(columns=LAUNCH_CALL)}, False)}
    for round_ in range(args.rounds):  # layouts alternate within a round: drift hits them alike
        for name, (layout, pk) in layouts.items():
            path = args.out / "layout.sqlite"
            seconds = write(layout, path, pk)
            print(f"round {round_ + 1}, {name}: {sum(seconds.values()):.2f} s {seconds}, "
                  f"{os.path.getsize(path) >> 20} MiB", flush=True)
            path.unlink()


if __name__ == "__main__":
    main()
