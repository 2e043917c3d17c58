"""A small CNN trained from a CPU data pipeline, written two ways, for gpudiag's recommendation rules.

    gpudiag profile examples/input_pipeline_train.py -- --practice bad    # the usual mistakes
    gpudiag profile examples/input_pipeline_train.py -- --practice good   # their fixes

bad:  DataLoader with no workers and CPU-side augmentation in the main process, pageable host
      batches copied synchronously, ``loss.item()`` every step, AdamW with per-tensor (foreach) kernels.
good: 4 workers, pinned memory, ``non_blocking`` copies, no per-step ``.item()``, ``AdamW(fused=True)``.
"""

import argparse

import torch
from torch.utils.data import DataLoader, Dataset


class Noise(Dataset):
    """Random images with a deliberately slow CPU 'augmentation' (a few FFTs per sample)."""

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(3, 128, 128, generator=g)
        for _ in range(2):
            x = torch.fft.irfft2(torch.fft.rfft2(x), s=(128, 128))
        return x, i % 100


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--practice", choices=["bad", "good"], default="bad")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    good = args.practice == "good"

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 100)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=good)
    loader = DataLoader(Noise(), batch_size=64, num_workers=4 if good else 0, pin_memory=good,
                        persistent_workers=good)
    for step, (x, y) in enumerate(loader):
        if step == args.steps:
            break
        x, y = x.cuda(non_blocking=good), y.cuda(non_blocking=good)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if not good:
            print(f"step {step} loss {loss.item():.3f}")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
