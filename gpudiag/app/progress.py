"""What a workflow tells its face while it runs: plain lines, warnings, the stages it goes through
and the summaries a face prints its own way (the command line with click and rich, the library
with ``print``)."""

from __future__ import annotations

import sys
import time
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
    whether it is still running, for the interrupted marker, and the wall time of each stage
    (``seconds``: stage name -> seconds, summed when a stage runs twice; ``time.perf_counter``)."""

    def __init__(self, stage_factory) -> None:
        self.name, self.running = "setup", True
        self.seconds: dict[str, float] = {}
        self._factory = stage_factory

    @contextmanager
    def __call__(self, text: str):
        name = self.name = stage_name(text)
        self.running = True
        with timed(self.seconds, name), self._factory(text):
            yield
        self.running = False


def plain_stage(echo=print):
    """A ``stage(text)`` factory that announces each stage with one line (CI logs, pipes): the
    capture's own (:func:`gpudiag.capture.run.plain_stage`), for the faces, which import the
    application layer only."""
    from gpudiag.capture.run import plain_stage as capture_plain_stage

    return capture_plain_stage(echo)


@contextmanager
def timed(times: dict[str, float] | None, name: str):
    """Adds the wall time of the block, in seconds (``time.perf_counter``), to ``times[name]``
    when ``times`` is given; the time counts also when the block raises. A :class:`ShownTimes`
    also shows the block as a stage (``gpudiag report`` on a terminal)."""
    stage = getattr(times, "stage", None)
    start = time.perf_counter()
    try:
        if stage is None:
            yield
        else:
            with stage(f"[report] {name}"):
                yield
    finally:
        if times is not None:
            times[name] = times.get(name, 0.0) + time.perf_counter() - start


class ShownTimes(dict):
    """The seconds of each part (as :func:`timed` fills a dict), each part also shown while it
    runs through ``stage(text)``, a face's stage factory (a rich spinner on a terminal)."""

    def __init__(self, stage) -> None:
        super().__init__()
        self.stage = stage


def stage_times_line(seconds: dict[str, float], parts: dict[str, float] | None = None) -> str:
    """The terminal's line of the time each stage took: ``seconds`` (stage -> s, in the order run),
    ``parts`` (the analysis stage's parts, shown in brackets after it)."""
    shown = []
    for name, s in seconds.items():
        inner = f" ({', '.join(f'{p} {v:.1f} s' for p, v in parts.items())})" if parts and name == "analysing" else ""
        shown.append(f"{name} {s:.1f} s{inner}")
    return "time by stage: " + ", ".join(shown)


def stage_name(text: str) -> str:
    """A stage's name from its line: '[1/3] profiling x' -> 'profiling', '[bare] timing x' -> 'bare
    timing', '[ncu] re-analysing x' -> 'ncu re-analysing'."""
    tag, _, rest = text.partition("] ")
    tag = tag.lstrip("[")
    word = rest.split(" ", 1)[0]
    return f"{tag} {word}" if tag.isalpha() else word
