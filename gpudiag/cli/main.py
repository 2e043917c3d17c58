"""The ``gpudiag`` command group. Each command lives in its own module and stays thin: parse
options, call the workflow (:mod:`gpudiag.app`), print, choose the exit code."""

from __future__ import annotations

import click

from gpudiag.cli import apply as apply_cmd
from gpudiag.cli import calibrate as calibrate_cmd
from gpudiag.cli import gate as gate_cmd
from gpudiag.cli import kernels as kernels_cmd
from gpudiag.cli import mcp as mcp_cmd
from gpudiag.cli import profile as profile_cmd
from gpudiag.cli import report as report_cmd
from gpudiag.cli.errors import Group
from gpudiag.version import __version__


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpudiag")
def cli() -> None:
    """GPU profiling and bottleneck diagnosis for PyTorch.

    \b
    gpudiag profile train.py -- --epochs 1     profile a script on this GPU
    gpudiag report RUN_DIR_OR_SQLITE...        analyse a run, any nsys SQLite export, or a job's rank exports
    gpudiag apply RUN_DIR [CHANGE]             apply a measured win's verified patch to your files
    gpudiag gate BASELINE CURRENT              fail CI on a GPU performance regression
    gpudiag calibrate                          measure this GPU's peaks (used by profile)
    gpudiag mcp                                serve the analysis to coding agents (MCP, stdio)
    """


cli.add_command(profile_cmd.profile)
cli.add_command(report_cmd.report)
cli.add_command(gate_cmd.gate)
cli.add_command(gate_cmd.baseline)
cli.add_command(calibrate_cmd.calibrate)
cli.add_command(kernels_cmd.kernels)
cli.add_command(mcp_cmd.mcp)
cli.add_command(apply_cmd.apply)
