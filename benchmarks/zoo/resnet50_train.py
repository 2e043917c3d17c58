"""ResNet-50 training on random images (torchvision, random init, no download).

    python benchmarks/zoo/resnet50_train.py --steps 20                            # NCHW, eager
    python benchmarks/zoo/resnet50_train.py --steps 20 --channels-last            # NHWC
    python benchmarks/zoo/resnet50_train.py --steps 20 --channels-last --compile  # NHWC + torch.compile
    gpudiag profile benchmarks/zoo/resnet50_train.py -- --steps 20
    python benchmarks/zoo/resnet50_train.py --tiny --device cpu --steps 4         # smoke test

``torchvision.models.resnet50(weights=None)``, batch 64 at 224x224, bf16 autocast, the default NCHW
memory format (as most people write it), SGD with momentum, cross-entropy on random labels.
``--channels-last`` converts the model and the input to ``torch.channels_last``; ``--compile`` runs
``torch.compile`` on the model: the before/after experiment. Prints ``step N loss X`` for each step
(after the loop) and ``median_step_ms X`` (CUDA events on cuda, wall time on cpu; first 3 steps left out).
"""

import argparse

import torch
import torchvision

from zoo_common import StepTimer, print_results  # benchmarks/zoo/zoo_common.py: next to this script, on sys.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=None, help="default 64 (tiny: 2)")
    parser.add_argument("--image-size", type=int, default=None, help="default 224 (tiny: 64)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="64x64 images, 10 classes, batch 2: seconds on a CPU")
    parser.add_argument("--channels-last", action="store_true", help="model and input in torch.channels_last (NHWC)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    batch = args.batch or (2 if args.tiny else 64)
    size = args.image_size or (64 if args.tiny else 224)
    num_classes = 10 if args.tiny else 1000
    device = torch.device(args.device)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None, num_classes=num_classes)
    model = model.to(device, memory_format=memory_format).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    forward = torch.compile(model) if args.compile else model
    data_gen = torch.Generator().manual_seed(1)  # CPU generator: the same data on every device
    images = torch.randn(batch, 3, size, size, generator=data_gen).to(device, memory_format=memory_format)
    labels = torch.randint(0, num_classes, (batch,), generator=data_gen).to(device)
    print(f"resnet50_train: batch {batch} x 3 x {size} x {size}, device {device}, "
          f"channels_last={args.channels_last}, compile={args.compile}", flush=True)

    timer = StepTimer(device)
    losses = []
    for _ in range(args.steps):
        timer.start()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = loss_fn(forward(images), labels)
        loss.backward()
        optimizer.step()
        timer.stop()
        losses.append(loss.detach().clone())
    print_results(losses, timer)


if __name__ == "__main__":
    main()
