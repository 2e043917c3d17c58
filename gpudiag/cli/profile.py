"""``gpudiag profile SCRIPT [-- ARGS]``: capture under Nsight Systems, then analyse and report."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import click

from gpudiag.capture import calibrate, nsys
from gpudiag.capture.instrument import CaptureConfig, detect_step_mode
from gpudiag.capture.run import STATUS_NAME, CaptureError, capture, capture_bare, capture_ncu, mark_interrupted
from gpudiag.cli.errors import UserError
from gpudiag.cli.options import AnalysisOptions, analysis_options
from gpudiag.cli.progress import StageTracker, stage_display


def _cached_calibration(export: Path, run_dir: Path) -> dict | None:
    """The ``gpudiag calibrate`` entry of the GPU and driver the capture ran on, copied into the run
    directory as calibration.json; None (datasheet peaks) when this GPU was never calibrated."""
    from gpudiag.sources.nsys_sqlite import read_gpu_in_use

    name, environment = read_gpu_in_use(export)
    if name is None:
        return None
    entry = calibrate.lookup(str(name), environment.get("driver_version"))
    if entry is None:
        click.echo(f"peaks: datasheet values for {name} (run 'gpudiag calibrate' once on this machine to measure them)")
        return None
    (run_dir / calibrate.CALIBRATION_NAME).write_text(json.dumps(entry, indent=1))
    click.echo(f"peaks: measured by gpudiag calibrate ({run_dir / calibrate.CALIBRATION_NAME})")
    return entry


def verify_candidates(report: dict, top: int = 3, echo=print) -> int:
    """Time the reference kernel of the ``top`` fusion candidates that have one, at the shape of the
    chain's first input (mapped by the kernel's ``from_activation``, e.g. rows = all leading
    dimensions, cols = the last), forward and forward + backward; attaches the measurements to each
    candidate as ``verified``. Returns how many ran."""
    import re as _re

    import torch

    from gpudiag.fused.bench import bench
    from gpudiag.fused.registry import kernels

    training = "backward" in (report.get("phases_ns_per_step") or {})
    ran = 0
    for cand in [c for c in report.get("fusion_candidates", []) if c.get("reference_kernel")][:top]:
        # the activation: the first floating-point tensor with at least two dimensions
        shape = next((m for m in (_re.match(r"^(float16|bfloat16|float32)\[(\d+(?:,\d+)+)\]", s)
                                  for s in cand.get("example_shapes", []) if isinstance(s, str)) if m), None)
        if shape is None:
            echo(f"[verify] {cand['reference_kernel']}: no 2-D+ float input recorded, skipped")
            continue
        kernel = kernels()[cand["reference_kernel"]]
        try:
            at = kernel.from_activation([int(v) for v in shape.group(2).split(",")])
        except ValueError as exc:
            echo(f"[verify] {kernel.name}: recorded shape {shape.group(2)} not usable ({exc}), skipped")
            continue
        dtype, label = getattr(torch, shape.group(1)), "x".join(map(str, at))
        echo(f"[verify] {kernel.name} at {label} {shape.group(1)}")
        try:
            cand["verified"] = {"forward": bench(kernel.name, at, dtype, backward=False)}
            if training:
                cand["verified"]["forward_backward"] = bench(kernel.name, at, dtype, backward=True)
        except Exception as exc:  # noqa: BLE001 - one failed measurement (OOM, unsupported width) must not lose the others
            echo(f"[verify] {kernel.name} at {label}: not measured ({type(exc).__name__}: {exc})")
            cand.pop("verified", None)
            continue
        cand["advice"] = advice(cand["verified"].get("forward_backward") or cand["verified"]["forward"])
        if cand.get("host_bound"):
            from gpudiag.analysis.fusion.dataflow import HOST_BOUND_ADVICE

            cand["advice"] += f"; but {HOST_BOUND_ADVICE}"
        ran += 1
    return ran


def advice(timing: dict) -> str:
    """What to use at this shape, from a --verify measurement: the fastest of the fused kernel,
    torch.compile of the chain, and eager (the kernel is recommended only where it wins)."""
    options = {"the reference kernel": timing["fused_ms"], "torch.compile": timing.get("compiled_ms"), "eager": timing["eager_ms"]}
    best = min((k for k, v in options.items() if v), key=lambda k: options[k])
    which = "forward+backward" if timing.get("backward") else "forward"
    return f"use {best} at this shape (fastest of fused {timing['fused_ms'] * 1e3:.0f} µs, " + ", ".join(
        f"{k} {v * 1e3:.0f} µs" for k, v in options.items() if v and k != "the reference kernel") + f", {which})"


def _verify(run_dir: Path, echo) -> None:
    report_path = run_dir / "report.json"
    if not report_path.exists():
        echo("--verify skipped: no report.json (the analysis did not run)")
        return
    report = json.loads(report_path.read_text())
    try:
        ran = verify_candidates(report, echo=echo)
    except (ImportError, RuntimeError) as exc:  # no Triton, no GPU
        echo(f"--verify skipped: {exc}")
        return
    if ran:
        from gpudiag.cli.report import write_reports

        write_reports(report, run_dir)
        echo(f"[verify] {ran} candidate(s) measured; report: {run_dir / 'report.html'}")
    else:
        echo("--verify: no fusion candidate with a reference kernel in this run")


# What the analysis reads of the bare run: step times, and for inference (gpudiag.analysis.steps.serving)
# its start-up, warm-up, batch, generate() forwards and the stepping module's weights; for a
# multi-process job, each rank's own status (gpudiag.capture.rank_hook).
BARE_KEYS = ("exit_code", "exception", "steps_completed", "step_wall_ns", "step_gpu_ns", "step_mode",
             "warmup_steps", "startup_ns", "warmup_ns", "samples_per_step", "generate_forwards",
             "root_parameters", "first_input_shape", "ranks")


def _keep_bare_run(bare: dict, run_dir: Path, status: dict) -> None:
    """The bare run's step times join the script's status (in memory and in script_status.json) as
    ``bare_run``, where the analysis finds them."""
    status["bare_run"] = {k: bare.get(k) for k in BARE_KEYS}
    (run_dir / STATUS_NAME).write_text(json.dumps(status, indent=1))


def _target(script: Path | None, module: str | None) -> Path | str:
    """What to run: the script's path, or the module's name (a ``str``). Raises UserError when
    neither is given, the script is missing, or no module of that name can be found."""
    if script is None and module is None:
        raise UserError("give SCRIPT (a Python file) or -m MODULE, e.g. 'gpudiag profile train.py' "
                        "or 'gpudiag profile -m mypackage.train'")
    if module is not None:
        from gpudiag.capture.launch import module_file

        try:
            module_file(module)
        except (ImportError, ValueError) as exc:
            raise UserError(f"-m {module}: {exc}; run gpudiag from the folder you would run python -m from") from None
        return module
    if not script.is_file():
        raise UserError(f"{script}: no such script; pass the path of the Python file to profile")
    return script


def _under_torchrun(target: Path | str, script_args: tuple[str, ...], nproc: int) -> tuple[str, tuple[str, ...]]:
    """``--nproc-per-node N``: the same job as ``-m torch.distributed.run --nproc-per-node N
    TARGET ARGS`` (torchrun's standalone rendezvous: one node, a free port). Raises UserError when
    TARGET is itself a launcher."""
    if isinstance(target, str) and target in ("torch.distributed.run", "torch.distributed.launch"):
        raise UserError(f"--nproc-per-node with -m {target}: give the script, e.g. "
                        "'gpudiag profile --nproc-per-node 2 train.py' (gpudiag starts torchrun)")
    run = ["-m", target] if isinstance(target, str) else [str(target)]
    return "torch.distributed.run", ("--standalone", "--nproc-per-node", str(nproc), *run, *script_args)


def default_run_dir(script: Path) -> Path:
    """``gpudiag-runs/<script stem>-<YYYYmmdd-HHMMSS>``, relative to the current directory."""
    return Path("gpudiag-runs") / f"{script.stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def prepare_run_dir(run_dir: Path, force: bool) -> None:
    """Create ``run_dir``; refuse a non-empty one unless ``force`` (then it is emptied)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir}: exists and is not a directory; pass -o DIR with a directory path")
    if run_dir.exists() and any(run_dir.iterdir()):
        if not force:
            raise UserError(f"{run_dir} already exists and is not empty: choose another -o DIR, or pass --force to replace it")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)


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
                   "fused-optimizer, channels-last, tf32, bf16-autocast, cudnn-benchmark, kernels, half-weights, static-cache, static-cache-compile, ending "
                   "optionally with args:ARGS (the script with other "
                   "arguments, compared per sample).")
