"""How ``gpudiag profile`` shows its stages: one line per stage when stdout is not a terminal (CI
logs, pipes), plus a rich spinner with the elapsed time while a stage runs when it is one. The
tools' own progress never reaches the terminal either way (the capture's tool runs)."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

import click

from gpudiag.app.progress import plain_stage


def stage_display(echo=click.echo, terminal: bool | None = None):
    """A ``stage(text)`` context-manager factory for the workflows' stages (the capture's, the report's).

    ``terminal``: None decides from ``sys.stdout.isatty()``. On a terminal, the stage's line is
    printed when it starts, a spinner with the elapsed seconds stays below whatever the script
    prints while it runs, and a closing line gives the stage's duration."""
    if terminal is None:
        terminal = sys.stdout.isatty()
    if not terminal:
        return plain_stage(echo)
    from rich.console import Console  # only here: importing rich slows every command's start
    from rich.text import Text  # not markup: a script's name may contain [brackets]

    console = Console()

    @contextmanager
    def stage(text: str):
        echo(text)
        start = time.monotonic()
        short = text.split(" (", 1)[0]
        with console.status(Text(f"{short} …"), spinner="dots"):
            yield
        console.print(Text(f"{short}: done in {time.monotonic() - start:.1f} s", style="dim"))

    return stage
