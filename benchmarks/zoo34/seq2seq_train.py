"""Encoder-decoder training in fp32: Hugging Face BART built from a ``BartConfig`` (random weights,
nothing downloaded), AdamW with PyTorch's default implementation, no autocast, no TF32.

    python benchmarks/zoo34/seq2seq_train.py                          # trains until stopped
    python benchmarks/zoo34/seq2seq_train.py --hand tf32              # one hand change (repeatable)
    gpudiag profile benchmarks/zoo34/seq2seq_train.py

BART-base-shaped but narrower: d_model 512, 6 encoder + 6 decoder layers, 8 heads, FFN 2048, vocab
32000 (about 60M parameters), SDPA attention; batch 16, 128 source and 64 target tokens (random,
seeded), loss from ``labels``. Unlike benchmarks/zoo/t5_train.py (T5 under bf16 autocast), this
one is the fp32 script a user starts from.

Hand changes (``--hand``, repeatable):
- ``compile``: ``model = torch.compile(model)``
- ``compile-graphs``: ``model = torch.compile(model, mode="reduce-overhead")`` with
  ``torch.compiler.cudagraph_mark_step_begin()`` at each step, the optimizer left eager: the form
  gpudiag's ``compile-graphs`` trial applies
- ``bf16-autocast``: the forward under ``torch.autocast("cuda", dtype=torch.bfloat16)``
- ``fused-optimizer``: ``AdamW(..., fused=True)``
- ``tf32``: ``torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True``
"""

import argparse
import contextlib

import torch
from transformers import BartConfig, BartForConditionalGeneration

import steptime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steptime.add_arguments(parser, hands=("compile", "compile-graphs", "bf16-autocast", "fused-optimizer", "tf32"))
    parser.add_argument("--batch", type=int, default=None, help="default 16 (2 with --tiny)")
    args = parser.parse_args()
    device = steptime.device_of(args)
    if "tf32" in args.hand:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if args.tiny:
        config = BartConfig(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                            max_position_embeddings=128)
        batch, src_len, tgt_len = 2, 16, 8
    else:
        config = BartConfig(vocab_size=32000, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                            decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                            max_position_embeddings=512)
        batch, src_len, tgt_len = 16, 128, 64
    batch = args.batch or batch
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = BartForConditionalGeneration(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01,
                                  **({"fused": True} if "fused-optimizer" in args.hand else {}))
    if "compile" in args.hand:
        model = torch.compile(model)
    if "compile-graphs" in args.hand:
        model = torch.compile(model, mode="reduce-overhead")
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, config.vocab_size, (batch, src_len), generator=g).to(device)
    tgt = torch.randint(3, config.vocab_size, (batch, tgt_len), generator=g).to(device)
    mask = torch.ones_like(src)
    params = sum(p.numel() for p in model.parameters())
    print(f"seq2seq_train: BART {params / 1e6:.0f}M parameters, batch {batch}, {src_len}->{tgt_len} tokens, fp32 weights, "
          f"device {device}, hand: {','.join(args.hand) or 'none'}", flush=True)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if "bf16-autocast" in args.hand \
        else contextlib.nullcontext
    clock = steptime.StepClock(device, args.warmup, args.log_every)
    try:
        while args.steps is None or clock.steps < args.steps:
            optimizer.zero_grad(set_to_none=True)
            if "compile-graphs" in args.hand:
                torch.compiler.cudagraph_mark_step_begin()
            with autocast():
                loss = model(input_ids=src, attention_mask=mask, labels=tgt).loss
            loss.backward()
            optimizer.step()
            clock.tick()
    finally:
        clock.report()


if __name__ == "__main__":
    main()
