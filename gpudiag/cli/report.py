"""``gpudiag report RUN_DIR_OR_SQLITE``: analyse a gpudiag run directory or any nsys SQLite export."""

from __future__ import annotations

import glob
import json
import lzma
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import click

from gpudiag.analysis.errors import AnalysisError
from gpudiag.capture.calibrate import CALIBRATION_NAME
from gpudiag.capture.run import NCU_NAME, SQLITE_NAME, STATUS_NAME
from gpudiag.cli.errors import UserError, commit, internal_error, make_output_folder, partial, write_atomically, written_or_removed
from gpudiag.cli.options import AnalysisOptions, analysis_options, rank_options

# The analysis, readers and report writers (pandas, plotly, jinja2, rich) are imported in the
# functions that use them, so that `gpudiag --help` starts fast (tests/cli/test_startup.py).
REPORT_FILES = ("report.html", "report.json", "run.sqlite")  # the last is store.RUN_DB_NAME (a test checks)


def read_status(path: Path) -> dict | None:
    """The launcher's status file as a dict (None if absent). Raises UserError if it is damaged."""
    if not path.exists():
        return None
    try:
        status = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        status = None
    if not isinstance(status, dict):
        raise UserError(f"{path}: not a gpudiag status file (damaged JSON); delete it to report without the script's status")
    return status


def resolve_input(path: Path) -> tuple[Path, dict | None, Path]:
    """(export file, launcher status or None, default output directory) for a run directory or an
    export file. Raises UserError when ``path`` is neither."""
    if path.is_dir():
        export = path / SQLITE_NAME
        if not export.exists():
            raise UserError(f"{path}: no {SQLITE_NAME} in this directory; pass a gpudiag run directory or an nsys SQLite export "
                            f"(make one with: nsys export --type sqlite REPORT.nsys-rep)")
        return export, read_status(path / STATUS_NAME), path
    if path.is_file():
        stem = path.name.removesuffix(".xz").removesuffix(".sqlite")
        return path, None, Path("gpudiag-reports") / stem
    raise UserError(f"{path}: no such file or directory; pass a gpudiag run directory or an nsys SQLite export")


EXPORT_GLOBS = ("*.sqlite", "*.sqlite.xz")  # a folder of rank exports (gpudiag's own run.sqlite left out)


def resolve_sources(sources: tuple[Path, ...]) -> tuple[list[Path], dict | None, Path]:
    """(export files, launcher status or None, default output directory) of ``gpudiag report``'s
    SOURCE arguments: one run directory or export (:func:`resolve_input`), or the exports of one
    job's ranks: several files, a folder of ``*.sqlite``/``*.sqlite.xz`` exports, or glob
    patterns (quoted, expanded here; sorted). Raises UserError naming what cannot be used."""
    if len(sources) == 1 and (sources[0].exists() or not _is_glob(str(sources[0]))):
        source = sources[0]
        found = _exports_in(source) if source.is_dir() and not (source / SQLITE_NAME).exists() else []
        if len(found) > 1:
            return found, None, Path("gpudiag-reports") / source.name
        export, status, default_dir = resolve_input(found[0] if found else source)
        return [export], status, default_dir
    exports: list[Path] = []
    for source in sources:
        if source.is_dir():
            raise UserError(f"{source}: a folder among several sources; pass the folder alone, or its exports")
        matched = [source] if source.is_file() else sorted(Path(p) for p in glob.glob(str(source)) if Path(p).is_file())
        if not matched:
            raise UserError(f"{source}: no such file{' (the pattern matches none)' if _is_glob(str(source)) else ''}; "
                            "pass the nsys SQLite exports of the job's ranks")
        exports.extend(m for m in matched if m not in exports)
    if len(exports) == 1:
        return resolve_sources((exports[0],))
    stem = exports[0].name.removesuffix(".xz").removesuffix(".sqlite")
    return exports, None, Path("gpudiag-reports") / f"{stem}-{len(exports)}-exports"


def _is_glob(text: str) -> bool:
    return glob.has_magic(text)


def _exports_in(folder: Path) -> list[Path]:
    """The nsys exports in ``folder`` (not gpudiag's run database), sorted by name."""
    found = {p for pattern in EXPORT_GLOBS for p in folder.glob(pattern) if p.is_file()}
    return sorted(p for p in found if p.name not in (REPORT_FILES[2], REPORT_FILES[2] + ".xz"))


