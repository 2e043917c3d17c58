"""A small-batch autoregressive decode loop: an overhead-bound inference workload.

    gpudiag profile examples/mlp_decode.py -- --steps 20

A 4-layer MLP "decoder" (hidden 1024, bf16) that feeds each output back as the next input, batch 4,
16 tokens per step; ``gpudiag.step()`` marks each step (there is no optimizer).
"""

import argparse

import torch

import gpudiag


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(args.hidden, 4 * args.hidden), torch.nn.GELU(), torch.nn.Linear(4 * args.hidden, args.hidden)]
    model = torch.nn.Sequential(*layers, torch.nn.LayerNorm(args.hidden)).cuda().to(torch.bfloat16).eval()
    x = torch.randn(args.batch, args.hidden, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        for _ in range(args.steps):
            for _ in range(args.tokens):
                x = model(x)
            gpudiag.step()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
