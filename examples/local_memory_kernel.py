"""A CUDA kernel that keeps a per-thread array in local memory (dynamic indexing defeats register
allocation), launched through CuPy: the real positive case for gpudiag's local-memory rule.

    gpudiag profile examples/local_memory_kernel.py -- --steps 10
"""

import argparse

import cupy
import torch

import gpudiag

SOURCE = r"""
extern "C" __global__ void scatter_hist(const float* x, float* out, int n) {
    float bins[256];  // indexed by data: lives in local memory
    for (int i = 0; i < 256; ++i) bins[i] = 0.f;
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = tid; i < n; i += gridDim.x * blockDim.x) {
        int b = ((int)(x[i] * 4096.f)) & 255;
        bins[b] += x[i];
    }
    float acc = 0.f;
    for (int i = 0; i < 256; ++i) acc += bins[i] * (float)(i + 1);
    out[tid] = acc;
}
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    kernel = cupy.RawKernel(SOURCE, "scatter_hist")
    x = torch.rand(1 << 24, device="cuda")
    out = torch.empty(132 * 4 * 256, device="cuda")
    for _ in range(args.steps):
        for _ in range(20):
            kernel((132 * 4,), (256,), (cupy.asarray(x), cupy.asarray(out), cupy.int32(x.numel())))
        out.add_(1.0)  # a PyTorch op in the step too
        gpudiag.step()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
