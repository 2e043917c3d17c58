"""ViT-B/16 batch inference on random images (torchvision, random init, no download).

    python benchmarks/zoo/vit_inference.py --steps 20
    gpudiag profile benchmarks/zoo/vit_inference.py -- --steps 20
    python benchmarks/zoo/vit_inference.py --tiny --device cpu --steps 4    # smoke test

``torchvision.models.vit_b_16(weights=None)`` cast to bf16, batch 64 at 224x224, ``torch.no_grad()``;
``gpudiag.step()`` ends each batch (a no-op when gpudiag is not installed or not profiling).
``--tiny`` builds a 2-layer ``VisionTransformer`` (hidden 64) on 32x32 images instead. Prints
``step N checksum X`` per batch (after the loop; the mean absolute value of the batch's logits) and
``median_step_ms X`` (CUDA events on cuda, wall time on cpu; the first 3 steps are left out).
"""

import argparse

import torch
import torchvision

from zoo_common import StepTimer, print_results  # benchmarks/zoo/zoo_common.py: next to this script, on sys.path

try:
    from gpudiag import step
except ImportError:  # gpudiag not installed: the script still runs
    step = lambda: None  # noqa: E731


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=None, help="default 64 (tiny: 2)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="2 layers, hidden 64, 32x32 images: seconds on a CPU")
    args = parser.parse_args()
    batch = args.batch or (2 if args.tiny else 64)
    device = torch.device(args.device)

    torch.manual_seed(0)
    if args.tiny:
        size = 32
        model = torchvision.models.VisionTransformer(image_size=size, patch_size=16, num_layers=2, num_heads=4,
                                                     hidden_dim=64, mlp_dim=128, num_classes=10)
    else:
        size = 224
        model = torchvision.models.vit_b_16(weights=None)
    # torchvision zero-initialises the classification head: random weights there, or every logit
    # (and so the checksum that compares plain and profiled runs) would be 0
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    model = model.to(device, dtype=torch.bfloat16).eval()
    data_gen = torch.Generator().manual_seed(1)  # CPU generator: the same images on every device
    images = torch.randn(batch, 3, size, size, generator=data_gen).to(device, dtype=torch.bfloat16)
    print(f"vit_inference: batch {batch} x 3 x {size} x {size}, bf16, device {device}", flush=True)

    timer = StepTimer(device)
    checksums = []
    with torch.no_grad():
        for _ in range(args.steps):
            timer.start()
            logits = model(images)
            checksums.append(logits.float().abs().mean())
            timer.stop()
            step()
    print_results(checksums, timer, kind="checksum")


if __name__ == "__main__":
    main()
