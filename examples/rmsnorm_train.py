"""A small LLaMA-style MLP stack with a hand-written RMSNorm (pow, mean, rsqrt, mul, mul: five
kernels per call), trained in bf16: the real positive case for gpudiag's unfused-normalization rule.

    gpudiag profile examples/rmsnorm_train.py -- --steps 10
"""

import argparse

import torch


class RMSNorm(torch.nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight, written out op by op as many model files do."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


class Block(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = RMSNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim, bias=False)
        self.down = torch.nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):
        return x + self.down(torch.nn.functional.silu(self.up(self.norm(x))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=1024)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(args.dim) for _ in range(8)]).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(args.tokens, args.dim, device="cuda")
    for _ in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
