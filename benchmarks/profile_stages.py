"""Device: where `gpudiag profile` spends its time on a short real run, stage by stage (issue 36
part 4), with nsys tracing OS runtime calls (``osrt``, the trace gpudiag used to ask for) and
without (what it asks for now), interleaved.

    source .devtools/nsys-env.sh
    python benchmarks/profile_stages.py --rounds 2 --out $OUT/stages.json -- benchmarks/zoo34/unet_fp32.py
    python benchmarks/profile_stages.py --arms osrt,no-osrt ... -- SCRIPT [ARGS...]

Each run is `gpudiag profile --try none -o DIR --force SCRIPT -- ARGS` (defaults otherwise: the
bare run, 2 warm-up steps and a 20-step window) in a process of its own; the ``osrt`` arm adds
``osrt`` to nsys's ``--trace`` list. Per run: the stage times gpudiag wrote (stage_times.json,
``time.perf_counter``), the time from the script's end to the report, the export's and the
nsys-rep's sizes, the kernels and OS-runtime rows in the export, and the profiler's inflation of
the step (report.json's representativeness: profiled against bare median step).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

# runs gpudiag's command line with nsys's --trace list set for the arm
CHILD = """
import sys
from gpudiag.capture import nsys
arm = sys.argv.pop(1)
original = nsys.profile_command
def command(*args, **kwargs):
    cmd = original(*args, **kwargs)
    traces = {"osrt": "--trace=cuda,nvtx,osrt", "no-osrt": "--trace=cuda,nvtx"}
    return [traces[arm] if c.startswith("--trace=") else c for c in cmd]
nsys.profile_command = command
from gpudiag.cli.main import cli
cli(prog_name="gpudiag")
"""


def _rows(export: Path, table: str) -> int | None:
    with sqlite3.connect(export) as con:
        try:
            return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        except sqlite3.Error:
            return None


def one_run(arm: str, script: list[str], work: Path) -> dict:
    """One `gpudiag profile` of ``script`` in ``arm``: its stage times, sizes and inflation."""
    run_dir = work / f"run-{arm}"
    cmd = [sys.executable, "-c", CHILD, arm, "profile", "--try", "none", "-o", str(run_dir), "--force",
           script[0], "--", *script[1:]]
    done = subprocess.run(cmd, capture_output=True, text=True)
    out = {"arm": arm, "exit_code": done.returncode}
    if done.returncode != 0:
        return out | {"tail": done.stdout[-1500:] + done.stderr[-1500:]}
    times = json.loads((run_dir / "stage_times.json").read_text())
    report = json.loads((run_dir / "report.json").read_text())
    rep = report.get("representativeness") or {}
    export = run_dir / "profile.sqlite"
    return out | times | {
        "export_bytes": export.stat().st_size, "nsys_rep_bytes": (run_dir / "profile.nsys-rep").stat().st_size,
        "kernels": _rows(export, "CUPTI_ACTIVITY_KIND_KERNEL"), "osrt_rows": _rows(export, "OSRT_API"),
        "inflation_percent": rep.get("inflation_percent") if isinstance(rep, dict) else None,
        "bare_step_ns": rep.get("bare_step_time_ns") if isinstance(rep, dict) else None,
        "profiled_step_ns": rep.get("profiled_step_time_ns") if isinstance(rep, dict) else None,
        "terminal_line": next((x for x in done.stdout.splitlines() if x.startswith("time by stage")), None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--arms", default="osrt,no-osrt")
    parser.add_argument("--out", type=Path, required=True, help="JSON file of every run")
    parser.add_argument("script", nargs="+", help="the script and its arguments (after --)")
    args = parser.parse_args()
    arms = args.arms.split(",")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for arm in arms:  # interleaved: A B A B
                run = one_run(arm, args.script, Path(tmp)) | {"round": round_, "script": args.script}
                runs.append(run)
                print(json.dumps({k: v for k, v in run.items() if k != "tail"}), flush=True)
                args.out.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
