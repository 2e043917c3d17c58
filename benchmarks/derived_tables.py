"""Issue 47, part 2: the derived per-kernel tables (kernel_class, kernel_attribution) stored as
SQLite tables with their texts as codes and a view (schema 4, kept), as plain SQLite text, and as
Parquet files beside run.sqlite, at 1 M and 5 M kernels. Frames: the encoder fixture's own two tables (tests/fixtures/roofline48/encoder, a
plain nsys export analysed by gpudiag), repeated to N rows with fresh kernel_ids.

    python benchmarks/derived_tables.py [--rows 1000000 5000000] [--repeats 3]

Prints per layout and size: write seconds (median of repeats), file bytes, and the seconds to read
the table back with plain sqlite3 (`select kernel_class, count(*) ... group by 1`) or with pyarrow.
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpudiag import store  # noqa: E402
from gpudiag.analysis.ingest import ingest  # noqa: E402
from gpudiag.analysis.pipeline import analyse  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests/fixtures/roofline48/encoder/profile.sqlite.xz"


def frames(tmp: Path) -> dict[str, pd.DataFrame]:
    export = tmp / "export.sqlite"
    with lzma.open(FIXTURE) as f, open(export, "wb") as g:
        shutil.copyfileobj(f, g)
    db = ingest(export, tmp / "run.sqlite")
    analyse(db)
    return {n: store.read_table(db, n) for n in store.DERIVED_TABLES}


def tiled(df: pd.DataFrame, rows: int) -> pd.DataFrame:
    idx = np.resize(np.arange(len(df)), rows)
    out = df.iloc[idx].reset_index(drop=True)
    out["kernel_id"] = np.arange(rows)
    return out


def write_coded(path: Path, tables: dict[str, pd.DataFrame]) -> None:
    """Schema 4, kept: texts as codes with a dictionary and a view (gpudiag.derived_text)."""
    db = store.create_run_db(path, {}, {})
    for name, df in tables.items():
        store.write_table(db, name, df)
    db.conn.close()


def write_text(path: Path, tables: dict[str, pd.DataFrame]) -> None:
    """Plain SQLite tables with the texts as text (ADBC, as the export's tables)."""
    db = store.create_run_db(path, {}, {})
    for name, df in tables.items():
        store._write(db, name, df.astype({c: object for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)}))
    db.conn.close()


def write_parquet(path: Path, tables: dict[str, pd.DataFrame]) -> None:
    """Parquet files beside run.sqlite (lz4, no statistics: schema 3's options)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    db = store.create_run_db(path, {}, {})
    db.conn.close()
    for name, df in tables.items():
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path.with_name(f"{path.stem}.{name}.parquet"),
                       compression="lz4", write_statistics=False)


def read_back(layout: str, path: Path) -> None:
    if layout == "parquet files":
        import pyarrow.parquet as pq
        pq.read_table(path.with_name(f"{path.stem}.kernel_class.parquet")).to_pandas()["kernel_class"].value_counts()
    else:
        sqlite3.connect(path).execute("select kernel_class, count(*) from kernel_class group by 1").fetchall()


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.parent.glob(f"{path.stem}*"))


LAYOUTS = {"sqlite codes + view (kept)": write_coded, "sqlite text": write_text, "parquet files": write_parquet}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 5_000_000])
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = frames(Path(tmp))
        for rows in a.rows:
            tables = {n: tiled(df, rows) for n, df in base.items()}
            for layout, write in LAYOUTS.items():
                times = []
                for i in range(a.repeats):
                    path = Path(tmp) / f"{list(LAYOUTS).index(layout)}_{rows}_{i}.sqlite"
                    t0 = time.perf_counter()
                    write(path, tables)
                    times.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                read_back(layout, path)
                read = time.perf_counter() - t0
                print(f"{rows:>9} {layout}: write {statistics.median(times):.2f} s (median of {len(times)}), "
                      f"files {size(path) / 2**20:.0f} MiB, kernel_class counts read back {read:.2f} s", flush=True)


if __name__ == "__main__":
    main()
