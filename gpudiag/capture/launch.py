"""The launcher ``gpudiag profile`` runs under Nsight Systems:
``python -m gpudiag.capture.launch --config JSON --status FILE script.py [args...]``.

It installs the NVTX instrumentation (:mod:`gpudiag.capture.instrument`), runs the user's script as
``__main__`` with the user's ``sys.argv``, and keeps the script's exit code. Whatever happens, it
closes the open NVTX ranges and writes a status file (exit code, exception, steps seen) so that the
profile of a crashed script is still exported and reported.

A trial's change (``CaptureConfig.trial``) is applied here, before the script runs, through the
registry of :mod:`gpudiag.capture.trial_changes`, which the modules named in
``CaptureConfig.change_modules`` fill when imported by name: capture never imports the trials.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import runpy
import signal
import sys
import time
import traceback

from gpudiag.capture import rank_hook
from gpudiag.capture.window import WindowComplete, release_process_group
from gpudiag.script_status import ScriptStatus


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # as Python does for sys.exit("message"), which exits 1
    return 1


def _exit_on_sigterm(signum, _frame) -> None:
    """SIGTERM ends the script like ``sys.exit(143)``, so the status is still written (Python's
    default would end the process at once)."""
    raise SystemExit(128 + signum)


def module_file(name: str) -> str:
    """The file ``python -m name`` would run (a package's ``__main__``), looked up with the current
    directory first on the path, as ``python -m`` does. Raises ImportError when there is none
    (ValueError for an invalid name)."""
    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:  # a package: its __main__
            spec = importlib.util.find_spec(name + ".__main__")
    finally:
        sys.path.pop(0)
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        raise ImportError(f"no module named {name!r}")
    return spec.origin


def _run(script: str, args: list[str], module: bool, path: str) -> None:
    """Run the user's code as ``__main__`` with the user's ``sys.argv``, as ``python script`` or
    ``python -m module`` would (``sys.path[0]``: the script's folder, or the current directory)."""
    sys.argv = [path, *args]
    if module:
        sys.path.insert(0, os.getcwd())
        runpy.run_module(script, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")


def _write_status(path: str, status: ScriptStatus) -> None:
    """Write the status whole or not at all (a temporary file renamed over it): processes that
    share one status path (ranks given the same one) never leave a file mixed from two writes."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(status.to_json(), f, indent=1)
    os.replace(tmp, path)


def _instrument_children(config_json: str, status_path: str, module: str | None) -> str | None:
    """Let the ranks this command starts (``torchrun`` workers: ``RANK`` set; every Python child of
    a known launcher module, e.g. ``accelerate launch`` of one process) instrument themselves
    (:mod:`gpudiag.capture.rank_hook`); returns the folder their statuses go to. None when this
    process is itself a rank (``torchrun … -m gpudiag profile``): each rank then has its own run."""
    if os.environ.get("RANK") is not None:
        return None
    ranks_dir = os.path.splitext(os.path.abspath(status_path))[0] + ".ranks"
    every_child = module is not None and module.startswith(rank_hook.LAUNCHER_MODULES)
    os.environ.update(rank_hook.child_environment(config_json, ranks_dir, os.environ, every_child))
    return ranks_dir


def _finish_status(status: ScriptStatus, config, code: int, ranks_dir: str | None, path: str, change=None) -> None:
    """Close the capture and write the status (exit code, steps, trials, ranks) to ``path``.
    ``change``: the trial's change installed in this process (a ``trial_changes.Change``), or None."""
    from gpudiag.capture import frameworks, inductor_provenance, instrument

    try:
        import torch

        status.update(torch_version=torch.__version__, torch_cuda_version=torch.version.cuda)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the kernels of the last step finish inside the capture
    except Exception:  # noqa: BLE001 - a broken CUDA context must not hide the status
        pass
    status.update(instrument.finish())
    if config.module_ranges:
        status.update(inductor_provenance=inductor_provenance.collect())
    status.update(frameworks=frameworks.summary())  # which framework owns precision, compile, the optimizer
    if change is not None:
        status.update(trial=change.summary())
    if ranks_dir:
        status.update(ranks=rank_hook.collect(ranks_dir) or None)
    status.update(exit_code=code, ended_unix_s=time.time())
    _write_status(path, status)


def _ranks_ended_by_the_window(exc: BaseException, ranks_dir: str | None, config) -> bool:
    """True when torchrun, run in this process, failed (``ChildFailedError``) only because a rank
    failed at exit after gpudiag ended every rank at its window: each of the job's ranks wrote its
    status with the window complete and no exception. A gloo rank can abort in torch.distributed's
    teardown then ("terminate called without an active exception", SIGABRT; docs/notes/measurements.md,
    2026-11-29): nothing it measured is lost. A rank that failed before its window ended, wrote no
    status, or ran on past the window (``run_to_end``) keeps the failure."""
    if type(exc).__name__ != "ChildFailedError" or not ranks_dir or config.run_to_end:
        return False
    ranks = rank_hook.collect(ranks_dir)
    world = {r.get("world_size") for r in ranks}
    return (len(world) == 1 and len(ranks) == next(iter(world), None)
            and all(r.get("window_complete") is True and r.get("exception") is None for r in ranks))


def main(argv: list[str] | None = None) -> int:
    """Run the script; returns its exit code (also written to the status file)."""
    parser = argparse.ArgumentParser(prog="gpudiag.capture.launch")
    parser.add_argument("--config", required=True, help="CaptureConfig as JSON")
    parser.add_argument("--status", required=True, help="where to write the status JSON")
    parser.add_argument("--module", action="store_true", help="SCRIPT is a module name, run like python -m")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)

    from gpudiag.capture import frameworks, inductor_provenance, instrument, trial_changes

    config = instrument.CaptureConfig.from_json(ns.config)
    path = module_file(ns.script) if ns.module else ns.script
    with open(path, encoding="utf-8", errors="replace") as f:
        source = f.read()
    status = ScriptStatus()
    status.update(script=os.path.basename(ns.script), args=ns.args, exit_code=None, exception=None, traceback=None,
                  started_unix_s=time.time())
    if os.environ.get("RANK") is not None:  # gpudiag itself started once per rank (torchrun -m gpudiag profile)
        status.update(rank_hook.rank_ids())
    try:
        state = instrument.install(config, source)
    except ValueError as exc:  # e.g. --steps-from call:TARGET that cannot be found: the user's to fix
        print(f"gpudiag: {exc}", file=sys.stderr)
        status.update(exit_code=2, exception=f"ValueError: {exc}")
        _write_status(ns.status, status)
        return 2
    frameworks.install()  # counts Trainer/Accelerator/DataLoader constructions, for the advice
    change = None
    if config.trial:  # a trial run: the change is applied here, in the user's process, before the script runs
        change = trial_changes.install(config, state)  # registered by config.change_modules (trial_changes)
    if config.module_ranges:  # compiled kernels back to modules: only where module ranges are wanted
        inductor_provenance.install(state.nvtx)

    launcher_pid = os.getpid()
    ranks_dir = _instrument_children(ns.config, ns.status, ns.script if ns.module else None)
    code = 0
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        _run(ns.script, ns.args, ns.module, path)
    except WindowComplete as exc:  # the step window is complete: the script was ended on purpose
        code = 0
        status.update(stopped_after_window=exc.steps)
        release_process_group()
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:  # Ctrl-C, or gpudiag profile passing one on: the capture stops here
        code = 128 + signal.SIGINT  # what a shell reports for a process ended by SIGINT
        status.update(exception="KeyboardInterrupt: interrupted with Ctrl-C (SIGINT)",
                      traceback=traceback.format_exc(), interrupted=True)
        print("KeyboardInterrupt: the script was stopped (Ctrl-C)", file=sys.stderr)  # no traceback: asked for
    except BaseException as exc:  # noqa: BLE001 - the user's crash is data, reported later
        if _ranks_ended_by_the_window(exc, ranks_dir, config):
            code = 0
            status.update(rank_exit_after_window=f"{type(exc).__name__}: {str(exc)[:500]}")
            print("gpudiag: a rank failed at exit after gpudiag ended its script at the window's end "
                  "(torch.distributed teardown); every rank's window is complete and measured", file=sys.stderr)
        else:
            code = 1
            status.update(exception=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
            traceback.print_exc()
    finally:
        if os.getpid() == launcher_pid:  # not in a child the script forked (os.fork) that ended through here
            _finish_status(status, config, code, ranks_dir, ns.status, change)
    return code


if __name__ == "__main__":
    sys.exit(main())
