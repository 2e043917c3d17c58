"""A UNet for segmentation trained in fp32, NCHW, the way a user first writes it: 3x3 convolutions
with BatchNorm and ReLU, max-pool down, transposed convolutions up, skip connections, Adam.

    python benchmarks/zoo34/unet_fp32.py                              # trains until stopped
    python benchmarks/zoo34/unet_fp32.py --hand channels-last         # one hand change (repeatable)
    gpudiag profile benchmarks/zoo34/unet_fp32.py

Four levels of 32, 64, 128, 256 channels and a 512-channel bottleneck (7.8M parameters), batch
16 of 3 x 256 x 256 random images, 4-class per-pixel cross-entropy on random masks (seeded). fp32
convolutions are where TF32, channels_last and cuDNN's autotuner each matter.

Hand changes (``--hand``, repeatable):
- ``channels-last``: model and input in ``torch.channels_last``
- ``tf32``: ``torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True``
  (PyTorch leaves cuDNN's TF32 on by default, so this mostly changes the matmuls: expected small)
- ``cudnn-benchmark``: ``torch.backends.cudnn.benchmark = True``
- ``bf16-autocast``: the forward under ``torch.autocast("cuda", dtype=torch.bfloat16)``
- ``no-cudnn-tf32``: ``torch.backends.cudnn.allow_tf32 = False`` (strict fp32, the slower reference)
"""

import argparse
import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

import steptime


def block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, channels=(32, 64, 128, 256), cin: int = 3, classes: int = 4):
        super().__init__()
        self.down = nn.ModuleList()
        for c in channels:
            self.down.append(block(cin, c))
            cin = c
        self.bottleneck = block(channels[-1], channels[-1] * 2)
        self.up = nn.ModuleList(nn.ConvTranspose2d(c * 2, c, 2, stride=2) for c in reversed(channels))
        self.decode = nn.ModuleList(block(c * 2, c) for c in reversed(channels))
        self.head = nn.Conv2d(channels[0], classes, 1)

    def forward(self, x):
        skips = []
        for down in self.down:
            x = down(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottleneck(x)
        for up, decode, skip in zip(self.up, self.decode, reversed(skips)):
            x = decode(torch.cat([up(x), skip], dim=1))
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steptime.add_arguments(parser, hands=("channels-last", "tf32", "cudnn-benchmark", "bf16-autocast", "no-cudnn-tf32"))
    parser.add_argument("--batch", type=int, default=None, help="default 16 (2 with --tiny)")
    args = parser.parse_args()
    device = steptime.device_of(args)
    if "tf32" in args.hand:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if "no-cudnn-tf32" in args.hand:
        torch.backends.cudnn.allow_tf32 = False
    if "cudnn-benchmark" in args.hand:
        torch.backends.cudnn.benchmark = True
    batch, size, channels = (2, 64, (8, 16, 32, 64)) if args.tiny else (16, 256, (32, 64, 128, 256))
    batch = args.batch or batch
    torch.manual_seed(0)
    model = UNet(channels).to(device).train()
    fmt = torch.channels_last if "channels-last" in args.hand else torch.contiguous_format
    model = model.to(memory_format=fmt)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    images = torch.randn(batch, 3, size, size, generator=g).to(device).contiguous(memory_format=fmt)
    masks = torch.randint(0, 4, (batch, size, size), generator=g).to(device)
    params = sum(p.numel() for p in model.parameters())
    print(f"unet_fp32: {params / 1e6:.1f}M parameters, batch {batch} x 3 x {size}^2, device {device}, "
          f"hand: {','.join(args.hand) or 'none'}", flush=True)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if "bf16-autocast" in args.hand \
        else contextlib.nullcontext
    clock = steptime.StepClock(device, args.warmup, args.log_every)
    try:
        while args.steps is None or clock.steps < args.steps:
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = F.cross_entropy(model(images), masks)
            loss.backward()
            optimizer.step()
            clock.tick()
    finally:
        clock.report()


if __name__ == "__main__":
    main()
