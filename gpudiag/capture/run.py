"""One capture: run the user's script under ``nsys profile`` through the launcher, then export the
report to SQLite. Produces, inside the run directory:

- ``profile.nsys-rep``  the Nsight Systems report
- ``profile.sqlite``    its SQLite export
- ``script_status.json`` the launcher's status (exit code, exception, steps seen)
- ``gpudiag.log``       every command run and its output
- ``profile.ncu-rep``   with ``--ncu``: the Nsight Compute report of the top kernels of the detail step
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpudiag.capture import ncu as ncu_mod
from gpudiag.capture import nsys
from gpudiag.capture.config import CaptureConfig
from gpudiag.capture.toolrun import Interrupted, run_logged
from gpudiag.script_status import ScriptStatus, read_status_lenient, write_status

REPORT_BASE = "profile"
SQLITE_NAME = "profile.sqlite"
NCU_NAME = "profile.ncu-rep"
STATUS_NAME = "script_status.json"
BARE_STATUS_NAME = "bare_status.json"
LOG_NAME = "gpudiag.log"


class CaptureError(RuntimeError):
    """nsys failed to produce a report or an export; the message names the log to read."""


@dataclass
class CaptureResult:
    run_dir: Path
    report: Path
    sqlite: Path
    status: ScriptStatus  # launcher status; empty (false) when the launcher never ran (e.g. nsys failed first)
    interrupted: Interrupted | None = None  # set when Ctrl-C / SIGTERM stopped the capture early

    @property
    def script_exit_code(self) -> int:
        return self.status.exit_code_or_failure


def _launcher_args(script: Path | str, script_args: list[str], run_dir: Path, config: CaptureConfig,
                   status_name: str) -> list[str]:
    """The launcher's arguments. ``script``: a script's path, or a module name (``str``) run as
    ``python -m`` runs it."""
    target = ["--module", script] if isinstance(script, str) else [str(script)]
    return ["--config", config.to_json(), "--status", str((run_dir / status_name).resolve()), *target, *script_args]


def plain_stage(echo=print):
    """The default ``stage`` of :func:`capture`: announces each stage with one line."""

    @contextmanager
    def stage(text: str):
        echo(text)
        yield

    return stage


def mark_interrupted(run_dir: Path, stage: str, signum: int = signal.SIGINT, finished: bool = False) -> ScriptStatus:
    """Record in the run's ``script_status.json`` (created if the launcher wrote none) that
    ``gpudiag profile`` was interrupted by ``signum`` during ``stage`` (after it, when
    ``finished``); returns the updated status."""
    path = run_dir / STATUS_NAME
    status = read_status_lenient(path)  # empty when written half: the launcher itself was killed
    status.update(interrupted={"stage": stage, "stage_finished": finished, "signal": signal.Signals(signum).name,
                               "unix_s": time.time()})
    write_status(path, status)
    return status


def _launcher_env(run_name: str) -> dict:
    """The launched script's environment: this gpudiag importable and, when gpudiag runs as one rank
    of a torchrun job, a rendezvous of its own for this run (:func:`rank_hook.fresh_rendezvous`)."""
    from gpudiag.capture.rank_hook import fresh_rendezvous

    try:
        env = fresh_rendezvous(dict(os.environ), run_name)
    except TimeoutError as exc:  # rank 0's gpudiag stopped (crashed, or made other runs)
        raise CaptureError(f"{exc}: see rank 0's gpudiag.log") from None
    # The launcher must import this gpudiag even when it is not installed (e.g. run from a checkout).
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = package_root + os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else package_root
    return env


def capture_ncu(script: Path, script_args: list[str], run_dir: Path, config: CaptureConfig, detail_step: int,
                kernel_names: list[str], max_kernels: int, echo=print, stage=None) -> Path | None:
    """Second pass under Nsight Compute (see :mod:`gpudiag.capture.ncu`): returns the path of
    ``profile.ncu-rep``, or None (with a message saying why) when ncu is missing, may not read the
    performance counters, or profiled nothing. Never raises for those: the nsys report stands.
    Raises :class:`~gpudiag.capture.toolrun.Interrupted` on Ctrl-C (ncu stopped)."""
    try:
        ncu_path = ncu_mod.locate_ncu()
    except nsys.ToolNotFound as exc:
        echo(f"--ncu skipped: {exc}")
        return None
    log = run_dir / LOG_NAME
    cmd = ncu_mod.profile_command(ncu_path, run_dir / REPORT_BASE, detail_step, kernel_names, max_kernels,
                                  _launcher_args(script, script_args, run_dir, config, "ncu_status.json"))
    start = log.stat().st_size if log.exists() else 0
    with (stage or plain_stage(echo))(f"[ncu] replaying {len(kernel_names)} top kernels of step {detail_step} "
                                      f"under Nsight Compute ({ncu_path})"):
        run_logged(cmd, log, _launcher_env("ncu_status.json"))
    output = log.read_text(errors="replace")[start:]
    report = run_dir / NCU_NAME
    if ncu_mod.PERMISSION_ERROR in output:
        echo(ncu_mod.PERMISSION_HINT)
        return None
    if not report.exists():
        echo(f"--ncu: Nsight Compute wrote no report (no kernel matched?); see {log}; the report uses nsys data alone")
        return None
    return report


def capture(script: Path, script_args: list[str], run_dir: Path, config: CaptureConfig,
            nsys_path: Path, echo=print, stage=None) -> CaptureResult:
    """Profile ``script`` with ``script_args`` into ``run_dir`` (which must exist). ``stage(text)``
    is a context manager around each stage (default: :func:`plain_stage`, one line per stage).

    Raises :class:`CaptureError` if nsys writes no report or the export fails. A script that
    crashes is not an error here: its partial profile is exported and its status says it failed.
    Ctrl-C (or SIGTERM) during the capture stops nsys, which writes what it recorded: that report
    is exported too and the result's ``interrupted`` is set; without a report, or on Ctrl-C during
    the export, :class:`~gpudiag.capture.toolrun.Interrupted` (or ``KeyboardInterrupt``) is raised."""
    stage = stage or plain_stage(echo)
    log = run_dir / LOG_NAME
    status_path = run_dir / STATUS_NAME
    launcher_args = _launcher_args(script, script_args, run_dir, config, STATUS_NAME)
    interrupted = None
    with stage(f"[1/3] profiling {script} under Nsight Systems ({nsys_path})"):
        try:
            run_logged(nsys.profile_command(nsys_path, run_dir / REPORT_BASE, launcher_args, config.capture_range), log,
                       _launcher_env(STATUS_NAME))
        except Interrupted as exc:
            interrupted = exc
        except OSError as exc:  # e.g. a script whose interpreter is missing passed as --nsys
            raise CaptureError(f"{nsys_path}: cannot be run ({exc.strerror or exc}); {nsys.INSTALL_HINT}") from None
    status = read_status_lenient(status_path)
    report = run_dir / (REPORT_BASE + ".nsys-rep")
    if not report.exists():
        if interrupted:
            raise interrupted
        raise CaptureError(f"nsys wrote no report in {run_dir}; see {log} for its output")
    if interrupted:
        echo(f"interrupted ({interrupted}): nsys stopped the capture and kept what it recorded; exporting it")

    sqlite_path = run_dir / SQLITE_NAME
    with stage(f"[2/3] exporting {report.name} to SQLite"):
        code = run_logged(nsys.export_command(nsys_path, report, sqlite_path), log)
    if code != 0 or not sqlite_path.exists():
        raise CaptureError(f"nsys export failed (exit {code}); see {log}; the report {report} is kept")
    return CaptureResult(run_dir=run_dir, report=report, sqlite=sqlite_path, status=status, interrupted=interrupted)


def run_bare(script: Path | str, script_args: list[str], run_dir: Path, config: CaptureConfig, status_name: str,
             timeout_s: float | None = None) -> tuple[int, ScriptStatus]:
    """The script once, without nsys, under the launcher with ``config`` made bare (no NVTX, no
    module hooks, no capture range); output to the log only. Returns (exit code, the launcher's
    status, empty when it wrote none or half). Used by the bare run and by the trials. Raises
    :class:`~gpudiag.errors.UserError` naming the file for a whole JSON file that is no status."""
    bare = dataclasses.replace(config, bare=True, capture_range=False)
    cmd = [sys.executable, "-m", "gpudiag.capture.launch", *_launcher_args(script, script_args, run_dir, bare, status_name)]
    code = run_logged(cmd, run_dir / LOG_NAME, _launcher_env(status_name), echo=False, timeout_s=timeout_s)
    return code, read_status_lenient(run_dir / status_name)  # empty when written half: the run was killed


def capture_bare(script: Path, script_args: list[str], run_dir: Path, config: CaptureConfig, echo=print,
                 stage=None) -> ScriptStatus:
    """The representativeness run: the script once more, without nsys and without NVTX or module
    hooks, recording only each step's host wall-clock time (see ``CaptureConfig.bare``). Its
    output goes to the log only. Returns its status (``step_wall_ns`` by step), empty when it
    wrote none; a failing bare run is reported, never raised (Ctrl-C raises
    :class:`~gpudiag.capture.toolrun.Interrupted` once the run has stopped)."""
    with (stage or plain_stage(echo))("[bare] timing the same steps without the profiler "
                                      "(output in gpudiag.log; --no-bare-run skips this)"):
        code, status = run_bare(script, script_args, run_dir, config, BARE_STATUS_NAME)
    if code != 0:
        echo(f"[bare] the run without the profiler exited with code {code} (see {run_dir / LOG_NAME}); "
             "its step times are kept if any")
    return status
