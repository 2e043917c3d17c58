"""How the workflows write their outputs so that nothing of the user's is lost: files are written
under a temporary name and renamed into place only when complete, and a failed run removes what
it wrote (the folders it created, its partial files), so no half-written report looks complete.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpudiag.errors import UserError

PARTIAL_SUFFIX = ".partial"


def partial(path: Path) -> Path:
    """The temporary name ``path`` is written under until it is complete: hidden, in the same
    folder (so the final rename is atomic), and this process's own (``.NAME.PID.partial``), so that
    a second process writing the same folder neither writes into it nor removes it."""
    return path.with_name(f".{path.name}.{os.getpid()}{PARTIAL_SUFFIX}")


def commit(path: Path) -> Path:
    """Rename ``partial(path)`` to ``path`` (replacing it); returns ``path``."""
    os.replace(partial(path), path)
    return path


def write_atomically(files: dict[Path, str]) -> None:
    """Write each text to its path: all to temporary names first, then renamed into place, so a
    failure (disk full) leaves the old files or none, never a truncated one."""
    for path, text in files.items():
        partial(path).write_text(text, encoding="utf-8")
    for path in files:
        commit(path)


def make_output_folder(out_dir: Path) -> Path | None:
    """Create ``out_dir`` (and its parents); returns the outermost folder created, None when it
    existed. Raises UserError when it is a file or cannot be created (no permission, a file in
    its path, a read-only or full file system)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir}: exists and is not a directory; pass -o DIR with a directory path")
    created = None
    for p in (out_dir, *out_dir.parents):
        if p.exists():
            break
        created = p
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out_dir}: cannot create the output folder ({exc.strerror or exc}); "
                        "pass -o DIR with a folder you can write to") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise UserError(f"{out_dir}: the output folder is not writable; pass -o DIR with a folder you can write to")
    return created


def _remove_partials(out_dir: Path) -> None:
    """This process's partial files (another process's are its own to finish or remove)."""
    for path in out_dir.glob(f".*.{os.getpid()}{PARTIAL_SUFFIX}*"):  # also SQLite's -journal beside a partial database
        path.unlink(missing_ok=True)


@contextmanager
def written_or_removed(out_dir: Path, created: Path | None) -> Iterator[None]:
    """Run the body that writes into ``out_dir``; if it fails (also Ctrl-C), remove the partial
    files and the folders it created (``created``, from :func:`make_output_folder`; a folder that
    existed before is left alone). A write that fails for lack of space or permission becomes a
    one-line UserError naming the folder."""
    try:
        yield
    except BaseException as exc:
        if out_dir.is_dir():
            _remove_partials(out_dir)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        if isinstance(exc, OSError) or (isinstance(exc, sqlite3.OperationalError) and _is_write_error(exc)):
            reason = getattr(exc, "strerror", None) or str(exc)
            raise UserError(f"{out_dir}: cannot write the report ({reason}); nothing was written. Free some space "
                            "or pass -o DIR with a folder you can write to") from None
        raise


def _is_write_error(exc: sqlite3.OperationalError) -> bool:
    """SQLite's words for a full disk, a read-only file or folder and an unopenable file."""
    text = str(exc).lower()
    return any(w in text for w in ("disk is full", "readonly", "read-only", "unable to open", "disk i/o"))
