"""BERT-base sequence-classification training under torch.compile (HF transformers, random init).

    python benchmarks/zoo/bert_compile_train.py --steps 20                           # torch.compile(model)
    python benchmarks/zoo/bert_compile_train.py --steps 20 --mode max-autotune
    python benchmarks/zoo/bert_compile_train.py --steps 20 --mode reduce-overhead    # CUDA graphs
    python benchmarks/zoo/bert_compile_train.py --steps 20 --compile-submodule       # only model.bert.encoder
    python benchmarks/zoo/bert_compile_train.py --steps 20 --no-compile              # eager, for comparison
    python benchmarks/zoo/bert_compile_train.py --steps 20 --compiled-autograd       # backward through Dynamo too
    gpudiag profile benchmarks/zoo/bert_compile_train.py -- --steps 20
    python benchmarks/zoo/bert_compile_train.py --tiny --device cpu --steps 4 --backend aot_eager  # smoke test

``BertForSequenceClassification`` from ``BertConfig()`` (bert-base: 12 layers, hidden 768, 12 heads;
2 labels), SDPA attention, batch 32 x 128 random tokens, random labels, bf16 autocast, AdamW.
The whole model is wrapped in ``torch.compile(model, mode=...)``; with ``--compile-submodule`` the
user compiles only the encoder (``model.bert.encoder = torch.compile(model.bert.encoder)``) and the
embeddings, pooler, classifier and loss stay eager. Prints ``step N loss X`` for each step (after the
loop) and ``median_step_ms X`` (CUDA events on cuda, wall time on cpu; the first 3 steps, which
include compilation, are left out).
"""

import argparse

import torch
from transformers import BertConfig, BertForSequenceClassification

from zoo_common import StepTimer, print_results  # benchmarks/zoo/zoo_common.py: next to this script, on sys.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=None, help="default 32 (tiny: 2)")
    parser.add_argument("--seq", type=int, default=None, help="default 128 (tiny: 16)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="2 layers, hidden 64: runs in seconds on a CPU")
    parser.add_argument("--mode", choices=["default", "max-autotune", "reduce-overhead"], default="default",
                        help="torch.compile mode")
    parser.add_argument("--compile-submodule", action="store_true", help="compile only model.bert.encoder")
    parser.add_argument("--no-compile", action="store_true", help="eager model (baseline)")
    parser.add_argument("--compiled-autograd", action="store_true",
                        help="also compile the backward (torch._dynamo.config.compiled_autograd)")
    parser.add_argument("--backend", default="inductor",
                        help="torch.compile backend (aot_eager: tracing without code generation, for CPU smoke tests)")
    parser.add_argument("--lr", type=float, default=5e-5)
    args = parser.parse_args()
    batch = args.batch or (2 if args.tiny else 32)
    seq = args.seq or (16 if args.tiny else 128)
    device = torch.device(args.device)

    if args.tiny:
        config = BertConfig(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=128, max_position_embeddings=64, num_labels=2,
                            attn_implementation="sdpa")
    else:
        config = BertConfig(num_labels=2, attn_implementation="sdpa")  # bert-base-uncased shapes
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    if args.compiled_autograd:
        torch._dynamo.config.compiled_autograd = True  # PyTorch's documented switch (compiled autograd tutorial)
    compile_kwargs = {"backend": args.backend}
    if args.mode != "default":
        compile_kwargs["mode"] = args.mode
    if args.no_compile:
        forward = model
    elif args.compile_submodule:
        model.bert.encoder = torch.compile(model.bert.encoder, **compile_kwargs)
        forward = model
    else:
        forward = torch.compile(model, **compile_kwargs)

    data_gen = torch.Generator().manual_seed(1)  # CPU generator: the same data on every device
    input_ids = torch.randint(0, config.vocab_size, (batch, seq), generator=data_gen).to(device)
    attention_mask = torch.ones(batch, seq, dtype=torch.long, device=device)
    labels = torch.randint(0, config.num_labels, (batch,), generator=data_gen).to(device)
    what = "eager" if args.no_compile else ("model.bert.encoder" if args.compile_submodule else "model")
    print(f"bert_compile_train: batch {batch} x {seq} tokens, device {device}, compiled {what}, "
          f"mode {args.mode}, backend {args.backend}, compiled autograd {args.compiled_autograd}, attention {model.config._attn_implementation}", flush=True)

    timer = StepTimer(device)
    losses = []
    for _ in range(args.steps):
        timer.start()
        if args.mode == "reduce-overhead" and not args.no_compile:
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration: earlier CUDA-graph outputs may be reused
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        timer.stop()
        losses.append(loss.detach().clone())  # a copy: CUDA-graph outputs are overwritten by the next replay
    print_results(losses, timer)


if __name__ == "__main__":
    main()
