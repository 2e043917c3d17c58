"""Why a Triton GEMM's class cannot come from an export without shapes (issue 48, device).

One Triton GEMM kernel (``gemm``: one CTA per BM x BN output tile, a K loop of BK steps, the config fixed),
launched on the same M x N = 8192 x 1024 (so the same grid, block and shared memory) in two ways:

- ``small_k``: K = 64 with a residual epilogue (an fp32 M x N tensor added, the fp32 sum written), as the
  triton_gemm fixture's widening GEMMs do;
- ``large_k``: K from --large-k (several), no epilogue, bf16 output.

Prints one JSON object: per variant the kernel's median duration over --repeats batches of back-to-back
launches timed with CUDA events after warm-up (ns), its 2MNK FLOPs and the minimum bytes it must move. The nsys export and the ncu
report come from capture.sh's workload ``triton_ambiguity`` (workloads.py: each step launches every variant).

    python benchmarks/roofline48/triton_ambiguity.py [--large-k 512,768,1024,1536] [--repeats 50]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

M, N, SMALL_K = 8192, 1024, 64
LARGE_K = "512,768,1024,1536"
BM, BN, BK, STAGES, WARPS = 64, 128, 32, 3, 4  # the config Inductor chose for the fixture's widening GEMMs


@triton.jit
def gemm(a, b, c, r, m, n, k, RESIDUAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(n, BN)
    rm = (pid // tiles_n) * BM + tl.arange(0, BM)
    rn = (pid % tiles_n) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, k, BK):
        x = tl.load(a + rm[:, None] * k + (k0 + rk)[None, :])
        y = tl.load(b + (k0 + rk)[:, None] * n + rn[None, :])
        acc += tl.dot(x, y)
    out = rm[:, None] * n + rn[None, :]
    if RESIDUAL:
        acc += tl.load(r + out)
        tl.store(c + out, acc)
    else:
        tl.store(c + out, acc.to(tl.bfloat16))


def launch(k: int, residual: bool):
    a = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, N, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(M, N, device="cuda", dtype=torch.float32)
    c = torch.empty(M, N, device="cuda", dtype=torch.float32 if residual else torch.bfloat16)
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)

    def run():
        gemm[grid](a, b, c, r, M, N, k, RESIDUAL=residual, BM=BM, BN=BN, BK=BK, num_stages=STAGES, num_warps=WARPS)

    out_bytes = M * N * (4 + 4 if residual else 2)  # fp32 residual read + fp32 sum written, or bf16 out
    return run, {"k": k, "residual": residual, "flop": 2 * M * N * k,
                 "min_bytes": 2 * (M * k + k * N) + out_bytes}


def variants(large_k: str = LARGE_K) -> list:
    """(name, run, info) per variant: ``small_k`` and ``large_k_K`` for each K in ``large_k``."""
    out = [("small_k", *launch(SMALL_K, True))]
    return out + [(f"large_k_{k}", *launch(int(k), False)) for k in large_k.split(",")]


def median_ns(run, repeats: int, batch: int = 20) -> float:
    """Median over ``repeats`` of the CUDA-event time of ``batch`` back-to-back launches, divided by
    ``batch`` (ns): one launch between two events would also time Triton's Python launcher (~20 us)."""
    from gpudiag.capture.calibrate import _time_ms  # gpudiag calibrate's CUDA-event timer

    return _time_ms(lambda: [run() for _ in range(batch)], warmup=10, repeats=repeats) * 1e6 / batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--large-k", default=LARGE_K)
    p.add_argument("--repeats", type=int, default=50)
    a = p.parse_args()
    result = {"device": torch.cuda.get_device_name(), "m": M, "n": N,
              "config": {"BM": BM, "BN": BN, "BK": BK, "stages": STAGES, "warps": WARPS}, "variants": {}}
    for name, run, info in variants(a.large_k):
        result["variants"][name] = {**info, "median_ns": median_ns(run, a.repeats)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
