"""``gpudiag gate BASELINE CURRENT`` and ``gpudiag baseline save RUN``: CI performance gates (the
workflow is :mod:`gpudiag.app.gate`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from gpudiag.app import gate as gate_app


@click.command()
@click.argument("baseline", type=click.Path(path_type=Path))
@click.argument("current", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["table", "json", "junit", "markdown", "github"]), default="table",
              show_default=True, help="Output format. github: ::error annotations, plus a table in $GITHUB_STEP_SUMMARY.")
@click.option("--config", "config_file", type=click.Path(path_type=Path, dir_okay=False),
              help="TOML file with a [tool.gpudiag.gate] table [default: ./pyproject.toml].")
@click.option("--allow-different-hardware", is_flag=True, help="Compare runs on a different GPU, driver or torch.")
@click.option("--force", is_flag=True, help="Compare runs that are not one workload (another script, or few kernels "
              "in common).")
@click.option("--all", "show_all", is_flag=True, help="Show every metric, not only headline ones and changes.")
def gate(baseline: Path, current: Path, fmt: str, config_file: Path | None, allow_different_hardware: bool,
         force: bool, show_all: bool) -> None:
    """Fail when CURRENT is slower than BASELINE, beyond noise.

    Each of BASELINE and CURRENT is a run directory, a report.json or a baseline file
    (gpudiag baseline save). A metric regresses when its median over steps is worse by more than
    its threshold (5 % for step time by default), by more than its noise floor, and the per-step
    samples differ significantly (two-sided Mann-Whitney U, p < alpha).

    Metrics: step_time, gpu_busy_time, overhead_time (ns per step), kernel_launches, peak_memory
    (where recorded), family:* and module:* GPU time; baselines with the old names gpu_busy and
    overhead_percent are converted.

    Two runs must be one workload: the same script where both name one, else at least half of the
    kernel time in kernels both runs have; --force compares others and says so.

    Exit codes: 0 pass (warnings allowed), 1 regression, 2 usage or configuration error (a missing
    or unreadable BASELINE or CURRENT), 3 nothing comparable, not one workload, or an invalid run.

    \b
    Example:
        gpudiag gate perf/baseline.json gpudiag-runs/train-20261121-101500
        gpudiag gate base/ new/ --format github --config perf/gate.toml
    """
    from gpudiag.renderers import gate_formats  # imports rich: here, so that --help starts fast

    result = gate_app.gate(baseline, current, config_file, allow_different_hardware, force)
    if result.get("forced"):
        click.echo(f"gpudiag gate: {result['forced']}", err=True)
    if fmt == "table":
        gate_formats.terminal(result, show_all=show_all)
    elif fmt == "github":
        click.echo(gate_formats.github(result), nl=False)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(gate_formats.markdown(result, show_all))
    else:
        text = {"json": gate_formats.to_json, "junit": gate_formats.junit,
                "markdown": lambda r: gate_formats.markdown(r, show_all)}[fmt](result)
        click.echo(text, nl=False)
    sys.exit(result["exit_code"])


@click.group()
def baseline() -> None:
    """Baseline files for gpudiag gate, meant to be committed."""


@baseline.command("save")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("-o", "--output", "output", type=click.Path(path_type=Path, dir_okay=False), default=Path("gpudiag-baseline.json"),
              show_default=True, help="Where to write the baseline.")
@click.option("--force", is_flag=True, help="Overwrite an existing baseline file.")
def baseline_save(run: Path, output: Path, force: bool) -> None:
    """Save RUN (a run directory or its report.json) as a baseline file.

    \b
    Example:
        gpudiag baseline save gpudiag-runs/train-20261121-101500 -o perf/baseline.json
    """
    content, label = gate_app.save_baseline(run, output, force)
    click.echo(f"baseline: {output} ({len(content['metrics'])} metrics, "
               f"{len(content['metrics']['step_time']['samples'])} steps each, from {label})")
