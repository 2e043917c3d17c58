"""One writer per run directory: ``gpudiag profile`` and ``gpudiag report`` hold a lock on the
folder they write (``filelock``: an OS file lock, released when the process ends, even killed). A
second process waits for it, saying for whom, or with ``wait=False`` fails with one line naming the
holder. Issue 47: two ``gpudiag report RUN_DIR`` at once failed both (0 of 16 processes in 8 tries).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from gpudiag.errors import UserError



def lock_path(folder: Path) -> Path:
    """The lock file of ``folder``: hidden, beside it (``PARENT/.NAME.gpudiag.lock``), so that
    locking neither creates the folder (a failed run removes the folders it created) nor adds a
    file to it."""
    return folder.parent / f".{folder.name}.gpudiag.lock"


def holder_path(folder: Path) -> Path:
    """Who holds the lock (pid, command, since), for the waiting process's message."""
    return folder.parent / f".{folder.name}.gpudiag.lock.holder"


def holder(folder: Path) -> str:
    """The holder of ``folder``'s lock in words ("process 123 (gpudiag report run), since 12:00:01"),
    or "another process" when it did not say."""
    try:
        info = json.loads(holder_path(folder).read_text())
        since = time.strftime("%H:%M:%S", time.localtime(float(info["since"])))
        return f"process {int(info['pid'])} ({info['command']}), since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr)


@contextmanager
def run_dir_lock(folder: Path, wait: bool = True, echo=_to_stderr) -> Iterator[None]:
    """Hold ``folder``'s lock (:func:`lock_path`; its parent is created when missing) while the
    body writes. Busy: with ``wait``, say who holds it through ``echo`` and wait; else raise
    UserError naming the holder. The lock file stays (removing it would let a third process lock a
    different file), unless the folder does not exist at the end (a failed run removed it): then
    the lock files go too, with the parent folders the lock created. Raises UserError when the
    parent folder cannot be written."""
    folder = Path(os.path.abspath(folder))
    created = next((p for p in reversed(folder.parents) if not p.exists()), None)  # the outermost we make
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(lock_path(folder))
        lock.acquire(timeout=0)
        busy = False
    except Timeout:
        busy = True
    except OSError as exc:
        raise UserError(f"{folder}: cannot create the lock beside it in {folder.parent} ({exc.strerror or exc}); "
                        "pass -o DIR with a folder you can write to") from None
    if busy:
        if not wait:
            raise UserError(f"{folder} is being written by {holder(folder)}: wait for it, or run again without "
                            "--no-wait") from None
        echo(f"[lock] {folder} is being written by {holder(folder)}: waiting for it (--no-wait fails instead)")
        lock.acquire()
    try:
        command = " ".join(["gpudiag", *sys.argv[1:3]]) if sys.argv else "gpudiag"
        holder_path(folder).write_text(json.dumps({"pid": os.getpid(), "command": command, "since": time.time()}))
        yield
    finally:
        lock.release()
        if not folder.exists():  # the run failed and removed what it made: so do we
            _remove(folder, created)


def _remove(folder: Path, created: Path | None) -> None:
    """The lock files of a folder that was not left, and the empty parents this lock created."""
    for path in (lock_path(folder), holder_path(folder)):
        path.unlink(missing_ok=True)
    if created is None:
        return
    for parent in (folder.parent, *folder.parent.parents):
        try:
            parent.rmdir()
        except OSError:  # not empty, or not ours
            return
        if parent == created:
            return
