"""An ImageNet-style training loop whose input pipeline is the bottleneck: each sample is a JPEG
decoded on the host (``torchvision.io.decode_jpeg``) and augmented there with torchvision
transforms v2 (RandomResizedCrop 224, horizontal flip, to float, normalize), by ``--workers``
DataLoader workers (default 0: in the training process); the model is a torchvision ResNet-18
(or ``--arch resnet50``), SGD with momentum, fp32, batch 64.

    python loader_bound.py [--workers 0] [--arch resnet18] [--max-steps 200]
    python loader_bound.py --tiny --max-steps 3               # a CPU smoke test

The JPEGs are made once at start-up, in memory (``--distinct`` random smooth 500x375 images
encoded by torchvision at quality 90, ~50 KB each; ~3 s for 256), and the dataset cycles over
them: no files, no downloads. On one core a sample takes ~1.5 ms to decode and augment, so a
batch of 64 costs ~100 ms of host time against ~20 ms of GPU time for ResNet-18 fp32 on an H100/H200.
One ``fw_step N`` line per optimizer step. By-hand changes (hand.sh): ``--workers 8
--pin-memory`` (the usual fix), ``--channels-last``, ``--tf32``, ``--compile``. With
FW_STEP_TIMES=1 the per-step times are printed at the end (fwcommon.py).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fwcommon  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torchvision.transforms import v2  # noqa: E402


def make_jpegs(count: int, height: int, width: int, seed: int = 0) -> list[torch.Tensor]:
    """``count`` JPEG byte tensors of smooth random images (low-resolution noise upsampled, plus a
    little grain), closer to photographs in size and decode cost than white noise."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        low = torch.rand(1, 3, height // 16, width // 16, generator=g)
        img = F.interpolate(low, size=(height, width), mode="bilinear", align_corners=False)[0]
        img = (img + 0.02 * torch.randn(img.shape, generator=g)).clamp(0, 1)
        out.append(torchvision.io.encode_jpeg((img * 255).to(torch.uint8), quality=90))
    return out


class JpegImages(Dataset):
    def __init__(self, jpegs: list[torch.Tensor], length: int, size: int):
        self.jpegs, self.length = jpegs, length
        self.transform = v2.Compose([
            v2.RandomResizedCrop(size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ])

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        k = i % len(self.jpegs)
        image = torchvision.io.decode_jpeg(self.jpegs[k])
        return self.transform(image), k % 1000


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (default 0)")
    parser.add_argument("--pin-memory", action="store_true", help="DataLoader(pin_memory=True), non_blocking copies")
    parser.add_argument("--arch", default="resnet18", choices=("resnet18", "resnet50"))
    parser.add_argument("--max-steps", type=int, default=200, help="optimizer steps (default 200)")
    parser.add_argument("--batch-size", type=int, default=None, help="default 64 (8 with --tiny)")
    parser.add_argument("--distinct", type=int, default=None, help="distinct JPEGs (default 256; 16 with --tiny)")
    fwcommon.add_common(parser)
    args = parser.parse_args(argv)
    device = fwcommon.device_of(args)
    fwcommon.apply_backend_flags(args)
    size = 64 if args.tiny else 224
    batch = args.batch_size or (8 if args.tiny else 64)
    h, w = (96, 128) if args.tiny else (375, 500)
    jpegs = make_jpegs(args.distinct or (16 if args.tiny else 256), h, w)
    loader = DataLoader(JpegImages(jpegs, batch * args.max_steps, size), batch_size=batch, shuffle=True,
                        num_workers=args.workers, pin_memory=args.pin_memory and device.type == "cuda",
                        persistent_workers=False, drop_last=True)
    model = getattr(torchvision.models, args.arch)(num_classes=1000).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                                **({"fused": True} if args.fused_optimizer else {}))
    step_model = torch.compile(model) if args.compile else model
    model.train()
    fwcommon.install_step_clock()
    steps = 0
    for images, labels in loader:
        images = images.to(device, non_blocking=args.pin_memory)
        labels = labels.to(device, non_blocking=args.pin_memory)
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        loss = F.cross_entropy(step_model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps += 1
        fwcommon.print_step(steps, args)
        if steps >= args.max_steps:
            break
    print(f"optimizer steps {steps}", flush=True)
    fwcommon.report_step_clock()
    return 0


if __name__ == "__main__":
    sys.exit(main())
