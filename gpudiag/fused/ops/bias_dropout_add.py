"""bias + dropout + residual add fused (Megatron-LM's ``bias_dropout_add``), with stochastic depth:

    y = residual + keep · (x + bias) · sample_scale[b],   keep ∈ {0, 1/(1−p)}, P(keep ≠ 0) = 1 − p

for x, residual of shape (B, ..., C), bias (C,), sample_scale (B,) and b the index along dim 0.
``sample_scale`` is timm's DropPath factor bernoulli(1 − drop_prob)/(1 − drop_prob) per sample
(Huang et al. 2016, "Deep Networks with Stochastic Depth"). The mask is drawn in the kernel with
Philox (Salmon et al. 2011) as a function of (seed, p, flat element index) only, so the backward
regenerates it instead of storing it (eager ``native_dropout`` saves a byte per element). Eagerly
the chain is an add (bias), ``native_dropout`` (writes y and the mask) and an add (residual), or
for DropPath ``bernoulli_``/``div_`` on B values then a mul and an add over the activation: 3
passes become one read of x and residual and one write of y. Backward: dresidual = dy (no kernel), dx = dy · keep ·
sample_scale[b] (one kernel), dbias = Σ_rows dx (fp32 sum). Math in fp32; y has the promoted dtype
of x, bias and residual (autocast adds a bf16 branch to an fp32 residual: fp32 out).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from gpudiag.fused.registry import ReferenceKernel, randn

BLOCK = 1024


@triton.jit
def _keep(seed, start, p, BLOCK: tl.constexpr):
    """Keep mask of elements start .. start + BLOCK - 1 (start a multiple of 4), each kept with
    probability 1 - p. One Philox call gives 4 uniforms: element e takes output e % 4 of counter
    e // 4 (independent of BLOCK). A tl.rand per element does 4x the integer work and left the
    forward compute-bound on an H200 (106 us vs 53 us for 8192x4096 bf16)."""
    counter = start // 4 + tl.arange(0, BLOCK // 4)
    u0, u1, u2, u3 = tl.rand4x(seed, counter)
    u = tl.reshape(tl.join(tl.join(u0, u1), tl.join(u2, u3)), [BLOCK])  # [i, j, k] -> element 4i + 2j + k
    return u >= p


@triton.jit(do_not_specialize=["seed"])  # one compiled kernel for every seed
def _bda_fwd(x_ptr, r_ptr, b_ptr, s_ptr, y_ptr, numel, n_cols, sample_numel, p, scale, seed,
             HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DROPOUT: tl.constexpr, SEED_IN_MEMORY: tl.constexpr,
             BLOCK: tl.constexpr):
    if SEED_IN_MEMORY:  # a seed drawn on the GPU (CUDA graph capture): read when the kernel runs
        seed = tl.load(seed)
    start = tl.program_id(0).to(tl.int64) * BLOCK  # int64: tensors past 2^31 elements
    offs = start + tl.arange(0, BLOCK)
    mask = offs < numel
    u = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        u += tl.load(b_ptr + offs % n_cols, mask=mask, other=0.0).to(tl.float32)
    if DROPOUT:
        # multiply by 0 rather than select 0: a dropped inf or NaN gives NaN, as in eager dropout
        u *= tl.where(_keep(seed, start, p, BLOCK), scale, 0.0)
    if HAS_SCALE:
        u *= tl.load(s_ptr + offs // sample_numel, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32) + u
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["seed"])
def _bda_bwd(dy_ptr, s_ptr, dx_ptr, numel, sample_numel, p, scale, seed,
             HAS_SCALE: tl.constexpr, DROPOUT: tl.constexpr, SEED_IN_MEMORY: tl.constexpr, BLOCK: tl.constexpr):
    if SEED_IN_MEMORY:
        seed = tl.load(seed)
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < numel
    g = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if DROPOUT:
        g *= tl.where(_keep(seed, start, p, BLOCK), scale, 0.0)  # the forward's mask: same seed, same index
    if HAS_SCALE:
        g *= tl.load(s_ptr + offs // sample_numel, mask=mask, other=0.0).to(tl.float32)
    tl.store(dx_ptr + offs, g.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["seed"])
def _keep_mask(m_ptr, numel, p, seed, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    tl.store(m_ptr + offs, _keep(seed, start, p, BLOCK).to(tl.int8), mask=offs < numel)


def _check(x, residual, bias, sample_scale, p) -> None:
    if x.shape != residual.shape:
        raise ValueError(f"x {tuple(x.shape)} and residual {tuple(residual.shape)} must have one shape (no broadcasting)")
    if bias is not None and (bias.dim() != 1 or x.dim() == 0 or bias.shape[0] != x.shape[-1]):
        raise ValueError(f"bias of shape {tuple(bias.shape)} does not match the last dimension of x {tuple(x.shape)}")
    if sample_scale is not None and (x.dim() < 2 or tuple(sample_scale.shape) != (x.shape[0],)):
        raise ValueError(f"sample_scale of shape {tuple(sample_scale.shape)} must be (B,) for x of shape {tuple(x.shape)} (B, ...)")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability p={p} is outside [0, 1]")


def _launch_args(x, p, seed, sample_scale):
    """(grid, p, scale, seed, sample_numel, DROPOUT) shared by the forward and the backward; the
    seed stays a tensor when it is one (read by the kernel: SEED_IN_MEMORY)."""
    numel = x.numel()
    scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)  # p = 1 drops everything (no 1/0)
    sample_numel = max(numel // x.shape[0], 1) if sample_scale is not None else 1
    # a seed tensor on another device (a CPU one for a GPU x) is read here, without a device sync
    seed = seed if isinstance(seed, torch.Tensor) and seed.device == x.device else int(seed)
    return (triton.cdiv(numel, BLOCK),), float(p), scale, seed, sample_numel, p > 0.0


def draw_seed(x: torch.Tensor):
    """A dropout seed for a kernel acting on ``x``: an ``int`` from torch's CPU generator (no kernel,
    no synchronization), or, while a CUDA graph is being captured, a 0-d int64 tensor drawn on x's
    GPU by torch's CUDA generator. An ``int`` would be fixed in the graph and every replay would
    drop the same elements; the CUDA generator's draws are graph-safe (each replay draws anew:
    PyTorch's CUDA graph notes, "Graph-safe RNG"; checked on an H100 by benchmarks/zoo/graphs_check.py)."""
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return torch.randint(2**31, (), dtype=torch.int64, device=x.device)
    return int(torch.randint(2**31, ()))


