"""How ``gpudiag profile`` shows its stages: one line per stage when stdout is not a terminal (CI
logs, pipes), plus a rich spinner with the elapsed time while a stage runs when it is one. The
tools' own progress never reaches the terminal either way (``gpudiag.capture.toolrun``)."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

import click

from gpudiag.capture.run import plain_stage


def stage_display(echo=click.echo, terminal: bool | None = None):
    """A ``stage(text)`` context-manager factory for :func:`gpudiag.capture.run.capture`.

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


class StageTracker:
    """A ``stage(text)`` factory that remembers which stage ``gpudiag profile`` is in (``name``) and
    whether it is still running, for the interrupted marker."""

    def __init__(self, stage_factory) -> None:
        self.name, self.running = "setup", True
        self._factory = stage_factory

    @contextmanager
    def __call__(self, text: str):
        self.name, self.running = stage_name(text), True
        with self._factory(text):
            yield
        self.running = False


def stage_name(text: str) -> str:
    """A stage's name from its line: '[1/3] profiling x' -> 'profiling', '[bare] timing x' -> 'bare
    timing', '[ncu] re-analysing x' -> 'ncu re-analysing'."""
    tag, _, rest = text.partition("] ")
    tag = tag.lstrip("[")
    word = rest.split(" ", 1)[0]
    return f"{tag} {word}" if tag.isalpha() else word
