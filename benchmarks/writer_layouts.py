"""The run database's four large tables written as SQLite rows in other layouts, measured (issue 36).

    taskset -c 0,1 python benchmarks/writer_layouts.py RUN.sqlite OUT_DIR [--rounds 2]

Reads ``kernels_coded``, ``runtime_api_coded``, ``kernel_attribution`` and ``kernel_class`` of an
existing run database (through :func:`gpudiag.store.queryable`: schema 3 keeps the last two as
Parquet) and writes them again into fresh files through the ADBC SQLite driver, as ``gpudiag.store``
does (``writer_pragmas.write``: 64 KiB pages, one transaction per table, the unique ``kernel_id`` index
on ``kernels_coded``; the Arrow conversion is not timed), in four layouts, alternating within each round: as stored (``base``); every text column as an
integer code (``coded``); ``kernel_id`` as the INTEGER PRIMARY KEY instead of an index (``pk``); both.
Then the two derived tables as one table (``merged``) and without the launch call's columns, which
``runtime_api`` holds (``merged-narrow``). Prints each layout's seconds per table and the file size.
Results: docs/scale.md ("The derived tables as Parquet"), benchmarks/data/scale/.
"""

from __future__ import annotations

import os

import pandas as pd
import pyarrow as pa

from gpudiag import store
from writer_pragmas import TABLES, arguments_and_tables, write  # benchmarks/, the script's folder, is first on sys.path
LAUNCH_CALL = ["api_start_ns", "api_end_ns", "api_tid", "api_name"]


def coded(df: pd.DataFrame) -> pd.DataFrame:
    """Every text column of ``df`` as its category codes (int32)."""
    return df.assign(**{c: df[c].astype("category").cat.codes.astype("int32") for c in df.columns if df[c].dtype == object})


def main() -> None:
    args, tables = arguments_and_tables(__doc__.splitlines()[0])
    merged = tables["kernel_attribution"].merge(tables["kernel_class"], on="kernel_id")
    layouts = {"base": (tables, False), "coded": ({t: coded(d) for t, d in tables.items()}, False),
               "pk": (tables, True), "coded+pk": ({t: coded(d) for t, d in tables.items()}, True),
               "derived separate": ({t: tables[t] for t in TABLES[2:]}, False), "merged": ({"m": merged}, False),
               "merged-narrow": ({"m": merged.drop(columns=LAUNCH_CALL)}, False)}
    for round_ in range(args.rounds):  # layouts alternate within a round: drift hits them alike
        for name, (layout, pk) in layouts.items():
            path = args.out / "layout.sqlite"
            arrow = {t: pa.Table.from_pandas(df, preserve_index=False) for t, df in layout.items()}
            seconds = write(layout, arrow, path, page_size=store.PAGE_SIZE, rowid_key=pk, kernel_id_index=True)
            print(f"round {round_ + 1}, {name}: {sum(seconds.values()):.2f} s {seconds}, "
                  f"{os.path.getsize(path) >> 20} MiB", flush=True)
            path.unlink()


if __name__ == "__main__":
    main()
