"""The error every face of gpudiag (the command line, the library, the MCP server) shows a user:
one line naming the file and the fix, and the exit code the command ends with. Plain Python, so that
the library and the server need no click; the command line turns it into its exit
(:mod:`gpudiag.cli.errors`)."""

from __future__ import annotations

import os
from pathlib import Path

# The exit codes: 2 a usage mistake (a missing file, a bad option), 3 an input that cannot be
# analysed or compared (no kernels, an invalid run) or an internal error said in one line.
EXIT_USAGE, EXIT_INVALID = 2, 3


class UserError(Exception):
    """A mistake the user can fix: ``message`` (one line) and ``exit_code`` (2, usage, unless told
    otherwise; 3 for an input that cannot be analysed)."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def format_message(self) -> str:
        """The one line shown to the user (click's name for it, kept for the faces that used it)."""
        return self.message

    def __str__(self) -> str:
        return self.message


INTERNAL_ERROR_MARK = "a gpudiag bug"


def internal_error(exc: BaseException, path: Path) -> UserError:
    """A one-line error (exit 3) for an unexpected exception while analysing ``path``: the user
    sees where it happened and that it is gpudiag's fault, not a traceback. ``GPUDIAG_DEBUG=1``
    re-raises instead (for developers). The fuzz test counts these as failures."""
    if os.environ.get("GPUDIAG_DEBUG"):
        raise exc
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = f" at {Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}" if tb is not None else ""
    return UserError(f"{path}: could not be analysed ({type(exc).__name__}{where}: {str(exc)[:200]}); "
                     f"{INTERNAL_ERROR_MARK}: please report it with this export (GPUDIAG_DEBUG=1 shows the traceback)",
                     exit_code=EXIT_INVALID)
