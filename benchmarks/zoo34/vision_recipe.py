"""torchvision classification recipe: uint8 images augmented by nn.Module transforms in DataLoader
workers, ResNet-18 trained in fp32 with SGD.

    python benchmarks/zoo34/vision_recipe.py                 # runs until stopped; --steps N to stop
    python benchmarks/zoo34/vision_recipe.py --workers 8     # the hand change: more loader workers
    gpudiag profile benchmarks/zoo34/vision_recipe.py -- --workers 2

The dataset holds a bank of random uint8 images (3 x 256 x 256, as decoded JPEGs would be) and
serves them through ``transforms.v2.Compose([RandomResizedCrop(224), RandomHorizontalFlip(),
ToDtype(float32, scale=True), Normalize(ImageNet mean/std)])``, each an ``nn.Module``, run per
sample in ``--workers`` DataLoader worker processes (default 2, one torch thread each, as the
DataLoader sets), with ``pin_memory=True`` and ``persistent_workers``. Batch 64, ResNet-18 (1000
classes), cross-entropy, SGD (momentum 0.9, weight decay 1e-4), no autocast. With 2 workers the
GPU waits for the loader; the hand change (``--workers 8``) feeds it.
"""

import argparse

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import models
from torchvision.transforms import v2

import steptime

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


class RandomImages(Dataset):
    """``length`` samples drawn from a bank of ``bank`` random uint8 images, labels by index."""

    def __init__(self, bank: int, size: int, length: int, classes: int, transform):
        g = torch.Generator().manual_seed(1)
        self.images = torch.randint(0, 256, (bank, 3, size, size), dtype=torch.uint8, generator=g)
        self.length, self.classes, self.transform = length, classes, transform

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        image = self.images[index % len(self.images)]
        return self.transform(image), (index * 7919) % self.classes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steptime.add_arguments(parser)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    parser.add_argument("--batch", type=int, default=None, help="default 64 (8 with --tiny)")
    args = parser.parse_args()
    device = steptime.device_of(args)
    size, crop, bank, batch = (64, 48, 16, 8) if args.tiny else (256, 224, 512, 64)
    batch = args.batch or batch
    transform = v2.Compose([
        v2.RandomResizedCrop(crop, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(MEAN, STD),
    ])
    dataset = RandomImages(bank, size, length=batch * 1000, classes=1000, transform=transform)
    loader = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=args.workers, pin_memory=device.type == "cuda",
                        drop_last=True, persistent_workers=args.workers > 0)
    torch.manual_seed(0)
    model = models.resnet18(num_classes=1000).to(device)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    print(f"vision_recipe: resnet18, batch {batch}, {crop}px crops of {size}px uint8 images, "
          f"{args.workers} workers, device {device}", flush=True)
    model.train()
    clock = steptime.StepClock(device, args.warmup, args.log_every)
    try:
        epoch = 0
        while args.steps is None or clock.steps < args.steps:
            for images, labels in loader:
                images = images.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
                loss = criterion(model(images), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                clock.tick()
                if args.steps is not None and clock.steps >= args.steps:
                    break
            epoch += 1
    finally:
        clock.report()


if __name__ == "__main__":
    main()
