"""Rotary position embedding (RoPE) fused, in Hugging Face's layout, forward and backward.

transformers' ``apply_rotary_pos_emb(q, k, cos, sin)`` computes, for q [B, Hq, S, D] and k [B, Hk, S, D]
(Hk < Hq under grouped-query attention) and cos/sin [B or 1, S, D] broadcast over the heads:
``x·cos + rotate_half(x)·sin`` with ``rotate_half(x) = cat(−x₂, x₁)`` (x₁, x₂ the two halves of the
head dimension; Su et al. 2021, "RoFormer", in GPT-NeoX's half-split form). Eagerly that is, per
tensor, mul, two slices, neg, cat, mul, add: six kernels and five D-wide intermediates, twice.

Here one program per (batch, position) rotates every head of q and k in one launch, reading cos/sin
once for all heads. With halves: o₁ = x₁·c₁ − x₂·s₁, o₂ = x₂·c₂ + x₁·s₂. The backward is the
transposed rotation, dx₁ = g₁·c₁ + g₂·s₂, dx₂ = g₂·c₂ − g₁·s₁, the same kernel with the sine terms
swapped; when cos/sin take gradients (HF computes them under no_grad, so usually not), dcos = Σ_heads
g·x and dsin = Σ_heads g·rotate_half(x), summed in the same pass. q and k may be any strided views
(HF's ``view(B, S, H, D).transpose(1, 2)``); outputs keep their input's layout. Math in fp32,
storage in the input dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpudiag.fused.registry import ReferenceKernel, randn


@triton.jit
def _rotate_heads(x_ptr, o_ptr, x_off, o_off, sx_h, sx_d, so_h, so_d, n_heads, half, a1, a2, b1, b2,
                  g_ptr, g_off, sg_h, sg_d, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
                  WITH_DCS: tl.constexpr):
    # o₁ = x₁·a₁ + x₂·b₁, o₂ = x₂·a₂ + x₁·b₂ for every head of one (batch, position); with WITH_DCS
    # (backward only: x_ptr is the gradient, g_ptr the saved input) also returns this tensor's share
    # of dcos and dsin per half, summed over its heads.
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < n_heads) & (cols < half)
    x_row = x_ptr + x_off + heads * sx_h
    x1 = tl.load(x_row + cols * sx_d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + (cols + half) * sx_d, mask=mask, other=0.0).to(tl.float32)
    o_row = o_ptr + o_off + heads * so_h
    tl.store(o_row + cols * so_d, (x1 * a1 + x2 * b1).to(o_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + (cols + half) * so_d, (x2 * a2 + x1 * b2).to(o_ptr.dtype.element_ty), mask=mask)
    dc1 = tl.zeros([BLOCK_HALF], dtype=tl.float32)
    dc2 = tl.zeros([BLOCK_HALF], dtype=tl.float32)
    ds1 = tl.zeros([BLOCK_HALF], dtype=tl.float32)
    ds2 = tl.zeros([BLOCK_HALF], dtype=tl.float32)
    if WITH_DCS:
        g_row = g_ptr + g_off + heads * sg_h
        v1 = tl.load(g_row + cols * sg_d, mask=mask, other=0.0).to(tl.float32)
        v2 = tl.load(g_row + (cols + half) * sg_d, mask=mask, other=0.0).to(tl.float32)
        dc1 = tl.sum(x1 * v1, axis=0)
        dc2 = tl.sum(x2 * v2, axis=0)
        ds1 = tl.sum(-x1 * v2, axis=0)  # rotate_half(v)₁ = −v₂
        ds2 = tl.sum(x2 * v1, axis=0)  # rotate_half(v)₂ = v₁
    return dc1, dc2, ds1, ds2


@triton.jit
def _rope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, qs_ptr, ks_ptr, dcos_ptr, dsin_ptr,
                 seq_len, n_q_heads, n_k_heads, half,
                 sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d,
                 sqo_b, sqo_h, sqo_s, sqo_d, sko_b, sko_h, sko_s, sko_d,
                 sqs_b, sqs_h, sqs_s, sqs_d, sks_b, sks_h, sks_s, sks_d,
                 sc_b, sc_s, sc_d,
                 BACKWARD: tl.constexpr, WITH_DCS: tl.constexpr,
                 BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)  # int64: B·H·S·D passes 2^31 at long contexts
    b = pid // seq_len
    s = pid % seq_len
    cols = tl.arange(0, BLOCK_HALF)
    cmask = cols < half
    c_row = b * sc_b + s * sc_s  # cos and sin share one (broadcast) stride set
    c1 = tl.load(cos_ptr + c_row + cols * sc_d, mask=cmask, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + c_row + (cols + half) * sc_d, mask=cmask, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + c_row + cols * sc_d, mask=cmask, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + c_row + (cols + half) * sc_d, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if BACKWARD:  # the transposed rotation: the sine of the other half, the sign on the first
        b1 = s2
        b2 = -s1
    else:
        b1 = -s1
        b2 = s2
    qc1, qc2, qs1, qs2 = _rotate_heads(q_ptr, qo_ptr, b * sq_b + s * sq_s, b * sqo_b + s * sqo_s, sq_h, sq_d,
                                       sqo_h, sqo_d, n_q_heads, half, c1, c2, b1, b2,
                                       qs_ptr, b * sqs_b + s * sqs_s, sqs_h, sqs_d, BLOCK_HQ, BLOCK_HALF, WITH_DCS)
    kc1, kc2, ks1, ks2 = _rotate_heads(k_ptr, ko_ptr, b * sk_b + s * sk_s, b * sko_b + s * sko_s, sk_h, sk_d,
                                       sko_h, sko_d, n_k_heads, half, c1, c2, b1, b2,
                                       ks_ptr, b * sks_b + s * sks_s, sks_h, sks_d, BLOCK_HK, BLOCK_HALF, WITH_DCS)
    if WITH_DCS:  # per-(b, s) partials [B, S, D] fp32, contiguous; summed to cos's shape afterwards
        d_row = pid * 2 * half
        tl.store(dcos_ptr + d_row + cols, qc1 + kc1, mask=cmask)
        tl.store(dcos_ptr + d_row + half + cols, qc2 + kc2, mask=cmask)
        tl.store(dsin_ptr + d_row + cols, qs1 + ks1, mask=cmask)
        tl.store(dsin_ptr + d_row + half + cols, qs2 + ks2, mask=cmask)


def _check(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must be [batch, heads, seq, head_dim] with one "
                         "batch, seq and head_dim (HF layout; for [batch, seq, heads, head_dim] pass .transpose(1, 2))")
    if q.shape[-1] % 2:
        raise ValueError(f"head_dim {q.shape[-1]} must be even: rotate_half splits it in two")
    batch, _, seq, dim = q.shape
    if cos.shape != sin.shape or cos.dim() not in (2, 3) or cos.shape[-2:] != (seq, dim) or (
            cos.dim() == 3 and cos.shape[0] not in (1, batch)):
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must both be [batch or 1, seq, head_dim] "
                         f"= [{batch} or 1, {seq}, {dim}] (as HF's rotary embedding returns them)")
    if len({q.dtype, k.dtype, cos.dtype, sin.dtype}) != 1:
        raise ValueError(f"q, k, cos, sin must have one dtype (got {q.dtype}, {k.dtype}, {cos.dtype}, {sin.dtype}): "
                         "cast cos/sin to q's dtype as HF's rotary embedding does (eager would promote)")


def _launch(q, k, cos, sin, q_out, k_out, backward: bool, saved=None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Runs the kernel; with ``saved`` = (q, k) of the forward (backward only), returns (dcos, dsin)
    fp32 [B, S, D] partials summed over the heads."""
    batch, n_q, seq, dim = q.shape
    cos_b, sin_b = cos.expand(batch, seq, dim), sin.expand(batch, seq, dim)  # stride 0 over a broadcast batch
    if cos_b.stride() != sin_b.stride():
        sin_b = sin_b.contiguous()
        cos_b = cos_b.contiguous()
    dcs = None
    if saved is not None:
        dcs = tuple(torch.empty(batch, seq, dim, dtype=torch.float32, device=q.device) for _ in range(2))
    qs, ks = saved if saved is not None else (q, k)  # unused placeholders without the cos/sin gradients
    half = dim // 2
    _rope_kernel[(batch * seq,)](
        q, k, cos_b, sin_b, q_out, k_out, qs, ks, *(dcs or (q_out, k_out)), seq, n_q, k.shape[1], half,
        *q.stride(), *k.stride(), *q_out.stride(), *k_out.stride(), *qs.stride(), *ks.stride(), *cos_b.stride(),
        BACKWARD=backward, WITH_DCS=saved is not None, BLOCK_HQ=triton.next_power_of_2(n_q),
        BLOCK_HK=triton.next_power_of_2(k.shape[1]), BLOCK_HALF=triton.next_power_of_2(max(half, 1)),
        num_warps=4 if n_q * dim <= 4096 else 8)
    return dcs


