"""gpudiag as a library: ``gpudiag.load(path)`` analyses a capture (or reads a report) and returns a
:class:`Run` whose tables are pandas DataFrames, for notebooks and tools (docs/api.md);
``gpudiag.profile(script)`` profiles a script as ``gpudiag profile`` does and returns its Run.

It is a face over the workflows of :mod:`gpudiag.app`: the same analysis as ``gpudiag report``
(:func:`gpudiag.app.report.ingest_and_analyse`), the same comparison as ``gpudiag gate``
(:func:`gpudiag.app.gate.gate_result`). Columns keep
report.json's names, whose suffix is the unit: ``_ns`` nanoseconds, ``_bytes`` bytes, ``_percent``
percent, ``flop`` floating-point operations; ``_per_step`` means per measured step (the mean over the
steady-state steps). Polars users convert with ``polars.from_pandas(frame)`` (through Arrow).

Errors a user can fix (a missing file, a file that is not an export, an invalid step regex, a
capture without kernels) raise :class:`gpudiag.errors.UserError` (also ``gpudiag.UserError``)
with one line naming the file and the fix, as the command line prints them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from gpudiag.app import frames
from gpudiag.app.gate import gate_result, gated, load_config
from gpudiag.app.options import AnalysisOptions
from gpudiag.app.report import Report, load_report
from gpudiag.errors import UserError

__all__ = ["Run", "UserError", "load", "profile", "STEP_COLUMNS", "KERNEL_COLUMNS", "RECOMMENDATION_COLUMNS",
           "FUSION_COLUMNS", "RANK_COLUMNS"]

# Each frame's columns, in order: its whole schema (columns and dtypes: gpudiag.app.frames, docs/api.md).
STEP_COLUMNS = tuple(c.name for c in frames.STEPS)
KERNEL_COLUMNS = tuple(c.name for c in frames.KERNELS)
RECOMMENDATION_COLUMNS = tuple(c.name for c in frames.RECOMMENDATIONS)
FUSION_COLUMNS = tuple(c.name for c in frames.FUSION_CANDIDATES)
RANK_COLUMNS = tuple(c.name for c in frames.RANKS)


class Run:
    """One analysed run: report.json's content (:attr:`report`) and its tables as DataFrames.

    Made by :func:`load`; each table property builds a new frame (edit it freely)."""

    def __init__(self, report: Report, source: str) -> None:
        self.report: Report = report  #: the finished report: the object report.json is written from
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
        otherwise), with ``launch_bound_idle_ns`` and ``host_compute_idle_ns`` where the host-bound
        idle is split. A capture without step ranges is one step. Columns and dtypes:
        :data:`gpudiag.app.frames.STEPS`."""
        return frames.steps(self.report)

    @property
    def kernels(self) -> pd.DataFrame:
        """The top kernels by GPU time over the measured steps, one row per kernel name, longest
        first (as many as ``load(top=...)`` kept; :data:`KERNEL_COLUMNS`): ``name`` (demangled),
        ``short_name``, ``label``, ``family``, ``kernel_class`` (compute, bandwidth, overhead...),
        ``evidence`` (ncu, shapes or heuristic), ``instances_per_step``, ``time_ns_per_step``,
        ``avg_ns`` and ``med_ns`` per instance, ``share_of_kernel_time_percent``,
        ``intensity_flop_per_byte``, ``ridge_flop_per_byte`` and ``efficiency`` (of the roofline
        bound, 0 to 1; missing where unknown). Dtypes: :data:`gpudiag.app.frames.KERNELS`."""
        return frames.kernels(self.report)

    @property
    def recommendations(self) -> pd.DataFrame:
        """The recommendations, largest saving first (:data:`RECOMMENDATION_COLUMNS`): ``rule_id``
        (stable, e.g. GD-OVERHEAD-BOUND), ``title``, ``saving_ns_per_step`` (estimated),
        ``saving_percent_of_step``, ``saving_estimated``, ``estimate`` (how the saving is
        estimated), ``evidence`` (a JSON list of sentences), ``how_to_fix``, ``overlaps`` (a JSON
        list of the rule ids whose savings count the same time), then the fields some rules and the
        trials set (missing elsewhere): :data:`gpudiag.app.frames.RECOMMENDATIONS`."""
        return frames.recommendations(self.report)

    @property
    def fusion_candidates(self) -> pd.DataFrame:
        """Chains of ops worth fusing into one kernel, largest saving first (:data:`FUSION_COLUMNS`):
        ``ops`` (a JSON list of aten ops), ``occurrences_per_step``, ``modules`` (JSON list), ``chain_ns`` (one
        occurrence), ``fused_floor_ns`` (one fused occurrence at the bandwidth bound),
        ``saving_ns_per_step``, ``external_bytes`` (read and written by the fused kernel),
        ``kernels_per_occurrence``, ``compile_fusable``, ``reference_kernel`` (a gpudiag kernel that
        does it, if any), ``host_bound``, ``example_shapes`` (a JSON list of the recorded inputs),
        then the fields of kernel-sequence chains and of ``--verify``
        (:data:`gpudiag.app.frames.FUSION_CANDIDATES`). Empty for a capture without per-op shapes."""
        return frames.fusion_candidates(self.report)

    @property
    def ranks(self) -> pd.DataFrame:
        """One row per process (rank) of a capture of several processes, else empty with the same
        columns (:data:`RANK_COLUMNS`): ``global_pid``, ``pid``, ``device_id``, ``rank`` and
        ``local_rank`` (where the launcher recorded them), ``measured_steps``,
        ``step_time_ns_median``, ``step_time_ns_mean``, ``gpu_busy_percent``, the breakdown of its
        step as ``compute_percent``, ``bandwidth_percent``, ``overhead_percent``,
        ``communication_percent``, ``idle_percent``, ``communication_ns_per_step``,
        ``exposed_communication_ns_per_step``, ``op_calls_recorded``, ``top_recommendation`` (rule
        id), ``bare_step_time_ns_median`` (without the profiler), ``slower_than_fastest_percent``,
        ``straggler`` (the rank the others wait for: report.json's ``ranks.straggler``), ``error``
        (why a rank could not be analysed). Dtypes: :data:`gpudiag.app.frames.RANKS`."""
        return frames.ranks(self.report)

    def to_json(self, path: str | Path | None = None) -> str | Path:
        """report.json's text (what ``gpudiag report`` writes); written to ``path`` if given, which
        is returned instead."""
        from gpudiag.renderers import json_report

        text = json_report.to_json(self.report)
        if path is None:
            return text
        Path(path).write_text(text, encoding="utf-8")
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
                allow_different_hardware: bool = False, force: bool = False) -> dict:
        """``gpudiag gate``'s comparison of this run (the baseline) with ``other`` (the candidate):
        its ``--format json`` dict, with ``verdict`` (pass, regression...), ``exit_code`` (0 pass,
        1 regression) and ``metrics``, one dict per metric (``name``, ``unit``, ``baseline_median``,
        ``current_median``, ``change`` relative, ``p_value``, ``threshold``, ``noise_floor``,
        ``verdict``): ``pandas.DataFrame(result["metrics"])`` is a table. ``config``: a TOML file
        with a ``[tool.gpudiag.gate]`` table (as ``--config``); None uses the defaults (unlike the
        command, it does not read ./pyproject.toml). Raises UserError (exit code 3) when the runs
        are not comparable: other GPU, driver or torch (unless ``allow_different_hardware``), not one
        workload (another script, or under half the kernel time in kernels both have; unless
        ``force``, and then ``result["forced"]`` says why it was needed), or no per-step samples."""
        from gpudiag.app.gate import GateConfig

        gate_config = load_config(Path(config)) if config is not None else GateConfig()
        return gate_result(gated((self.report, self.source)), gated((other.report, other.source)), gate_config,
                           allow_different_hardware, force)