def bias_dropout_add_forward(x, residual, bias=None, p=0.0, seed=0, sample_scale=None) -> torch.Tensor:
    """y (shape of x, promoted dtype); see the module docstring. Raises ValueError on shape mismatch."""
    _check(x, residual, bias, sample_scale, p)
    dtype = torch.promote_types(x.dtype if bias is None else torch.promote_types(x.dtype, bias.dtype), residual.dtype)
    x, residual = x.contiguous(), residual.contiguous()
    y = torch.empty(x.shape, dtype=dtype, device=x.device)
    if x.numel() == 0:
        return y
    grid, p, scale, seed, sample_numel, dropout = _launch_args(x, p, seed, sample_scale)
    b = bias.contiguous() if bias is not None else x  # unused pointer when HAS_BIAS is false
    s = sample_scale.contiguous() if sample_scale is not None else x
    _bda_fwd[grid](x, residual, b, s, y, x.numel(), x.shape[-1], sample_numel, p, scale, seed,
                   HAS_BIAS=bias is not None, HAS_SCALE=sample_scale is not None, DROPOUT=dropout,
                   SEED_IN_MEMORY=isinstance(seed, torch.Tensor), BLOCK=BLOCK)
    return y


def bias_dropout_add_backward(dy, x_dtype, p=0.0, seed=0, sample_scale=None) -> torch.Tensor:
    """dx = dy · keep · sample_scale[b] in ``x_dtype`` (the forward's mask, regenerated from ``seed``)."""
    if p == 0.0 and sample_scale is None:  # y = residual + x + bias: dx is dy itself, no pass needed
        return dy if dy.dtype == x_dtype else dy.to(x_dtype)
    dy = dy.contiguous()
    dx = torch.empty(dy.shape, dtype=x_dtype, device=dy.device)
    if dy.numel() == 0:
        return dx
    grid, p, scale, seed, sample_numel, dropout = _launch_args(dy, p, seed, sample_scale)
    s = sample_scale.contiguous() if sample_scale is not None else dy
    _bda_bwd[grid](dy, s, dx, dy.numel(), sample_numel, p, scale, seed,
                   HAS_SCALE=sample_scale is not None, DROPOUT=dropout,
                   SEED_IN_MEMORY=isinstance(seed, torch.Tensor), BLOCK=BLOCK)
    return dx


