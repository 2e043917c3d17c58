"""GPT-2 (124M) training on random tokens: a second real workload for gpudiag's benchmarks.

    gpudiag profile examples/gpt2_train.py -- --amp bf16 --steps 10
    python examples/gpt2_train.py --steps 23 --time [--fused-gelu] [--fused-ce]   # step time, CUDA events

transformers ``GPT2LMHeadModel`` built from ``GPT2Config()`` (random init, no download), batch 8 x
512 tokens, AdamW, language-modelling loss.
"""

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", choices=["bf16", "none"], default="bf16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fused-gelu", action="store_true",
                        help="replace each block's NewGELU with gpudiag's fused Triton GELU (the top fusion candidate)")
    parser.add_argument("--fused-ce", action="store_true",
                        help="compute the loss with gpudiag's fused cross-entropy on the bf16 logits (HF upcasts them to fp32)")
    parser.add_argument("--time", action="store_true", help="print the median step time (CUDA events, after 3 warm-up steps)")
    args = parser.parse_args()
    if args.time and args.steps <= 3:
        parser.error("--time needs more than 3 steps (the first 3 are warm-up), e.g. --steps 23")

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_positions=args.seq)).cuda().train()
    if args.fused_gelu:
        from gpudiag.fused.ops.bias_gelu import FusedGelu

        for block in model.transformer.h:
            block.mlp.act = FusedGelu()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), device="cuda")
    # HF's causal-LM loss: next-token targets, the last position ignored (-100), mean over the rest
    targets = torch.nn.functional.pad(tokens[:, 1:], (0, 1), value=-100).reshape(-1)
    if args.fused_ce:
        from gpudiag.fused.ops.cross_entropy import cross_entropy
    times, losses = [], []
    for step in range(args.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
            if args.fused_ce:
                logits = model(input_ids=tokens).logits
                loss = cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)
            else:
                loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        end.record()
        if args.time:
            end.synchronize()
            losses.append(loss.item())
            if step >= 3:
                times.append(start.elapsed_time(end))
    torch.cuda.synchronize()
    if args.time:
        times.sort()
        print(f"median step time {times[len(times) // 2]:.3f} ms over {len(times)} steps (fused_gelu={args.fused_gelu}, "
              f"fused_ce={args.fused_ce}); losses of the first 3 steps {[round(v, 4) for v in losses[:3]]}")


if __name__ == "__main__":
    main()
