"""A Hugging Face Accelerate training loop with gradient accumulation: ``accelerator.accumulate(model)``
and ``accelerator.backward(loss)``, ``gradient_accumulation_steps=4``, AdamW, gradient clipping on
the sync step, a linear warm-up schedule; the model is GPT-2 small built from ``GPT2Config()``
(random weights; sequence 512, micro-batch 8) or, with ``--model vit``, timm's ViT-B/16 (random
weights, 224x224, micro-batch 32).

    python accelerate_accum.py [--model gpt2|vit] [--grad-accum 4] [--max-steps 200]
    python accelerate_accum.py --tiny --max-steps 3           # a CPU smoke test

``--max-steps`` counts optimizer steps (micro-batches / grad-accum). A ``fw_step N`` line is
printed when ``accelerator.sync_gradients`` is true after a micro-batch (the step Accelerate
really applied). By-hand changes (hand.sh): ``--mixed-precision bf16``, ``--tf32``, ``--compile``,
``--fused-optimizer``, ``--channels-last`` (vit only). With FW_STEP_TIMES=1 the
per-optimizer-step times are printed at the end (fwcommon.py).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fwcommon  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class Cycling(Dataset):
    """``length`` samples cycling over ``distinct`` pre-made random samples."""

    def __init__(self, samples: list, length: int):
        self.samples, self.length = samples, length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return self.samples[i % len(self.samples)]


def build(args):
    g = torch.Generator().manual_seed(0)
    if args.model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        tiny = dict(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=128, bos_token_id=0, eos_token_id=0)
        config = GPT2Config(**tiny) if args.tiny else GPT2Config()  # GPT-2 small: 12 layers, 768, vocab 50257
        model = GPT2LMHeadModel(config)
        seq = 32 if args.tiny else 512
        ids = torch.randint(0, config.vocab_size, (256, seq), generator=g)
        samples = [ids[i] for i in range(len(ids))]

        def loss_of(model, batch):
            return model(input_ids=batch, labels=batch).loss
    else:
        import timm

        model = timm.create_model("vit_tiny_patch16_224" if args.tiny else "vit_base_patch16_224",
                                  pretrained=False, num_classes=1000, **({"img_size": 64} if args.tiny else {}))
        size = 64 if args.tiny else 224
        images = torch.randn(128, 3, size, size, generator=g)
        labels = torch.randint(0, 1000, (128,), generator=g)
        samples = [(images[i], labels[i]) for i in range(len(images))]

        def loss_of(model, batch):
            x, y = batch
            if args.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            return F.cross_entropy(model(x), y)
    return model, samples, loss_of


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("gpt2", "vit"), default="gpt2")
    parser.add_argument("--grad-accum", type=int, default=4, help="gradient_accumulation_steps (default 4)")
    parser.add_argument("--max-steps", type=int, default=200, help="optimizer steps (default 200)")
    parser.add_argument("--batch-size", type=int, default=None, help="micro-batch (default 8 gpt2, 32 vit; 2 with --tiny)")
    parser.add_argument("--mixed-precision", default="no", choices=("no", "bf16", "fp16"))
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (default 0)")
    fwcommon.add_common(parser)
    args = parser.parse_args(argv)
    device = fwcommon.device_of(args)
    fwcommon.apply_backend_flags(args)
    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum, mixed_precision=args.mixed_precision,
                              cpu=device.type == "cpu")
    model, samples, loss_of = build(args)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    batch = args.batch_size or (2 if args.tiny else 8 if args.model == "gpt2" else 32)
    loader = DataLoader(Cycling(samples, batch * args.grad_accum * args.max_steps), batch_size=batch, shuffle=True,
                        num_workers=args.workers, drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01,
                                  **({"fused": True} if args.fused_optimizer else {}))
    warmup = 20
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    if args.compile:
        model = torch.compile(model)
    model.train()
    fwcommon.install_step_clock()
    steps = 0
    for batch_data in loader:
        with accelerator.accumulate(model):
            loss = loss_of(model, batch_data)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            steps += 1
            fwcommon.print_step(steps, args)
            if steps >= args.max_steps:
                break
    print(f"accelerate optimizer steps {steps}", flush=True)
    accelerator.end_training()
    fwcommon.report_step_clock()
    return 0


if __name__ == "__main__":
    sys.exit(main())
