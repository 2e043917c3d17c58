"""Seconds of each stage of ``gpudiag report`` on one export, in one ordinary run.

    python benchmarks/stage_times.py EXPORT OUT_DIR [--json FILE]

The report runs as ``gpudiag report EXPORT -o OUT_DIR --force`` would (``analyse_and_report``),
with the pipeline's stage functions wrapped by a wall-clock timer (``time.perf_counter``; nothing
else changes, unlike a profiler, whose per-call cost inflates the many small calls of some stages).
Printed: start-up (the imports), reading the export (connectorx's reads and the row checks, the
run database's writer started), each analysis stage in order, the wait for the writer and the
report files. A stage's seconds include the stages it calls (the derived tables' Parquet is made
inside "the analysis' other work"). docs/scale.md has results.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

# the analysis' stages, in the order analyse calls them: (module attribute, label)
STAGES = [("_load", "frames of one process"), ("find_steps", "steps"), ("_attribute", "attribution"),
          ("classify", "classification"), ("_step_frames", "step stage"),
          ("findings", "findings: fusion, rules, host floor"), ("_step_sections", "report sections")]


def _timed(module, name: str, label: str, seconds: dict) -> None:
    """``module.name`` replaced by itself with its wall time added to ``seconds[label]``."""
    fn = getattr(module, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[label] = seconds.get(label, 0.0) + time.perf_counter() - t

    setattr(module, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export")
    parser.add_argument("out")
    parser.add_argument("--json", help="also write the seconds to this file")
    args = parser.parse_args()
    from gpudiag import store
    from gpudiag.analysis import pipeline
    from gpudiag.app.options import AnalysisOptions
    from gpudiag.app.report import analyse_and_report

    seconds: dict[str, float] = {"start-up (imports)": time.perf_counter() - START}
    for name, label in STAGES:
        _timed(pipeline, name, label, seconds)
    _timed(store, "flush", "waiting for the run database's writer", seconds)
    parts: dict[str, float] = {}
    analyse_and_report(Path(args.export), Path(args.out), AnalysisOptions(steps_from=None, warmup_steps=None),
                       times=parts)
    seconds["reading the export"] = parts["reading the export"]
    staged = sum(seconds.get(label, 0.0) for _, label in STAGES) + seconds.get("waiting for the run database's writer", 0.0)
    seconds["the analysis' other work"] = parts["analysis"] - staged
    seconds["report files"] = parts["report files"]
    seconds["total"] = time.perf_counter() - START
    order = ["start-up (imports)", "reading the export", *(label for _, label in STAGES), "the analysis' other work",
             "waiting for the run database's writer", "report files", "total"]
    for label in order:
        print(f"{seconds.get(label, 0.0):8.2f} s  {label}")
    if args.json:
        Path(args.json).write_text(json.dumps({label: round(seconds.get(label, 0.0), 3) for label in order}, indent=1))


if __name__ == "__main__":
    main()
