"""Running nsys, ncu and the bare run as child processes of ``gpudiag profile``.

- Everything a child prints goes to the run's log (``gpudiag.log``). The terminal gets the user's
  script's own output, never the tools' progress: nsys redraws its bars with carriage returns,
  which a pipe turns into about 100 lines per export (``[1/1] [==21%   ] profile.nsys-rep``,
  ``Processing 117642 events: [====98%  ]``, as recorded in real gpudiag.log files on the H100).
  In the log, a run of redraws of one bar is kept as its last state.
- The child runs in its own process group. Ctrl-C (SIGINT) or SIGTERM reaching gpudiag is passed
  on to that group once, which makes nsys stop the application and still write its report (the
  same signal a terminal's Ctrl-C would have sent to both); the child's end is then awaited and
  :class:`Interrupted` raised. A second signal kills the group and raises ``KeyboardInterrupt`` at
  once.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

# nsys's progress bars: "[1/1] [==21%        ] profile.nsys-rep" (nsys profile, nsys export of a
# .qdstrm) and "Processing 117642 events: [=====98%  ]" (nsys export --type sqlite).
_BAR = re.compile(r"^(\[\d+/\d+\] |Processing \d+ events: )\[=*\d{1,3}%[= ]*\]")
# nsys's and ncu's status lines: nothing the user has to act on.
_STATUS = re.compile(r"^(Collecting data\.\.\.|Generating '.*'|Generated:|==PROF== )")


class Interrupted(KeyboardInterrupt):
    """The child was stopped by a signal gpudiag received (Ctrl-C or SIGTERM) and has exited;
    what it wrote before stopping (nsys: its report) is kept. ``exit_code`` is 128 + the signal
    number, as a shell reports a process ended by that signal (130 for Ctrl-C)."""

    def __init__(self, signum: int, returncode: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.returncode = returncode
        self.exit_code = 128 + signum


class ToolLines:
    """Sorts a child's output lines into the tool's own (progress bars, status lines, and the blank
    lines nsys prints before them: log only) and everything else (the user's script, the tools'
    warnings and errors: log and terminal)."""

    def __init__(self) -> None:
        self._after_generated = False  # nsys lists the written files, tab-indented, after "Generated:"
        self._blanks = 0  # blank lines held back until the next line shows whose they are

    def for_terminal(self, line: str) -> str:
        """What of ``line`` (and blank lines held back before it) the terminal gets: "" for the
        tool's own lines."""
        if not line.strip():
            self._blanks += 1
            return ""
        tool = (self._after_generated and line.startswith("\t")) or bool(_BAR.match(line) or _STATUS.match(line))
        self._after_generated = line.startswith("Generated:") or (self._after_generated and line.startswith("\t"))
        blanks, self._blanks = self._blanks, 0
        return "" if tool else "\n" * blanks + line

    @staticmethod
    def bar_label(line: str) -> str | None:
        """What a progress bar is about (the line without the bar), or None for other lines."""
        match = _BAR.match(line)
        return None if match is None else match.group(1) + line[match.end():].strip()


def _copy_output(stream, log, echo: bool) -> None:
    """Copy ``stream`` to ``log``, a bar's redraws collapsed to the last one; echo the lines that
    are not the tool's own to stdout when ``echo``."""
    sorter, pending, pending_label = ToolLines(), None, None
    for line in stream:
        label = sorter.bar_label(line)
        if pending is not None and label != pending_label:
            log.write(pending)
        pending, pending_label = (line, label) if label is not None else (None, None)
        if label is None:
            log.write(line)
        shown = sorter.for_terminal(line) if echo else ""
        if shown:
            sys.stdout.write(shown)
            sys.stdout.flush()
    if pending is not None:
        log.write(pending)


@contextmanager
def _forward_signals(child: dict):
    """While in the block, SIGINT and SIGTERM go to the process group of ``child["proc"]`` (once
    set; first: the same signal; second: SIGKILL and ``KeyboardInterrupt``). Yields the list of
    signals received."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set there
        yield received
        return

    def handler(signum, _frame):
        received.append(signum)
        proc = child.get("proc")
        if len(received) == 1:
            _note(f"\n{signal.Signals(signum).name}: stopping {Path(child['cmd'][0]).name}, which keeps what it has "
                  "(press Ctrl-C again to abort)\n")
            if proc is not None:
                _kill_group(proc, signum)
            return
        if proc is not None:
            _kill_group(proc, signal.SIGKILL)
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _kill_group(proc: subprocess.Popen, signum: int) -> None:
    """``signum`` to ``proc``'s process group where it leads one, else to ``proc`` alone."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
    except (ProcessLookupError, PermissionError):  # already gone
        pass


def _note(message: str) -> None:
    """A message written straight to stderr's file descriptor: safe inside a signal handler,
    where Python's buffered streams may be in the middle of a write."""
    try:
        os.write(2, message.encode())
    except OSError:
        pass


def run_logged(cmd: list[str], log: Path, env: dict | None = None, echo: bool = True,
               timeout_s: float | None = None) -> int:
    """Run ``cmd`` with stdout and stderr appended to ``log``; the lines that are not the tool's own
    progress or status are echoed to stdout too, unless ``echo`` is False. Returns the exit code;
    past ``timeout_s`` seconds the child's group gets SIGTERM (then SIGKILL 10 s later) and the
    code is the child's (the launcher exits 143 on SIGTERM).

    Raises :class:`Interrupted` when gpudiag received SIGINT or SIGTERM while ``cmd`` ran (after
    ``cmd`` has exited), ``KeyboardInterrupt`` on a second one (``cmd``'s group killed)."""
    with open(log, "a", encoding="utf-8") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        own_group = threading.current_thread() is threading.main_thread()
        child = {"cmd": cmd}
        with _forward_signals(child) as received:  # before the start: no signal may slip between
            proc = child["proc"] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                                    text=True, errors="replace", start_new_session=own_group)
            if received:  # arrived while the child was starting
                _kill_group(proc, received[0])
            timers = [] if timeout_s is None else [
                threading.Timer(timeout_s, _kill_group, (proc, signal.SIGTERM)),
                threading.Timer(timeout_s + 10, _kill_group, (proc, signal.SIGKILL))]
            for timer in timers:
                timer.daemon = True
                timer.start()
            try:
                _copy_output(proc.stdout, f, echo)
                code = proc.wait()
            except BaseException:
                _kill_group(proc, signal.SIGKILL)
                proc.wait()
                raise
            finally:
                for timer in timers:
                    timer.cancel()
    if received:
        raise Interrupted(received[0], code)
    return code
