"""Before/after timing of a zoo script with the report's advice applied, on the GPU machine.

    python benchmarks/zoo/before_after.py OUT.tsv --rounds 3 \\
        "resnet50|resnet50_train.py --steps 30" "resnet50_cl|resnet50_train.py --steps 30 --channels-last"

Each variant (``name|script and arguments``, scripts in benchmarks/zoo/) runs as its own process,
plainly (no profiler), ``--rounds`` times, the variants interleaved round by round so that drift of
the machine hits all of them alike. Each run prints its own ``median_step_ms`` (CUDA events after
warm-up, zoo_common.StepTimer); the TSV gets one line per run and the summary the median over
rounds per variant (METHOD.md: CUDA events, warm-up, median of repeats).
"""

from __future__ import annotations

import argparse
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_once(spec: str, timeout_s: int) -> tuple[float | None, str]:
    """(median_step_ms printed by the script or None, last line of its output)."""
    script, *args = shlex.split(spec)
    proc = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True, timeout=timeout_s)
    found = re.search(r"^median_step_ms ([\d.]+)", proc.stdout, re.M)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    return (float(found.group(1)) if found and proc.returncode == 0 else None), tail[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("variants", nargs="+", help='"name|script.py args"')
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per run")
    args = parser.parse_args()
    variants = [v.split("|", 1) for v in args.variants]
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    with args.out.open("w") as out:
        out.write("round\tvariant\tmedian_step_ms\tcommand\n")
        for r in range(args.rounds):
            for name, spec in variants:
                ms, tail = run_once(spec, args.timeout)
                out.write(f"{r}\t{name}\t{ms if ms is not None else 'FAIL'}\t{spec}\n")
                out.flush()
                print(f"round {r} {name}: {ms} ms ({tail})", flush=True)
                if ms is not None:
                    times[name].append(ms)
    for name, values in times.items():
        print(f"{name}\tmedian_over_rounds_ms\t{statistics.median(values) if values else 'FAIL'}\truns\t{values}")


if __name__ == "__main__":
    main()
