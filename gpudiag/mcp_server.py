"""gpudiag's analysis served to coding agents over the Model Context Protocol (``gpudiag mcp``).

The tools are the workflows of :mod:`gpudiag.app` with JSON answers: each reads what ``gpudiag
report`` takes (a run directory, an nsys SQLite export ``.sqlite``/``.sqlite.xz``, a report.json,
or the exports of one job's ranks: a folder of them, a glob, a list of paths), analyses it as
``gpudiag report`` does (once per file: later calls reuse the analysis while the files are unchanged)
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

from gpudiag.app.gate import gate_result, gated
from gpudiag.app.options import AnalysisOptions
from gpudiag.app.report import load_report
from gpudiag.errors import UserError
from gpudiag.version import __version__

INSTRUCTIONS = ("gpudiag diagnoses GPU bottlenecks of PyTorch runs from Nsight Systems captures. Find runs with "
                "list_runs, then read_steps / read_kernels / read_recommendations / read_ranks on a path (or a "
                "list of a job's rank exports), compare_runs to gate a change, and read_patch for a measured win's "
                "verified diff of the user's script. Times are ns per measured step "
                "unless a key says otherwise.")
# Captures to list: run directories hold this export; loose exports end so. run.sqlite is gpudiag's
# own run database, not an export.
EXPORT_SUFFIXES = (".sqlite", ".sqlite.xz")
RUN_DATABASE = "run.sqlite"
MAX_LISTED = 500

_cache: dict[tuple, dict] = {}
_cache_lock = threading.Lock()

Paths = str | list[str]  # one path (a run directory, an export, a report.json, a folder of rank exports, a glob) or several


def _report(path: Paths, top: int = 20) -> dict:
    """report.json's content of ``path`` (cached while every file's size and modification time
    hold; a glob is analysed again each time). Raises ToolError with gpudiag's one-line message for
    a user error."""
    targets = [Path(p).expanduser() for p in ([path] if isinstance(path, str) else path)]
    if not targets:
        raise ToolError("no path given: pass a run directory, an nsys SQLite export, or a list of rank exports")
    try:
        key = (*((str(t.resolve()), t.stat().st_mtime_ns, t.stat().st_size) for t in targets), top)
    except OSError:
        key = None
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    try:
        report = load_report(targets, AnalysisOptions(steps_from=None, warmup_steps=None), top=top)
    except UserError as exc:
        raise ToolError(exc.format_message()) from None
    if key is not None:
        with _cache_lock:
            _cache[key] = report
    return report


def list_runs(folder: str) -> dict[str, Any]:
    """Captures under ``folder`` (searched recursively, hidden folders skipped, at most 500): run
    directories made by gpudiag profile, nsys SQLite exports (.sqlite, .sqlite.xz) and report
    folders (a report.json without its export). Each: path, kind (run_directory, export or
    report), has_report (a report.json already written), size_bytes (of the export)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ToolError(f"{folder}: no such folder; pass a folder that holds gpudiag runs or nsys SQLite exports")
    from gpudiag.app.inputs import SQLITE_NAME

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


def read_summary(path: Paths) -> dict[str, Any]:
    """The run's headline: source, device, measured steps, step time (ns: mean, median, min,
    max), GPU busy percent, where the step's time goes (breakdown_percent: compute, bandwidth,
    overhead, communication, idle) and the report's warnings."""
    report = _report(path)
    steps = report["steps"]
    return {"path": path, "source": report.get("source"), "device": (report.get("device") or {}).get("name"),
            "steps_source": steps.get("source"), "measured_steps": steps.get("measured"),
            "step_time_ns": steps.get("step_time_ns"), "gpu_busy_percent": report.get("gpu_busy_percent"),
            "breakdown_percent": report.get("breakdown_percent"), "warnings": report.get("warnings") or []}


def read_steps(path: Paths) -> dict[str, Any]:
    """The run's steps: how they were found (source, kind), counts (count, warmup_steps, measured,
    outliers), step_time_ns statistics over the measured steps, and per_step: one record per step
    (step, step_time_ns, busy_ns, idle_ns, kernels, warmup, detail, measured, outlier; for measured
    steps compute_ns, bandwidth_ns, overhead_ns, communication_ns, host_bound_idle_ns,
    other_idle_ns)."""
    steps = _report(path)["steps"]
    return {"path": path, **steps}


