"""A noisy, host-bound image-classification server that never ends: each request's batch is
preprocessed on the CPU (PIL resize, numpy normalise), copied to the GPU, classified by a small
CNN in eval/no_grad, and its top-5 read back with ``.tolist()``.

    python benchmarks/zoo34/host_server.py                          # serves until stopped
    python benchmarks/zoo34/host_server.py --hand compile-graphs    # torch.compile(mode="reduce-overhead")
    python benchmarks/zoo34/host_server.py --hand gpu-input         # preprocessing on the GPU
    gpudiag profile benchmarks/zoo34/host_server.py                 # steps: one per model call (request)

Each request carries 8 images "decoded" to uint8 HWC arrays of one source size drawn at random
per request (480x360 half of the time, 640x480 a third, 1280x720 the rest: that is the noise), as
a web server's would arrive. The CPU path resizes each image with PIL (shorter side 256,
bilinear), centre-crops 224, converts to float32, normalises with numpy, transposes to CHW and
stacks: several ms per request, against about a millisecond of GPU work for ResNet-18 at batch 8.
One request in 20 also writes a JSON log line of its result (string only, not printed).

Hand changes:
- ``compile-graphs``: ``model = torch.compile(model, mode="reduce-overhead")`` and
  ``torch.compiler.cudagraph_mark_step_begin()`` before each request. It removes launch overhead
  the GPU never waited on: expected to save next to nothing.
- ``gpu-input``: the request's uint8 images are stacked and copied to the GPU as they are, and the
  resize (``F.interpolate``, bilinear, antialias), crop and normalisation run there: the host work
  that bounds the request goes away.
"""

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision import models

import steptime

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
SOURCES = [((360, 480), 0.5), ((480, 640), 0.35), ((720, 1280), 0.15)]  # (height, width), probability


def preprocess_cpu(image: np.ndarray, resize: int, crop: int) -> np.ndarray:
    """One HWC uint8 image -> CHW float32, the way torchvision's classic eval transform does it."""
    h, w = image.shape[:2]
    scale = resize / min(h, w)
    pil = Image.fromarray(image).resize((round(w * scale), round(h * scale)), Image.BILINEAR)
    left, top = (pil.width - crop) // 2, (pil.height - crop) // 2
    pil = pil.crop((left, top, left + crop, top + crop))
    array = np.asarray(pil, dtype=np.float32) / 255.0
    return ((array - MEAN) / STD).transpose(2, 0, 1)


def preprocess_gpu(images: np.ndarray, device, resize: int, crop: int) -> torch.Tensor:
    """N x H x W x 3 uint8 on the host -> N x 3 x crop x crop float32 on the GPU."""
    batch = torch.from_numpy(images).to(device, non_blocking=True).permute(0, 3, 1, 2).float().div_(255.0)
    h, w = batch.shape[-2:]
    scale = resize / min(h, w)
    batch = F.interpolate(batch, size=(round(h * scale), round(w * scale)), mode="bilinear", antialias=True,
                          align_corners=False)
    top, left = (batch.shape[-2] - crop) // 2, (batch.shape[-1] - crop) // 2
    batch = batch[:, :, top:top + crop, left:left + crop]
    mean = torch.as_tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.as_tensor(STD, device=device).view(1, 3, 1, 1)
    return (batch - mean) / std


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steptime.add_arguments(parser, hands=("compile-graphs", "gpu-input"))
    parser.add_argument("--batch", type=int, default=8, help="images per request (default 8)")
    args = parser.parse_args()
    device = steptime.device_of(args)
    resize, crop = (64, 56) if args.tiny else (256, 224)
    sources = [((h // 4, w // 4), p) for (h, w), p in SOURCES] if args.tiny else SOURCES
    rng = np.random.default_rng(1)
    # "decoded" images waiting in the server's queue: a few per source size, reused
    bank = {hw: rng.integers(0, 256, size=(args.batch * 2, *hw, 3), dtype=np.uint8) for hw, _ in sources}
    sizes, weights = [hw for hw, _ in sources], [p for _, p in sources]

    torch.manual_seed(0)
    model = models.resnet18(num_classes=1000).to(device).eval()
    if "compile-graphs" in args.hand:
        model = torch.compile(model, mode="reduce-overhead")
    gpu_input = "gpu-input" in args.hand
    print(f"host_server: resnet18, {args.batch} images per request, device {device}, "
          f"hand: {','.join(args.hand) or 'none'}", flush=True)
    log_lines = []
    clock = steptime.StepClock(device, args.warmup, args.log_every)
    try:
        request = 0
        while args.steps is None or clock.steps < args.steps:
            hw = sizes[rng.choice(len(sizes), p=weights)]
            pick = rng.choice(len(bank[hw]), size=args.batch, replace=False)
            images = bank[hw][pick]
            with torch.no_grad():
                if gpu_input:
                    batch = preprocess_gpu(images, device, resize, crop)
                else:
                    batch = torch.from_numpy(np.stack([preprocess_cpu(im, resize, crop) for im in images])).to(device)
                if "compile-graphs" in args.hand:
                    torch.compiler.cudagraph_mark_step_begin()
                logits = model(batch)
                top = logits.softmax(dim=-1).topk(5, dim=-1)
                result = {"classes": top.indices.tolist(), "scores": top.values.tolist()}
            if request % 20 == 0:
                log_lines.append(json.dumps({"request": request, "source": hw, **result}))
                del log_lines[:-100]
            request += 1
            clock.tick()
    finally:
        clock.report()


if __name__ == "__main__":
    main()
