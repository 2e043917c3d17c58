"""What the framework suite's own workloads share: the device choice, the by-hand switches and an
optional per-optimizer-step clock.

The clock is off unless ``FW_STEP_TIMES=1`` is set (``hand.sh`` sets it; under ``gpudiag profile``
the scripts run without it, as a user would run them). It hangs on PyTorch's global optimizer
step post-hook, so it sees every real ``optimizer.step()`` whatever framework calls it (Lightning's
automatic optimization, the HF Trainer, Accelerate's wrapped optimizer, which skips the inner step
on accumulation micro-batches, LBFGS with its closure) and nothing else. One CUDA event is recorded
after each step, never waited on inside the loop: step k lasts from the end of step k-1 to the end
of step k on the GPU's timeline (a wait for the host or the data loader counts, as a wall clock
would). On the CPU it reads ``perf_counter``. At exit (or ``report()``) it prints, after
``FW_WARMUP`` steps (default 5), the lines benchmarks/zoo34/interval.py reads:

    STEP_TIMES_MS [12.345, ...]
    median_step_ms 12.345
    FW_STEP_TIMES {"steps": 35, "warmup": 5, "median_ms": 12.345, "min_ms": ..., "max_ms": ..., "times_ms": [...]}

``fw_step N`` lines (one per optimizer step, printed by each workload from its framework's own
counter: Lightning's ``trainer.global_step``, the HF Trainer's ``state.global_step``, Accelerate's
``sync_gradients``) let summarize.py count the framework's steps in gpudiag's logs.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import statistics
import time

import torch


def add_common(parser: argparse.ArgumentParser) -> None:
    """Arguments every workload takes: the device, a CPU-sized smoke test, the quiet switch and the
    by-hand changes (each off by default: the default run is the one gpudiag profiles)."""
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available, else cpu)")
    parser.add_argument("--tiny", action="store_true", help="sizes that run in seconds on a CPU (smoke test)")
    parser.add_argument("--quiet-steps", action="store_true", help="no 'fw_step N' line per optimizer step")
    hand = parser.add_argument_group("by-hand changes (hand.sh)")
    hand.add_argument("--tf32", action="store_true", help="TF32 matmuls and convolutions")
    hand.add_argument("--channels-last", action="store_true", help="model and inputs in channels_last (CNNs)")
    hand.add_argument("--compile", action="store_true", help="torch.compile the model")
    hand.add_argument("--fused-optimizer", action="store_true", help="the optimizer's fused implementation")
    hand.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")


def device_of(args) -> torch.device:
    return torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def apply_backend_flags(args) -> None:
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if args.cudnn_benchmark:
        torch.backends.cudnn.benchmark = True


def print_step(n: int, args, extra: str = "") -> None:
    if not getattr(args, "quiet_steps", False):
        print(f"fw_step {n}{' ' + extra if extra else ''}", flush=True)


class StepClock:
    """One mark per real optimizer step (global post-hook); see the module's docstring."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.cuda = torch.cuda.is_available()
        self.marks: list = []
        self.reported = False
        self.mark()  # the first step starts at install time; warm-up steps absorb the set-up

    def mark(self, *_args) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

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
            times = self.times_ms()
        except RuntimeError as exc:  # a broken CUDA context after a crash
            print(f"step times unavailable: {exc}", flush=True)
            return
        measured = times[self.warmup:]
        median = statistics.median(measured) if measured else float("nan")
        print("STEP_TIMES_MS [" + ", ".join(f"{t:.4f}" for t in measured) + "]")
        print(f"median_step_ms {median:.4f}")
        print("FW_STEP_TIMES " + json.dumps({
            "steps": len(times), "warmup": min(self.warmup, len(times)), "median_ms": round(median, 4),
            "min_ms": round(min(measured), 4) if measured else None,
            "max_ms": round(max(measured), 4) if measured else None,
            "times_ms": [round(t, 4) for t in measured]}), flush=True)


_CLOCK: StepClock | None = None


def install_step_clock() -> StepClock | None:
    """The step clock when FW_STEP_TIMES=1 (else None): a global optimizer step post-hook, reported
    at exit. Call it before the training loop starts (the first mark is made here)."""
    global _CLOCK
    if os.environ.get("FW_STEP_TIMES") != "1" or _CLOCK is not None:
        return _CLOCK
    _CLOCK = StepClock(int(os.environ.get("FW_WARMUP", "5")))
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: _CLOCK.mark())
    atexit.register(_CLOCK.report)
    return _CLOCK


def report_step_clock() -> None:
    if _CLOCK is not None:
        _CLOCK.report()
