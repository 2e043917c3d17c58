"""gpudiag as a library: ``gpudiag.load(path)`` analyses a capture (or reads a report) and returns a
:class:`Run` whose tables are pandas DataFrames, for notebooks and tools (docs/api.md).

It runs the same analysis as ``gpudiag report`` (:func:`gpudiag.cli.report.ingest_and_analyse`) and
compares two runs as ``gpudiag gate`` does (:func:`gpudiag.cli.gate.gate_result`). Columns keep
report.json's names, whose suffix is the unit: ``_ns`` nanoseconds, ``_bytes`` bytes, ``_percent``
percent, ``flop`` floating-point operations; ``_per_step`` means per measured step (the mean over the
steady-state steps). Polars users convert with ``polars.from_pandas(frame)`` (through Arrow).

Errors a user can fix (a missing file, a file that is not an export, an invalid step regex, a
capture without kernels) raise :class:`gpudiag.cli.errors.UserError` (also ``gpudiag.api.UserError``)
with one line naming the file and the fix, as the command line prints them.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pandas as pd

from gpudiag.cli.errors import UserError
from gpudiag.cli.gate import gate_result, gated
from gpudiag.cli.options import AnalysisOptions
from gpudiag.cli.report import analysis_inputs, ingest_and_analyse

__all__ = ["Run", "UserError", "load", "STEP_COLUMNS", "KERNEL_COLUMNS", "RECOMMENDATION_COLUMNS",
           "FUSION_COLUMNS", "RANK_COLUMNS"]

# The documented columns of each frame, in order; a report may add more after them.
STEP_COLUMNS = ("step", "step_time_ns", "busy_ns", "idle_ns", "kernels", "warmup", "detail", "measured", "outlier",
                "compute_ns", "bandwidth_ns", "overhead_ns", "communication_ns", "host_bound_idle_ns", "other_idle_ns")
KERNEL_COLUMNS = ("name", "short_name", "label", "family", "kernel_class", "evidence", "instances_per_step",
                  "time_ns_per_step", "avg_ns", "med_ns", "share_of_kernel_time_percent", "intensity_flop_per_byte",
                  "ridge_flop_per_byte", "efficiency")
RECOMMENDATION_COLUMNS = ("rule_id", "title", "saving_ns_per_step", "saving_percent_of_step", "saving_estimated",
                          "estimate", "evidence", "how_to_fix", "overlaps")
FUSION_COLUMNS = ("ops", "occurrences_per_step", "modules", "chain_ns", "fused_floor_ns", "saving_ns_per_step",
                  "external_bytes", "kernels_per_occurrence", "compile_fusable", "reference_kernel", "host_bound")
RANK_COLUMNS = ("global_pid", "pid", "device_id", "rank", "local_rank", "measured_steps", "step_time_ns_median",
                "step_time_ns_mean", "gpu_busy_percent", "compute_percent", "bandwidth_percent", "overhead_percent",
                "communication_percent", "idle_percent", "communication_ns_per_step",
                "exposed_communication_ns_per_step", "top_recommendation", "slower_than_fastest_percent", "error")


def _frame(rows: list[dict], columns: tuple[str, ...]) -> pd.DataFrame:
    """``rows`` as a frame: the documented ``columns`` first (absent ones as missing values), then
    any others the report has, in their order; no rows gives an empty frame with the columns."""
    frame = pd.DataFrame(rows)
    extra = [c for c in frame.columns if c not in columns]
    return frame.reindex(columns=[*columns, *extra])


class Run:
    """One analysed run: report.json's content (:attr:`report`) and its tables as DataFrames.

    Made by :func:`load`; each table property builds a new frame (edit it freely)."""

    def __init__(self, report: dict, source: str) -> None:
        from gpudiag.renderers import json_report

        self._json = json_report.to_json(report)  # the exact text gpudiag report writes to report.json
        self.report: dict = json.loads(self._json)  #: report.json's content (JSON types; NaN is None)
        self.source: str = source  #: the path it was loaded from, as given

    def __repr__(self) -> str:
        steps = self.report["steps"]
        median = (steps.get("step_time_ns") or {}).get("median")
        step = f", median step {median / 1e6:.2f} ms" if median else ""
        return (f"<gpudiag.Run {self.source!r}: {steps.get('measured', 0)} measured steps{step}, "
                f"{len(self.report.get('recommendations') or [])} recommendations>")

    @property
    def steps(self) -> pd.DataFrame:
        """One row per step of the capture, in order (:data:`STEP_COLUMNS`): ``step`` (its number),
        ``step_time_ns``, GPU ``busy_ns`` and ``idle_ns``, ``kernels`` (count), flags ``warmup``,
        ``detail`` (the step with per-op ranges), ``measured`` (in the statistics) and ``outlier``;
        for measured steps the time split ``compute_ns``, ``bandwidth_ns``, ``overhead_ns``,
        ``communication_ns`` and the idle split ``host_bound_idle_ns``, ``other_idle_ns`` (missing
        otherwise). A capture without step ranges is one step."""
        return _frame(self.report["steps"].get("per_step") or [], STEP_COLUMNS)

    @property
    def kernels(self) -> pd.DataFrame:
        """The top kernels by GPU time over the measured steps, one row per kernel name, longest
        first (as many as ``load(top=...)`` kept; :data:`KERNEL_COLUMNS`): ``name`` (demangled),
        ``short_name``, ``label``, ``family``, ``kernel_class`` (compute, bandwidth, overhead...),
        ``evidence`` (ncu, shapes or heuristic), ``instances_per_step``, ``time_ns_per_step``,
        ``avg_ns`` and ``med_ns`` per instance, ``share_of_kernel_time_percent``,
        ``intensity_flop_per_byte``, ``ridge_flop_per_byte`` and ``efficiency`` (of the roofline
        bound, 0 to 1; missing where unknown)."""
        return _frame(self.report.get("top_kernels") or [], KERNEL_COLUMNS)

    @property
    def recommendations(self) -> pd.DataFrame:
        """The recommendations, largest saving first (:data:`RECOMMENDATION_COLUMNS`): ``rule_id``
        (stable, e.g. GD-OVERHEAD-BOUND), ``title``, ``saving_ns_per_step`` (estimated),
        ``saving_percent_of_step``, ``saving_estimated``, ``estimate`` (how the saving is
        estimated), ``evidence`` (list of sentences), ``how_to_fix``, ``overlaps`` (rule ids whose
        savings count the same time)."""
        return _frame(self.report.get("recommendations") or [], RECOMMENDATION_COLUMNS)

    @property
    def fusion_candidates(self) -> pd.DataFrame:
        """Chains of ops worth fusing into one kernel, largest saving first (:data:`FUSION_COLUMNS`):
        ``ops`` (list of aten ops), ``occurrences_per_step``, ``modules``, ``chain_ns`` (one
        occurrence), ``fused_floor_ns`` (one fused occurrence at the bandwidth bound),
        ``saving_ns_per_step``, ``external_bytes`` (read and written by the fused kernel),
        ``kernels_per_occurrence``, ``compile_fusable``, ``reference_kernel`` (a gpudiag kernel that
        does it, if any), ``host_bound``. Empty for a capture without per-op shapes."""
        return _frame(self.report.get("fusion_candidates") or [], FUSION_COLUMNS)

    @property
    def ranks(self) -> pd.DataFrame:
        """One row per process (rank) of a capture of several processes, else empty with the same
        columns (:data:`RANK_COLUMNS`): ``global_pid``, ``pid``, ``device_id``, ``rank`` and
        ``local_rank`` (where the launcher recorded them), ``measured_steps``,
        ``step_time_ns_median``, ``step_time_ns_mean``, ``gpu_busy_percent``, the breakdown of its
        step as ``compute_percent``, ``bandwidth_percent``, ``overhead_percent``,
        ``communication_percent``, ``idle_percent``, ``communication_ns_per_step``,
        ``exposed_communication_ns_per_step``, ``top_recommendation`` (rule id),
        ``slower_than_fastest_percent``, ``error`` (why a rank could not be analysed)."""
        rows = [{**{k: v for k, v in r.items() if k != "breakdown_percent"},
                 **{f"{k}_percent": v for k, v in (r.get("breakdown_percent") or {}).items()}}
                for r in (self.report.get("ranks") or {}).get("ranks") or []]
        return _frame(rows, RANK_COLUMNS)

    def to_json(self, path: str | Path | None = None) -> str | Path:
        """report.json's text (what ``gpudiag report`` writes); written to ``path`` if given, which
        is returned instead."""
        if path is None:
            return self._json
        Path(path).write_text(self._json, encoding="utf-8")
        return Path(path)

    def to_html(self, path: str | Path | None = None) -> str | Path:
        """The self-contained report.html page (a few MB: plotly.js is inlined); written to ``path``
        if given, which is returned instead."""
        from gpudiag.renderers import html

        page = html.render(self.report)
        if path is None:
            return page
        Path(path).write_text(page, encoding="utf-8")
        return Path(path)

    def compare(self, other: Run, *, config: str | Path | None = None,
                allow_different_hardware: bool = False) -> dict:
        """``gpudiag gate``'s comparison of this run (the baseline) with ``other`` (the candidate):
        its ``--format json`` dict, with ``verdict`` (pass, regression...), ``exit_code`` (0 pass,
        1 regression) and ``metrics``, one dict per metric (``name``, ``unit``, ``baseline_median``,
        ``current_median``, ``change`` relative, ``p_value``, ``threshold``, ``noise_floor``,
        ``verdict``): ``pandas.DataFrame(result["metrics"])`` is a table. ``config``: a TOML file
        with a ``[tool.gpudiag.gate]`` table (as ``--config``); None uses the defaults (unlike the
        command, it does not read ./pyproject.toml). Raises UserError (exit code 3) when the runs
        are not comparable: other GPU, driver or torch (unless ``allow_different_hardware``), or no
        per-step samples."""
        from gpudiag.analysis.gate import GateConfig
        from gpudiag.cli.gate import load_config

        gate_config = load_config(Path(config)) if config is not None else GateConfig()
        return gate_result(gated((self.report, self.source)), gated((other.report, other.source)), gate_config,
                           allow_different_hardware)


def load(path: str | Path, *, ncu: str | Path | None = None, peaks: str | Path | None = None,
         steps_from: str | None = None, warmup_steps: int | None = None, top: int = 20) -> Run:
    """Analyse ``path`` as ``gpudiag report`` does and return the :class:`Run`, writing nothing.

    ``path``: a run directory made by ``gpudiag profile`` (its own ncu report, calibration and
    status are used), an nsys SQLite export (``.sqlite`` or ``.sqlite.xz``), or a report already
    written: a ``report.json`` or a folder holding one and no export (read, not analysed again).
    ``ncu``: an Nsight Compute report of the same workload (``.ncu-rep`` or ``.ncu-rep.xz``);
    ``peaks``: a ``calibration.json`` of measured peaks; ``steps_from`` and ``warmup_steps`` as the
    command's ``--steps-from`` and ``--warmup-steps``; ``top``: how many kernels the kernel table
    keeps. The analysis of a large export takes as long as the command (seconds to minutes).

    Raises :class:`UserError` (one line naming the file; ``exit_code`` as the command's) for a
    missing path, a file that is neither an export nor a report, options given with a report
    already written, an invalid ``steps_from``, or a capture that cannot be analysed.
    """
    source = Path(path)
    report_file = _written_report(source)
    if report_file is not None:
        if ncu is not None or peaks is not None or steps_from is not None or warmup_steps is not None:
            raise UserError(f"{source}: a report already written cannot be analysed again with other options; "
                            "pass the run directory or export instead")
        return Run(_read_report(report_file), str(path))
    options = AnalysisOptions(steps_from=steps_from, warmup_steps=warmup_steps)
    inputs = analysis_inputs(source, options, Path(ncu) if ncu else None, Path(peaks) if peaks else None)
    with tempfile.TemporaryDirectory(prefix="gpudiag-") as tmp:
        result = ingest_and_analyse(inputs.export, Path(tmp) / "run.sqlite", options, inputs.status, inputs.ncu,
                                    inputs.calibration, top)
    return Run(result, str(path))


def _written_report(source: Path) -> Path | None:
    """The report.json ``source`` names: itself (a ``.json`` file), or the one in a folder without
    an export; None for anything to analyse."""
    from gpudiag.capture.run import SQLITE_NAME

    if source.is_file() and source.suffix == ".json":
        return source
    if source.is_dir() and not (source / SQLITE_NAME).exists() and (source / "report.json").is_file():
        return source / "report.json"
    return None


def _read_report(file: Path) -> dict:
    """A report.json's content. Raises UserError when it is not one."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict) or "schema_version" not in data or "steps" not in data:
        raise UserError(f"{file}: not a gpudiag report.json; pass a run directory, an nsys SQLite export or the "
                        "report.json gpudiag report wrote", exit_code=3)
    return data
