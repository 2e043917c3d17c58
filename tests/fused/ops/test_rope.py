"""Fused RoPE against transformers' own ``apply_rotary_pos_emb`` (Llama) in float64, in Triton's
interpreter on the CPU (conftest sets TRITON_INTERPRET=1): q and k rotated, and the gradients of q,
k, cos and sin, across fp32/fp16/bf16, GQA (fewer key heads), HF's transposed q/k views, cos/sin
from HF's rotary embedding with per-sample positions, and the refusals."""

from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
llama = pytest.importorskip("transformers.models.llama.modeling_llama")

from gpudiag.fused.ops import rope as rp  # noqa: E402

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}  # as tests/fused/test_fused_registry.py
KERNEL = rp.KERNELS[0]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def hf_view(batch, seq, heads, dim, dtype, gen):
    """q or k as HF's attention makes it: a [B, S, H, D] projection viewed as [B, H, S, D]."""
    return torch.randn(batch, seq, heads, dim, generator=gen).to(dtype).transpose(1, 2)


def check(q, k, cos, sin, dtype, grads_of_cos=True, gen=None):
    """Outputs and all gradients of the fused op vs transformers' apply_rotary_pos_emb in float64."""
    tol = TOLERANCE[dtype]
    fused_in = [t.detach().to(dtype).requires_grad_(i < 2 or grads_of_cos) for i, t in enumerate((q, k, cos, sin))]
    ref_in = [t.detach().double().requires_grad_(i < 2 or grads_of_cos) for i, t in enumerate(fused_in)]
    outs, refs = rp.rope(*fused_in), llama.apply_rotary_pos_emb(*ref_in)
    for out, ref, x in zip(outs, refs, fused_in):
        assert out.dtype == dtype and out.shape == ref.shape
        assert out.stride() == x.stride()  # the input's layout is kept (HF's transposed view)
        assert rel(out, ref) < tol
    dys = [torch.randn(r.shape, generator=gen, dtype=torch.float64) for r in refs]
    torch.autograd.backward(outs, [d.to(dtype) for d in dys])
    torch.autograd.backward(refs, dys)
    for i, (got, want) in enumerate(zip(fused_in, ref_in)):
        if not want.requires_grad:
            assert got.grad is None
            continue
        assert got.grad.dtype == dtype and got.grad.shape == got.shape, f"input {i}"
        assert rel(got.grad, want.grad) < 2 * tol, f"input {i}"
    return outs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 4, 7, 8, 4), (2, 6, 5, 10, 2), (3, 5, 3, 96, 1), (1, 3, 1, 2, 3)],
                         ids=lambda s: "x".join(map(str, s)))
def test_matches_transformers_with_gqa_and_random_cos_sin(dtype, shape):
    """B, Hq, S, D, Hk: GQA 2:1 and 3:1, multi-query (one key head), odd heads and positions, D not
    a power of two. cos/sin random with different halves (HF's have equal halves, which would hide
    a kernel that read the wrong half) and one per sample."""
    batch, heads, seq, dim, kv_heads = shape
    gen = torch.Generator().manual_seed(zlib.crc32(f"rope{dtype}{shape}".encode()))
    q, k = hf_view(batch, seq, heads, dim, dtype, gen), hf_view(batch, seq, kv_heads, dim, dtype, gen)
    cos, sin = torch.randn(batch, seq, dim, generator=gen), torch.randn(batch, seq, dim, generator=gen)
    check(q, k, cos, sin, dtype, gen=gen)
    check(q, k, cos[:1], sin[:1], dtype, gen=gen)  # one cos/sin broadcast over the batch: its gradient sums it
    check(q.contiguous(), k.contiguous(), cos, sin, dtype, grads_of_cos=False, gen=gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cos_sin_from_hf_rotary_embedding(dtype):
    """cos/sin as a tiny Llama's LlamaRotaryEmbedding returns them (under no_grad, cast to the
    activations' dtype), for per-sample position ids (left padding shifts them)."""
    config = llama.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    gen = torch.Generator().manual_seed(1)
    seq, dim = 11, config.hidden_size // config.num_attention_heads
    x = torch.randn(2, seq, config.hidden_size, generator=gen).to(dtype)
    positions = torch.stack([torch.arange(seq), torch.arange(seq) + 5])
    cos, sin = llama.LlamaRotaryEmbedding(config)(x, positions)
    assert cos.shape == (2, seq, dim) and cos.dtype == dtype and not cos.requires_grad
    q, k = hf_view(2, seq, 4, dim, dtype, gen), hf_view(2, seq, 2, dim, dtype, gen)
    q_out, _ = check(q, k, cos, sin, dtype, grads_of_cos=False, gen=gen)
    assert not torch.equal(q_out[0], q_out[1]) or torch.equal(q[0], q[1])  # the two samples' positions differ


def test_q_and_k_sliced_from_one_fused_qkv_projection():
    """Models with one qkv GEMM (GPT-NeoX, Phi) slice q and k out of it: views that are neither
    contiguous nor dense (gaps between heads); the outputs are fresh dense tensors in q's dimension order."""
    gen = torch.Generator().manual_seed(4)
    batch, seq, heads, kv_heads, dim = 2, 7, 4, 2, 12
    qkv = torch.randn(batch, seq, (heads + 2 * kv_heads) * dim, generator=gen)
    q = qkv[..., : heads * dim].view(batch, seq, heads, dim).transpose(1, 2)
    k = qkv[..., heads * dim: (heads + kv_heads) * dim].view(batch, seq, kv_heads, dim).transpose(1, 2)
    cos, sin = torch.randn(1, seq, dim, generator=gen), torch.randn(1, seq, dim, generator=gen)
    outs = rp.rope(q, k, cos, sin)
    for out, ref in zip(outs, llama.apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double())):
        assert rel(out, ref) < 1e-6
    assert outs[0].stride() == (seq * heads * dim, dim, heads * dim, 1)  # [B, S, H, D] memory, as q's


