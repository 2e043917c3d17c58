"""Six-plus workloads for the issue 48 ground truth: roofline classes from Nsight Compute against
gpudiag's estimate from an nsys export made WITHOUT gpudiag (no op ranges, no shapes).

    python benchmarks/roofline48/workloads.py NAME [--steps N] [--ncu-step K]

Names: conv (torchvision EfficientNet-B0 training, bf16 autocast, channels-last), swinv2
(torchvision Swin-V2-T training, bf16 autocast: windowed attention), encoder (transformers
DeBERTa-v2 training, bf16), decoder (transformers Llama training step, bf16), decode (transformers
Llama greedy generate, bf16, dynamic cache), moe (transformers Mixtral training step, bf16: top-2 of 8
experts), grouped (torch._grouped_mm over 8 experts, forward and backward, bf16), decoder_eager (the
decoder with eager attention: explicit matmul + softmax, no biases), bert_sdpa and gpt2_sdpa (2-layer BERT MLM
and GPT-2 LM training with SDPA attention, bf16), triton_gemm (an MLP of Linear
layers compiled with max-autotune and Triton as its only GEMM backend, bf16: Triton template GEMMs,
large-K and small-K, with fused epilogues), bert_eager and gpt2_eager (transformers BERT MLM and GPT-2 LM
training, bf16, eager attention: held out for the attention-product rule), vit_compiled (timm ViT-S/16
training under default torch.compile, bf16: cuBLAS GEMMs as Inductor extern calls, held out for the
shapes compiled graphs record), gpt2_compiled (transformers GPT-2, 3 layers, SDPA attention, under
default torch.compile, bf16: held out likewise). All models are
built from configs (no download) with fixed seeds and random inputs. None of them was used to tune
gpudiag's roofline heuristics (those were Swin-T, GPT-2, an MLP decode loop and BERT).

The script emits no NVTX range, except, only when $NCU_STEP_RANGE is set, one range
``ncu_step`` around step ``--ncu-step``: the ncu pass filters on it (``--nvtx-include ncu_step/``)
so that ncu replays exactly one steady-state step; the nsys pass runs without it, as a user's
export would.
"""

from __future__ import annotations

import argparse
import os

import torch


def _nvtx(step: int, target: int, push: bool) -> None:
    if os.environ.get("NCU_STEP_RANGE") and step == target:
        (torch.cuda.nvtx.range_push if push else torch.cuda.nvtx.range_pop)(*(("ncu_step",) if push else ()))


def _train_step(model, batch, opt, loss_fn):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model, batch)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def conv():
    import torchvision
    m = torchvision.models.efficientnet_b0(num_classes=100).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(64, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 100, (64,), device="cuda")
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    return lambda: _train_step(m, (x, y), opt, lambda mm, b: torch.nn.functional.cross_entropy(mm(b[0]), b[1]))


def swinv2():
    import torchvision
    m = torchvision.models.swin_v2_t(num_classes=100).cuda()
    x = torch.randn(32, 3, 256, 256, device="cuda")
    y = torch.randint(0, 100, (32,), device="cuda")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    return lambda: _train_step(m, (x, y), opt, lambda mm, b: torch.nn.functional.cross_entropy(mm(b[0]), b[1]))


def _hf_train(model, ids, labels_key="labels"):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return lambda: _train_step(model, ids, opt, lambda mm, b: mm(input_ids=b, **{labels_key: b}).loss)


def encoder():
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM
    cfg = DebertaV2Config(vocab_size=32000, hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
                          intermediate_size=3072, max_position_embeddings=512, relative_attention=True,
                          pos_att_type=["p2c", "c2p"], position_buckets=256)
    m = DebertaV2ForMaskedLM(cfg).cuda()
    return _hf_train(m, torch.randint(0, 32000, (16, 256), device="cuda"))


def _llama(layers=6, hidden=1024, attention="sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64,
                      num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4,
                      max_position_embeddings=2048, attn_implementation=attention)
    return LlamaForCausalLM(cfg).cuda()


def decoder():
    return _hf_train(_llama(), torch.randint(0, 32000, (8, 512), device="cuda"))


def decoder_eager():
    return _hf_train(_llama(attention="eager"), torch.randint(0, 32000, (8, 512), device="cuda"))


def _bert(layers: int, attention: str):
    from transformers import BertConfig, BertForMaskedLM
    cfg = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=layers, num_attention_heads=12,
                     intermediate_size=3072, attn_implementation=attention)
    return _hf_train(BertForMaskedLM(cfg).cuda(), torch.randint(0, 30522, (16, 256), device="cuda"))


def _gpt2(layers: int, attention: str):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=layers, n_embd=768, n_head=12, n_positions=1024, attn_implementation=attention)
    return _hf_train(GPT2LMHeadModel(cfg).cuda(), torch.randint(0, 50257, (8, 512), device="cuda"))


def bert_eager():
    return _bert(6, "eager")


def gpt2_eager():
    return _gpt2(6, "eager")


def bert_sdpa():
    """BERT MLM training, 2 layers, SDPA attention (cuDNN's flash kernels and their backward helpers):
    held out for the attention-backward helper rule and the ncu pairing (2026-11-29), small enough that
    `gpudiag profile --ncu` replays a whole step."""
    return _bert(2, "sdpa")


