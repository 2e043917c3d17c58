"""Scale benchmark of several gpudiag versions (and nsys-ai) on the same exports, pinned to 2 cores.

The exports are :mod:`scale`'s (the GPT-2 capture replicated in time; ``gpudiag`` and ``foreign``
kinds). Each version runs ``python -m gpudiag report`` on a fresh copy under ``taskset -c 0,1``, so a
machine with more cores measures what the project's 2-core machine would, without its neighbours'
load. Versions: ``after`` is this checkout; any other name is a folder ``VERSIONS/NAME`` holding a
``gpudiag`` package (``git archive COMMIT gpudiag | tar x -C VERSIONS/before``); ``nsysai`` runs
``python -m nsys_ai diagnose`` (nsys-ai 0.3.0, DuckDB's SQLite scanner installed) instead, its Parquet
cache removed before each run. Each run is started outside the checkout, since ``python -m`` puts the
working folder first on ``sys.path``, and the package each run imported is recorded.

    OUT=results python benchmarks/scale_versions.py 1M,5M gpudiag,foreign before,after,nsysai --versions VERSIONS

With ``KEEP=1`` the exports stay in the work folder and are reused by the next call (same machine).
docs/scale.md has the results (2026-11-26, the device's host pinned to 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import scale  # noqa: E402
from gpudiag.sources.replicate import replicate_export  # noqa: E402


def build(size: str, kind: str, work: Path) -> tuple[Path, dict, float]:
    """The export of ``size`` and ``kind`` in ``work`` (reused with KEEP=1), its row counts, build seconds."""
    export, rows_file = work / f"g_{size}_{kind}.sqlite", work / f"g_{size}_{kind}.rows.json"
    start = time.perf_counter()
    if os.environ.get("KEEP") and export.exists() and rows_file.exists():
        return export, json.loads(rows_file.read_text()), 0.0
    rows = replicate_export(scale.SOURCE, export, round(scale.SIZES[size] / 7215)).rows
    if kind == "foreign":
        scale.make_foreign(export)
    rows_file.write_text(json.dumps(rows))
    return export, rows, time.perf_counter() - start


def command(version: str, fresh: Path, out: Path) -> list[str]:
    """The pinned command line of ``version`` on ``fresh``, writing into ``out``."""
    if version == "nsysai":
        return ["taskset", "-c", "0,1", sys.executable, "-m", "nsys_ai", "diagnose", str(fresh), "--format", "json",
                "-o", str(out / "findings.json")]
    return ["taskset", "-c", "0,1", sys.executable, "-m", "gpudiag", "report", str(fresh), "-o", str(out), "--force"]


def run_one(version: str, size: str, kind: str, export: Path, rows: dict, args) -> dict:
    """One timed run (wall, CPU = user + system, peak RSS from ``os.wait4``) and its check."""
    for cache in args.work.glob("fresh_*.nsys-cache*"):  # nsys-ai's cache: every run starts cold
        shutil.rmtree(cache, ignore_errors=True) if cache.is_dir() else cache.unlink()
    fresh, out = args.work / f"fresh_{size}_{kind}.sqlite", args.work / f"rep_{size}_{kind}_{version}"
    shutil.copyfile(export, fresh)
    out.mkdir(exist_ok=True)
    package = str(ROOT) if version in ("after", "nsysai") else str(args.versions / version)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package, os.environ.get("SITE", "")) if p)}
    imported = subprocess.run([sys.executable, "-c", "import gpudiag; print(gpudiag.__file__)"], env=env,
                              cwd=args.work, capture_output=True, text=True).stdout.strip()
    start = time.perf_counter()
    with open(args.out / f"log_{size}_{kind}_{version}.txt", "w") as log:
        proc = subprocess.Popen(command(version, fresh, out), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=args.work)
        _, status, usage = os.wait4(proc.pid, 0)
    row = {"version": version, "package": imported, "size": size, "kind": kind,
           "kernels": rows["CUPTI_ACTIVITY_KIND_KERNEL"], "wall_s": round(time.perf_counter() - start, 2),
           "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "peak_rss_gib": round(usage.ru_maxrss / 2**20, 3),
           "exit": os.waitstatus_to_exitcode(status)}
    if row["exit"] == 0 and version != "nsysai":
        report = json.loads((out / "report.json").read_text())
        try:
            row["check"] = scale.check_foreign(report, row["kernels"]) if kind == "foreign" else \
                {"steps": report["steps"]["count"], "median_step_ns": report["steps"]["step_time_ns"]["median"],
                 "gpu_busy_percent": report["gpu_busy_percent"]}
        except SystemExit as exc:
            row["check"] = str(exc)
    fresh.unlink()
    shutil.rmtree(out, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sizes", help="comma-separated, of " + ", ".join(scale.SIZES))
    ap.add_argument("kinds", help="comma-separated, of gpudiag, foreign")
    ap.add_argument("names", help="comma-separated versions: after, nsysai, or folders under --versions")
    ap.add_argument("--versions", dest="versions_dir", type=Path, default=ROOT / ".bench" / "versions")
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpudiag-scale-versions"))
    args = ap.parse_args()
    # absolute: each run starts in the work folder (see the module docstring)
    args.versions, args.out = args.versions_dir.resolve(), Path(os.environ.get("OUT", args.work / "out"))
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for size in args.sizes.split(","):
        for kind in args.kinds.split(","):
            export, rows, built = build(size, kind, args.work)
            for version in args.names.split(","):
                row = {**run_one(version, size, kind, export, rows, args), "build_s": round(built, 1)}
                print(json.dumps(row), flush=True)
                results.append(row)
            if not os.environ.get("KEEP"):
                export.unlink()
    (args.out / "scale_versions.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
