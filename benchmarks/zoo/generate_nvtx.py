"""Batch text generation with Hugging Face generate(), one request batch per loop iteration inside
the script's own ``step N`` NVTX range (no optimizer, no gpudiag calls): an inference loop whose
steps gpudiag must find from the script's ranges.

    gpudiag profile benchmarks/zoo/generate_nvtx.py
    python benchmarks/zoo/generate_nvtx.py --steps 14 --compile   # the change by hand (zoo_changes.py)

GPT-2-small-sized decoder (random init from a GPT2Config), fp32 weights, batch 4, 32-token prompt,
32 new tokens, greedy, KV cache.
"""

import argparse
import contextlib

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import zoo_changes
from zoo_common import StepTimer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    zoo_changes.add_arguments(parser, steps=10000)
    args = parser.parse_args()
    device = torch.device(args.device)
    zoo_changes.before_model(args)
    config = (GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500) if args.tiny
              else GPT2Config(n_layer=12, n_embd=768, n_head=12))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).to(device).eval()
    if args.compile or args.compile_graphs:  # generate() calls forward: compile that
        model.forward = torch.compile(model.forward, mode="reduce-overhead" if args.compile_graphs else None)
    if args.bf16_autocast:
        model.forward = torch.autocast("cuda", dtype=torch.bfloat16)(model.forward)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, config.vocab_size, (4, 32), generator=g).to(device)
    print(f"generate_nvtx: batch 4, 32 + 32 tokens, {zoo_changes.describe(args)}", flush=True)
    timer = StepTimer(device)
    with torch.no_grad():
        for step in range(args.steps):
            with torch.cuda.nvtx.range(f"step {step}") if device.type == "cuda" else contextlib.nullcontext():
                if args.compile_graphs:  # the graphs' outputs (the KV cache) are the previous step's: PyTorch's fix
                    torch.compiler.cudagraph_mark_step_begin()
                timer.start()
                out = model.generate(prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                                     pad_token_id=0)
                timer.stop()
    print(f"generated {tuple(out.shape)}; median_step_ms {timer.median_ms(skip=args.warmup):.3f}")


if __name__ == "__main__":
    main()
