"""Eight independent MLP towers over the same input (as in recommendation models), run one after
another on one stream: the real positive case for gpudiag's multi-stream rule. Each tower's first
GEMM is skinny (256 x 8192 -> 512): long enough to matter, on too few blocks to fill the GPU.

    gpudiag profile examples/towers_inference.py -- --steps 12
"""

import argparse

import torch

import gpudiag


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--towers", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    towers = torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(8192, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
        for _ in range(args.towers)).cuda().to(torch.bfloat16).eval()
    x = torch.randn(256, 8192, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        for _ in range(args.steps):
            outputs = [tower(x) for tower in towers]  # independent: each could run on its own stream
            torch.cat(outputs, dim=1).sum()
            gpudiag.step()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
