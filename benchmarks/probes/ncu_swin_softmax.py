"""Launches the Swin LayerNorm + partition kernel and the attention-score softmax (3 times each, at
Swin-T stage 1, batch 128 / batch 32) for Nsight Compute, on the device:

    ncu --kernel-name regex:"_ln_partition_fwd|_fwd" --launch-skip 2 --launch-count 2 \
        --section SpeedOfLight --section LaunchStats --section Occupancy \
        python3 benchmarks/probes/ncu_swin_softmax.py

Results: docs/notes/measurements.md (2026-11-21).
"""

import torch, triton
from gpudiag.fused.ops import swin_window as sw
from gpudiag.fused.registry import kernels
B, H, W, C = 128, 56, 56, 96
x = torch.randn(B, H, W, C, device="cuda", dtype=torch.bfloat16)
w = torch.ones(C, device="cuda", dtype=torch.bfloat16); b = torch.zeros_like(w)
for _ in range(3):
    sw.ln_roll_partition(x, w, b, 7, 3)
k = kernels()["softmax_bias_mask"]
inp = k.make_inputs((2048, 3, 49, 64), torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
for _ in range(3):
    k.fused(*inp)
torch.cuda.synchronize()
