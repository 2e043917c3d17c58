"""What the zoo34 scripts share: their command-line basics and their own step clock.

The clock records one CUDA event at each step's end (never waited on inside the loop): step k
lasts from the end of step k-1 to the end of step k on the GPU's timeline, so a step whose GPU sat
idle (waiting for the host, the data loader or a request's preprocessing) counts that wait, as a
user's wall clock would. On the CPU it reads the wall clock. ``report()`` prints, after the warm-up
steps:

    STEP_TIMES_MS [12.345, ...]      one value per measured step (interval.py reads these)
    median_step_ms 12.345            their median (hand.sh prints it)

It is called from each script's ``finally:``, so a run that gpudiag ends after its step window
(as ``sys.exit(0)`` would), or one stopped with Ctrl-C, still prints what it measured.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def add_arguments(parser: argparse.ArgumentParser, hands: tuple[str, ...] = ()) -> None:
    parser.add_argument("--steps", type=int, default=None,
                        help="stop after this many steps (warm-up included); default: run until stopped")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the printed times (default 5)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--tiny", action="store_true", help="sizes that run in seconds on a CPU (smoke test)")
    parser.add_argument("--log-every", type=int, default=0, metavar="N",
                        help="print 'iter K' every N steps (no GPU wait; 0: only the summary)")
    if hands:
        parser.add_argument("--hand", action="append", default=[], choices=hands,
                            help="a change made by hand (repeatable): " + ", ".join(hands))


def device_of(args) -> torch.device:
    return torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))


class StepClock:
    """One timestamp per step boundary: CUDA events on cuda, ``perf_counter`` on cpu."""

    def __init__(self, device: torch.device, warmup: int, log_every: int = 0):
        self.cuda = device.type == "cuda"
        self.warmup = warmup
        self.log_every = log_every
        self.marks: list = []
        self.reported = False
        self.mark()  # the first step starts here

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def tick(self) -> None:
        """The end of a step (and the start of the next)."""
        self.mark()
        done = len(self.marks) - 1
        if self.log_every and done % self.log_every == 0:
            print(f"iter {done}", flush=True)

    @property
    def steps(self) -> int:
        return len(self.marks) - 1

    def times_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]

    def report(self) -> None:
        if self.reported:
            return
        self.reported = True
        try:
            measured = self.times_ms()[self.warmup:]
        except RuntimeError as exc:  # a broken CUDA context at the end of a crashed run
            print(f"step times unavailable: {exc}", flush=True)
            return
        print(f"steps {self.steps} (warm-up {min(self.warmup, self.steps)})")
        print("STEP_TIMES_MS [" + ", ".join(f"{t:.4f}" for t in measured) + "]")
        print(f"median_step_ms {statistics.median(measured):.4f}" if measured else "median_step_ms nan", flush=True)
