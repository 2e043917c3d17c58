"""The steps of ``gpudiag profile`` after the capture: the calibration it uses, the bare run kept
with the status, ``--verify``'s measurements, the trials, and what an interruption leaves."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from gpudiag.app.progress import Feedback, StageTracker, stage_times_line
from gpudiag.capture import calibrate
from gpudiag.capture.run import STATUS_NAME, mark_interrupted
from gpudiag.errors import UserError
from gpudiag.script_status import ScriptStatus, write_status


def cached_calibration(export: Path, run_dir: Path, echo) -> dict | None:
    """The ``gpudiag calibrate`` entry of the GPU and driver the capture ran on, copied into the run
    directory as calibration.json; None (datasheet peaks) when this GPU was never calibrated."""
    from gpudiag.sources.nsys_sqlite import read_gpu_in_use

    name, environment = read_gpu_in_use(export)
    if name is None:
        return None
    entry = calibrate.lookup(str(name), environment.get("driver_version"))
    if entry is None:
        echo(f"peaks: datasheet values for {name} (run 'gpudiag calibrate' once on this machine to measure them)")
        return None
    (run_dir / calibrate.CALIBRATION_NAME).write_text(json.dumps(entry, indent=1))
    echo(f"peaks: measured by gpudiag calibrate ({run_dir / calibrate.CALIBRATION_NAME})")
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


def verify(run_dir: Path, echo) -> None:
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
        from gpudiag.app.report import write_reports

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


STAGE_TIMES_NAME = "stage_times.json"


def record_stage_times(run_dir: Path, seconds: dict[str, float], parts: dict[str, float], status: ScriptStatus | None,
                       echo=None) -> None:
    """Write the wall time of each stage of ``gpudiag profile`` into the run directory's
    stage_times.json (``stages_s``: stage -> seconds in the order run, ``analysing_parts_s``: the
    analysis stage's parts, ``report_after_script_s``: from the end of the profiled script, the
    launcher's ``ended_unix_s`` in ``status``, to now; None without it) and, with ``echo``, show it
    in one line: what a user waits for after the script's window, measured (docs/scale.md,
    "gpudiag profile end to end")."""
    ended = status.ended_unix_s if status is not None else None
    after = time.time() - ended if isinstance(ended, (int, float)) else None
    (run_dir / STAGE_TIMES_NAME).write_text(json.dumps({"stages_s": seconds, "analysing_parts_s": parts,
                                                        "report_after_script_s": after}, indent=1))
    if echo is not None:
        echo(stage_times_line(seconds, parts) + (f"; the report came {after:.1f} s after the script ended"
                                                 if after is not None else ""))


def keep_bare_run(bare: ScriptStatus, run_dir: Path, status: ScriptStatus) -> None:
    """The bare run's step times join the script's status (in memory and in script_status.json) as
    ``bare_run``, where the analysis finds them."""
    kept = bare.to_json()
    status.update(bare_run=ScriptStatus.from_json({k: kept.get(k) for k in BARE_KEYS}))
    write_status(run_dir / STATUS_NAME, status)


def run_trials(job, status: ScriptStatus, feedback: Feedback) -> None:
    """Choose and run the trials, then rewrite report.json / report.html with them."""
    from gpudiag.app.patches import hand_back
    from gpudiag.app.report import write_reports
    from gpudiag.trials import plan, results, runner
    from gpudiag.trials.framework_changes import name_switches

    report_path = job.run_dir / "report.json"
    if not report_path.exists():
        return
    profiled = results.job_view(status)  # a launched job: its ranks' steps, the lowest rank's settings
    if job.asked_changes is None and not profiled.step_gpu_ns:
        feedback.echo("[try] no trials: no step of the profiled run was timed on a GPU (trials compare CUDA-event "
                   "step times); --try CHANGE,... runs the ones you name anyway")
        return
    report = json.loads(report_path.read_text())
    from gpudiag.app.ranks import rank0_has

    chosen, left = plan.choose(report, profiled, job.asked_changes)
    chosen = rank0_has("trials-chosen", chosen)  # under torchrun: every rank runs rank 0's trials, in its order
    for entry in left:
        feedback.echo(f"[try] not tried: {entry['change']} ({entry['reason']})")
    generic = [f"{e['change']} ({e['why']})" for e in chosen
               if e.get("origin") == "generic" and e.get("rule_id") is None]
    if generic:
        feedback.echo(f"[try] also tried, though no rule predicted a saving: {', '.join(generic)}")
    if not chosen:
        feedback.echo("[try] no recommendation gpudiag can apply itself; --try CHANGE,... picks changes")
        results.attach(report, [], left)
    else:
        trials, account = runner.run_session(job.script, job.script_args, job.run_dir, job.config, chosen, profiled,
                                             job.try_budget_s, echo=feedback.echo)
        results.attach(report, trials, left)
        report["trials_budget"] = account  # what the --try-budget bought (runner.budget_account)
        report["patches"] = hand_back(job.script, job.script_args, job.run_dir, job.config, report, profiled,
                                      job.verify_patches, job.patch_budget_s, echo=feedback.echo)
        feedback.show_trials(report)
    name_switches(report, profiled)  # a GD-MEASURED win names its framework's switch too
    write_reports(report, job.run_dir)
    # kept with the run, so that 'gpudiag report RUN_DIR' shows them again
    status.update(trials=report["trials"], trials_left_out=report["trials_left_out"],
                  **({"trials_budget": report["trials_budget"]} if report.get("trials_budget") else {}),
                  **({"patches": report["patches"]} if report.get("patches") else {}))
    write_status(job.run_dir / STATUS_NAME, status)


def analyse_interrupted(job, result, stage: StageTracker, feedback: Feedback) -> int:
    """The report of a capture Ctrl-C stopped (no --ncu, no --verify: the user asked to stop).
    A capture too short to analyse keeps its export; the exit code stays the interruption's."""
    from gpudiag.app.inputs import AnalysisInputs
    from gpudiag.app.report import analyse_and_report

    with stage("[3/3] analysing what was captured before the interruption"):
        try:
            calibration = cached_calibration(result.sqlite, job.run_dir, feedback.echo)
            analyse_and_report(AnalysisInputs(result.sqlite, result.status, job.run_dir, calibration=calibration),
                               job.run_dir, job.analysis)
        except UserError as exc:
            feedback.warn(f"no report: {exc.message}; the export is kept in {result.sqlite}", err=True)
    feedback.warn(f"interrupted: the capture was stopped early; {job.run_dir / STATUS_NAME} records it",
                  err=True)
    return result.interrupted.exit_code


def interrupted(run_dir: Path, stage: StageTracker, exc: KeyboardInterrupt, feedback: Feedback) -> int:
    """Ctrl-C (or a second one) outside the capture: marks the run directory, removes report files
    an interrupted analysis may have left half-written, says what is kept; returns 128 + signal."""
    from gpudiag.app.inputs import REPORT_FILES

    signum = getattr(exc, "signum", signal.SIGINT)
    where = f"{'during' if stage.running else 'after'} {stage.name}"
    mark_interrupted(run_dir, stage.name, signum, finished=not stage.running)
    if stage.running and stage.name.endswith("analysing"):
        for name in REPORT_FILES:
            (run_dir / name).unlink(missing_ok=True)
    kept = sorted(p.name for p in run_dir.iterdir())
    feedback.warn(f"\ninterrupted {where}; {run_dir} keeps {', '.join(kept)} ({STATUS_NAME} records "
                  "the interruption)", err=True)
    return getattr(exc, "exit_code", 128 + signum)
