"""gpudiag's analysis served to coding agents over the Model Context Protocol (``gpudiag mcp``).

The tools are the library (:mod:`gpudiag.api`) with JSON answers: each reads a run directory, an
nsys SQLite export (``.sqlite``/``.sqlite.xz``) or a report.json by path, analyses it as
``gpudiag report`` does (once per file: later calls reuse the analysis while the file is unchanged)
and answers with report.json's own records, so an agent sees the numbers the report shows. Units
are in the key names (``_ns``, ``_bytes``, ``_percent``). A user error (a missing file, a file that
is not an export) is the tool's error result, one line naming the file.

Needs the official ``mcp`` SDK, an optional extra: ``pip install 'gpudiag[mcp]'``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from gpudiag import __version__, api

INSTRUCTIONS = ("gpudiag diagnoses GPU bottlenecks of PyTorch runs from Nsight Systems captures. Find runs with "
                "list_runs, then read_steps / read_kernels / read_recommendations on a path, and compare_runs to "
                "gate a change. Times are ns per measured step unless a key says otherwise.")
# Captures to list: run directories hold this export; loose exports end so. run.sqlite is gpudiag's
# own run database, not an export.
EXPORT_SUFFIXES = (".sqlite", ".sqlite.xz")
RUN_DATABASE = "run.sqlite"
MAX_LISTED = 500

_cache: dict[tuple, api.Run] = {}
_cache_lock = threading.Lock()


def _run(path: str, top: int = 20) -> api.Run:
    """The analysed run at ``path`` (cached while the file's size and modification time hold).
    Raises ToolError with gpudiag's one-line message for a user error."""
    target = Path(path).expanduser()
    try:
        stat = target.stat()
        key = (str(target.resolve()), stat.st_mtime_ns, stat.st_size, top)
    except OSError:
        key = None
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    try:
        run = api.load(target, top=top)
    except api.UserError as exc:
        raise ToolError(exc.format_message()) from None
    if key is not None:
        with _cache_lock:
            _cache[key] = run
    return run


def list_runs(folder: str) -> dict[str, Any]:
    """Captures under ``folder`` (searched recursively, hidden folders skipped, at most 500): run
    directories made by gpudiag profile, nsys SQLite exports (.sqlite, .sqlite.xz) and report
    folders (a report.json without its export). Each: path, kind (run_directory, export or
    report), has_report (a report.json already written), size_bytes (of the export)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ToolError(f"{folder}: no such folder; pass a folder that holds gpudiag runs or nsys SQLite exports")
    from gpudiag.capture.run import SQLITE_NAME

    runs: list[dict[str, Any]] = []
    for path in sorted(root.rglob("*")):
        if len(runs) >= MAX_LISTED:
            break
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        if path.is_dir() and (path / SQLITE_NAME).is_file():
            runs.append(_entry(path, "run_directory", path / SQLITE_NAME))
        elif path.is_dir() and (path / "report.json").is_file():
            runs.append(_entry(path, "report", None))
        elif (path.is_file() and path.name.endswith(EXPORT_SUFFIXES) and path.name != RUN_DATABASE
              and path.name != SQLITE_NAME):
            runs.append(_entry(path, "export", path))
    return {"folder": str(root), "runs": runs, "truncated": len(runs) >= MAX_LISTED}


def _entry(path: Path, kind: str, export: Path | None) -> dict[str, Any]:
    report = path / "report.json" if path.is_dir() else None
    return {"path": str(path), "kind": kind, "has_report": bool(report and report.is_file()),
            "size_bytes": export.stat().st_size if export else None}


def read_summary(path: str) -> dict[str, Any]:
    """The run's headline: source, device, measured steps, step time (ns: mean, median, min,
    max), GPU busy percent, where the step's time goes (breakdown_percent: compute, bandwidth,
    overhead, communication, idle) and the report's warnings."""
    report = _run(path).report
    steps = report["steps"]
    return {"path": path, "source": report.get("source"), "device": (report.get("device") or {}).get("name"),
            "steps_source": steps.get("source"), "measured_steps": steps.get("measured"),
            "step_time_ns": steps.get("step_time_ns"), "gpu_busy_percent": report.get("gpu_busy_percent"),
            "breakdown_percent": report.get("breakdown_percent"), "warnings": report.get("warnings") or []}


def read_steps(path: str) -> dict[str, Any]:
    """The run's steps: how they were found (source, kind), counts (count, warmup_steps, measured,
    outliers), step_time_ns statistics over the measured steps, and per_step: one record per step
    (step, step_time_ns, busy_ns, idle_ns, kernels, warmup, detail, measured, outlier; for measured
    steps compute_ns, bandwidth_ns, overhead_ns, communication_ns, host_bound_idle_ns,
    other_idle_ns)."""
    steps = _run(path).report["steps"]
    return {"path": path, **steps}


def read_kernels(path: str, top: int = 20) -> dict[str, Any]:
    """The ``top`` kernels by GPU time per measured step, longest first: name, short_name, label,
    family, kernel_class (compute, bandwidth, overhead...), evidence, instances_per_step,
    time_ns_per_step, avg_ns, med_ns, share_of_kernel_time_percent, intensity_flop_per_byte,
    ridge_flop_per_byte, efficiency."""
    if top < 1:
        raise ToolError(f"top={top}: pass a number of kernels of at least 1")
    kernels = _run(path, top=max(top, 20)).report.get("top_kernels") or []
    return {"path": path, "kernels": kernels[:top]}


def read_recommendations(path: str) -> dict[str, Any]:
    """The run's recommendations, largest saving first: rule_id, title, saving_ns_per_step,
    saving_percent_of_step, estimate, evidence, how_to_fix, overlaps (rules counting the same time),
    and the fusion candidates (chains of ops worth fusing, with saving_ns_per_step)."""
    report = _run(path).report
    return {"path": path, "recommendations": report.get("recommendations") or [],
            "fusion_candidates": report.get("fusion_candidates") or []}


def compare_runs(baseline: str, candidate: str) -> dict[str, Any]:
    """gpudiag gate's verdict on ``candidate`` against ``baseline`` (default thresholds): verdict
    (pass, regression, ...), exit_code (0 pass, 1 regression), and per metric (step_time,
    gpu_busy_time, kernel_launches, family:*, module:* ...) the medians before and after, the
    relative change, the Mann-Whitney p_value and a verdict."""
    base, cand = _run(baseline), _run(candidate)
    try:
        return base.compare(cand)
    except api.UserError as exc:
        raise ToolError(exc.format_message()) from None


TOOLS = (list_runs, read_summary, read_steps, read_kernels, read_recommendations, compare_runs)


def build_server() -> MCPServer:
    """The MCP server with gpudiag's tools (:data:`TOOLS`); ``build_server().run("stdio")`` serves it."""
    server = MCPServer("gpudiag", instructions=INSTRUCTIONS, version=__version__)
    for tool in TOOLS:
        server.add_tool(tool)
    return server
