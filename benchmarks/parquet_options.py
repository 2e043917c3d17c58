"""(Schema 3's layout, replaced in schema 4 by SQL tables, benchmarks/derived_tables.py: run it from a
checkout of commit 8f4a6f8 or earlier.) The derived tables' Parquet files, by compression, statistics and part size (issue 36, schema 3).

    taskset -c 0,1 python benchmarks/parquet_options.py EXPORT.sqlite [--rounds 5]

Ingests and analyses ``EXPORT`` once, keeping the two frames the analysis hands to
:func:`gpudiag.store.parquet_parts` (``kernel_attribution``, ``kernel_class``), then makes their Parquet
files with each option set, alternating within each round, and prints the median seconds (with the
range) and the bytes of both tables. Results: docs/scale.md, benchmarks/data/scale/.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from gpudiag import store

OPTIONS = {  # label -> (rows per part, pyarrow.parquet.write_table keywords)
    "zstd + statistics, 250k-row parts": (250_000, {"compression": "zstd"}),
    "zstd + statistics, 1M-row parts": (1_000_000, {"compression": "zstd"}),
    "zstd, no statistics, 1M-row parts": (1_000_000, {"compression": "zstd", "write_statistics": False}),
    "lz4, no statistics, 1M-row parts": (1_000_000, {"compression": "lz4", "write_statistics": False}),
    "none, no statistics, 1M-row parts": (1_000_000, {"compression": "none", "write_statistics": False}),
}


def derived_frames(export: Path) -> list[pd.DataFrame]:
    """The frames the analysis of ``export`` writes as Parquet."""
    from gpudiag.analysis.ingest import ingest
    from gpudiag.analysis.pipeline import analyse

    frames, parts = [], store.parquet_parts
    store.parquet_parts = lambda df: frames.append(df) or parts(df)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            analyse(ingest(export, Path(tmp) / "run.sqlite"))
    finally:
        store.parquet_parts = parts
    return frames


def files(df: pd.DataFrame, rows: int, options: dict) -> int:
    """Bytes of ``df`` as Parquet files of ``rows`` rows each."""
    size = 0
    for start in range(0, len(df), rows):
        buffer = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pandas(df.iloc[start:start + rows], preserve_index=False), buffer, **options)
        size += buffer.getvalue().size
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    frames = derived_frames(args.export)
    print(", ".join(f"{len(df)} rows x {df.shape[1]} columns" for df in frames), flush=True)
    seconds: dict[str, list[float]] = {label: [] for label in OPTIONS}
    sizes = {}
    for _ in range(args.rounds):  # options alternate within a round: drift hits them alike
        for label, (rows, options) in OPTIONS.items():
            start = time.perf_counter()
            sizes[label] = sum(files(df, rows, options) for df in frames)
            seconds[label].append(time.perf_counter() - start)
    for label, times in seconds.items():
        print(f"{label}: median {statistics.median(times):.2f} s (range {min(times):.2f}-{max(times):.2f}), "
              f"{sizes[label] / 2**20:.1f} MiB", flush=True)


if __name__ == "__main__":
    main()
