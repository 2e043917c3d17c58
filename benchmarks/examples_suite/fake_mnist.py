"""Fake MNIST raw files, so that scripts calling ``torchvision.datasets.MNIST(root, download=True)``
run unmodified on a machine without network access.

    python benchmarks/examples_suite/fake_mnist.py DATA_ROOT [--train 10000] [--test 2000]

writes ``DATA_ROOT/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte``: the idx format
MNIST uses (big-endian magic 0x00000803 for uint8 images of 3 dimensions, 0x00000801 for uint8
labels of 1 dimension, then the sizes as big-endian uint32), random pixels and random labels 0-9.

torchvision's ``MNIST._check_exists`` only checks that those four uncompressed files exist
(``check_integrity`` without an md5), so ``download=True`` then downloads nothing; no
``MNIST/processed`` folder is written (that one would be the legacy ``training.pt`` path).
The pytorch/examples mnist and vae scripts read ``../data`` relative to their working directory:
pass that folder as DATA_ROOT.
"""

from __future__ import annotations

import argparse
import struct
from pathlib import Path

import numpy as np

IMAGES_MAGIC = 0x00000803  # type 0x08 (uint8), 3 dimensions
LABELS_MAGIC = 0x00000801  # type 0x08 (uint8), 1 dimension
FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def write_images(path: Path, count: int, rng: np.random.Generator, rows: int = 28, cols: int = 28) -> None:
    pixels = rng.integers(0, 256, size=(count, rows, cols), dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(struct.pack(">IIII", IMAGES_MAGIC, count, rows, cols))
        f.write(pixels.tobytes())


def write_labels(path: Path, count: int, rng: np.random.Generator) -> None:
    labels = rng.integers(0, 10, size=count, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(struct.pack(">II", LABELS_MAGIC, count))
        f.write(labels.tobytes())


def make(root: Path, train: int = 10000, test: int = 2000, seed: int = 0) -> Path:
    """Write the four files under ``root/MNIST/raw`` and return that folder."""
    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    write_images(raw / FILES[0], train, rng)
    write_labels(raw / FILES[1], train, rng)
    write_images(raw / FILES[2], test, rng)
    write_labels(raw / FILES[3], test, rng)
    return raw


def read_idx(path: Path) -> np.ndarray:
    """Read an idx file back (the check used by the self-test; torchvision reads it its own way)."""
    data = Path(path).read_bytes()
    magic = struct.unpack(">I", data[:4])[0]
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the dataset root the script passes to MNIST (e.g. ../data)")
    parser.add_argument("--train", type=int, default=10000, help="training images (real MNIST: 60000)")
    parser.add_argument("--test", type=int, default=2000, help="test images (real MNIST: 10000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    raw = make(args.root, args.train, args.test, args.seed)
    shapes = {name: read_idx(raw / name).shape for name in FILES}
    print(f"fake MNIST in {raw}: " + ", ".join(f"{k} {v}" for k, v in shapes.items()))


if __name__ == "__main__":
    main()
