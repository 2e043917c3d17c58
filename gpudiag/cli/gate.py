"""``gpudiag gate BASELINE CURRENT`` and ``gpudiag baseline save RUN``: CI performance gates."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from gpudiag.analysis import gate as gate_mod
from gpudiag.cli.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

EXIT_PASS, EXIT_REGRESSION, EXIT_USAGE, EXIT_NOT_COMPARABLE = 0, 1, 2, 3


def read_run(path: Path) -> tuple[dict, str]:
    """Parsed JSON of a run directory's report.json, a report.json or a baseline file, and its label.
    Raises UserError: exit 2 (usage) when ``path`` does not exist or cannot be read, exit 3
    (invalid run) when it holds no report or no JSON."""
    if not path.exists():
        raise UserError(f"{path}: no such file or directory; pass a run directory, a report.json or a baseline file",
                        exit_code=EXIT_USAGE)
    file = path / "report.json" if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"{file}: not found; run 'gpudiag report {path}' first", exit_code=EXIT_NOT_COMPARABLE)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{file}: cannot be read ({exc.strerror}); check its permissions", exit_code=EXIT_USAGE) from None
    except UnicodeDecodeError:
        text = ""  # binary content: reported as not JSON below
    try:
        return json.loads(text), str(path)
    except ValueError:
        raise UserError(f"{file}: not valid JSON; pass a gpudiag report.json or baseline file", exit_code=EXIT_NOT_COMPARABLE) from None


def load_config(config_file: Path | None) -> gate_mod.GateConfig:
    """``--config FILE`` (its [tool.gpudiag.gate] table, or the whole file if it has none), else
    ./pyproject.toml's [tool.gpudiag.gate] if present, else the defaults."""
    path = config_file or (Path("pyproject.toml") if Path("pyproject.toml").is_file() else None)
    if path is None:
        return gate_mod.GateConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{path}: cannot read the gate configuration ({exc}); fix the TOML or pass --config FILE") from None
    table = data.get("tool", {}).get("gpudiag", {}).get("gate")
    if table is None:
        table = {} if config_file is None else data
    try:
        return gate_mod.config_from_table(table, str(path))
    except gate_mod.GateError as exc:
        raise UserError(str(exc), exit_code=exc.exit_code) from None


def gated(run: tuple[dict, str]) -> tuple[dict, dict, str]:
    """(gated metrics, environment, label) of a (parsed report.json or baseline file, label) pair
    (:func:`read_run`'s answer). Raises UserError, exit 3, when it is neither or has no samples."""
    try:
        return (*gate_mod.metrics_from(*run), run[1])
    except gate_mod.GateError as exc:
        raise UserError(str(exc), exit_code=exc.exit_code) from None


def gate_result(baseline: tuple[dict, dict, str], current: tuple[dict, dict, str], config: gate_mod.GateConfig,
                allow_different_hardware: bool = False) -> dict:
    """The gate's verdict on two runs, each as :func:`gated` gives it: the ``--format json`` dict
    (verdict, exit_code, baseline and current labels, metrics, ...). The one comparison of
    ``gpudiag gate`` and :meth:`gpudiag.api.Run.compare`. Raises UserError, exit 3, when the runs'
    GPU, driver or torch differ (unless ``allow_different_hardware``) or no metric is in both."""
    from gpudiag.renderers import gate_formats  # imports rich: here, so that --help starts fast

    (base_metrics, base_env, base_label), (cur_metrics, cur_env, cur_label) = baseline, current
    diffs = gate_mod.differences(base_env, cur_env)
    if diffs and not allow_different_hardware:
        raise UserError("not comparable: " + "; ".join(diffs) + " (pass --allow-different-hardware to compare anyway)",
                        exit_code=EXIT_NOT_COMPARABLE)
    comparisons = gate_mod.compare(base_metrics, cur_metrics, config)
    if not any(c.verdict not in ("new", "gone") for c in comparisons):
        raise UserError(f"nothing comparable between {base_label} and {cur_label}: no metric in both",
                        exit_code=EXIT_NOT_COMPARABLE)
    verdict, code = gate_mod.overall(comparisons)
    return gate_formats.result_dict(comparisons, verdict, code, base_label, cur_label, diffs, config.alpha)


@click.command()
@click.argument("baseline", type=click.Path(path_type=Path))
@click.argument("current", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["table", "json", "junit", "markdown", "github"]), default="table",
              show_default=True, help="Output format. github: ::error annotations, plus a table in $GITHUB_STEP_SUMMARY.")
@click.option("--config", "config_file", type=click.Path(path_type=Path, dir_okay=False),
              help="TOML file with a [tool.gpudiag.gate] table [default: ./pyproject.toml].")
@click.option("--allow-different-hardware", is_flag=True, help="Compare runs on a different GPU, driver or torch.")
@click.option("--all", "show_all", is_flag=True, help="Show every metric, not only headline ones and changes.")
def gate(baseline: Path, current: Path, fmt: str, config_file: Path | None, allow_different_hardware: bool,
         show_all: bool) -> None:
    """Fail when CURRENT is slower than BASELINE, beyond noise.

    Each of BASELINE and CURRENT is a run directory, a report.json or a baseline file
    (gpudiag baseline save). A metric regresses when its median over steps is worse by more than
    its threshold (5 % for step time by default), by more than its noise floor, and the per-step
    samples differ significantly (two-sided Mann-Whitney U, p < alpha).

    Metrics: step_time, gpu_busy_time, overhead_time (ns per step), kernel_launches, peak_memory
    (where recorded), family:* and module:* GPU time; baselines with the old names gpu_busy and
    overhead_percent are converted.

    Exit codes: 0 pass (warnings allowed), 1 regression, 2 usage or configuration error (a missing
    or unreadable BASELINE or CURRENT), 3 nothing comparable or an invalid run.

    \b
    Example:
        gpudiag gate perf/baseline.json gpudiag-runs/train-20261121-101500
        gpudiag gate base/ new/ --format github --config perf/gate.toml
    """
    from gpudiag.renderers import gate_formats  # imports rich: here, so that --help starts fast

    config = load_config(config_file)
    base = gated(read_run(baseline))  # read and checked in this order: the first bad one is named
    result = gate_result(base, gated(read_run(current)), config, allow_different_hardware)
    code = result["exit_code"]
    if fmt == "table":
        gate_formats.terminal(result, show_all=show_all)
    elif fmt == "json":
        click.echo(gate_formats.to_json(result), nl=False)
    elif fmt == "junit":
        click.echo(gate_formats.junit(result), nl=False)
    elif fmt == "markdown":
        click.echo(gate_formats.markdown(result, show_all), nl=False)
    else:
        click.echo(gate_formats.github(result), nl=False)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(gate_formats.markdown(result, show_all))
    sys.exit(code)


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
    data, label = read_run(run)
    try:
        content = gate_mod.baseline_from_report(data)
    except gate_mod.GateError as exc:
        raise UserError(f"{label}: {exc}", exit_code=exc.exit_code) from None
    if output.exists() and not force:
        raise UserError(f"{output} already exists: pass --force to overwrite it, or -o FILE to write elsewhere")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(content, indent=1), encoding="utf-8")
    click.echo(f"baseline: {output} ({len(content['metrics'])} metrics, "
               f"{len(content['metrics']['step_time']['samples'])} steps each, from {label})")