def rope_forward(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_embed, k_embed) for q [B, Hq, S, D], k [B, Hk, S, D] (any strides) and cos/sin [B or 1, S, D]
    (or [S, D]), all of one dtype; outputs in q's and k's layout. Raises ValueError for other shapes,
    an odd D or mixed dtypes."""
    _check(q, k, cos, sin)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    if q.numel() and k.numel():
        _launch(q, k, cos, sin, q_out, k_out, backward=False)
    return q_out, k_out


def rope_backward(dq_out, dk_out, cos, sin, saved=None):
    """(dq, dk, dcos, dsin) of :func:`rope_forward`; dcos/dsin (in cos's shape and dtype) only when
    ``saved`` = the forward's (q, k) is given, else None."""
    dq, dk = torch.empty_like(dq_out), torch.empty_like(dk_out)
    dcs = _launch(dq_out, dk_out, cos, sin, dq, dk, backward=True, saved=saved) if dq.numel() and dk.numel() else None
    if saved is None:
        return dq, dk, None, None
    if dcs is None:  # empty batch: nothing to sum
        return dq, dk, torch.zeros_like(cos), torch.zeros_like(sin)
    return dq, dk, *(d.sum_to_size(cos.shape).to(cos.dtype) for d in dcs)


class RoPEFunction(torch.autograd.Function):
    """Autograd for :func:`rope`: saves cos and sin, and q and k only when cos/sin need gradients."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        q_out, k_out = rope_forward(q, k, cos, sin)
        ctx.with_dcs = ctx.needs_input_grad[2] or ctx.needs_input_grad[3]
        ctx.save_for_backward(cos, sin, *((q, k) if ctx.with_dcs else ()))
        return q_out, k_out

    @staticmethod
    def backward(ctx, dq_out, dk_out):
        cos, sin, *saved = ctx.saved_tensors
        return rope_backward(dq_out, dk_out, cos, sin, tuple(saved) if ctx.with_dcs else None)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in fused ``apply_rotary_pos_emb(q, k, cos, sin)`` (HF, unsqueeze_dim=1): q [B, Hq, S, D],
    k [B, Hk, S, D], cos/sin [B or 1, S, D] -> (q_embed, k_embed), differentiable in all four.
    Raises ValueError as :func:`rope_forward`."""
    return RoPEFunction.apply(q, k, cos, sin)


def reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager chain the kernel replaces, as transformers' Llama writes it (cos/sin unsqueezed at dim 1)."""

    def rotate_half(x):
        return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)

    cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def hf_cos_sin(batch: int, seq: int, dim: int, dtype, device,
               base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [batch, seq, dim] as HF's default LlamaRotaryEmbedding makes them for positions 0..seq-1."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    freqs = torch.arange(seq, dtype=torch.float32)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1).expand(batch, seq, dim)
    return emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)