def read_kernels(path: Paths, top: int = 20) -> dict[str, Any]:
    """The ``top`` kernels by GPU time per measured step, longest first: name, short_name, label,
    family, kernel_class (compute, bandwidth, overhead...), evidence, instances_per_step,
    time_ns_per_step, avg_ns, med_ns, share_of_kernel_time_percent, intensity_flop_per_byte,
    ridge_flop_per_byte, efficiency."""
    if top < 1:
        raise ToolError(f"top={top}: pass a number of kernels of at least 1")
    kernels = _report(path, top=max(top, 20)).get("top_kernels") or []
    return {"path": path, "kernels": kernels[:top]}


def read_recommendations(path: Paths) -> dict[str, Any]:
    """The run's recommendations, largest saving first: rule_id, title, saving_ns_per_step,
    saving_percent_of_step, estimate, evidence, how_to_fix, overlaps (rules counting the same time),
    and the fusion candidates (chains of ops worth fusing, with saving_ns_per_step)."""
    report = _report(path)
    return {"path": path, "recommendations": report.get("recommendations") or [],
            "fusion_candidates": report.get("fusion_candidates") or []}


def compare_runs(baseline: Paths, candidate: Paths, force: bool = False) -> dict[str, Any]:
    """gpudiag gate's verdict on ``candidate`` against ``baseline`` (default thresholds; runs that
    are not one workload are refused unless ``force``, as ``gpudiag gate --force``): verdict
    (pass, regression, ...), exit_code (0 pass, 1 regression), and per metric (step_time,
    gpu_busy_time, kernel_launches, family:*, module:* ...) the medians before and after, the
    relative change, the Mann-Whitney p_value and a verdict."""
    from gpudiag.app.gate import GateConfig

    base, cand = _report(baseline), _report(candidate)
    try:
        return gate_result(gated((base, str(baseline))), gated((cand, str(candidate))), GateConfig(), force=force)
    except UserError as exc:
        raise ToolError(exc.format_message()) from None


def read_ranks(path: Paths) -> dict[str, Any]:
    """The job's ranks (a capture of several processes, or the exports of its ranks): ranks, one
    record per process (global_pid, pid, device_id, rank, local_rank, measured_steps,
    step_time_ns_median, step_time_ns_mean, gpu_busy_percent, breakdown_percent,
    communication_ns_per_step, exposed_communication_ns_per_step, top_recommendation, error), and
    straggler: the rank the others wait for (its global_pid, pid, rank and how much shorter its
    step's communication waits are), or None. Empty ranks for a single process."""
    section = _report(path).get("ranks") or {}
    straggler = section.get("straggler", section.get("slowest"))  # report.json's older name of the field
    return {"path": path, "ranks": section.get("ranks") or [], "straggler": straggler,
            **{k: v for k, v in section.items() if k not in ("ranks", "straggler", "slowest")}}


def read_patch(run_dir: str, change: str | None = None) -> dict[str, Any]:
    """The verified patch of a measured win, to apply to the user's files: change, diff (a unified
    diff, paths relative to script_dir, for ``git apply`` there), script_dir, files (path,
    sha256_before, sha256_after), verification (status "verified", saving_percent,
    saving_ci_percent, trial_saving_percent). ``change`` None: the largest measured win's. An
    error when the patch is not verified, or a file changed since the run."""
    from gpudiag.app.apply import apply

    try:
        done = apply(Path(run_dir).expanduser(), change, dry_run=True)
    except UserError as exc:
        raise ToolError(exc.format_message()) from None
    if (done.patch.verification or {}).get("status") != "verified":
        state = (done.patch.verification or {}).get("status", "not verified")
        raise ToolError(f"{done.patch.change}: the patch is {state}, not verified; its diff is in "
                        f"{Path(run_dir) / 'changes' / (done.patch.change + '.patch')}")
    return {"run_dir": run_dir, **done.patch.summary()}


TOOLS = (list_runs, read_summary, read_steps, read_kernels, read_recommendations, read_ranks, compare_runs, read_patch)


def build_server() -> MCPServer:
    """The MCP server with gpudiag's tools (:data:`TOOLS`); ``build_server().run("stdio")`` serves it."""
    server = MCPServer("gpudiag", instructions=INSTRUCTIONS, version=__version__)
    for tool in TOOLS:
        server.add_tool(tool)
    return server