@click.option("--try-budget", type=click.FloatRange(min=1), default=300, show_default=True,
              help="Seconds all trials together may take (the baseline runs interleaved with them included).")
@click.option("--verify", is_flag=True, help="Time the reference kernel of each top fusion candidate at the recorded "
              "shapes on this GPU (eager vs fused vs torch.compile, outputs checked) and show it in the report.")
@analysis_options
def profile(script: Path | None, script_args: tuple[str, ...], module: str | None, nproc_per_node: int | None,
            run_dir: Path | None, force: bool,
            nsys_path: str | None,
            detail_step: int | None, no_module_ranges: bool, no_op_ranges: bool, no_analysis: bool,
            use_ncu: bool, ncu_top: int, ncu_max_kernels: int, no_bare_run: bool, window_steps: int,
            run_to_end: bool, try_changes: str, try_budget: float, verify: bool, options: AnalysisOptions) -> None:
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
    if module is not None and script is not None:  # with -m, click hands the module's first argument to SCRIPT
        script_args, script = (str(script), *script_args), None
    script = _target(script, module)
    stem = Path(script.rsplit(".", 1)[-1]) if isinstance(script, str) else script
    if nproc_per_node is not None:
        script, script_args = _under_torchrun(script, script_args, nproc_per_node)
    if use_ncu and no_analysis:
        raise UserError("--ncu needs the analysis (it replays the top kernels the analysis finds): drop --no-analysis")
    warmup = 2 if options.warmup_steps is None else options.warmup_steps
    config = CaptureConfig(steps_from=options.steps_from or "auto", warmup_steps=warmup,
                           detail_step=detail_step, module_ranges=not no_module_ranges,
                           op_ranges=not no_op_ranges, window_steps=window_steps or None,
                           run_to_end=run_to_end, capture_range=bool(window_steps))
    try:
        from gpudiag.trials.plan import parse_try

        asked = parse_try(try_changes)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    try:
        detect_step_mode(config, "")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    try:
        nsys_exe = nsys.locate_nsys(nsys_path)
    except nsys.ToolNotFound as exc:
        raise UserError(str(exc)) from None
    run_dir, quiet = rank_run_dir(run_dir, stem)
    run_dir = run_dir or default_run_dir(stem)
    prepare_run_dir(run_dir, force)
    job = Job(script, list(script_args), run_dir, config, nsys_exe, AnalysisOptions(options.steps_from, warmup),
              no_bare_run, no_analysis, use_ncu, ncu_top, ncu_max_kernels, verify, asked, try_budget)
    with _terminal_of_rank(run_dir, quiet):
        stage = StageTracker(stage_display())
        try:
            code = _capture_and_report(job, stage)
        except KeyboardInterrupt as exc:  # Ctrl-C outside the capture (which handles its own), or a second one
            code = _interrupted(run_dir, stage, exc)
    raise SystemExit(code)


