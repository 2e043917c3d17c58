"""Host (CPU) cost per call of a reference kernel against its eager chain, on a tiny input so the
GPU is never the bottleneck: what decides step time when a step is overhead-bound.

    python benchmarks/host_launch_cost.py

For each kernel: microseconds of host time per call (time.perf_counter over 2000 calls after 200
warm-up calls, synchronized once at the end; median of 5 rounds), forward alone and forward +
backward (autograd), for the Triton kernel and for the eager chain.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from gpudiag.fused.registry import kernels  # noqa: E402

TINY = {"ln_roll_window_partition": (1, 7, 7, 8), "window_reverse_roll_add": (1, 7, 7, 8),
        "softmax_bias_mask": (2, 1, 7, 1), "cross_entropy": (4, 16)}


def per_call_us(fn, calls: int = 2000, warmup: int = 200) -> float:
    """Host µs per call of ``fn``: median of 5 rounds of ``calls`` calls after ``warmup`` calls,
    the GPU (if any) synchronized after the warm-up and after each round, never inside one."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
        sync()
    return statistics.median(rounds)


def main() -> None:
    print(f"{'kernel':26s} {'fused fwd':>10s} {'eager fwd':>10s} {'fused f+b':>10s} {'eager f+b':>10s}  (us of host time per call)")
    for name, kernel in kernels().items():
        gen = torch.Generator().manual_seed(0)
        inputs = kernel.make_inputs(TINY.get(name, (8, 64)), torch.bfloat16, "cuda", gen)
        grad_in = [t.detach().requires_grad_(True) if t.is_floating_point() else t for t in inputs]
        diff = [t for t in grad_in if t.requires_grad]

        def fwd(fn):
            return lambda: fn(*inputs)

        def fwd_bwd(fn):
            def step():
                out = fn(*grad_in)
                out = out if isinstance(out, tuple) else (out,)
                torch.autograd.backward([o.float().sum() for o in out], inputs=diff)
            return step

        times = [per_call_us(f(k)) for f in (fwd, fwd_bwd) for k in (kernel.fused, kernel.reference)]
        print(f"{name:26s} {times[0]:10.1f} {times[1]:10.1f} {times[2]:10.1f} {times[3]:10.1f}", flush=True)


if __name__ == "__main__":
    main()
