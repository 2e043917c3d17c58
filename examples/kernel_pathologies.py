"""Three CUDA kernels with classic pathologies, and a clean one, launched through CuPy: the real
positive cases for gpudiag's Nsight Compute rules (run with ``gpudiag profile --ncu``).

    gpudiag profile examples/kernel_pathologies.py --ncu -- --steps 8

- ``spilling_hist``: a 256-float per-thread array compiled with ``--maxrregcount=32``: register
  spills to local memory;
- ``strided_copy``: each thread reads with a 32-element stride: uncoalesced global loads;
- ``smem_hog``: 96 KiB of shared memory per 128-thread block: at most 2 blocks (8 warps) per SM,
  low achieved occupancy;
- ``clean_copy``: a coalesced, vectorizable copy (no pathology).
"""

import argparse

import cupy
import torch

import gpudiag

HIST = r"""
extern "C" __global__ void spilling_hist(const float* x, float* out, int n) {
    float bins[256];
    for (int i = 0; i < 256; ++i) bins[i] = 0.f;
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = tid; i < n; i += gridDim.x * blockDim.x) { bins[((int)(x[i] * 4096.f)) & 255] += x[i]; }
    float acc = 0.f;
    for (int i = 0; i < 256; ++i) acc += bins[i] * (float)(i + 1);
    out[tid] = acc;
}
"""
STRIDED = r"""
extern "C" __global__ void strided_copy(const float* x, float* y, long n) {
    long tid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    long i = (tid * 32) % n + (tid * 32) / n;  // neighbouring threads read 128 bytes apart
    if (tid < n) y[tid] = x[i] * 2.f;
}
"""
SMEM = r"""
extern "C" __global__ void smem_hog(const float* x, float* y, long n) {
    extern __shared__ float tile[];  // 96 KiB requested at launch
    long tid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    tile[threadIdx.x] = tid < n ? x[tid] : 0.f;
    __syncthreads();
    float acc = 0.f;
    for (int k = 0; k < 64; ++k) acc += tile[(threadIdx.x + k) % blockDim.x];
    if (tid < n) y[tid] = acc;
}
"""
CLEAN = r"""
extern "C" __global__ void clean_copy(const float4* x, float4* y, long n4) {
    long tid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (tid < n4) { float4 v = x[tid]; v.x *= 2.f; v.y *= 2.f; v.z *= 2.f; v.w *= 2.f; y[tid] = v; }
}
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    hist = cupy.RawKernel(HIST, "spilling_hist", options=("--maxrregcount=32",))
    strided = cupy.RawKernel(STRIDED, "strided_copy")
    smem = cupy.RawKernel(SMEM, "smem_hog")
    smem.max_dynamic_shared_size_bytes = 96 * 1024
    clean = cupy.RawKernel(CLEAN, "clean_copy")
    n = 1 << 26
    x, y = torch.rand(n, device="cuda"), torch.empty(n, device="cuda")
    out = torch.empty(132 * 8 * 256, device="cuda")
    cx, cy, cout = cupy.asarray(x), cupy.asarray(y), cupy.asarray(out)
    blocks = (n + 255) // 256
    for _ in range(args.steps):
        hist((132 * 8,), (256,), (cx, cout, cupy.int32(1 << 22)))
        strided((blocks,), (256,), (cx, cy, cupy.int64(n)))
        smem(((n + 127) // 128,), (128,), (cx, cy, cupy.int64(n)), shared_mem=96 * 1024)
        clean(((n // 4 + 255) // 256,), (256,), (cx, cy, cupy.int64(n // 4)))
        gpudiag.step()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
