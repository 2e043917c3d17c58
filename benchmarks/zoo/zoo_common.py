"""What every zoo script shares: per-step timing the way the device measurements are taken (CUDA
events after warm-up, median; METHOD.md), without synchronizing inside the loop."""

from __future__ import annotations

import statistics
import time

import torch

class StepTimer:
    """Per-step times: CUDA events on cuda (no synchronisation inside the loop), wall time on cpu."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans = []

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.spans.append((self._start, end))
        else:
            self.spans.append(time.perf_counter() - self._start)

    def median_ms(self, skip: int = 3) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            times = [start.elapsed_time(end) for start, end in self.spans]
        else:
            times = [seconds * 1e3 for seconds in self.spans]
        times = times[skip:]
        return statistics.median(times) if times else float("nan")



def print_results(values: list, timer: StepTimer, kind: str = "loss") -> None:
    """``step N <kind> X`` per step (after the loop: printing a GPU value waits for the GPU) and
    ``median_step_ms X``: the lines compare_losses.py and collect_fixtures.py read."""
    for step, value in enumerate(torch.stack(values).float().tolist()):
        print(f"step {step} {kind} {value:.{4 if kind == 'loss' else 6}f}")
    print(f"median_step_ms {timer.median_ms():.3f}")
