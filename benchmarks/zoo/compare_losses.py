"""Compare the per-step lines of two runs of a zoo script (plain vs under ``gpudiag profile``).

    python benchmarks/zoo/compare_losses.py plain.log profiled.log [--rtol 0.02] [--atol 1e-3] [--first-rtol 5e-3]

Reads the lines ``step N loss X`` (training) or ``step N checksum X ...`` (inference) of each log,
anything else is ignored (gpudiag's own output, warnings). The runs match when both have the same
steps and every value agrees within ``|a - b| <= atol + rtol * |a|``; step 0 (before any
non-deterministic weight update) within ``first-rtol``. Training steps differ slightly between runs
because some CUDA backward kernels accumulate with atomics; the tolerance allows for that, not
for a changed computation. Prints both columns; exits 0 on a match, 1 on a mismatch, 2 when a log
has no step lines (the run crashed before printing) or cannot be read.
"""

from __future__ import annotations

import argparse
import math
import re
import sys

LINE = re.compile(r"^step (\d+) (loss|checksum) (\S+)")


def read_steps(path: str) -> dict[int, tuple[str, float]]:
    """step -> (kind, value) of the step lines of a log (the last line of a step wins)."""
    steps = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LINE.match(line.strip())
            if m:
                try:
                    value = float(m.group(3))
                except ValueError:
                    continue
                steps[int(m.group(1))] = (m.group(2), value)
    return steps


def compare(a: dict, b: dict, rtol: float, atol: float, first_rtol: float) -> tuple[bool, list[str]]:
    """(match, report lines) for two step tables."""
    lines = [f"{'step':>5} {'kind':>8} {'run A':>14} {'run B':>14} {'|diff|':>10}  verdict"]
    ok = True
    if set(a) != set(b):
        ok = False
        lines.append(f"different steps: only in A {sorted(set(a) - set(b))}, only in B {sorted(set(b) - set(a))}")
    for step in sorted(set(a) | set(b)):
        kind_a, va = a.get(step, ("-", math.nan))
        kind_b, vb = b.get(step, ("-", math.nan))
        tol = atol + (first_rtol if step == 0 else rtol) * abs(va)
        diff = abs(va - vb)
        good = kind_a == kind_b and math.isfinite(diff) and diff <= tol
        if not good and math.isnan(va) and math.isnan(vb) and kind_a == kind_b:
            good = True  # both nan: the same (diverged) result
        ok &= good
        lines.append(f"{step:>5} {kind_a:>8} {va:>14.6f} {vb:>14.6f} {diff:>10.3g}  {'ok' if good else f'MISMATCH (tol {tol:.3g})'}")
    return ok, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log_a", help="e.g. the plain run's stdout")
    parser.add_argument("log_b", help="e.g. the profiled run's stdout")
    parser.add_argument("--rtol", type=float, default=0.02)
    parser.add_argument("--atol", type=float, default=1e-3)
    parser.add_argument("--first-rtol", type=float, default=5e-3, help="relative tolerance of step 0")
    args = parser.parse_args(argv)
    try:
        a, b = read_steps(args.log_a), read_steps(args.log_b)
    except OSError as exc:
        print(f"compare_losses: {exc}")
        return 2
    print(f"A: {args.log_a} ({len(a)} step lines)\nB: {args.log_b} ({len(b)} step lines)")
    if not a or not b:
        print("compare_losses: no 'step N loss|checksum X' lines in " + " and ".join(
            p for p, s in ((args.log_a, a), (args.log_b, b)) if not s))
        return 2
    ok, lines = compare(a, b, args.rtol, args.atol, args.first_rtol)
    print("\n".join(lines))
    print(f"compare_losses: {'MATCH' if ok else 'MISMATCH'} (rtol {args.rtol}, atol {args.atol}, step 0 rtol {args.first_rtol})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
