"""What a workflow tells its face while it runs: plain lines, warnings, the stages it goes through
and the summaries a face prints its own way (the command line with click and rich, the library
with ``print``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field


def _warn(text: str, err: bool = False) -> None:
    print(text, file=sys.stderr if err else sys.stdout)


def _plain_stages():
    from gpudiag.capture.run import plain_stage

    return plain_stage(print)


@dataclass
class Feedback:
    """The face's printers. ``echo(text)``: a line; ``warn(text, err)``: a warning (to stderr when
    ``err``); ``stages()``: a new ``stage(text)`` context-manager factory (called once the output is
    where it goes: a quiet rank's goes to its terminal.log); ``show_report(result, out_dir)``: the
    summary of a report written; ``show_trials(report)``: the trials' table."""

    echo: Callable[[str], None] = print
    warn: Callable[..., None] = _warn
    stages: Callable[[], Callable] = _plain_stages
    show_report: Callable[[dict, object], None] = field(default=lambda result, out_dir: None)
    show_trials: Callable[[dict], None] = field(default=lambda report: None)


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