def _decompressed(path: Path, tmp: Path) -> Path:
    """``path`` itself, or for ``*.xz`` its decompressed copy in ``tmp``."""
    if path.suffix != ".xz":
        return path
    target = tmp / path.name.removesuffix(".xz")
    try:
        with lzma.open(path) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    except (lzma.LZMAError, EOFError, FileNotFoundError):  # EOFError: a truncated stream
        raise UserError(f"{path}: not a readable .xz file; decompress it with xz -d and pass the result") from None
    return target


def read_calibration(path: Path, gpu: str | None) -> dict:
    """A ``calibration.json`` written by gpudiag profile (one entry) or the calibrate cache (one
    entry per GPU and driver: the one for ``gpu`` is used). Raises UserError for anything else."""
    problem = f"{path}: not a gpudiag calibration file; make one with gpudiag calibrate"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UserError(problem) from None
    if isinstance(data, dict) and "copy_bytes_per_s" not in data:
        entries = [e for e in data.values() if isinstance(e, dict)]
        data = next((e for e in entries if e.get("gpu") == gpu), entries[0] if entries else None)
    try:
        valid = (isinstance(data, dict) and float(data["copy_bytes_per_s"]) > 0
                 and all(float(v) > 0 for v in (data.get("matmul_flop_per_s") or {}).values())
                 and float(data.get("launch_overhead_ns") or 1) > 0)
    except (KeyError, TypeError, ValueError):
        valid = False
    if not valid:
        raise UserError(problem)
    return data


@dataclass
class AnalysisInputs:
    """What the analysis of one SOURCE needs, checked (:func:`analysis_inputs`)."""

    export: Path  # the nsys SQLite export (.sqlite or .sqlite.xz)
    status: dict | None  # the launcher's status file of a run directory
    default_dir: Path  # where gpudiag report writes without -o
    ncu: Path | None  # the Nsight Compute report, if any
    calibration: dict | None  # measured peaks, if any


def check_steps_from(steps_from: str | None) -> None:
    """Raises UserError unless ``steps_from`` is None, a step source a report can use, or nvtx:REGEX
    with a valid regular expression."""
    if steps_from and not steps_from.startswith("nvtx:") and steps_from not in (
            "auto", "optimizer", "call", "forward", "generate"):
        raise UserError(f"--steps-from {steps_from!r}: use nvtx:REGEX (or auto) when reporting")
    if steps_from and steps_from.startswith("nvtx:"):
        try:
            re.compile(steps_from[5:])
        except re.error as exc:
            raise UserError(f"--steps-from {steps_from!r}: invalid regular expression ({exc})") from None


def analysis_inputs(source: Path, options: AnalysisOptions, ncu: Path | None = None, peaks_file: Path | None = None,
                    resolved: tuple[Path, dict | None, Path] | None = None) -> AnalysisInputs:
    """The checked inputs of analysing ``source`` (a run directory or an export file), as
    ``gpudiag report`` takes them: a run directory's own ncu report and calibration unless ``ncu``
    and ``peaks_file`` are given. ``resolved``: :func:`resolve_input`'s answer, if already asked.
    Raises UserError (one line naming the file) for anything that cannot be used."""
    export, status, default_dir = resolved or resolve_input(source)
    check_steps_from(options.steps_from)
    if ncu is None and source.is_dir() and (source / NCU_NAME).exists():
        ncu = source / NCU_NAME
    if ncu is not None and not ncu.is_file():
        raise UserError(f"{ncu}: no such file; pass the .ncu-rep written by ncu or gpudiag profile --ncu")
    if peaks_file is None and source.is_dir() and (source / CALIBRATION_NAME).exists():
        peaks_file = source / CALIBRATION_NAME
    calibration = read_calibration(peaks_file, _gpu_of(export)) if peaks_file else None
    return AnalysisInputs(export, status, default_dir, ncu, calibration)


def _gpu_of(export: Path) -> str | None:
    """The GPU an export ran on (None for an .xz, read only after decompressing, or an unreadable file)."""
    from gpudiag.sources.nsys_sqlite import ExportError, read_gpu_in_use

    try:
        return read_gpu_in_use(export)[0] if export.suffix != ".xz" else None
    except ExportError:
        return None


def write_reports(result: dict, out_dir: Path) -> None:
    """report.json and report.html of ``result`` in ``out_dir``, each renamed into place only when
    complete (a full disk leaves the old files or none)."""
    from gpudiag.renderers import html, json_report

    write_atomically({out_dir / "report.json": json_report.to_json(result), out_dir / "report.html": html.render(result)})