def load(path: str | Path | Sequence[str | Path], *, ncu: str | Path | None = None, peaks: str | Path | None = None,
         steps_from: str | None = None, warmup_steps: int | None = None, top: int = 20) -> Run:
    """Analyse ``path`` as ``gpudiag report`` does and return the :class:`Run`, writing nothing.

    ``path``: what ``gpudiag report`` takes: a run directory made by ``gpudiag profile`` (its own
    ncu report, calibration and status are used), an nsys SQLite export (``.sqlite`` or
    ``.sqlite.xz``), or the exports of one job's ranks: a folder of exports, a glob string
    (``"exports/rank*.sqlite"``) or a list of files; or a report already written: a ``report.json``
    or a folder holding one and no export (read, not analysed again).
    ``ncu``: an Nsight Compute report of the same workload (``.ncu-rep`` or ``.ncu-rep.xz``; one
    export only); ``peaks``: a ``calibration.json`` of measured peaks; ``steps_from`` and
    ``warmup_steps`` as the command's ``--steps-from`` and ``--warmup-steps``; ``top``: how many
    kernels the kernel table keeps. The ranks of a job are analysed in a local process pool. The
    analysis of a large export takes as long as the command (seconds to minutes).

    Raises :class:`UserError` (one line naming the file; ``exit_code`` as the command's) for a
    missing path, a file that is neither an export nor a report, a pattern that matches nothing,
    options given with a report already written, an invalid ``steps_from``, or a capture that
    cannot be analysed.
    """
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    if not paths:
        raise UserError("no path given: pass a run directory, an nsys SQLite export, or a list of rank exports")
    options = AnalysisOptions(steps_from=steps_from, warmup_steps=warmup_steps)
    result = load_report([Path(p) for p in paths], options, Path(ncu) if ncu else None, Path(peaks) if peaks else None,
                         top)
    return Run(result, str(path) if len(paths) == 1 and isinstance(path, (str, Path)) else
               ", ".join(str(p) for p in paths))


