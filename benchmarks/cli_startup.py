"""Wall time of ``gpudiag --help`` and every command's ``--help`` (target: under 0.3 s, issue 13):

    python benchmarks/cli_startup.py [--repeat 20] [--checkout DIR ...]

Each command line runs ``--repeat`` times in turn with the others (so a burst of load on a shared
machine spreads over all of them); prints the median and the minimum in seconds, with
``python -c pass`` (the interpreter alone) as the floor. ``--checkout DIR`` times ``python -m
gpudiag`` of another checkout too (e.g. the tree before a change, from ``git archive``), labelled
with DIR's name. The console script is timed as installed (``gpudiag`` on PATH).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ((), ("report",), ("profile",), ("gate",), ("baseline", "save"), ("calibrate",), ("kernels", "bench"))


def command_lines(checkouts: list[Path]) -> list[tuple[str, list[str], Path]]:
    """(label, argv, working directory) of each timed command line."""
    lines = [("python -c pass", [sys.executable, "-c", "pass"], REPO_ROOT)]
    for folder, tag in [(REPO_ROOT, "")] + [(c, f" [{c.name}]") for c in checkouts]:
        # python -m gpudiag finds the package of the working directory first
        lines += [(f"python -m gpudiag {' '.join(c)} --help{tag}".replace("  ", " "),
                   [sys.executable, "-m", "gpudiag", *c, "--help"], folder) for c in COMMANDS]
    if shutil.which("gpudiag"):
        lines += [(f"gpudiag {' '.join(c)} --help (console script)".replace("  ", " "),
                   [shutil.which("gpudiag"), *c, "--help"], REPO_ROOT) for c in ((), ("report",))]
    return lines


def main() -> None:
    """Time the command lines and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--checkout", type=Path, action="append", default=[])
    args = parser.parse_args()
    lines = command_lines(args.checkout)
    times: dict[str, list[float]] = {label: [] for label, _, _ in lines}
    for _ in range(args.repeat):
        for label, argv, cwd in lines:
            start = time.perf_counter()
            subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times[label].append(time.perf_counter() - start)
    print("| command | median s | min s |\n| --- | --- | --- |")
    for label, samples in times.items():
        print(f"| `{label}` | {statistics.median(samples):.3f} | {min(samples):.3f} |")


if __name__ == "__main__":
    main()
