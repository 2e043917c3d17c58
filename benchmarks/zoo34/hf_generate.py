"""Greedy ``generate()`` requests to a Hugging Face Llama-style decoder built from a config (random
weights, nothing downloaded), bf16, batch 1, 64 new tokens per request, until stopped.

    python benchmarks/zoo34/hf_generate.py                          # serves until stopped
    python benchmarks/zoo34/hf_generate.py --hand static-cache      # generation_config.cache_implementation="static"
    python benchmarks/zoo34/hf_generate.py --hand compile-graphs    # forward under torch.compile(mode="reduce-overhead")
    gpudiag profile benchmarks/zoo34/hf_generate.py                 # steps: one per generate() call

Model: ``LlamaConfig`` with hidden 1024, 6 layers, 16 heads, intermediate 2816, vocab 32000, tied
embeddings (110M parameters), SDPA attention, weights in bf16. Each request: a 32-token random
prompt (seeded), ``generate(max_new_tokens=64, min_new_tokens=64, do_sample=False)``, the new
tokens read back with ``.tolist()``. A step is one request (64 decoding forwards after a prefill).

Hand changes:
- ``static-cache``: ``model.generation_config.cache_implementation = "static"`` with generate()'s
  automatic compilation turned off (``generation_config.disable_compile = True``): the cache alone,
  as gpudiag's ``static-cache`` trial measures it.
- ``static-cache-compile``: the static cache with generate()'s automatic compilation left on.
- ``compile-graphs``: ``model.forward = torch.compile(model.forward, mode="reduce-overhead")`` and
  ``torch.compiler.cudagraph_mark_step_begin()`` before each request, over the default dynamic
  cache (whose shapes grow every token).
"""

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import steptime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steptime.add_arguments(parser, hands=("static-cache", "static-cache-compile", "compile-graphs"))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens (default 32)")
    args = parser.parse_args()
    device = steptime.device_of(args)
    if args.tiny:
        config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, max_position_embeddings=256, tie_word_embeddings=True)
    else:
        config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=6,
                             num_attention_heads=16, max_position_embeddings=512, tie_word_embeddings=True)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    gen = model.generation_config
    gen.pad_token_id, gen.eos_token_id, gen.bos_token_id = 0, None, None
    if "static-cache" in args.hand or "static-cache-compile" in args.hand:
        gen.cache_implementation = "static"
        gen.disable_compile = "static-cache-compile" not in args.hand
    if "compile-graphs" in args.hand:
        model.forward = torch.compile(model.forward, mode="reduce-overhead")
    params = sum(p.numel() for p in model.parameters())
    print(f"hf_generate: Llama {params / 1e6:.0f}M parameters ({dtype}), prompt {args.prompt}, "
          f"{args.new_tokens} new tokens, device {device}, hand: {','.join(args.hand) or 'none'}", flush=True)
    g = torch.Generator().manual_seed(1)
    clock = steptime.StepClock(device, args.warmup, args.log_every)
    try:
        while args.steps is None or clock.steps < args.steps:
            prompt = torch.randint(1, config.vocab_size, (1, args.prompt), generator=g).to(device)
            if "compile-graphs" in args.hand:
                torch.compiler.cudagraph_mark_step_begin()
            with torch.no_grad():
                out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.new_tokens,
                                     min_new_tokens=args.new_tokens, do_sample=False)
            tokens = out[0, args.prompt:].tolist()
            assert len(tokens) == args.new_tokens, len(tokens)
            clock.tick()
    finally:
        clock.report()


if __name__ == "__main__":
    main()