def gpt2_sdpa():
    """GPT-2 LM training, 2 layers, SDPA attention (causal, with dropout): held out likewise."""
    return _gpt2(2, "sdpa")


def triton_ambiguity():
    """One Triton GEMM kernel, one config, one grid: K = 64 with an fp32 residual epilogue, and larger K
    without (triton_ambiguity.py): each step launches every variant once."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from triton_ambiguity import variants

    runs = [run for _, run, _ in variants()]
    return lambda: [run() for run in runs]


def triton_gemm():
    import torch._inductor.config as inductor
    from torch import nn

    inductor.max_autotune_gemm_backends = "TRITON"  # every GEMM a Triton template kernel

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(1024, 4096), nn.Linear(4096, 1024)
            self.narrow, self.widen = nn.Linear(1024, 64), nn.Linear(64, 1024)  # small-K / small-N GEMMs

        def forward(self, x):
            x = x + self.down(nn.functional.gelu(self.up(x)))
            return x + self.widen(torch.relu(self.narrow(x)))

    m = nn.Sequential(Block(), Block()).cuda()
    compiled = torch.compile(m, mode="max-autotune-no-cudagraphs")
    x = torch.randn(8192, 1024, device="cuda")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    return lambda: _train_step(compiled, x, opt, lambda mm, b: mm(b).float().pow(2).mean())


def vit_compiled():
    import timm

    # 4 of ViT-S's 12 blocks: Nsight Compute then replays a whole step within one device call
    m = timm.create_model("vit_small_patch16_224", depth=4, num_classes=100).cuda()
    compiled = torch.compile(m)  # default mode: cuBLAS GEMMs as extern calls, Triton for the rest
    x = torch.randn(64, 3, 224, 224, device="cuda")
    y = torch.randint(0, 100, (64,), device="cuda")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    return lambda: _train_step(compiled, (x, y), opt, lambda mm, b: torch.nn.functional.cross_entropy(mm(b[0]), b[1]))


def gpt2_compiled():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=3, n_embd=768, n_head=12, n_positions=1024, attn_implementation="sdpa")
    m = GPT2LMHeadModel(cfg).cuda()
    compiled = torch.compile(m)
    ids = torch.randint(0, 50257, (8, 384), device="cuda")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    return lambda: _train_step(compiled, ids, opt, lambda mm, b: mm(input_ids=b, labels=b).loss)


def gpt2_dynamic():
    """GPT-2 (3 layers, SDPA) under torch.compile with variable sequence lengths (256, 320, 384 in
    turn, batch 8), as a padded-to-the-batch loader gives: Inductor compiles the graphs with a symbolic
    length after the first recompile. Held out for the dynamic-shape costs (2026-11-29)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=3, n_embd=768, n_head=12, n_positions=1024, attn_implementation="sdpa")
    m = GPT2LMHeadModel(cfg).cuda()
    compiled = torch.compile(m)
    batches = [torch.randint(0, 50257, (8, t), device="cuda") for t in (256, 320, 384)]
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    step = iter(range(10 ** 9))
    return lambda: _train_step(compiled, batches[next(step) % 3], opt, lambda mm, b: mm(input_ids=b, labels=b).loss)


def decode():
    m = _llama(layers=8).to(torch.bfloat16).eval()
    ids = torch.randint(0, 32000, (4, 128), device="cuda")

    def step():
        with torch.no_grad():
            m.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    return step


def moe():
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(vocab_size=32000, hidden_size=768, intermediate_size=1536, num_hidden_layers=4,
                        num_attention_heads=12, num_key_value_heads=4, num_local_experts=8,
                        num_experts_per_tok=2, max_position_embeddings=2048, attn_implementation="sdpa")
    return _hf_train(MixtralForCausalLM(cfg).cuda(), torch.randint(0, 32000, (8, 512), device="cuda"))


def grouped():
    experts, dim, ffn, tokens = 8, 1024, 2816, 8192
    w1 = torch.randn(experts, dim, ffn, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w2 = torch.randn(experts, ffn, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(tokens, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    counts = torch.tensor([1536, 512, 1024, 768, 1280, 1024, 1024, 1024], device="cuda")
    offs = torch.cumsum(counts, 0).to(torch.int32)

    def step():
        h = torch.nn.functional.silu(torch._grouped_mm(x, w1, offs=offs))
        torch._grouped_mm(h, w2, offs=offs).float().pow(2).mean().backward()
    return step


WORKLOADS = {f.__name__: f for f in (conv, swinv2, encoder, decoder, decode, moe, grouped, decoder_eager, vit_compiled,
                                     gpt2_compiled,
                                     triton_gemm, bert_eager, gpt2_eager, bert_sdpa, gpt2_sdpa, triton_ambiguity,
                                     gpt2_dynamic)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name", choices=sorted(WORKLOADS))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--ncu-step", type=int, default=5, help="the step the ncu pass replays (after warm-up)")
    a = p.parse_args()
    torch.manual_seed(0)
    step = WORKLOADS[a.name]()
    for i in range(a.steps):
        _nvtx(i, a.ncu_step, True)
        step()
        torch.cuda.synchronize()
        _nvtx(i, a.ncu_step, False)
    print(f"{a.name}: {a.steps} steps done")


if __name__ == "__main__":
    main()
