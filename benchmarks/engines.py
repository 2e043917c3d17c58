"""Issue 36 part 2: the same analysis core in pandas (today's engine), Polars and DuckDB, on the
replicated exports of benchmarks/scale.py, to choose the engine by measurement.

    python benchmarks/engines.py EXPORT.sqlite --json out.json            # every engine, each in its own process
    taskset -c 0,1 python benchmarks/engines.py EXPORT.sqlite --engines polars,duckdb

The core is what every heavy stage of gpudiag does to the kernel table, on all of it:
1. **read** the kernels (start, end, device, stream, correlation id, demangled-name id), their launch
   calls (runtime API: correlation id, start) and the step ranges (NVTX ``gpudiag:step N``) with
   connectorx into Arrow (the same for every engine; timed apart);
2. **names**: pandas resolves every kernel's name id to its text (what gpudiag's ingest does now);
   Polars and DuckDB keep the ``StringIds`` id as the name's code and look names up only for the
   rows shown (issue 36 part 1, "names once");
3. **attribution**: each kernel's launch call by correlation id, then its step: the step range on
   the host's timeline holding the launch call's start (ranges sorted, an as-of join);
4. **statistics**: per step the kernels, their GPU time and span; over the steps the 20 kernel names
   with the most time, with their time per step.

Each engine runs in its own process (``--child``), with 2 threads where it has threads
(``POLARS_MAX_THREADS``, DuckDB's ``threads``). Reported per engine: the seconds of each part
(``time.perf_counter``), the process's peak RSS (``ru_maxrss``), and a digest of the results,
which must be equal across engines (the per-step table and the top names, rounded to the ns).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

KERNELS = ("SELECT start, end, deviceId AS device, streamId AS stream, correlationId AS correlation,"
           " demangledName AS name_id FROM CUPTI_ACTIVITY_KIND_KERNEL")
LAUNCHES = "SELECT correlationId AS correlation, start AS api_start FROM CUPTI_ACTIVITY_KIND_RUNTIME"
STEPS = ("SELECT start AS step_start, end AS step_end FROM NVTX_EVENTS WHERE text LIKE 'gpudiag:step %'"
         " AND end IS NOT NULL")
NAMES = "SELECT id AS name_id, value AS name FROM StringIds"
TOP = 20


def read(export: Path) -> dict:
    """The four tables as Arrow tables (connectorx)."""
    import connectorx

    uri = "sqlite://" + str(export.resolve())
    return {key: connectorx.read_sql(uri, sql, return_type="arrow")
            for key, sql in (("kernels", KERNELS), ("launches", LAUNCHES), ("steps", STEPS), ("names", NAMES))}


def run_pandas(t: dict) -> tuple[list, list, dict]:
    import pandas as pd

    times = {}
    start = time.perf_counter()
    k = t["kernels"].to_pandas()
    names = t["names"].to_pandas().set_index("name_id")["name"]
    k["name"] = k["name_id"].map(names).astype("string[pyarrow]")  # today: the text in every row
    times["names"] = time.perf_counter() - start
    start = time.perf_counter()
    launches = t["launches"].to_pandas()
    k = k.merge(launches, on="correlation", how="left")
    steps = t["steps"].to_pandas().sort_values("step_start", kind="stable").reset_index(drop=True)
    steps["step"] = range(len(steps))
    k = pd.merge_asof(k.dropna(subset=["api_start"]).astype({"api_start": "int64"}).sort_values("api_start"),
                      steps, left_on="api_start", right_on="step_start", direction="backward")
    k = k[k["api_start"] < k["step_end"]]
    times["attribution"] = time.perf_counter() - start
    start = time.perf_counter()
    k["duration"] = k["end"] - k["start"]
    per_step = k.groupby("step").agg(kernels=("duration", "size"), busy=("duration", "sum"),
                                     first=("start", "min"), last=("end", "max")).reset_index()
    n = len(per_step)
    top = k.groupby("name", observed=True)["duration"].sum().sort_values(ascending=False, kind="stable").head(TOP)
    times["statistics"] = time.perf_counter() - start
    return ([list(map(int, r)) for r in per_step.itertuples(index=False)],
            [[str(name), round(float(v) / n)] for name, v in top.items()], times)


def run_polars(t: dict) -> tuple[list, list, dict]:
    import polars as pl

    times = {}
    start = time.perf_counter()
    k = pl.from_arrow(t["kernels"]).lazy()  # the name stays its StringIds id: a code
    names = pl.from_arrow(t["names"])
    times["names"] = time.perf_counter() - start
    start = time.perf_counter()
    steps = (pl.from_arrow(t["steps"]).lazy().sort("step_start")
             .with_row_index("step").with_columns(pl.col("step").cast(pl.Int64)))
    k = (k.join(pl.from_arrow(t["launches"]).lazy(), on="correlation", how="inner")
         .sort("api_start")
         .join_asof(steps, left_on="api_start", right_on="step_start", strategy="backward")
         .filter(pl.col("api_start") < pl.col("step_end")))
    k = k.collect()
    times["attribution"] = time.perf_counter() - start
    start = time.perf_counter()
    k = k.with_columns((pl.col("end") - pl.col("start")).alias("duration"))
    per_step = (k.group_by("step").agg(pl.len().alias("kernels"), pl.col("duration").sum().alias("busy"),
                                        pl.col("start").min().alias("first"), pl.col("end").max().alias("last"))
                .sort("step"))
    n = per_step.height
    top = (k.group_by("name_id").agg(pl.col("duration").sum()).sort(["duration", "name_id"], descending=[True, False])
           .head(TOP).join(names, on="name_id", how="left", maintain_order="left"))  # names for the rows shown only
    times["statistics"] = time.perf_counter() - start
    return ([list(map(int, r)) for r in per_step.iter_rows()],
            [[name, round(v / n)] for name, v in zip(top["name"], top["duration"])], times)


def run_duckdb(t: dict) -> tuple[list, list, dict]:
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 2")
    times = {}
    start = time.perf_counter()
    kernels, launches, step_rows, names = t["kernels"], t["launches"], t["steps"], t["names"]  # noqa: F841 (scanned by name)
    times["names"] = time.perf_counter() - start
    start = time.perf_counter()
    con.execute("CREATE TEMP TABLE steps AS SELECT row_number() OVER (ORDER BY step_start) - 1 AS step, * "
                "FROM step_rows")
    con.execute("CREATE TEMP TABLE k AS SELECT k.*, l.api_start, s.step, s.step_end FROM kernels k "
                "JOIN launches l USING (correlation) ASOF JOIN steps s ON l.api_start >= s.step_start "
                "WHERE l.api_start < s.step_end")
    times["attribution"] = time.perf_counter() - start
    start = time.perf_counter()
    per_step = con.execute("SELECT step, count(*), sum(\"end\" - start), min(start), max(\"end\") FROM k "
                           "GROUP BY step ORDER BY step").fetchall()
    n = len(per_step)
    top = con.execute(f"SELECT n.name, t.d FROM (SELECT name_id, sum(\"end\" - start) AS d FROM k GROUP BY name_id "
                      f"ORDER BY d DESC, name_id LIMIT {TOP}) t LEFT JOIN names n USING (name_id) ORDER BY t.d DESC, "
                      "t.name_id").fetchall()
    times["statistics"] = time.perf_counter() - start
    return [list(map(int, r)) for r in per_step], [[name, round(d / n)] for name, d in top], times


ENGINES = {"pandas": run_pandas, "polars": run_polars, "duckdb": run_duckdb}


def child(engine: str, export: Path) -> dict:
    start = time.perf_counter()
    tables = read(export)
    read_s = time.perf_counter() - start
    per_step, top, times = ENGINES[engine](tables)
    digest = hashlib.sha256(json.dumps([per_step, top]).encode()).hexdigest()[:16]
    return {"engine": engine, "read_s": round(read_s, 3), **{f"{k}_s": round(v, 3) for k, v in times.items()},
            "engine_s": round(sum(times.values()), 3), "kernels": tables["kernels"].num_rows, "steps": len(per_step),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "digest": digest,
            "top_name": top[0][0][:60]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--engines", default="pandas,polars,duckdb")
    parser.add_argument("--rounds", type=int, default=1, help="each engine this many times, interleaved")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.export)))
        return
    env = {**os.environ, "POLARS_MAX_THREADS": "2"}
    results = []
    for _ in range(args.rounds):
        for engine in args.engines.split(","):
            done = subprocess.run([sys.executable, __file__, str(args.export), "--child", engine], env=env,
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{engine}: {done.stderr[-2000:]}")
            results.append(json.loads(done.stdout))
            print(json.dumps(results[-1]), flush=True)
    if len({r["digest"] for r in results}) != 1:
        raise SystemExit("the engines' results differ: " + ", ".join(f"{r['engine']} {r['digest']}" for r in results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