def test_backward_saves_q_and_k_only_for_cos_sin_gradients():
    """HF's cos/sin take no gradient: then only cos and sin are saved (q and k are not kept alive)."""
    gen = torch.Generator().manual_seed(2)
    q, k = hf_view(2, 5, 4, 8, torch.float32, gen), hf_view(2, 5, 2, 8, torch.float32, gen)
    cos, sin = rp.hf_cos_sin(1, 5, 8, torch.float32, "cpu")
    for cos_grad, expected in ((False, 2), (True, 4)):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            rp.rope(q.requires_grad_(True), k.requires_grad_(True), cos.clone().requires_grad_(cos_grad), sin)
        assert len(saved) == expected


def test_one_output_used_and_a_second_backward():
    """Only q's output reaches the loss (k's gradient is then zero), and retain_graph gives the
    same gradients twice."""
    gen = torch.Generator().manual_seed(3)
    q = hf_view(1, 6, 3, 16, torch.float32, gen).requires_grad_(True)
    k = hf_view(1, 6, 3, 16, torch.float32, gen).requires_grad_(True)
    cos, sin = rp.hf_cos_sin(1, 6, 16, torch.float32, "cpu")
    q_out, _ = rp.rope(q, k, cos, sin)
    (q_out ** 2).sum().backward(retain_graph=True)
    first = q.grad.clone()
    assert torch.equal(k.grad, torch.zeros_like(k))
    q_ref = q.detach().double().requires_grad_(True)
    (llama.apply_rotary_pos_emb(q_ref, q_ref, cos.double(), sin.double())[0] ** 2).sum().backward()
    assert rel(first, q_ref.grad) < 1e-5
    q.grad = None
    (q_out ** 2).sum().backward()
    assert torch.equal(q.grad, first)


def test_refusals_name_the_fix():
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    cos, sin = rp.hf_cos_sin(1, 5, 8, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"transpose\(1, 2\)"):
        rp.rope(q, torch.randn(2, 5, 2, 8), cos, sin)  # k in [B, S, H, D]
    with pytest.raises(ValueError, match="must be even"):
        rp.rope(q[..., :7], k[..., :7], cos[..., :7], sin[..., :7])
    with pytest.raises(ValueError, match=r"\[2 or 1, 5, 8\]"):
        rp.rope(q, k, cos[:, :4], sin[:, :4])
    with pytest.raises(ValueError, match="cast cos/sin to q's dtype"):
        rp.rope(q.bfloat16(), k.bfloat16(), cos, sin)


def test_registry_entry_and_reproducible_inputs():
    assert KERNEL.name == "rope" and KERNEL.fused is rp.rope and KERNEL.shape_doc.startswith("BATCH,HEADS,SEQ,HEAD_DIM")
    assert (8, 16, 1024, 64) == KERNEL.bench_shapes[0]  # batch 8, seq 1024, 16 heads of 64
    a = KERNEL.make_inputs((2, 4, 3, 8, 2), torch.bfloat16, "cpu", torch.Generator().manual_seed(1))
    b = KERNEL.make_inputs((2, 4, 3, 8, 2), torch.bfloat16, "cpu", torch.Generator().manual_seed(1))
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert a[0].shape == (2, 4, 3, 8) and a[1].shape == (2, 2, 3, 8) and not a[0].is_contiguous()
    config = llama.LlamaConfig(hidden_size=32, num_attention_heads=4)  # head_dim 8, default rope base
    hf = llama.LlamaRotaryEmbedding(config)(torch.zeros(1, 3, 32), torch.arange(3)[None])
    assert all(rel(ours, theirs) < 1e-6 for ours, theirs in zip(rp.hf_cos_sin(1, 3, 8, torch.float32, "cpu"), hf))
    assert KERNEL.from_activation([8, 16, 1024, 64]) == (8, 16, 1024, 64)
    with pytest.raises(ValueError, match="even head_dim"):
        KERNEL.from_activation([8, 1024, 63])