def rank_run_dir(run_dir: Path | None, script: Path, environ=None) -> tuple[Path | None, bool]:
    """Under a launcher that runs gpudiag once per rank (``torchrun … -m gpudiag profile``: RANK set,
    WORLD_SIZE > 1): (``OUT/rank<k>``, whether this rank is quiet). OUT is ``-o`` or, for all ranks
    alike, ``gpudiag-runs/<script>-job<launcher pid>`` (a timestamp could differ between ranks). Only
    local rank 0 prints; the others write their terminal output to ``terminal.log`` in their run
    directory. Else (run_dir, False) unchanged."""
    from gpudiag.capture.rank_hook import rank_ids

    ids = rank_ids(os.environ if environ is None else environ)
    if ids["rank"] is None or (ids["world_size"] or 1) <= 1:
        return run_dir, False
    base = run_dir or Path("gpudiag-runs") / f"{script.stem}-job{os.getppid()}"
    return base / f"rank{ids['rank']}", (ids["local_rank"] or 0) != 0


@contextlib.contextmanager
def _terminal_of_rank(run_dir: Path, quiet: bool):
    """A quiet rank's terminal output goes to ``run_dir/terminal.log`` (kept, not lost)."""
    if not quiet:
        yield
        return
    with open(run_dir / "terminal.log", "w", encoding="utf-8") as log, contextlib.redirect_stdout(log):
        yield


