"""How the command line ends on a :class:`gpudiag.errors.UserError`: click's one-line ``Error:
MESSAGE`` and the error's exit code, never a traceback."""

from __future__ import annotations

import click

from gpudiag.errors import UserError


class CommandError(click.ClickException):
    """A UserError as click shows it (``Error: MESSAGE`` on stderr) with its exit code."""

    def __init__(self, error: UserError) -> None:
        super().__init__(error.message)
        self.exit_code = error.exit_code


class Group(click.Group):
    """The ``gpudiag`` group: every command runs inside it, so its UserError becomes click's exit here."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            raise CommandError(exc) from None
