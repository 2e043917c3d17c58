"""``gpudiag report RUN_DIR_OR_SQLITE``: analyse a gpudiag run directory or any nsys SQLite export."""

from __future__ import annotations

from pathlib import Path

import click

from gpudiag.app.options import AnalysisOptions
from gpudiag.app.report import ReportRequest
from gpudiag.app.report import report as report_workflow
from gpudiag.cli.options import analysis_options, rank_options
from gpudiag.cli.progress import stage_display


def show_report(result: dict, out_dir: Path, as_json: bool = False, notes: list[str] = ()) -> None:
    """The terminal summary of a report written to ``out_dir`` (or report.json's text, ``as_json``),
    after ``notes`` (the ranks' engine, warnings): on stderr with --json, so stdout stays JSON."""
    from gpudiag.renderers import json_report, terminal  # rich, pandas: here, so that --help starts fast

    for note in notes:
        if as_json and not note.startswith("warning:"):
            continue  # the JSON is the output: only a warning is worth a line beside it
        click.secho(note, fg="yellow" if note.startswith("warning:") else None, err=as_json)
    if as_json:
        click.echo(json_report.to_json(result))
        return
    terminal.render(result)
    click.echo(f"report: {out_dir / 'report.html'}  (data: {out_dir / 'report.json'})")


@click.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_dir", type=click.Path(path_type=Path),
              help="Where to write report.html, report.json and run.sqlite [default: the run directory, "
                   "or gpudiag-reports/<export name>/ for an export file].")
@click.option("--force", is_flag=True, help="Overwrite an existing report.")
@click.option("--no-wait", is_flag=True, help="When another gpudiag process is writing the output folder, fail at once "
              "(naming it) instead of waiting for it.")
@click.option("--json", "as_json", is_flag=True, help="Print report.json to stdout instead of the summary table.")
@click.option("--ncu", "ncu", type=click.Path(path_type=Path),
              help="Nsight Compute report (.ncu-rep) of the same workload: measured FLOPs and DRAM bytes "
                   "override estimates [default: profile.ncu-rep in a run directory, if there].")
@click.option("--peaks", "peaks_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Measured peaks (calibration.json from gpudiag calibrate) [default: the run directory's, if there; "
                   "else datasheet values].")
@analysis_options
@rank_options
def report(sources: tuple[Path, ...], out_dir: Path | None, force: bool, no_wait: bool, as_json: bool,
           ncu: Path | None, peaks_file: Path | None, options: AnalysisOptions) -> None:
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
    import sys

    # on a terminal, each part (reading the export, analysis, report files) with a spinner; a pipe
    # or --json gets only the result
    stage = stage_display(terminal=True) if sys.stdout.isatty() and not as_json else None
    request = ReportRequest(sources, options, out_dir, force, ncu, peaks_file, wait=not no_wait, stage=stage)
    report_workflow(request, show=lambda result, folder: show_report(result, folder, as_json, request.notes))
