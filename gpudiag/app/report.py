"""The report workflow: analyse a run directory, an export or the exports of one job's ranks, and
write report.json, report.html and the run database (``gpudiag report``, ``gpudiag profile``'s
analysis, :func:`gpudiag.load`)."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpudiag.analysis.errors import AnalysisError
from gpudiag.analysis.finish import Report
from gpudiag.app.inputs import (AnalysisInputs, analysis_inputs, decompressed, read_report, refuse_overwrites, resolve_sources,
                                written_report)
from gpudiag.app.options import AnalysisOptions
from gpudiag.app.output import commit, make_output_folder, partial, write_atomically, written_or_removed
from gpudiag.app.progress import ShownTimes, timed
from gpudiag.errors import UserError, internal_error
from gpudiag.script_status import ScriptStatus

# The analysis, readers and report writers (pandas, plotly, jinja2, rich) are imported in the
# functions that use them, so that `gpudiag --help` starts fast (tests/cli/test_startup.py).


def write_reports(result: dict, out_dir: Path) -> None:
    """report.json and report.html of ``result`` in ``out_dir``, each renamed into place only when
    complete (a full disk leaves the old files or none). ``result`` is finished first
    (:func:`gpudiag.analysis.finish.finish`, idempotent): the trials and ``--verify`` add to a
    report read back from report.json before it is written again."""
    from gpudiag.analysis.finish import finish
    from gpudiag.renderers import html, json_report

    report = finish(result)
    write_atomically({out_dir / "report.json": json_report.to_json(report), out_dir / "report.html": html.render(report)})


def ingest_and_analyse(inputs: AnalysisInputs, db_path: Path, options: AnalysisOptions, top: int = 20,
                       notes: list[str] | None = None, times: dict[str, float] | None = None) -> dict:
    """The analysis of ``inputs.export`` (``.sqlite`` or ``.sqlite.xz``, or a list of them: the exports
    of one job's ranks, :func:`gpudiag.analysis.ingest.ingest_many`; ``inputs.ncu``: its Nsight
    Compute report, ``.ncu-rep`` or ``.ncu-rep.xz``): ingested into the run database ``db_path``,
    then analysed into report.json's content (a dict, documented in docs/architecture.md).
    ``inputs.status``: the launcher's status of a run directory (warm-up steps, step mode, trials);
    ``inputs.calibration``: measured peaks (:func:`read_calibration`); ``top``: how many kernels the
    kernel tables keep. The ranks of a
    several-process job are analysed where ``options`` says (Dask or a process pool); ``notes``, if
    given, receives the line the terminal shows about the engine (:mod:`gpudiag.app.ranks`), never
    written into the report; exports that cannot be one job's ranks are the report's first
    ``warnings``. ``times``, if given,
    receives the seconds spent "reading the export" and in the "analysis". Returns the finished
    report (:func:`gpudiag.analysis.finish.finish`: distinct labels, JSON values).

    The one analysis path of ``gpudiag report``, ``gpudiag profile`` and :func:`gpudiag.load`.
    Raises UserError naming the user's files: exit 2 for a file that is not an export or ncu report
    or a Dask scheduler that cannot be reached, 3 for a capture that cannot be analysed (no
    kernels) or an internal error (said in one line)."""
    from gpudiag import store
    from gpudiag.analysis.finish import finish
    from gpudiag.analysis.pipeline import analyse
    from gpudiag.analysis.ranks.engine import EngineError, RankEngine

    export, status, calibration = inputs.export, inputs.status, inputs.calibration
    exports = list(export) if isinstance(export, (list, tuple)) else [export]
    label = exports[0] if len(exports) == 1 else Path(f"{exports[0]} (+{len(exports) - 1} more exports)")
    with timed(times, "reading the export"):
        db, mismatches = _ingest(exports, db_path, inputs.ncu)
    status = ScriptStatus.of(status)
    known = status or ScriptStatus()
    # 2 warm-up steps: the launcher's default (CaptureConfig.warmup_steps) for a status that predates the key
    warmup = options.warmup_steps if options.warmup_steps is not None else \
        (known.warmup_steps if known.warmup_steps is not None else 2)
    # A step-window capture starts at the warm-up's last step: only the warm-up steps it holds count.
    first_captured = known.capture_started_step
    warmup = max(warmup - int(first_captured), 0) if first_captured is not None else warmup
    steps_from = options.steps_from
    if steps_from is None and known.step_mode == "nvtx" and known.steps_regex:
        steps_from = "nvtx:" + known.steps_regex  # the user's ranges the launcher took as steps
    engine = RankEngine(scheduler=options.scheduler, dask=options.dask,
                        **({"worker_memory": options.worker_memory} if options.worker_memory else {}))
    try:
        with timed(times, "analysis"):
            result = analyse(db, warmup_steps=warmup, steps_from=steps_from, status=status, calibration=calibration,
                             top=top, ranks_engine=engine)
        # exports that cannot be one job's ranks: said in the report itself, so that every face (the
        # terminal, report.json and report.html, the library, the MCP server) says it (issue 47)
        result["warnings"] = [*mismatches, *(result.get("warnings") or [])]
        if known.trials is not None:  # the run's trials, kept in its status by gpudiag profile
            from gpudiag.trials.results import attach

            attach(result, known.trials, known.trials_left_out or [])
            if known.trials_budget:
                result["trials_budget"] = known.trials_budget
            if known.patches:  # gpudiag.app.patches.hand_back's summaries
                result["patches"] = known.patches
        from gpudiag.trials.framework_changes import name_switches

        name_switches(result, status)  # the advice names the switch of the script's framework (Lightning, HF, ...)
        if notes is not None:
            from gpudiag.app.ranks import engine_note

            note = engine_note(options, len((result.get("ranks") or {}).get("ranks") or []))
            notes.extend([note] if note else [])
        return finish(result)  # the one place the report is finished: every face shows this object
    except EngineError as exc:
        raise UserError(str(exc)) from None
    except AnalysisError as exc:
        raise UserError(f"{label}: {exc}", exit_code=3) from None
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:  # a bug, said in one line
        raise internal_error(exc, label) from None
    finally:
        store.close(db)  # after the tables written in the background (the analysis flushed them)


def _ingest(exports: list[Path], db_path: Path, ncu: Path | None) -> tuple:
    """(the run database ``db_path`` of ``exports`` (one export, with ``ncu`` if given, or the
    exports of one job's ranks), from decompressed copies of ``.xz`` files; the warnings of
    exports that cannot be one job's ranks, :func:`gpudiag.app.ranks.job_mismatches`). Raises
    UserError naming the user's file, not the copy."""
    from gpudiag.analysis.ingest import MAX_FILES, ingest, ingest_many
    from gpudiag.sources.ncu import NcuError
    from gpudiag.sources.nsys_sqlite import ExportError

    if len(exports) > MAX_FILES:
        raise UserError(f"{len(exports)} exports: at most {MAX_FILES} can be analysed together; analyse the ranks in groups")
    with tempfile.TemporaryDirectory(prefix="gpudiag-") as tmp:
        sources = [decompressed(e, Path(tmp)) if len(exports) == 1 else
                   decompressed(e, _own_folder(Path(tmp), i)) for i, e in enumerate(exports)]
        ncu_source = decompressed(ncu, Path(tmp)) if ncu else None
        mismatches = []
        if len(exports) > 1:
            from gpudiag.app.ranks import job_mismatches

            mismatches = job_mismatches(sources, exports)
        try:
            if len(exports) == 1:
                return ingest(sources[0], db_path, source_name=exports[0].name, ncu_path=ncu_source,
                              background=True), mismatches
            return ingest_many(sources, db_path, background=True), mismatches
        except (ExportError, NcuError) as exc:
            message = str(exc)  # name the user's files, not the decompressed copies
            for copy, original in zip(sources, exports):
                message = message.replace(str(copy), str(original))
            raise UserError(message.replace(str(ncu_source), str(ncu)) if ncu_source else message) from None


def _own_folder(tmp: Path, index: int) -> Path:
    """A folder of its own in ``tmp`` for export ``index``: rank exports of several folders may share a name."""
    folder = tmp / str(index)
    folder.mkdir()
    return folder




def analyse_and_report(inputs: AnalysisInputs, out_dir: Path, options: AnalysisOptions, top: int = 20,
                       show: Callable[[dict], None] | None = None, notes: list[str] | None = None,
                       times: dict[str, float] | None = None) -> dict:
    """Ingest ``inputs`` (:func:`ingest_and_analyse`) into ``out_dir``/run.sqlite, analyse it and write
    report.html and report.json there; then ``show(result)`` (the face prints its summary). When it
    fails, the folders it created are removed again (a folder that existed before is left alone).
    ``times``, if given, receives the seconds of each part: "reading the export", "analysis" and
    "report files" (report.json and report.html). Returns report.json's content; raises UserError as
    :func:`ingest_and_analyse`."""
    created = make_output_folder(out_dir)
    with written_or_removed(out_dir, created):  # also Ctrl-C: a half-written report folder only misleads
        # the run database under its partial name until it is complete; the reports only after it,
        # so that report files never stand without the run database they were made from
        result = ingest_and_analyse(inputs, partial(out_dir / "run.sqlite"), options, top, notes, times)
        commit(out_dir / "run.sqlite")
        with timed(times, "report files"):
            write_reports(result, out_dir)
    if show is not None:
        show(result)
    return result


def check_scheduler(address: str) -> None:
    """Raises UserError (one line) unless a Dask scheduler answers at ``address``."""
    from gpudiag.analysis.ranks.engine import EngineError, check_scheduler as probe

    try:
        probe(address)
    except EngineError as exc:
        raise UserError(str(exc)) from None


@dataclass
class ReportRequest:
    """What ``gpudiag report`` analyses: ``sources`` (one run directory or export, or the exports
    of one job's ranks: files, a folder, glob patterns), ``out_dir`` (None: the run directory, or
    gpudiag-reports/<name>), ``force`` (overwrite a report), ``ncu`` and ``peaks_file`` (as
    :func:`gpudiag.app.inputs.analysis_inputs`), ``options``, ``wait`` (for another process
    writing ``out_dir``: :func:`gpudiag.app.lock.run_dir_lock`)."""

    sources: tuple[Path, ...]
    options: AnalysisOptions
    out_dir: Path | None = None
    force: bool = False
    ncu: Path | None = None
    peaks_file: Path | None = None
    notes: list[str] = field(default_factory=list)  # filled: the terminal's lines about the ranks
    wait: bool = True  # another process writing out_dir: wait for it (False: fail, naming it)
    stage: Callable | None = None  # the face's stage(text) factory: each part shown while it runs


def report(request: ReportRequest, show: Callable[[dict, Path], None] | None = None) -> dict:
    """The ``gpudiag report`` workflow: resolve the sources, refuse to overwrite anything of the
    user's, analyse and write the report; ``show(result, out_dir)`` prints it. Returns report.json's
    content. Raises UserError (one line naming the file) for anything that cannot be used."""
    from gpudiag.app.lock import run_dir_lock

    exports, status, default_dir = resolve_sources(request.sources)
    out_dir = request.out_dir or default_dir
    with run_dir_lock(out_dir, request.wait):
        return _report_locked(request, exports, status, default_dir, out_dir, show)


def _report_locked(request: ReportRequest, exports: list[Path], status, default_dir: Path, out_dir: Path,
                   show: Callable[[dict, Path], None] | None) -> dict:
    """:func:`report` while it holds ``out_dir``'s lock: the refusals, then the analysis and the
    report files (a second process that waited sees the first one's files and refuses or, with
    ``force``, writes its own)."""
    for export in exports:
        refuse_overwrites(export, out_dir, request.force)
    inputs = _inputs(request.sources, exports, status, default_dir, request.options, request.ncu, request.peaks_file)
    if request.options.scheduler:  # before the ingest: a wrong address is said at once
        check_scheduler(request.options.scheduler)
    return analyse_and_report(inputs, out_dir, request.options,
                              show=(lambda result: show(result, out_dir)) if show else None, notes=request.notes,
                              times=ShownTimes(request.stage) if request.stage else None)


def _inputs(sources: Sequence[Path], exports: list[Path], status, default_dir: Path, options: AnalysisOptions,
            ncu: Path | None, peaks_file: Path | None):
    """The analysis inputs (:func:`gpudiag.app.inputs.analysis_inputs`) of resolved ``sources``, for
    both :func:`report` and :func:`load_report`. Raises UserError for ``--ncu`` with several exports."""
    if len(exports) > 1 and ncu is not None:
        raise UserError(f"{ncu}: --ncu goes with one export; pass it with the export of the rank ncu profiled")
    source = sources[0] if len(exports) == 1 else exports[0]
    inputs = analysis_inputs(source, options, ncu, peaks_file, resolved=(exports[0], status, default_dir))
    return dataclasses.replace(inputs, export=exports) if len(exports) > 1 else inputs


def load_report(sources: Sequence[Path], options: AnalysisOptions, ncu: Path | None = None,
                peaks_file: Path | None = None, top: int = 20, notes: list[str] | None = None) -> Report:
    """report.json's content of ``sources`` (what ``gpudiag report`` takes: one run directory or
    export, or one job's rank exports as files, a folder or glob patterns), analysed in a temporary
    folder: nothing is written. A report already written (a report.json, or a folder holding one and
    no export) is read instead. Raises UserError as :func:`report`, and for options given with a
    report already written."""
    report_file = written_report(sources[0]) if len(sources) == 1 else None
    if report_file is not None:
        if ncu is not None or peaks_file is not None or options.steps_from is not None \
                or options.warmup_steps is not None:
            raise UserError(f"{sources[0]}: a report already written cannot be analysed again with other options; "
                            "pass the run directory or export instead")
        return read_report(report_file)
    exports, status, default_dir = resolve_sources(tuple(sources))
    inputs = _inputs(sources, exports, status, default_dir, options, ncu, peaks_file)
    with tempfile.TemporaryDirectory(prefix="gpudiag-") as tmp:
        return ingest_and_analyse(inputs, Path(tmp) / "run.sqlite", options, top, notes)
