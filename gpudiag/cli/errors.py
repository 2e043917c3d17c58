"""User-facing errors: one line naming the file and the fix, a non-zero exit code, no traceback."""

from __future__ import annotations

import click


class UserError(click.ClickException):
    """A mistake the user can fix; exits with code 2 (usage) unless told otherwise."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