def _inputs(shape, dtype, device, gen):
    # q and k as HF makes them: a [B, S, H, D] projection viewed as [B, H, S, D] (not contiguous);
    # cos/sin for positions 0..S-1 with batch 1 (HF's position_ids = cache_position[None]).
    batch, heads, seq, dim, *kv = shape
    kv_heads = kv[0] if kv else heads
    q = randn((batch, seq, heads, dim), dtype, device, gen).transpose(1, 2)
    k = randn((batch, seq, kv_heads, dim), dtype, device, gen).transpose(1, 2)
    return q, k, *hf_cos_sin(1, seq, dim, dtype, device)


def _from_activation(dims):
    """Recorded q [B, H, S, D] -> (B, H, S, D) (k assumed to have as many heads). Raises ValueError otherwise."""
    if len(dims) != 4 or dims[-1] % 2:
        raise ValueError(f"expected q as [batch, heads, seq, head_dim] with an even head_dim, got {list(dims)}")
    return tuple(dims)


KERNELS = [ReferenceKernel(
    "rope", fused=rope, reference=reference, make_inputs=_inputs, shape_doc="BATCH,HEADS,SEQ,HEAD_DIM[,KV_HEADS]",
    test_shapes=((2, 3, 7, 8), (1, 4, 5, 6, 2), (3, 2, 1, 2), (2, 5, 9, 96, 1), (1, 1, 3, 128)),
    # Llama-style: batch 8, seq 1024, 16 heads of 64 (MHA and GQA 4:1); Llama-3 8B: 32 heads of 128, 8 KV heads
    bench_shapes=((8, 16, 1024, 64), (8, 16, 1024, 64, 4), (4, 32, 2048, 128, 8), (1, 32, 8192, 128, 8)),
    from_activation=_from_activation)]
