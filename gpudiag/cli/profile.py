"""``gpudiag profile SCRIPT [-- ARGS]``: capture under Nsight Systems, then analyse and report
(the workflow is :mod:`gpudiag.app.profile`)."""

from __future__ import annotations

from pathlib import Path

import click

from gpudiag.app.options import AnalysisOptions
from gpudiag.app.profile import DEFAULT_BUDGET_S, DEFAULT_PATCH_BUDGET_S, ProfileRequest
from gpudiag.app.profile import profile as profile_workflow
from gpudiag.app.progress import Feedback
from gpudiag.cli.options import analysis_options
from gpudiag.cli.progress import stage_display
from gpudiag.cli.report import show_report


def terminal_feedback() -> Feedback:
    """The workflow's lines through click (yellow warnings), rich stages on a terminal, and the
    terminal summaries of the report and the trials."""

    def show_trials(report: dict) -> None:
        from gpudiag.renderers.terminal import render_trials

        render_trials(report)

    return Feedback(echo=click.echo, warn=lambda text, err=False: click.secho(text, fg="yellow", err=err),
                    stages=stage_display, show_report=show_report, show_trials=show_trials)


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("script", type=click.Path(path_type=Path), required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("-m", "--module", "module", metavar="MODULE", help="Profile a module as `python -m MODULE` runs it "
              "(then no SCRIPT; arguments after -- go to the module).")
@click.option("--nproc-per-node", type=click.IntRange(min=1), default=None, metavar="N",
              help="Run SCRIPT as N processes under torchrun (python -m torch.distributed.run --nproc-per-node N "
                   "SCRIPT); every rank is instrumented and timed.")
@click.option("-o", "--output", "run_dir", type=click.Path(path_type=Path), help="Run directory [default: gpudiag-runs/<script>-<timestamp>].")
@click.option("--force", is_flag=True, help="Replace an existing run directory.")
@click.option("--no-wait", is_flag=True, help="When another gpudiag process is writing the run directory, fail at once "
              "(naming it) instead of waiting for it.")
@click.option("--nsys", "nsys_path", help="Path of the nsys executable (else $GPUDIAG_NSYS, PATH, known install folders).")
@click.option("--detail-step", type=int, default=None, help="Step recorded with per-op ranges and shapes [default: first step after warm-up].")
@click.option("--no-module-ranges", is_flag=True, help="Do not inject per-module NVTX ranges.")
@click.option("--no-op-ranges", is_flag=True, help="Do not record per-op ranges on the detail step.")
@click.option("--no-analysis", is_flag=True, help="Capture and export only (analyse later with 'gpudiag report RUN_DIR').")
@click.option("--ncu", "use_ncu", is_flag=True, help="Also replay the top kernels of the detail step under Nsight Compute "
              "(roofline counters); measured FLOPs and bytes then replace estimates.")
@click.option("--ncu-top", type=click.IntRange(min=1), default=20, show_default=True,
              help="How many kernel names (by total time) --ncu replays.")
@click.option("--ncu-max-kernels", type=click.IntRange(min=1), default=400, show_default=True,
              help="At most this many kernel launches profiled by --ncu.")
@click.option("--no-bare-run", is_flag=True, help="Skip the second run without the profiler that measures how much "
              "the profiler slows each step (the report then cannot correct its overhead-bound numbers).")
@click.option("--steps", "window_steps", type=click.IntRange(min=0), default=20, show_default=True,
              help="Measured steps after the warm-up: the capture holds the warm-up's last step and these, and the "
                   "script is then ended (0: run and capture the whole script).")
@click.option("--run-to-end", is_flag=True, help="After the --steps window, let the script run on (not captured).")
@click.option("--try", "try_changes", default="auto", show_default=True, metavar="auto|none|CHANGE,...",
              help="Changes to apply and measure bare after the analysis (trials), interleaved with runs of the "
                   "unchanged script: auto picks up to three from the recommendations, then changes no rule "
                   "predicted that apply to the run, six in all; or a list of compile, compile-graphs, "
                   "fused-optimizer, channels-last, tf32, bf16-autocast, cudnn-benchmark, kernels, loader-workers, pin-memory, "
                   "half-weights, static-cache, static-cache-compile, ending "
                   "optionally with args:ARGS (the script with other "
                   "arguments, compared per sample).")
@click.option("--try-budget", type=click.FloatRange(min=1), default=DEFAULT_BUDGET_S, show_default=True,
              help="Seconds all trials together may take (the baseline runs interleaved with them included); the "
                   "largest predicted changes run first, and the report says what the budget bought.")
@click.option("--verify", is_flag=True, help="Time the reference kernel of each top fusion candidate at the recorded "
              "shapes on this GPU (eager vs fused vs torch.compile, outputs checked) and show it in the report.")
@click.option("--verify-patches", type=click.Choice(["top", "all", "none"]), default="top", show_default=True,
              help="Each measured win is written as a patch to your files (RUN_DIR/changes/CHANGE.patch); run the "
                   "patched script bare against the unchanged one to verify the top one, all, or none.")
@click.option("--patch-budget", type=click.FloatRange(min=1), default=DEFAULT_PATCH_BUDGET_S, show_default=True,
              help="Seconds the verification of patches may take.")
@analysis_options
def profile(script: Path | None, script_args: tuple[str, ...], module: str | None, nproc_per_node: int | None,
            run_dir: Path | None, force: bool, no_wait: bool,
            nsys_path: str | None,
            detail_step: int | None, no_module_ranges: bool, no_op_ranges: bool, no_analysis: bool,
            use_ncu: bool, ncu_top: int, ncu_max_kernels: int, no_bare_run: bool, window_steps: int,
            run_to_end: bool, try_changes: str, try_budget: float, verify: bool, verify_patches: str,
            patch_budget: float, options: AnalysisOptions) -> None:
    """Profile SCRIPT on this GPU and write a run directory with report.html and report.json.

    Arguments after ``--`` go to the script; its exit code becomes gpudiag's. If the script
    crashes, what was captured up to the crash is still exported and reported; so it is after
    Ctrl-C, which stops the capture (exit code 130; a second Ctrl-C aborts at once).

    \b
    A long training job is profiled over a step window: warm-up, then ``--steps`` measured steps
    (default 20), after which gpudiag ends the script; only the warm-up's last step and the window
    are captured. Then the top recommendations it can apply itself are tried, each measured bare
    over the same kind of window (``--try``).

    \b
    Example:
        gpudiag profile train.py
        gpudiag profile train.py --steps 50 --try compile,fused-optimizer
        gpudiag profile train.py -o runs/baseline --force -- --batch 64
        gpudiag profile train.py --ncu --ncu-top 20 -- --epochs 1
        gpudiag profile -m mypackage.train -- --epochs 1
        gpudiag profile --nproc-per-node 2 train_ddp.py
        torchrun --nproc-per-node 2 -m gpudiag profile train_ddp.py -o runs/ddp
    """
    request = ProfileRequest(script, script_args, module, nproc_per_node, run_dir, force, nsys_path, detail_step,
                             not no_module_ranges, not no_op_ranges, not no_analysis, use_ncu, ncu_top,
                             ncu_max_kernels, not no_bare_run, window_steps, run_to_end, try_changes, try_budget,
                             verify, options.steps_from, options.warmup_steps, verify_patches, patch_budget,
                             wait=not no_wait)
    _, code = profile_workflow(request, terminal_feedback())
    raise SystemExit(code)
