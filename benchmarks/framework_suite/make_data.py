"""Local, synthetic stand-ins for what the external scripts would download (the GPU machine has no
network), made where they run, in seconds:

    python make_data.py DATA_DIR [--images 6400] [--val-images 640] [--classes 10] [--words 1000000] [--what all]

- ``DATA_DIR/imagefolder/{train,validation}/class_K/img_NNNNN.jpg``: smooth random JPEGs (320x256,
  quality 90, ~20 KB; timm's ``train.py DATA_DIR/imagefolder``), K in [0, --classes);
- ``DATA_DIR/pets/classK_NNNNN.jpg``: symbolic links to the first --pet-images of those, named as
  Accelerate's ``cv_example.py`` parses labels (``^(.*)_\\d+\\.jpg$``);
- ``DATA_DIR/text/wikitext-2.txt``: --words words of Zipf-distributed synthetic vocabulary (--vocab
  words), lines of 5-30 words; the Lightning transformer demo reads it as ``./data/wikitext-2.txt``
  (run_suite.sh links it there) and run_clm.py as ``--train_file``;
- ``DATA_DIR/tokenizer/``: a word-level fast tokenizer over that vocabulary (``AutoTokenizer``
  loads it; ``model_max_length`` 1024), for run_clm.py's ``--tokenizer_name``;
- ``DATA_DIR/hf/hub/models--timm--<resnet50d's default tag>/``: a Hugging Face hub cache entry
  holding random ``model.safetensors`` for timm's resnet50d, which ``cv_example.py`` asks for with
  ``pretrained=True``; with ``HF_HOME=DATA_DIR/hf HF_HUB_OFFLINE=1`` timm loads it from the cache.

Files already there are kept (a second call costs nothing). ``--what`` picks parts: images, text,
tokenizer, timm-hub (comma-separated) or all.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
from multiprocessing import Pool
from pathlib import Path

import numpy as np


def _image(args: tuple[str, int]) -> None:
    path, seed = args
    from PIL import Image

    if os.path.exists(path):
        return
    rng = np.random.default_rng(seed)
    low = (rng.random((16, 20, 3)) * 255).astype(np.uint8)
    img = Image.fromarray(low).resize((320, 256), Image.BILINEAR)
    arr = np.asarray(img).astype(np.int16) + rng.integers(-6, 7, (256, 320, 3), dtype=np.int16)
    buf = io.BytesIO()
    Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
    os.replace(tmp, path)


def make_images(root: Path, count: int, val_count: int, classes: int, pet_images: int, workers: int) -> None:
    jobs, names = [], []
    for i in range(count + val_count):
        k = i % classes
        split = "train" if i < count else "validation"
        folder = root / "imagefolder" / split / f"class_{k}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"img_{i:05d}.jpg"
        jobs.append((str(path), i))
        if split == "train":
            names.append((path, k, i))
    with Pool(workers) as pool:
        pool.map(_image, jobs, chunksize=64)
    pets = root / "pets"
    pets.mkdir(parents=True, exist_ok=True)
    for path, k, i in names[:pet_images]:
        link = pets / f"class{k}_{i}.jpg"
        if not link.exists():
            link.symlink_to(path)
    print(f"images: {count} in {root / 'imagefolder' / 'train'}, {val_count} in validation/ ({classes} classes), "
          f"{min(pet_images, count)} linked in {pets}")


def vocabulary(size: int) -> list[str]:
    """``size`` distinct lowercase pseudo-words (deterministic)."""
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    words = []
    for i in range(size):
        n, w = i, ""
        while True:
            w += letters[n % 26]
            n //= 26
            if n == 0:
                break
        words.append(w + ("s" if i % 7 == 0 else ""))
    return list(dict.fromkeys(words))


def make_text(root: Path, words: int, vocab: int) -> Path:
    out = root / "text" / "wikitext-2.txt"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    vocab_words = np.array(vocabulary(vocab))
    ranks = np.arange(1, len(vocab_words) + 1)
    p = 1.0 / ranks ** 1.05
    p /= p.sum()
    ids = rng.choice(len(vocab_words), size=words, p=p)
    lengths = rng.integers(5, 31, size=words // 5)
    lines, at = [], 0
    for n in lengths:
        if at >= words:
            break
        lines.append(" " + " ".join(vocab_words[ids[at:at + n]]) + " . ")
        at += n
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out)
    print(f"text: {at} words, {len(vocab_words)}-word vocabulary, {len(lines)} lines in {out}")
    return out


def make_tokenizer(root: Path, vocab: int) -> None:
    out = root / "tokenizer"
    if (out / "tokenizer.json").exists():
        return
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<|endoftext|>"]
    table = {w: i for i, w in enumerate(specials + vocabulary(vocab) + ["."])}
    tok = Tokenizer(models.WordLevel(vocab=table, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>", model_max_length=1024)
    fast.save_pretrained(str(out))
    print(f"tokenizer: word level, {len(table)} tokens, in {out}")


def make_timm_hub(root: Path, model_name: str = "resnet50d") -> None:
    """A hub cache entry (refs/main -> snapshots/<commit>/model.safetensors) for the tag timm
    resolves ``model_name`` to, with random weights of the right shapes."""
    import timm
    import torch
    from safetensors.torch import save_file

    model = timm.create_model(model_name, pretrained=False)
    hub_id = model.pretrained_cfg.get("hf_hub_id")
    if not hub_id:
        print(f"timm-hub: {model_name} has no hf_hub_id in its pretrained config; nothing made")
        return
    repo = root / "hf" / "hub" / ("models--" + hub_id.replace("/", "--"))
    commit = hashlib.sha1(hub_id.encode()).hexdigest()
    snap = repo / "snapshots" / commit
    if (snap / "model.safetensors").exists():
        return
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    save_file(state, str(snap / "model.safetensors"))
    (snap / "config.json").write_text(json.dumps({"architecture": model_name, "num_classes": 1000}))
    print(f"timm-hub: random {model_name} weights as {hub_id} in {repo}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--what", default="all", help="images,text,tokenizer,timm-hub or all")
    parser.add_argument("--images", type=int, default=6400, help="JPEGs in the image folder (default 6400)")
    parser.add_argument("--val-images", type=int, default=640, help="JPEGs in imagefolder/validation (default 640)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--pet-images", type=int, default=4000, help="of those, linked for cv_example.py (default 4000)")
    parser.add_argument("--words", type=int, default=1_000_000, help="words of synthetic text (default 1000000)")
    parser.add_argument("--vocab", type=int, default=30000, help="vocabulary size (default 30000)")
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    what = {"images", "text", "tokenizer", "timm-hub"} if args.what == "all" else set(args.what.split(","))
    args.data_dir.mkdir(parents=True, exist_ok=True)
    if "images" in what:
        make_images(args.data_dir, args.images, args.val_images, args.classes, args.pet_images, args.workers)
    if "text" in what:
        make_text(args.data_dir, args.words, args.vocab)
    if "tokenizer" in what:
        make_tokenizer(args.data_dir, args.vocab)
    if "timm-hub" in what:
        make_timm_hub(args.data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
