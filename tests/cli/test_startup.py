"""``gpudiag --help`` and every command's ``--help`` start fast: none of the heavy libraries is
imported until a command runs. The oracle is the interpreter's own import log (``python -X
importtime``), not a wall-clock time, so the test does not depend on the machine's speed; the
measured times are in docs/notes/measurements.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from gpudiag.cli.main import cli

from conftest import ROOT

REPO_ROOT = ROOT
# Each costs 0.05 s (rich) to over 1 s (scipy.stats) to import on this 2-core machine.
HEAVY = {"scipy", "pandas", "numpy", "torch", "plotly", "sqlite_utils", "triton", "jinja2", "rich"}


def _command_paths(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand of the group, as argument tuples: (), ("report",), ("baseline", "save"), ..."""
    paths = [path]
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            paths += _command_paths(sub, (*path, name))
    return paths


def imported_modules(args: list[str]) -> tuple[set[str], subprocess.CompletedProcess]:
    """Top-level names of the modules ``python -X importtime ARGS`` imported, and the process."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=120)
    names = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in proc.stderr.splitlines()
             if line.startswith("import time:") and line.count("|") == 2}
    return names, proc


@pytest.mark.parametrize("path", _command_paths(cli), ids=lambda p: " ".join(p) or "gpudiag")
def test_help_imports_no_heavy_library(path):
    """``python -m gpudiag [COMMAND] --help`` shows its help and imports none of HEAVY."""
    names, proc = imported_modules(["-m", "gpudiag", *path, "--help"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Usage:" in proc.stdout
    assert {"click", "gpudiag"} <= names  # the import log was read
    assert not names & HEAVY, f"gpudiag {' '.join(path)} --help imported {sorted(names & HEAVY)}"


def test_the_import_log_shows_a_heavy_import():
    """The oracle can fail: importing the run database module (pandas, sqlite-utils) is seen."""
    names, proc = imported_modules(["-c", "import gpudiag.cli.main, gpudiag.store"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {"pandas", "sqlite_utils", "numpy"} <= names


def test_report_files_name_the_run_database():
    """app/inputs.py names the run database without importing the store (pandas): same name."""
    from gpudiag.app.inputs import REPORT_FILES
    from gpudiag.store import RUN_DB_NAME

    assert RUN_DB_NAME in REPORT_FILES