def ingest_and_analyse(export: Path | list[Path], db_path: Path, options: AnalysisOptions, status: dict | None = None,
                       ncu: Path | None = None, calibration: dict | None = None, top: int = 20) -> dict:
    """The analysis of ``export`` (``.sqlite`` or ``.sqlite.xz``, or a list of them: the exports of one
    job's ranks, :func:`gpudiag.analysis.ingest.ingest_many`; ``ncu``: its Nsight Compute report,
    ``.ncu-rep`` or ``.ncu-rep.xz``): ingested into the run database ``db_path``, then analysed into
    report.json's content (a dict, documented in docs/architecture.md). ``status``: the launcher's
    status of a run directory (warm-up steps, step mode, trials); ``calibration``: measured peaks
    (:func:`read_calibration`); ``top``: how many kernels the kernel tables keep. The ranks of a
    several-process job are analysed where ``options`` says (Dask or a process pool).

    The one analysis path of ``gpudiag report``, ``gpudiag profile`` and :func:`gpudiag.load`.
    Raises UserError naming the user's files: exit 2 for a file that is not an export or ncu report
    or a Dask scheduler that cannot be reached, 3 for a capture that cannot be analysed (no
    kernels) or an internal error (said in one line)."""
    from gpudiag import store
    from gpudiag.analysis.pipeline import analyse
    from gpudiag.analysis.ranks.engine import EngineError, RankEngine

    exports = list(export) if isinstance(export, (list, tuple)) else [export]
    label = exports[0] if len(exports) == 1 else Path(f"{exports[0]} (+{len(exports) - 1} more exports)")
    db = _ingest(exports, db_path, ncu)
    warmup = options.warmup_steps if options.warmup_steps is not None else (status or {}).get("warmup_steps", 2)
    # A step-window capture starts at the warm-up's last step: only the warm-up steps it holds count.
    first_captured = (status or {}).get("capture_started_step")
    warmup = max(warmup - int(first_captured), 0) if first_captured is not None else warmup
    steps_from = options.steps_from
    if steps_from is None and (status or {}).get("step_mode") == "nvtx" and status.get("steps_regex"):
        steps_from = "nvtx:" + status["steps_regex"]  # the user's ranges the launcher took as steps
    engine = RankEngine(scheduler=options.scheduler, dask=options.dask,
                        **({"worker_memory": options.worker_memory} if options.worker_memory else {}))
    try:
        result = analyse(db, warmup_steps=warmup, steps_from=steps_from, status=status, calibration=calibration,
                         top=top, ranks_engine=engine)
        if (status or {}).get("trials") is not None:  # the run's trials, kept in its status by gpudiag profile
            from gpudiag.trials.results import attach

            attach(result, status["trials"], status.get("trials_left_out") or [])
        return result
    except EngineError as exc:
        raise UserError(str(exc)) from None
    except AnalysisError as exc:
        raise UserError(f"{label}: {exc}", exit_code=3) from None
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:  # a bug, said in one line
        raise internal_error(exc, label) from None
    finally:
        store.close(db)  # after the tables written in the background (the analysis flushed them)


def _ingest(exports: list[Path], db_path: Path, ncu: Path | None):
    """The run database ``db_path`` of ``exports`` (one export, with ``ncu`` if given, or the
    exports of one job's ranks), from decompressed copies of ``.xz`` files. Raises UserError
    naming the user's file, not the copy."""
    from gpudiag.analysis.ingest import MAX_FILES, ingest, ingest_many
    from gpudiag.sources.ncu import NcuError
    from gpudiag.sources.nsys_sqlite import ExportError

    if len(exports) > MAX_FILES:
        raise UserError(f"{len(exports)} exports: at most {MAX_FILES} can be analysed together; analyse the ranks in groups")
    with tempfile.TemporaryDirectory(prefix="gpudiag-") as tmp:
        sources = [_decompressed(e, Path(tmp)) if len(exports) == 1 else
                   _decompressed(e, _own_folder(Path(tmp), i)) for i, e in enumerate(exports)]
        ncu_source = _decompressed(ncu, Path(tmp)) if ncu else None
        try:
            if len(exports) == 1:
                return ingest(sources[0], db_path, source_name=exports[0].name, ncu_path=ncu_source, background=True)
            return ingest_many(sources, db_path, background=True)
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


