"""Synthetic data for the pytorch/examples scripts of the patch suite, made on the machine that runs
them (no network there; nothing fetched is committed):

    python benchmarks/patch_suite/make_data.py DATA_DIR [--what wikitext,mnist] [--words 400000]
        [--mnist-root ROOT] [--mnist-train 10000]

- ``wikitext``: ``DATA_DIR/wikitext-2/{train,valid,test}.txt``, what word_language_model's
  ``data.Corpus`` reads (whitespace-split words, one ``<eos>`` per line): ``--words`` training words
  (valid and test a tenth each) drawn from a Zipf-like vocabulary of ``--vocab`` words, 5 to 40
  words a line. 400000 words: about 600 batches of 20 x 35 tokens in the one epoch the suite runs.
- ``mnist``: the four raw idx files torchvision's ``MNIST(root, download=True)`` checks for, under
  ``ROOT/MNIST/raw`` (benchmarks/examples_suite/fake_mnist.py writes them; the mnist example reads
  ``../data`` from its working directory, so ROOT is the working directory's parent:
  run_suite.sh passes ``RUNS_DIR/scratch/data``; default DATA_DIR).

Files already there are kept (a second call costs nothing).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def wikitext(folder: Path, words: int, vocab: int, seed: int = 0) -> Path:
    out = folder / "wikitext-2"
    sizes = {"train.txt": words, "valid.txt": max(words // 10, 1000), "test.txt": max(words // 10, 1000)}
    if all((out / name).is_file() and (out / name).stat().st_size > 0 for name in sizes):
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    table = np.array([f"w{k}" for k in range(vocab)])
    weights = 1.0 / np.arange(1, vocab + 1)  # Zipf (s = 1), as words in text roughly are
    weights /= weights.sum()
    for name, count in sizes.items():
        ids = rng.choice(vocab, size=count, p=weights)
        lines, at = [], 0
        while at < count:
            n = int(rng.integers(5, 41))
            lines.append(" " + " ".join(table[ids[at:at + n]]) + " ")
            at += n
        tmp = out / (name + ".tmp")
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        tmp.replace(out / name)
    return out


def mnist(root: Path, train: int, test: int) -> Path:
    sys.path.insert(0, str(HERE.parent / "examples_suite"))
    import fake_mnist

    raw = root / "MNIST" / "raw"
    if all((raw / name).is_file() for name in fake_mnist.FILES):
        return raw
    return fake_mnist.make(root, train, test)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--what", default="wikitext,mnist", help="wikitext, mnist or both (comma-separated)")
    parser.add_argument("--words", type=int, default=400_000, help="training words of the synthetic wikitext-2")
    parser.add_argument("--vocab", type=int, default=10_000)
    parser.add_argument("--mnist-root", type=Path, default=None, help="the folder MNIST(ROOT) gets (default DATA_DIR)")
    parser.add_argument("--mnist-train", type=int, default=10_000)
    parser.add_argument("--mnist-test", type=int, default=2_000)
    args = parser.parse_args(argv)
    what = set(filter(None, args.what.split(",")))
    if "wikitext" in what:
        out = wikitext(args.data_dir, args.words, args.vocab)
        print(f"wikitext-2 (synthetic) in {out}: " + ", ".join(f"{p.name} {p.stat().st_size / 2**20:.1f} MiB"
                                                              for p in sorted(out.glob("*.txt"))))
    if "mnist" in what:
        raw = mnist(args.mnist_root or args.data_dir, args.mnist_train, args.mnist_test)
        print(f"MNIST (synthetic idx files) in {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
