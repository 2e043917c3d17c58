"""Swin-T training on random data: the workload gpudiag's examples were captured from.

    gpudiag profile examples/swin_train.py -- --amp bf16 --steps 10

timm ``swin_tiny_patch4_window7_224``, random init, batch 32, AdamW, cross-entropy on random labels.
"""

import argparse

import timm
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", choices=["bf16", "none"], default="bf16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fail-at", type=int, default=None, help="raise at this step (shows crash handling)")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    images = torch.randn(args.batch, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (args.batch,), device="cuda")
    for step in range(args.steps):
        if step == args.fail_at:
            raise RuntimeError(f"planted failure at step {step}")
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
            loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