def dropout_keep_mask(seed: int, shape, p: float, device) -> torch.Tensor:
    """The bool keep mask the kernels draw for a tensor of ``shape`` with (``seed``, ``p``)."""
    m = torch.empty(tuple(shape), dtype=torch.int8, device=device)
    if m.numel():
        _keep_mask[(triton.cdiv(m.numel(), BLOCK),)](m, m.numel(), float(p), int(seed), BLOCK=BLOCK)
    return m.bool()


class BiasDropoutAddFunction(torch.autograd.Function):
    """Autograd for :func:`bias_dropout_add`: saves only ``sample_scale`` (B values) and the seed;
    ``sample_scale`` gets no gradient (DropPath's random factor is a constant)."""

    @staticmethod
    def forward(ctx, x, residual, bias, sample_scale, p, seed):
        ctx.save_for_backward(sample_scale)
        ctx.p, ctx.seed, ctx.x_dtype, ctx.r_dtype = p, seed, x.dtype, residual.dtype
        ctx.b_dtype = bias.dtype if bias is not None else None
        return bias_dropout_add_forward(x, residual, bias, p, seed, sample_scale)

    @staticmethod
    def backward(ctx, dy):
        (sample_scale,) = ctx.saved_tensors
        need_x, need_r, need_b = ctx.needs_input_grad[:3]
        dx = bias_dropout_add_backward(dy, ctx.x_dtype, ctx.p, ctx.seed, sample_scale) if need_x or need_b else None
        db = dx.reshape(-1, dx.shape[-1]).sum(0, dtype=torch.float32).to(ctx.b_dtype) if need_b else None
        dr = (dy if dy.dtype == ctx.r_dtype else dy.to(ctx.r_dtype)) if need_r else None  # y = residual + ...: dy itself
        return dx if need_x else None, dr, db, None, None, None


def bias_dropout_add(x, residual, bias=None, p=0.0, training=True, sample_scale=None, seed=None) -> torch.Tensor:
    """Drop-in fused ``residual + F.dropout(x + bias, p, training) * sample_scale[b]`` (differentiable).

    ``seed`` None draws one with :func:`draw_seed` (torch's CPU generator, or its CUDA generator
    while a CUDA graph is captured; ``torch.manual_seed`` makes runs reproducible); ``seed`` may
    also be a 0-d int64 tensor on x's device. The mask is a function of (seed, p, element index)
    only. ``training`` False disables dropout (not ``sample_scale``)."""
    p = float(p) if training else 0.0
    if seed is None:
        seed = draw_seed(x) if p > 0.0 else 0
    return BiasDropoutAddFunction.apply(x, residual, bias, sample_scale, p, seed)


def drop_path_add(x, residual, drop_prob: float, training: bool = True, scale_by_keep: bool = True) -> torch.Tensor:
    """Drop-in fused ``residual + timm.layers.drop_path(x, drop_prob, training, scale_by_keep)``: the
    per-sample bernoulli (B values) is drawn with torch on x's device in x's dtype, as timm does."""
    if drop_prob == 0.0 or not training:
        return bias_dropout_add(x, residual)
    keep_prob = 1.0 - drop_prob
    scale = x.new_empty(x.shape[0]).bernoulli_(keep_prob)
    if keep_prob > 0.0 and scale_by_keep:
        scale.div_(keep_prob)
    return bias_dropout_add(x, residual, sample_scale=scale)


def reference(x, residual, bias=None):
    """The eager chain the kernel replaces at p = 0: residual + (x + bias)."""
    return residual + (x if bias is None else x + bias)


def reference_dropout(x, residual, bias=None, p=0.1):
    """The eager chain with dropout (its own random mask: for timing, not for comparing values)."""
    return residual + F.dropout(x if bias is None else x + bias, p)


def _inputs(shape, dtype, device, gen):
    rows, cols = shape
    return randn((rows, cols), dtype, device, gen), randn((rows, cols), dtype, device, gen), randn((cols,), dtype, device, gen)


P, SEED = 0.1, 1234  # the registry's dropout case: a fixed seed so fused and exact_reference share a mask

KERNELS = [
    ReferenceKernel("bias_residual_add", fused=lambda x, r, b: bias_dropout_add(x, r, b), reference=reference,
                    make_inputs=_inputs, shape_doc="ROWS,COLS"),
    ReferenceKernel("bias_dropout_add", fused=lambda x, r, b: bias_dropout_add(x, r, b, p=P, seed=SEED),
                    reference=lambda x, r, b: reference_dropout(x, r, b, P), make_inputs=_inputs,
                    exact_reference=lambda x, r, b: r + dropout_keep_mask(SEED, x.shape, P, x.device) * (x + b) / (1 - P)),
]
