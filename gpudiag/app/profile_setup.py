"""The setting-up of ``gpudiag profile``: what to run (a script, a module, under torchrun) and the
run directory it writes (one per rank under a launcher)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

from gpudiag.errors import UserError


def target(script: Path | None, module: str | None) -> Path | str:
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


def under_torchrun(target: Path | str, script_args: tuple[str, ...], nproc: int) -> tuple[str, tuple[str, ...]]:
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
def terminal_of_rank(run_dir: Path, quiet: bool):
    """A quiet rank's terminal output goes to ``run_dir/terminal.log`` (kept, not lost)."""
    if not quiet:
        yield
        return
    with open(run_dir / "terminal.log", "w", encoding="utf-8") as log, contextlib.redirect_stdout(log):
        yield
