"""Encoder-decoder training: Hugging Face T5 (random init from a T5Config, no download), bf16
autocast, AdamW (PyTorch's default implementation), batch 16, 128 source / 64 target tokens.

    gpudiag profile benchmarks/zoo/t5_train.py
    python benchmarks/zoo/t5_train.py --steps 14 --fused-optimizer   # the change by hand (zoo_changes.py)

T5-small-sized: d_model 512, 6 encoder + 6 decoder layers, 8 heads, d_ff 2048, vocab 32128.
"""

import argparse

import torch
from transformers import T5Config, T5ForConditionalGeneration

import zoo_changes
from zoo_common import StepTimer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    zoo_changes.add_arguments(parser)
    args = parser.parse_args()
    device = torch.device(args.device)
    zoo_changes.before_model(args)
    if args.tiny:
        config = T5Config(vocab_size=512, d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                          d_kv=16, decoder_start_token_id=0)
        batch, src_len, tgt_len = 2, 16, 8
    else:
        config = T5Config(vocab_size=32128, d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
                          d_kv=64, decoder_start_token_id=0)
        batch, src_len, tgt_len = 16, 128, 64
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **zoo_changes.optimizer_kwargs(args))
    forward = zoo_changes.model_forward(args, model)
    g = torch.Generator().manual_seed(1)
    src = torch.randint(1, config.vocab_size, (batch, src_len), generator=g).to(device)
    tgt = torch.randint(1, config.vocab_size, (batch, tgt_len), generator=g).to(device)
    print(f"t5_train: batch {batch}, {src_len}->{tgt_len} tokens, {zoo_changes.describe(args)}", flush=True)
    timer = StepTimer(device)
    for _ in range(args.steps):
        zoo_changes.step_begin(args)
        timer.start()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = forward(input_ids=src, labels=tgt).loss
        loss.backward()
        optimizer.step()
        timer.stop()
    print(f"median_step_ms {timer.median_ms(skip=args.warmup):.3f}")


if __name__ == "__main__":
    main()
