"""The profile workflow (``gpudiag profile``, :func:`gpudiag.profile`): bare run, capture over the
step window (the whole script when the window never opens), analysis, ``--ncu`` replay,
``--verify``, trials, and the rewrite of report and status. :func:`prepare` checks a
:class:`ProfileRequest` into a :class:`Job`; :func:`run` runs it and returns the exit code."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from gpudiag.app.options import AnalysisOptions
from gpudiag.app.patches import DEFAULT_PATCH_BUDGET_S, VERIFY_CHOICES
from gpudiag.app.profile_setup import (default_run_dir, prepare_run_dir, rank_run_dir, target, terminal_of_rank,
                                       under_torchrun)
from gpudiag.app.profile_steps import (analyse_interrupted, cached_calibration, interrupted, keep_bare_run,
                                       record_stage_times, run_trials, verify)
from gpudiag.app.progress import Feedback, StageTracker, timed
from gpudiag.capture import nsys
from gpudiag.capture.instrument import CaptureConfig, detect_step_mode
from gpudiag.capture.run import STATUS_NAME, CaptureError, capture, capture_bare, capture_ncu, mark_interrupted
from gpudiag.errors import UserError
from gpudiag.script_status import ScriptStatus, read_status_lenient
from gpudiag.trials.budget import DEFAULT_BUDGET_S


@dataclass
class ProfileRequest:
    """What to profile and how, as ``gpudiag profile``'s options say it (the defaults are the
    command's): ``script`` (a Python file; None with ``module``) and ``script_args``; ``module``
    (``-m``); ``nproc_per_node`` (run under torchrun); ``run_dir`` (None: gpudiag-runs/<script>-<time>)
    and ``force``; ``nsys_path``; ``detail_step``; ``module_ranges``/``op_ranges`` (NVTX ranges
    injected); ``analysis`` (False: capture only); ``ncu`` with ``ncu_top`` kernel names and at most
    ``ncu_max_kernels`` launches; ``bare_run``; ``steps`` (the measured window, 0 the whole script)
    and ``run_to_end``; ``try_changes`` (auto, none or CHANGE,...) within ``try_budget_s`` seconds;
    ``verify``; ``steps_from`` and ``warmup_steps`` as the analysis options; ``verify_patches``
    (top, all, none: which measured wins' patches run to verify them) within ``patch_budget_s``;
    ``wait`` for another process writing the run directory (False: fail at once, naming it)."""

    script: Path | None
    script_args: tuple[str, ...] = ()
    module: str | None = None
    nproc_per_node: int | None = None
    run_dir: Path | None = None
    force: bool = False
    nsys_path: str | None = None
    detail_step: int | None = None
    module_ranges: bool = True
    op_ranges: bool = True
    analysis: bool = True
    ncu: bool = False
    ncu_top: int = 20
    ncu_max_kernels: int = 400
    bare_run: bool = True
    steps: int = 20
    run_to_end: bool = False
    try_changes: str = "auto"
    try_budget_s: float = DEFAULT_BUDGET_S
    verify: bool = False
    steps_from: str | None = None
    warmup_steps: int | None = None
    verify_patches: str = "top"
    patch_budget_s: float = DEFAULT_PATCH_BUDGET_S
    wait: bool = True  # another process writing the run directory: wait for it (False: fail, naming it)


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
    try_budget_s: float = DEFAULT_BUDGET_S
    verify_patches: str = "top"  # which measured wins' patches are run to verify them (app.patches)
    patch_budget_s: float = DEFAULT_PATCH_BUDGET_S


def _capture_and_report(job: Job, stage: StageTracker, feedback: Feedback) -> int:
    """Bare run, capture, export, analysis, then --ncu and --verify; returns the exit code (the
    script's, or 128 + the signal when Ctrl-C stopped the capture: then what was captured is still
    exported and analysed, and nothing more runs)."""
    run_dir = job.run_dir
    # The bare run goes first: measured on the H100, runs started right after an nsys capture were
    # 14-56 % slower than the same script run plainly before it (docs/notes/measurements.md).
    bare = None if job.no_bare_run else capture_bare(job.script, job.script_args, run_dir, job.config,
                                                     echo=feedback.echo, stage=stage)
    result = _capture_window(job, bare, stage, feedback)
    code = result.script_exit_code
    if result.interrupted:
        result.status = mark_interrupted(run_dir, "profiling", result.interrupted.signum)
        code = result.interrupted.exit_code
    elif code != 0:
        feedback.warn(f"the script exited with code {code}; reporting what was captured up to then")
    if bare is not None:
        keep_bare_run(bare, run_dir, result.status)
    if result.interrupted and not job.no_analysis:
        return analyse_interrupted(job, result, stage, feedback)
    if job.no_analysis:
        feedback.echo(f"capture kept in {run_dir}; analyse it with: gpudiag report {run_dir}")
        return code
    from gpudiag.app.inputs import AnalysisInputs
    from gpudiag.app.report import analyse_and_report

    calibration = cached_calibration(result.sqlite, run_dir, feedback.echo)
    show = (lambda report: feedback.show_report(report, run_dir))
    parts: dict[str, float] = {}
    with stage("[3/3] analysing"):
        report = analyse_and_report(AnalysisInputs(result.sqlite, result.status, run_dir, calibration=calibration),
                                    run_dir, job.analysis, top=max(20, job.ncu_top if job.use_ncu else 0), show=show,
                                    times=parts)
    record_stage_times(run_dir, stage.seconds, parts, result.status, feedback.echo)
    detail = report["steps"]["detail_step"]
    if job.use_ncu and detail is not None and report["top_kernels"]:
        names = [k["name"] for k in report["top_kernels"][:job.ncu_top]]
        ncu_report = capture_ncu(job.script, job.script_args, run_dir, dataclasses.replace(job.config, capture_range=False),
                                 detail, names, job.ncu_max_kernels,
                                 echo=feedback.echo, stage=stage)
        if ncu_report is not None:
            with stage("[ncu] re-analysing with Nsight Compute measurements"):
                analyse_and_report(AnalysisInputs(result.sqlite, result.status, run_dir, ncu_report, calibration),
                                   run_dir, job.analysis, show=show)
    elif job.use_ncu:
        feedback.echo("--ncu skipped: no detail step with kernels (profile with op ranges and at least warm-up + 1 steps)")
    if job.verify:
        verify(run_dir, echo=feedback.echo)
    if job.asked_changes != []:
        with timed(stage.seconds, "trials"):  # not a stage: the trials print their own lines
            run_trials(job, result.status, feedback)
        record_stage_times(run_dir, stage.seconds, parts, result.status)
    return code


def _capture_window(job: Job, bare: ScriptStatus | None, stage: StageTracker, feedback: Feedback):
    """The capture over the step window; the whole script when the window cannot open: the bare
    run found fewer steps than the warm-up, or nsys recorded nothing because the launcher never
    reached the window (then the script runs once more, captured whole). Raises UserError when
    nsys fails."""
    from gpudiag.trials.results import job_view  # a launched job's steps are its ranks'

    config = job.config
    bare = job_view(bare) if bare is not None else None
    if config.capture_range and bare is not None and bare.exit_code == 0 \
            and int(bare.steps_completed or 0) < config.capture_start_step:
        feedback.echo(f"[window] the bare run completed {bare.steps_completed or 0} steps, fewer than the "
                   f"{config.warmup_steps} warm-up steps: capturing the whole script (see --steps-from)")
        config = job.config = dataclasses.replace(config, capture_range=False)
    try:
        return capture(job.script, job.script_args, job.run_dir, config, job.nsys_exe, echo=feedback.echo, stage=stage)
    except CaptureError as exc:
        status_path = job.run_dir / STATUS_NAME
        status = job_view(read_status_lenient(status_path))
        if not config.capture_range or status.capture_started_step is not None or not status:
            raise UserError(str(exc), exit_code=3) from None
    feedback.echo(f"[window] the script reached no step window ({status.steps_completed or 0} steps): "
               "capturing the whole script instead (see --steps-from)")
    job.config = dataclasses.replace(config, capture_range=False)
    try:
        return capture(job.script, job.script_args, job.run_dir, job.config, job.nsys_exe, echo=feedback.echo, stage=stage)
    except CaptureError as exc:
        raise UserError(str(exc), exit_code=3) from None




def prepare(request: ProfileRequest, locks: contextlib.ExitStack | None = None) -> tuple[Job, bool]:
    """The checked :class:`Job` of ``request`` and whether this process is a quiet rank (its output
    goes to terminal.log); creates the run directory, after taking its lock into ``locks`` when
    given (:func:`gpudiag.app.lock.run_dir_lock`: one writer per run directory; ``request.wait``).
    Raises UserError for a missing script or module, conflicting options, an invalid step source or
    --try list, no nsys, a run directory that exists (without ``force``), or one another process
    writes (with ``wait`` False)."""
    script, script_args = request.script, tuple(request.script_args)
    if request.module is not None and script is not None:  # with -m, click hands the module's first argument to SCRIPT
        script_args, script = (str(script), *script_args), None
    script = target(Path(script) if script is not None else None, request.module)
    stem = Path(script.rsplit(".", 1)[-1]) if isinstance(script, str) else script
    if request.nproc_per_node is not None:
        script, script_args = under_torchrun(script, script_args, request.nproc_per_node)
    if request.verify_patches not in VERIFY_CHOICES:
        raise UserError(f"--verify-patches {request.verify_patches!r}: use one of {', '.join(VERIFY_CHOICES)}")
    if request.ncu and not request.analysis:
        raise UserError("--ncu needs the analysis (it replays the top kernels the analysis finds): drop --no-analysis")
    warmup = 2 if request.warmup_steps is None else request.warmup_steps
    config = CaptureConfig(steps_from=request.steps_from or "auto", warmup_steps=warmup,
                           detail_step=request.detail_step, module_ranges=request.module_ranges,
                           op_ranges=request.op_ranges, window_steps=request.steps or None,
                           run_to_end=request.run_to_end, capture_range=bool(request.steps))
    try:
        from gpudiag.trials.plan import parse_try

        asked = parse_try(request.try_changes)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    try:
        detect_step_mode(config, "")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    try:
        nsys_exe = nsys.locate_nsys(request.nsys_path)
    except nsys.ToolNotFound as exc:
        raise UserError(str(exc)) from None
    run_dir, quiet = rank_run_dir(Path(request.run_dir) if request.run_dir else None, stem)
    run_dir = run_dir or default_run_dir(stem)
    if locks is not None:
        from gpudiag.app.lock import run_dir_lock

        locks.enter_context(run_dir_lock(run_dir, request.wait))
    prepare_run_dir(run_dir, request.force)
    job = Job(script, list(script_args), run_dir, config, nsys_exe, AnalysisOptions(request.steps_from, warmup),
              not request.bare_run, not request.analysis, request.ncu, request.ncu_top, request.ncu_max_kernels,
              request.verify, asked, request.try_budget_s, request.verify_patches, request.patch_budget_s)
    return job, quiet


def run(job: Job, quiet: bool = False, feedback: Feedback | None = None) -> int:
    """Run ``job``: the workflow of the module doc, telling ``feedback`` (default: ``print``) what it
    does. Returns the exit code: the script's, or 128 + the signal when Ctrl-C stopped it. Raises
    UserError when nsys fails or the analysis cannot use the capture."""
    feedback = feedback or Feedback()
    with terminal_of_rank(job.run_dir, quiet):
        stage = StageTracker(feedback.stages())
        try:
            return _capture_and_report(job, stage, feedback)
        except KeyboardInterrupt as exc:  # Ctrl-C outside the capture (which handles its own), or a second one
            return interrupted(job.run_dir, stage, exc, feedback)


def profile(request: ProfileRequest, feedback: Feedback | None = None) -> tuple[Path, int]:
    """:func:`prepare` then :func:`run`, holding the run directory's lock throughout: (the run
    directory, the exit code)."""
    with contextlib.ExitStack() as locks:
        job, quiet = prepare(request, locks)
        return job.run_dir, run(job, quiet, feedback)