def profile(script: str | Path | None = None, *args: str, **options) -> Run:
    """Profile ``script`` (a Python file) with ``args`` as ``gpudiag profile SCRIPT -- ARGS`` does
    (bare run, capture over the step window, analysis, trials) and return the :class:`Run` of the
    analysed run directory (its ``source``); the stages are printed as the command prints them.

    ``options``, the command's options as keywords (defaults as the command's): ``module`` (run
    ``python -m MODULE`` instead of a script), ``nproc_per_node``, ``run_dir`` (default
    gpudiag-runs/<script>-<time>) and ``force``, ``nsys_path``, ``detail_step``, ``module_ranges``
    and ``op_ranges`` (bools), ``analysis`` (False: capture only; the returned Run is then analysed
    in memory), ``ncu``, ``ncu_top``, ``ncu_max_kernels``, ``bare_run``, ``steps`` (measured steps,
    0 the whole script), ``run_to_end``, ``try_changes`` ("auto", "none" or "compile,tf32,...") and
    ``try_budget_s`` (seconds), ``verify``, ``steps_from``, ``warmup_steps``. The script's exit
    code (nonzero when it crashed: what was captured is still reported) is ``run.exit_code``.

    Raises :class:`UserError` for an unknown option, a missing script or module, no nsys, a run
    directory that exists (without ``force=True``), or a capture that cannot be analysed.
    """
    import dataclasses

    from gpudiag.app.inputs import read_report
    from gpudiag.app.profile import ProfileRequest
    from gpudiag.app.profile import profile as profile_workflow

    known = [f.name for f in dataclasses.fields(ProfileRequest) if f.name not in ("script", "script_args")]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UserError(f"gpudiag.profile: no option {unknown[0]!r}; the options are {', '.join(known)}")
    request = ProfileRequest(Path(script) if script is not None else None, tuple(str(a) for a in args), **options)
    run_dir, code = profile_workflow(request)
    report_file = run_dir / "report.json"
    run = Run(read_report(report_file), str(run_dir)) if report_file.is_file() else load(run_dir)
    run.exit_code = code  #: the profiled script's exit code
    return run

