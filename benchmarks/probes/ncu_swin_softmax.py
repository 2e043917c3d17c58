import torch, triton
from gpudiag.kernels.ops import swin_window as sw
from gpudiag.kernels.registry import kernels
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
