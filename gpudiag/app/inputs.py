"""What a workflow analyses: the inputs of ``gpudiag report`` / :func:`gpudiag.load` (a run
directory, an export, the exports of one job's ranks), checked, with their status, ncu report and
calibration. Every problem is a one-line :class:`gpudiag.errors.UserError` naming the file."""

from __future__ import annotations

import glob
import json
import lzma
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpudiag.app.options import AnalysisOptions
from gpudiag.capture.calibrate import CALIBRATION_NAME
from gpudiag.capture.run import NCU_NAME, SQLITE_NAME, STATUS_NAME
from gpudiag.errors import UserError
from gpudiag.script_status import ScriptStatus, read_status  # noqa: F401 - read_status: this module's name for it

REPORT_FILES = ("report.html", "report.json", "run.sqlite")  # the last is store.RUN_DB_NAME (a test checks)


def resolve_input(path: Path) -> tuple[Path, ScriptStatus | None, Path]:
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


def resolve_sources(sources: tuple[Path, ...]) -> tuple[list[Path], ScriptStatus | None, Path]:
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


def decompressed(path: Path, tmp: Path) -> Path:
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
    """What the analysis of one SOURCE needs, checked (:func:`analysis_inputs`); the one input of
    :func:`gpudiag.app.report.ingest_and_analyse` (``gpudiag profile`` makes it from its capture)."""

    export: Path | list[Path]  # the nsys SQLite export (.sqlite or .sqlite.xz), or one job's rank exports
    status: ScriptStatus | None = None  # the launcher's status file of a run directory
    default_dir: Path | None = None  # where gpudiag report writes without -o
    ncu: Path | None = None  # the Nsight Compute report (.ncu-rep or .ncu-rep.xz), if any
    calibration: dict | None = None  # measured peaks (read_calibration), if any


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
                    resolved: tuple[Path, ScriptStatus | None, Path] | None = None) -> AnalysisInputs:
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


def refuse_overwrites(export: Path, out_dir: Path, force: bool) -> None:
    """Nothing of the user's is overwritten: not the input (even with --force), and no report file
    or run database already in ``out_dir`` without --force. Raises UserError naming the file."""
    targets = {(out_dir / name).resolve(): out_dir / name for name in REPORT_FILES}
    if export.resolve() in targets:
        raise UserError(f"{export}: the input would be overwritten by the report's {export.name}; "
                        "pass -o DIR with another directory")
    existing = [path for path in targets.values() if path.exists()]
    if existing and not force:
        raise UserError(f"{existing[0]} already exists: pass --force to overwrite it, or -o DIR to write elsewhere")


def written_report(source: Path) -> Path | None:
    """The report.json ``source`` names: itself (a ``.json`` file), or the one in a folder without
    an export; None for anything to analyse."""
    if source.is_file() and source.suffix == ".json":
        return source
    if source.is_dir() and not (source / SQLITE_NAME).exists() and (source / "report.json").is_file():
        return source / "report.json"
    return None


def read_report(file: Path) -> dict:
    """A report.json's content. Raises UserError when it is not one."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict) or "schema_version" not in data or "steps" not in data:
        raise UserError(f"{file}: not a gpudiag report.json; pass a run directory, an nsys SQLite export or the "
                        "report.json gpudiag report wrote", exit_code=3)
    return data