@dataclass
class Job:
    """What ``gpudiag profile`` was asked to do, after its options were checked."""

    script: Path | str
    script_args: list[str]
    run_dir: Path
    config: CaptureConfig
    nsys_exe: Path
    analysis: AnalysisOptions
    no_bare_run: bool
    no_analysis: bool
    use_ncu: bool
    ncu_top: int
    ncu_max_kernels: int
    verify: bool
    asked_changes: list[str] | None = None  # --try: None chooses from the report, [] tries nothing
    try_budget_s: float = 300.0


def _capture_and_report(job: Job, stage: StageTracker) -> int:
    """Bare run, capture, export, analysis, then --ncu and --verify; returns the exit code (the
    script's, or 128 + the signal when Ctrl-C stopped the capture: then what was captured is still
    exported and analysed, and nothing more runs)."""
    run_dir = job.run_dir
    # The bare run goes first: measured on the H100, runs started right after an nsys capture were
    # 14-56 % slower than the same script run plainly before it (docs/notes/measurements.md).
    bare = None if job.no_bare_run else capture_bare(job.script, job.script_args, run_dir, job.config,
                                                     echo=click.echo, stage=stage)
    result = _capture_window(job, bare, stage)
    code = result.script_exit_code
    if result.interrupted:
        result.status = mark_interrupted(run_dir, "profiling", result.interrupted.signum)
        code = result.interrupted.exit_code
    elif code != 0:
        click.secho(f"the script exited with code {code}; reporting what was captured up to then", fg="yellow")
    if bare is not None:
        _keep_bare_run(bare, run_dir, result.status)
    if result.interrupted and not job.no_analysis:
        return _analyse_interrupted(job, result, stage)
    if job.no_analysis:
        click.echo(f"capture kept in {run_dir}; analyse it with: gpudiag report {run_dir}")
        return code
    from gpudiag.cli.report import analyse_and_report

    calibration = _cached_calibration(result.sqlite, run_dir)
    with stage("[3/3] analysing"):
        report = analyse_and_report(result.sqlite, run_dir, job.analysis, status=result.status,
                                    calibration=calibration, top=max(20, job.ncu_top if job.use_ncu else 0))
    detail = report["steps"]["detail_step"]
    if job.use_ncu and detail is not None and report["top_kernels"]:
        names = [k["name"] for k in report["top_kernels"][:job.ncu_top]]
        ncu_report = capture_ncu(job.script, job.script_args, run_dir, dataclasses.replace(job.config, capture_range=False),
                                 detail, names, job.ncu_max_kernels,
                                 echo=click.echo, stage=stage)
        if ncu_report is not None:
            with stage("[ncu] re-analysing with Nsight Compute measurements"):
                analyse_and_report(result.sqlite, run_dir, job.analysis, status=result.status, ncu=ncu_report,
                                   calibration=calibration)
    elif job.use_ncu:
        click.echo("--ncu skipped: no detail step with kernels (profile with op ranges and at least warm-up + 1 steps)")
    if job.verify:
        _verify(run_dir, echo=click.echo)
    if job.asked_changes != []:
        _trials(job, result.status)
    return code


def _capture_window(job: Job, bare: dict | None, stage: StageTracker):
    """The capture over the step window; the whole script when the window cannot open: the bare
    run found fewer steps than the warm-up, or nsys recorded nothing because the launcher never
    reached the window (then the script runs once more, captured whole). Raises UserError when
    nsys fails."""
    from gpudiag.trials.results import job_view  # a launched job's steps are its ranks'

    config = job.config
    bare = job_view(bare) if bare is not None else None
    if config.capture_range and bare is not None and bare.get("exit_code") == 0 \
            and int(bare.get("steps_completed") or 0) < config.capture_start_step:
        click.echo(f"[window] the bare run completed {bare.get('steps_completed') or 0} steps, fewer than the "
                   f"{config.warmup_steps} warm-up steps: capturing the whole script (see --steps-from)")
        config = job.config = dataclasses.replace(config, capture_range=False)
    try:
        return capture(job.script, job.script_args, job.run_dir, config, job.nsys_exe, echo=click.echo, stage=stage)
    except CaptureError as exc:
        status_path = job.run_dir / STATUS_NAME
        status = job_view(json.loads(status_path.read_text())) if status_path.exists() else {}
        if not config.capture_range or status.get("capture_started_step") is not None or not status:
            raise UserError(str(exc), exit_code=3) from None
    click.echo(f"[window] the script reached no step window ({status.get('steps_completed', 0)} steps): "
               "capturing the whole script instead (see --steps-from)")
    job.config = dataclasses.replace(config, capture_range=False)
    try:
        return capture(job.script, job.script_args, job.run_dir, job.config, job.nsys_exe, echo=click.echo, stage=stage)
    except CaptureError as exc:
        raise UserError(str(exc), exit_code=3) from None


