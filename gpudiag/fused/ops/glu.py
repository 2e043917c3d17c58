"""SwiGLU / GeGLU fused: y = act(a) · b (act = SiLU or tanh-GELU), forward and backward.

The gated MLPs of LLaMA (SwiGLU, Shazeer 2020 "GLU Variants Improve Transformer") compute
``silu(x @ W1) * (x @ W3)``; eagerly that is two element-wise kernels and an intermediate tensor.
Forward reads a and b once and writes y; backward reads a, b, dy once and writes da, db:
da = dy · b · act'(a), db = dy · act(a). Math in fp32, storage in the input dtype.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpudiag.fused.registry import ReferenceKernel, randn

BLOCK = 1024
SILU, GELU = 0, 1
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@triton.jit
def _act_and_grad(a, ACT: tl.constexpr, K: tl.constexpr):
    if ACT == 0:  # SiLU: a·σ(a); derivative σ(a)·(1 + a·(1 − σ(a)))
        s = 1.0 / (1.0 + tl.exp(-a))
        return a * s, s * (1.0 + a * (1.0 - s))
    else:  # tanh-GELU
        t = 1.0 - 2.0 / (tl.exp(2.0 * K * (a + 0.044715 * a * a * a)) + 1.0)
        return 0.5 * a * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * K * (1.0 + 3.0 * 0.044715 * a * a)


@triton.jit
def _glu_fwd(a_ptr, b_ptr, y_ptr, numel, BLOCK: tl.constexpr, ACT: tl.constexpr, K: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: tensors past 2^31 elements
    mask = offs < numel
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    act, _ = _act_and_grad(a, ACT, K)
    tl.store(y_ptr + offs, (act * b).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _glu_bwd(a_ptr, b_ptr, dy_ptr, da_ptr, db_ptr, numel, BLOCK: tl.constexpr, ACT: tl.constexpr, K: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: tensors past 2^31 elements
    mask = offs < numel
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    act, grad = _act_and_grad(a, ACT, K)
    tl.store(da_ptr + offs, (dy * b * grad).to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offs, (dy * act).to(db_ptr.dtype.element_ty), mask=mask)


def glu_forward(a: torch.Tensor, b: torch.Tensor, activation: int = SILU) -> torch.Tensor:
    """act(a) · b for same-shape a and b. Raises ValueError on a shape mismatch."""
    if a.shape != b.shape:
        raise ValueError(f"gate {tuple(a.shape)} and value {tuple(b.shape)} must have the same shape")
    if a.dtype != b.dtype:
        raise ValueError(f"gate ({a.dtype}) and value ({b.dtype}) must have one dtype: cast one (eager would promote)")
    a, b = a.contiguous(), b.contiguous()
    y = torch.empty_like(a)
    _glu_fwd[(triton.cdiv(a.numel(), BLOCK),)](a, b, y, a.numel(), BLOCK=BLOCK, ACT=activation, K=SQRT_2_OVER_PI)
    return y


class GLUFunction(torch.autograd.Function):
    """Autograd for :func:`swiglu` / :func:`geglu`: saves a and b, recomputes act(a)."""

    @staticmethod
    def forward(ctx, a, b, activation):
        a, b = a.contiguous(), b.contiguous()
        ctx.save_for_backward(a, b)
        ctx.activation = activation
        return glu_forward(a, b, activation)

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        da, db = torch.empty_like(a), torch.empty_like(b)
        _glu_bwd[(triton.cdiv(a.numel(), BLOCK),)](a, b, dy.contiguous(), da, db, a.numel(), BLOCK=BLOCK,
                                                  ACT=ctx.activation, K=SQRT_2_OVER_PI)
        return da, db, None


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Drop-in fused ``F.silu(a) * b`` (differentiable)."""
    return GLUFunction.apply(a, b, SILU)


def geglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Drop-in fused ``F.gelu(a, approximate="tanh") * b`` (differentiable)."""
    return GLUFunction.apply(a, b, GELU)


def reference_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(a) * b


def reference_geglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(a, approximate="tanh") * b


def _inputs(shape, dtype, device, gen):
    return randn(shape, dtype, device, gen), randn(shape, dtype, device, gen)


KERNELS = [ReferenceKernel("swiglu", swiglu, reference_swiglu, _inputs),
           ReferenceKernel("geglu", geglu, reference_geglu, _inputs)]
