"""Turn run_zoo.sh output folders (copied back from the GPU machine) into committed test fixtures.

    python benchmarks/zoo/collect_fixtures.py OUT_DIR/llama OUT_DIR/resnet50 ... [--dest tests/fixtures/zoo]

Per workload: ``<name>.sqlite.xz`` (the export, scrubbed with :mod:`gpudiag.sources.scrub`),
``<name>.status.json.xz`` (gpudiag's script status with its bare run and Inductor provenance,
absolute paths reduced to their last component like the scrubber does) and one entry of
``zoo_runs.json``: the plain run's printed losses and median step (CUDA events), and the bare and
profiled medians from report.json, which docs/workload_zoo.md tabulates.
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import shutil
import tempfile
from pathlib import Path

from gpudiag.sources import scrub

STEP_LINE = re.compile(r"^step (\d+) (loss|checksum) ([-\d.eE+]+)")


def _printed(log: Path) -> dict:
    """Per-step values and the median step time a zoo script printed."""
    values, median = {}, None
    for line in log.read_text(errors="replace").splitlines():
        if m := STEP_LINE.match(line):
            values[m.group(1)] = float(m.group(3))
        elif line.startswith("median_step_ms "):
            median = float(line.split()[1])
    return {"values": values, "median_step_ms": median}


def _scrubbed_export(src: Path, dest: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "export.sqlite"
        with lzma.open(src) as f, open(plain, "wb") as out:
            shutil.copyfileobj(f, out)
        scrub.scrub(plain)
        with open(plain, "rb") as f, lzma.open(dest, "wb", preset=9) as out:
            shutil.copyfileobj(f, out)


def _scrubbed_status(src: Path, dest: Path) -> None:
    text = scrub.scrub_text(src.read_text())
    json.loads(text)  # still valid JSON
    with lzma.open(dest, "wt", preset=9) as out:
        out.write(text)


def collect(run: Path, dest: Path) -> dict:
    """Write the fixtures of one workload folder into ``dest``; returns its zoo_runs.json entry."""
    name = run.name
    _scrubbed_export(run / "profile.sqlite.xz", dest / f"{name}.sqlite.xz")
    _scrubbed_status(run / "script_status.json", dest / f"{name}.status.json.xz")
    report = json.loads((run / "report.json").read_text())
    rep = report.get("representativeness") or {}
    return {"workload": name, "command": (run / "commands.txt").read_text().splitlines()[0].split("benchmarks/zoo/")[-1],
            "device": report["device"]["name"], "plain": _printed(run / "plain.log"),
            "profiled_printed": _printed(run / "profiled.log"),
            "bare_step_time_ns": rep.get("bare_step_time_ns"), "profiled_step_time_ns": rep.get("profiled_step_time_ns"),
            "report_median_step_time_ns": report["steps"]["step_time_ns"]["median"],
            "inflation_percent": rep.get("inflation_percent"),
            "overhead_bound_before": any(r["rule_id"] == "GD-OVERHEAD-BOUND" for r in report["recommendations"])
            or any(r["rule_id"] == "GD-OVERHEAD-BOUND" for r in report.get("suppressed", [])),
            "overhead_bound_after": any(r["rule_id"] == "GD-OVERHEAD-BOUND" for r in report["recommendations"]),
            "compiled": report.get("compiled"), "launches_per_step": report.get("launches_per_step"),
            "compare": (run / "compare.txt").read_text().strip().splitlines()[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--dest", type=Path, default=Path("tests/fixtures/zoo"))
    args = parser.parse_args()
    args.dest.mkdir(parents=True, exist_ok=True)
    index = args.dest / "zoo_runs.json"
    entries = {e["workload"]: e for e in (json.loads(index.read_text()) if index.exists() else [])}
    for run in args.runs:
        entries[run.name] = collect(run, args.dest)
        print(f"{run.name}: fixtures written")
    index.write_text(json.dumps(sorted(entries.values(), key=lambda e: e["workload"]), indent=1) + "\n")


if __name__ == "__main__":
    main()