def _trials(job: Job, status: dict) -> None:
    """Choose and run the trials, then rewrite report.json / report.html with them."""
    from gpudiag.cli.report import write_reports
    from gpudiag.renderers.terminal import render_trials
    from gpudiag.trials import plan, results, runner

    report_path = job.run_dir / "report.json"
    if not report_path.exists():
        return
    profiled = results.job_view(status)  # a launched job: its ranks' steps, the lowest rank's settings
    if job.asked_changes is None and not profiled.get("step_gpu_ns"):
        click.echo("[try] no trials: no step of the profiled run was timed on a GPU (trials compare CUDA-event "
                   "step times); --try CHANGE,... runs the ones you name anyway")
        return
    report = json.loads(report_path.read_text())
    chosen, left = plan.choose(report, profiled, job.asked_changes)
    for entry in left:
        click.echo(f"[try] not tried: {entry['change']} ({entry['reason']})")
    generic = [f"{e['change']} ({e['why']})" for e in chosen
               if e.get("origin") == "generic" and e.get("rule_id") is None]
    if generic:
        click.echo(f"[try] also tried, though no rule predicted a saving: {', '.join(generic)}")
    if not chosen:
        click.echo("[try] no recommendation gpudiag can apply itself; --try CHANGE,... picks changes")
        results.attach(report, [], left)
    else:
        trials = runner.run_trials(job.script, job.script_args, job.run_dir, job.config, chosen, profiled,
                                   job.try_budget_s, echo=click.echo)
        results.attach(report, trials, left)
        render_trials(report)
    write_reports(report, job.run_dir)
    # kept with the run, so that 'gpudiag report RUN_DIR' shows them again
    status.update(trials=report["trials"], trials_left_out=report["trials_left_out"])
    (job.run_dir / STATUS_NAME).write_text(json.dumps(status, indent=1))


def _analyse_interrupted(job: Job, result, stage: StageTracker) -> int:
    """The report of a capture Ctrl-C stopped (no --ncu, no --verify: the user asked to stop).
    A capture too short to analyse keeps its export; the exit code stays the interruption's."""
    from gpudiag.cli.report import analyse_and_report

    with stage("[3/3] analysing what was captured before the interruption"):
        try:
            analyse_and_report(result.sqlite, job.run_dir, job.analysis, status=result.status,
                               calibration=_cached_calibration(result.sqlite, job.run_dir))
        except UserError as exc:
            click.secho(f"no report: {exc.message}; the export is kept in {result.sqlite}", fg="yellow", err=True)
    click.secho(f"interrupted: the capture was stopped early; {job.run_dir / STATUS_NAME} records it", fg="yellow",
                err=True)
    return result.interrupted.exit_code


def _interrupted(run_dir: Path, stage: StageTracker, exc: KeyboardInterrupt) -> int:
    """Ctrl-C (or a second one) outside the capture: marks the run directory, removes report files
    an interrupted analysis may have left half-written, says what is kept; returns 128 + signal."""
    from gpudiag.cli.report import REPORT_FILES

    signum = getattr(exc, "signum", signal.SIGINT)
    where = f"{'during' if stage.running else 'after'} {stage.name}"
    mark_interrupted(run_dir, stage.name, signum, finished=not stage.running)
    if stage.running and stage.name.endswith("analysing"):
        for name in REPORT_FILES:
            (run_dir / name).unlink(missing_ok=True)
    kept = sorted(p.name for p in run_dir.iterdir())
    click.secho(f"\ninterrupted {where}; {run_dir} keeps {', '.join(kept)} ({STATUS_NAME} records "
                "the interruption)", fg="yellow", err=True)
    return getattr(exc, "exit_code", 128 + signum)