def analyse_and_report(export: Path | list[Path], out_dir: Path, options: AnalysisOptions, status: dict | None = None,
                       as_json: bool = False, ncu: Path | None = None, calibration: dict | None = None,
                       top: int = 20) -> dict:
    """Ingest ``export`` (``.sqlite`` or ``.sqlite.xz``, plus the Nsight Compute report ``ncu`` if
    given, ``.ncu-rep`` or ``.ncu-rep.xz``) into ``out_dir``/run.sqlite, analyse it and write
    report.html and report.json there; prints the terminal summary (or the JSON). When it fails, the
    folders it created are removed again (a folder that existed before is left alone)."""
    created = make_output_folder(out_dir)
    with written_or_removed(out_dir, created):  # also Ctrl-C: a half-written report folder only misleads
        # the run database under its partial name until the reports are written (see commit)
        result = ingest_and_analyse(export, partial(out_dir / "run.sqlite"), options, status, ncu, calibration, top)
        write_reports(result, out_dir)
        commit(out_dir / "run.sqlite")
    from gpudiag.renderers import json_report, terminal

    if as_json:
        click.echo(json_report.to_json(result))
    else:
        terminal.render(result)
        click.echo(f"report: {out_dir / 'report.html'}  (data: {out_dir / 'report.json'})")
    return result


def _refuse_overwrites(export: Path, out_dir: Path, force: bool) -> None:
    """Nothing of the user's is overwritten: not the input (even with --force), and no report file
    or run database already in ``out_dir`` without --force. Raises UserError naming the file."""
    targets = {(out_dir / name).resolve(): out_dir / name for name in REPORT_FILES}
    if export.resolve() in targets:
        raise UserError(f"{export}: the input would be overwritten by the report's {export.name}; "
                        "pass -o DIR with another directory")
    existing = [path for path in targets.values() if path.exists()]
    if existing and not force:
        raise UserError(f"{existing[0]} already exists: pass --force to overwrite it, or -o DIR to write elsewhere")


@click.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_dir", type=click.Path(path_type=Path),
              help="Where to write report.html, report.json and run.sqlite [default: the run directory, "
                   "or gpudiag-reports/<export name>/ for an export file].")
@click.option("--force", is_flag=True, help="Overwrite an existing report.")
@click.option("--json", "as_json", is_flag=True, help="Print report.json to stdout instead of the summary table.")
@click.option("--ncu", "ncu", type=click.Path(path_type=Path),
              help="Nsight Compute report (.ncu-rep) of the same workload: measured FLOPs and DRAM bytes "
                   "override estimates [default: profile.ncu-rep in a run directory, if there].")
@click.option("--peaks", "peaks_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Measured peaks (calibration.json from gpudiag calibrate) [default: the run directory's, if there; "
                   "else datasheet values].")
@analysis_options
@rank_options
def report(sources: tuple[Path, ...], out_dir: Path | None, force: bool, as_json: bool, ncu: Path | None,
           peaks_file: Path | None, options: AnalysisOptions) -> None:
    """Analyse SOURCE, a gpudiag run directory or any nsys SQLite export (.sqlite or .sqlite.xz),
    or the exports of one job's ranks: several files, a folder of exports, or a quoted glob.

    For an export made without gpudiag, steps come from your own NVTX ranges named like
    step/iteration, or from --steps-from nvtx:REGEX; with neither, the whole capture is one step.
    The report says which. The ranks of a job (several exports, or one export of several
    processes) are each analysed on Dask: a local cluster, or --scheduler's.

    \b
    Example:
        gpudiag report examples/swin_t_train_bf16.sqlite.xz -o swin-report
        gpudiag report gpudiag-runs/train-20261121-101500 --force
        gpudiag report theirs.sqlite --steps-from 'nvtx:^train_step$' --json
        gpudiag report run.sqlite --ncu run.ncu-rep
        gpudiag report rank0.sqlite rank1.sqlite -o job-report
        gpudiag report 'exports/rank*.sqlite' --scheduler tcp://10.0.0.5:8786
    """
    exports, status, default_dir = resolve_sources(sources)
    out_dir = out_dir or default_dir
    for export in exports:
        _refuse_overwrites(export, out_dir, force)
    if len(exports) > 1 and ncu is not None:
        raise UserError(f"{ncu}: --ncu goes with one export; pass it with the export of the rank ncu profiled")
    if options.scheduler:  # before the ingest: a wrong address is said at once
        _check_scheduler(options.scheduler)
    source = sources[0] if len(exports) == 1 else exports[0]
    inputs = analysis_inputs(source, options, ncu, peaks_file, resolved=(exports[0], status, default_dir))
    analyse_and_report(exports if len(exports) > 1 else inputs.export, out_dir, options, status=inputs.status,
                       as_json=as_json, ncu=inputs.ncu, calibration=inputs.calibration)


def _check_scheduler(address: str) -> None:
    """Raises UserError (one line) unless a Dask scheduler answers at ``address``."""
    from gpudiag.analysis.ranks.engine import EngineError, check_scheduler

    try:
        check_scheduler(address)
    except EngineError as exc:
        raise UserError(str(exc)) from None
