"""One capture: run the user's script under ``nsys profile`` through the launcher, then export the
report to SQLite. Produces, inside the run directory:

- ``profile.nsys-rep``  the Nsight Systems report
- ``profile.sqlite``    its SQLite export
- ``script_status.json`` the launcher's status (exit code, exception, steps seen)
- ``gpudiag.log``       every command run and its output
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from gpudiag.capture import nsys
from gpudiag.capture.instrument import CaptureConfig

REPORT_BASE = "profile"
SQLITE_NAME = "profile.sqlite"
STATUS_NAME = "script_status.json"
LOG_NAME = "gpudiag.log"


class CaptureError(RuntimeError):
    """nsys failed to produce a report or an export; the message names the log to read."""


@dataclass
class CaptureResult:
    run_dir: Path
    report: Path
    sqlite: Path
    status: dict  # launcher status; {} when the launcher never ran (e.g. nsys failed first)

    @property
    def script_exit_code(self) -> int:
        code = self.status.get("exit_code")
        return 1 if code is None else int(code)


def capture(script: Path, script_args: list[str], run_dir: Path, config: CaptureConfig,
            nsys_path: Path, echo=print) -> CaptureResult:
    """Profile ``script`` with ``script_args`` into ``run_dir`` (which must exist).

    Raises :class:`CaptureError` if nsys writes no report or the export fails. A script that
    crashes is not an error here: its partial profile is exported and its status says it failed."""
    log = run_dir / LOG_NAME
    status_path = run_dir / STATUS_NAME
    launcher_args = ["--config", config.to_json(), "--status", str(status_path.resolve()),
                     str(script), *script_args]
    env = dict(os.environ)
    # The launcher must import this gpudiag even when it is not installed (e.g. run from a checkout).
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = package_root + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else package_root

    echo(f"[1/3] profiling {script} under Nsight Systems ({nsys_path})")
    nsys.run_logged(nsys.profile_command(nsys_path, run_dir / REPORT_BASE, launcher_args), log, env)
    status = json.loads(status_path.read_text()) if status_path.exists() else {}
    report = run_dir / (REPORT_BASE + ".nsys-rep")
    if not report.exists():
        raise CaptureError(f"nsys wrote no report in {run_dir}; see {log} for its output")

    echo(f"[2/3] exporting {report.name} to SQLite")
    sqlite_path = run_dir / SQLITE_NAME
    code = nsys.run_logged(nsys.export_command(nsys_path, report, sqlite_path), log)
    if code != 0 or not sqlite_path.exists():
        raise CaptureError(f"nsys export failed (exit {code}); see {log}; the report {report} is kept")
    return CaptureResult(run_dir=run_dir, report=report, sqlite=sqlite_path, status=status)
