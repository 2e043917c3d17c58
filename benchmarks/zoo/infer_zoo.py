"""Plain inference scripts, as users write them: no NVTX, no optimizer, no gpudiag calls
(issue 24's proof workloads; built for it, never tuned on). Random weights, no download.

    gpudiag profile benchmarks/zoo/infer_zoo.py -- --kind mixer          # as a user would
    python benchmarks/zoo/infer_zoo.py --kind mixer --steps 14 --half-weights   # the change by hand

--kind:
  mixer    MLP-Mixer B/16 image classifier (timm), fp32, batch 32, eval + no_grad, .tolist() of the
           predicted classes per batch
  encoder  ELECTRA-base-sized encoder (transformers), fp32, batch 1, 128 tokens, one request per
           call with .cpu() of the [CLS] vector
  decoder  Llama-style decoder LM (transformers, 12 layers, hidden 1024), fp32, generate() of 48
           new tokens for 4 prompts of 64 tokens, greedy
  seq2seq  BART-base-sized encoder-decoder (transformers), fp32, generate() of 32 tokens for 4
           inputs of 96 tokens, greedy
  serve    MobileNetV3-Large (torchvision) served in a loop that never ends by itself (stopped by
           gpudiag's --steps, or this script's --steps), batch 8, fp32, .tolist() per request

Hand-made changes (the trials' oracle, zoo_changes.FLAGS): --tf32, --bf16-autocast, --compile,
--compile-graphs, --half-weights (model.to(torch.bfloat16) and its float inputs), --static-cache
(generation_config.cache_implementation = "static" with generate()'s automatic compile off),
--static-cache-compile (the same, automatic compile on), --batch N. Prints median_step_ms: CUDA
events around each request (one forward call, or one generate() call) after --warmup requests.
"""

import argparse
import contextlib
import itertools

import torch

import zoo_changes
from zoo_common import StepTimer


def _flags(parser: argparse.ArgumentParser) -> None:
    zoo_changes.add_arguments(parser, steps=0)  # 0: as many requests as gpudiag lets run (serve: forever)
    parser.add_argument("--kind", choices=("mixer", "encoder", "decoder", "seq2seq", "serve"), required=True)
    parser.add_argument("--batch", type=int, default=None)


def _hf_decoder():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                         num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=512)
    return LlamaForCausalLM(config)


def _hf_seq2seq():
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(vocab_size=32000, d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                        decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                        max_position_embeddings=256, forced_bos_token_id=None)
    return BartForConditionalGeneration(config)


def build(kind: str, batch: int | None, device: torch.device):
    """(model, inputs for one request, request function(model, inputs) -> host result)."""
    g = torch.Generator().manual_seed(1)
    if kind == "mixer":
        import timm

        model = timm.create_model("mixer_b16_224", pretrained=False, num_classes=1000)
        torch.nn.init.normal_(model.head.weight, std=0.02)  # timm zero-initialises it: outputs would all be 0
        x = torch.randn(batch or 32, 3, 224, 224, generator=g)
        return model, (x,), lambda m, a: m(*a).argmax(1).tolist()
    if kind == "serve":
        import torchvision

        model = torchvision.models.mobilenet_v3_large(weights=None)
        x = torch.randn(batch or 8, 3, 224, 224, generator=g)
        return model, (x,), lambda m, a: m(*a).argmax(1).tolist()
    if kind == "encoder":
        from transformers import ElectraConfig, ElectraModel

        model = ElectraModel(ElectraConfig(vocab_size=30522, embedding_size=768, hidden_size=768, num_hidden_layers=12,
                                           num_attention_heads=12, intermediate_size=3072))
        ids = torch.randint(0, 30522, (batch or 1, 128), generator=g)
        return model, (ids,), lambda m, a: m(input_ids=a[0]).last_hidden_state[:, 0].cpu()
    model = _hf_decoder() if kind == "decoder" else _hf_seq2seq()
    prompt_len, new = (64, 48) if kind == "decoder" else (96, 32)
    ids = torch.randint(3, 32000, (batch or 4, prompt_len), generator=g)
    model.generation_config.pad_token_id = 0

    def generate(m, a):
        return m.generate(a[0], attention_mask=torch.ones_like(a[0]), max_new_tokens=new, min_new_tokens=new,
                          do_sample=False)
    return model, (ids,), generate


def apply_changes(args, model):
    """The hand-made change, as the one-line edit a user makes."""
    if args.half_weights:
        model = model.to(torch.bfloat16)
    if args.static_cache or args.static_cache_compile:
        model.generation_config.cache_implementation = "static"
        model.generation_config.disable_compile = not args.static_cache_compile
    if args.compile or args.compile_graphs:
        mode = "reduce-overhead" if args.compile_graphs else None
        if hasattr(model, "generate"):  # Hugging Face's idiom: the forward that generate() calls
            model.forward = torch.compile(model.forward, mode=mode)
        else:
            model = torch.compile(model, mode=mode)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _flags(parser)
    args = parser.parse_args()
    device = torch.device(args.device)
    zoo_changes.before_model(args)
    torch.manual_seed(0)
    model, inputs, request = build(args.kind, args.batch, device)
    model = model.to(device).eval()
    inputs = tuple(t.to(device) for t in inputs)
    if args.half_weights:
        inputs = tuple(t.to(torch.bfloat16) if t.is_floating_point() else t for t in inputs)
    model = apply_changes(args, model)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16_autocast else contextlib.nullcontext())
    print(f"infer_zoo: {args.kind}, {zoo_changes.describe(args)}", flush=True)
    timer = StepTimer(device)
    requests = itertools.count() if not args.steps else range(args.steps)
    with torch.no_grad(), autocast:
        for _ in requests:
            if args.compile_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            timer.start()
            request(model, inputs)
            timer.stop()
    print(f"median_step_ms {timer.median_ms(skip=args.warmup):.3f}")


if __name__ == "__main__":
    main()
