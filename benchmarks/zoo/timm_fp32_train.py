"""timm image-model training in plain fp32 (no autocast, NCHW, SGD with momentum): the settings a
first training script often has.

    gpudiag profile benchmarks/zoo/timm_fp32_train.py -- --model convnext_tiny
    python benchmarks/zoo/timm_fp32_train.py --model convnext_tiny --steps 14 --tf32   # by hand

--model: any timm model name (random init, no download); default convnext_tiny; batch 32 at 224x224,
1000 classes, cross-entropy.
"""

import argparse

import timm
import torch

import zoo_changes
from zoo_common import StepTimer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    zoo_changes.add_arguments(parser)
    parser.add_argument("--model", default="convnext_tiny")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    device = torch.device(args.device)
    zoo_changes.before_model(args)
    size, batch = (64, 2) if args.tiny else (224, args.batch)
    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False, num_classes=1000).to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, **zoo_changes.optimizer_kwargs(args))
    forward = zoo_changes.model_forward(args, model)
    g = torch.Generator().manual_seed(1)
    images = zoo_changes.inputs(args, torch.randn(batch, 3, size, size, generator=g).to(device))
    labels = torch.randint(0, 1000, (batch,), generator=g).to(device)
    print(f"timm_fp32_train: {args.model}, batch {batch}, {zoo_changes.describe(args)}", flush=True)
    timer = StepTimer(device)
    for _ in range(args.steps):
        zoo_changes.step_begin(args)
        timer.start()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(forward(images), labels)
        loss.backward()
        optimizer.step()
        timer.stop()
    print(f"median_step_ms {timer.median_ms(skip=args.warmup):.3f}")


if __name__ == "__main__":
    main()
