"""LLaMA-style decoder training on random tokens (HF transformers, random init, no download).

    python benchmarks/zoo/llama_train.py --steps 20
    gpudiag profile benchmarks/zoo/llama_train.py -- --steps 20
    python benchmarks/zoo/llama_train.py --tiny --device cpu --steps 4      # smoke test
    python benchmarks/zoo/llama_train.py --steps 20 --compile                 # the report's advice, applied:
    python benchmarks/zoo/llama_train.py --steps 20 --fused-optimizer         #   one at a time, for the
    python benchmarks/zoo/llama_train.py --steps 20 --gpudiag-kernels         #   before/after table

``LlamaForCausalLM`` from a ``LlamaConfig`` (8 layers, hidden 1024, intermediate 2816, 16 heads,
vocab 32000), SDPA attention, batch 8 x 1024 tokens, bf16 autocast, AdamW (PyTorch's default
implementation, not fused), loss from ``labels=input_ids``. Prints ``step N loss X`` for each step
(after the loop, so the loop itself never waits for the GPU) and ``median_step_ms X`` (CUDA events
on cuda, wall time on cpu; the first 3 steps are left out).
"""

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from zoo_common import StepTimer, print_results  # benchmarks/zoo/zoo_common.py: next to this script, on sys.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=None, help="default 8 (tiny: 2)")
    parser.add_argument("--seq", type=int, default=None, help="default 1024 (tiny: 32)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="2 layers, hidden 64: runs in seconds on a CPU")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--compile", action="store_true", help="torch.compile(model)")
    parser.add_argument("--fused-optimizer", action="store_true", help="AdamW(fused=True)")
    parser.add_argument("--gpudiag-kernels", action="store_true", help="gpudiag.fused.hf.apply(model)")
    args = parser.parse_args()
    batch = args.batch or (2 if args.tiny else 8)
    seq = args.seq or (32 if args.tiny else 1024)
    device = torch.device(args.device)

    if args.tiny:
        config = LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=seq,
                             attn_implementation="sdpa")
    else:
        config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                             num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=max(seq, 2048),
                             attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, **({"fused": True} if args.fused_optimizer else {}))
    if args.gpudiag_kernels:
        from gpudiag.fused import hf

        print("gpudiag kernels:", hf.apply(model), flush=True)
    forward = torch.compile(model) if args.compile else model
    data_gen = torch.Generator().manual_seed(1)  # CPU generator: the same tokens on every device
    input_ids = torch.randint(0, config.vocab_size, (batch, seq), generator=data_gen).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"llama_train: {n_params / 1e6:.1f}M parameters, batch {batch} x {seq} tokens, device {device}, "
          f"attention {model.config._attn_implementation}, compile {args.compile}, "
          f"fused optimizer {args.fused_optimizer}, gpudiag kernels {args.gpudiag_kernels}", flush=True)

    timer = StepTimer(device)
    losses = []
    for _ in range(args.steps):
        timer.start()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = forward(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        timer.stop()
        losses.append(loss.detach().clone())
    print_results(losses, timer)


if __name__ == "__main__":
    main()
