"""Scale benchmark (issue 13): ``gpudiag report`` on exports of 0.1 M, 1 M and 5 M kernels.

The exports are a real capture (examples/gpt2_train_bf16.sqlite.xz, 7,215 kernels) replicated in
time by :func:`gpudiag.sources.replicate.replicate_export` (SQL inside SQLite): every time-stamped
table copied with shifted timestamps and offset correlation/range/grid ids, so each copy is the
original run again. The benchmark checks that the report of every size gives the original's
per-step numbers (steps = copies x the original's, median step time, GPU busy, kernel time per
step), then times ``gpudiag report`` (wall, CPU, peak RSS of the process, from ``os.wait4``) and,
with ``--nsys-ai PATH``, ``nsys-ai diagnose`` on its own fresh copy of the same file (it indexes
the file and writes its cache beside it, so each run starts cold).

    python benchmarks/scale.py --work /tmp/scale --nsys-ai /path/to/venv/bin/nsys-ai --json scale.json

Two kinds of export (``--kinds``): ``gpudiag``, the capture as ``gpudiag profile`` made it (step,
phase, module and op ranges), and ``foreign``, the same with every ``gpudiag:`` NVTX range deleted,
as a plain ``nsys profile`` of the script would be (the whole capture is then one step; the check
is every kernel counted once).

docs/scale.md has the results and the exact set-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from gpudiag.sources.replicate import replicate_export

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "examples" / "gpt2_train_bf16.sqlite.xz"
SIZES = {"0.02M": 20_000, "0.1M": 100_000, "1M": 1_000_000, "5M": 5_000_000}


def timed(cmd: list[str], cwd: Path, log: Path) -> dict:
    """Run ``cmd``; wall seconds, user+system CPU seconds and peak RSS (bytes) of the process."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    return {"command": " ".join(cmd), "exit_code": os.waitstatus_to_exitcode(status), "wall_s": round(wall, 2),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "peak_rss_bytes": usage.ru_maxrss * 1024}


def per_step(report: dict) -> dict:
    """The per-step numbers the replication must keep."""
    return {"median_step_ns": report["steps"]["step_time_ns"]["median"], "gpu_busy_percent": report["gpu_busy_percent"],
            "kernel_ns_per_step": {k["name"]: k["time_ns_per_step"] for k in report["top_kernels"]}}


def gpudiag_report(export: Path, out: Path, log: Path) -> tuple[dict, dict]:
    run = timed([sys.executable, "-m", "gpudiag", "report", str(export), "-o", str(out), "--force"], out.parent, log)
    if run["exit_code"] != 0:
        raise SystemExit(f"gpudiag report failed on {export}: see {log}")
    return run, json.loads((out / "report.json").read_text())


def check(report: dict, original: dict, copies: int) -> dict:
    """Raises SystemExit when the replicated export's per-step numbers differ from the original's."""
    got, want = per_step(report), per_step(original)
    ok = (report["steps"]["count"] == copies * original["steps"]["count"] and got["median_step_ns"] == want["median_step_ns"]
          and abs(got["gpu_busy_percent"] - want["gpu_busy_percent"]) < 1e-9
          and all(abs(v - want["kernel_ns_per_step"][k]) < 1e-6 for k, v in got["kernel_ns_per_step"].items()))
    if not ok:
        raise SystemExit(f"per-step numbers differ from the original's: {got} vs {want}")
    return {"steps": report["steps"]["count"], **{k: v for k, v in got.items() if k != "kernel_ns_per_step"}}


def make_foreign(export: Path) -> int:
    """Delete gpudiag's NVTX ranges from ``export`` in place (a plain nsys export of the same run);
    returns how many rows went."""
    with sqlite3.connect(export) as conn:
        gone = conn.execute("DELETE FROM NVTX_EVENTS WHERE COALESCE(text, (SELECT value FROM StringIds "
                            "WHERE id = NVTX_EVENTS.textId)) LIKE 'gpudiag:%'").rowcount
    with sqlite3.connect(export) as conn:
        conn.execute("VACUUM")
    return gone


def check_foreign(report: dict, kernels: int) -> dict:
    """Raises SystemExit unless the foreign export's report counts every kernel once."""
    counted = sum(s["kernels"] for s in report["steps"]["per_step"])
    if counted != kernels:
        raise SystemExit(f"the foreign export's report counts {counted} kernels, not {kernels}")
    return {"steps": report["steps"]["count"], "kernels": counted}


def nsys_ai(tool: str, export: Path, work: Path, log: Path) -> dict:
    """``nsys-ai diagnose`` (its default skill pack, findings JSON) on a fresh copy of ``export``."""
    folder = work / "nsys-ai"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    copy = folder / export.name
    shutil.copyfile(export, copy)
    run = timed([tool, "diagnose", str(copy), "--format", "json", "-o", str(folder / "findings.json")], folder, log)
    shutil.rmtree(folder, ignore_errors=True)
    return run


def run_size(args, label: str, kind: str, per_copy: int, original: dict) -> dict:
    """Build one export of ``label``'s size and ``kind``, time gpudiag (and nsys-ai) on it, check it."""
    copies = round(SIZES[label] / per_copy)
    export = args.work / f"gpt2_x{copies}_{kind}.sqlite"
    t = time.perf_counter()
    replica = replicate_export(SOURCE, export, copies)
    removed = make_foreign(export) if kind == "foreign" else 0
    built = time.perf_counter() - t
    name = f"{label}-{kind}"
    run, report = gpudiag_report(export, args.work / f"report-{name}", args.work / f"gpudiag-{name}.log")
    kernels = replica.rows["CUPTI_ACTIVITY_KIND_KERNEL"]
    row = {"size": label, "kind": kind, "copies": copies, "kernels": kernels, "rows": replica.rows,
           "nvtx_rows_removed": removed, "file_bytes": export.stat().st_size, "build_s": round(built, 1),
           "check": check_foreign(report, kernels) if kind == "foreign" else check(report, original, copies),
           "gpudiag": run}
    if args.nsys_ai:
        row["nsys_ai"] = nsys_ai(args.nsys_ai, export, args.work, args.work / f"nsys-ai-{name}.log")
    export.unlink()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="folder for the exports (5 M kernels: about 3 GB)")
    ap.add_argument("--sizes", default="0.1M,1M,5M", help="comma-separated, of " + ", ".join(SIZES))
    ap.add_argument("--nsys-ai", help="nsys-ai executable to compare with (its own virtual environment)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--kinds", default="gpudiag", help="comma-separated, of gpudiag, foreign (see above)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    original_db = args.work / "original.sqlite"
    replicate_export(SOURCE, original_db, 1)
    _, original = gpudiag_report(original_db, args.work / "report-original", args.work / "original.log")
    with sqlite3.connect(original_db) as conn:
        per_copy = conn.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    results = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
               "source": SOURCE.name, "kernels_per_copy": per_copy, "sizes": []}
    for label in args.sizes.split(","):
        for kind in args.kinds.split(","):
            row = run_size(args, label, kind, per_copy, original)
            print(json.dumps(row), flush=True)
            results["sizes"].append(row)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
