"""bias + GELU (tanh approximation) fused: y = gelu_tanh(x + b), forward and backward.

gelu_tanh(u) = 0.5·u·(1 + tanh(√(2/π)·(u + 0.044715·u³)))  (Hendrycks & Gimpel 2016; GPT-2's
NewGELU and ``torch.nn.functional.gelu(approximate="tanh")``). One read of x (and b), one write of y;
the backward reads x, b and dy once and writes dx; the bias gradient is dx summed over rows
(a PyTorch reduction). Math in fp32, storage in the input dtype.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpudiag.fused.registry import ReferenceKernel, randn

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
BLOCK = 1024


@triton.jit
def _tanh(z):
    # tanh(z) = 1 - 2 / (exp(2z) + 1): exact at the extremes (exp -> inf gives 1, exp -> 0 gives -1)
    return 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)


@triton.jit
def _bias_gelu_fwd(x_ptr, b_ptr, y_ptr, numel, n_cols, BLOCK: tl.constexpr, K: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: tensors past 2^31 elements
    mask = offs < numel
    u = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) + tl.load(b_ptr + offs % n_cols, mask=mask, other=0.0).to(tl.float32)
    t = _tanh(K * (u + 0.044715 * u * u * u))
    tl.store(y_ptr + offs, (0.5 * u * (1.0 + t)).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bias_gelu_bwd(x_ptr, b_ptr, dy_ptr, dx_ptr, numel, n_cols, BLOCK: tl.constexpr, K: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: tensors past 2^31 elements
    mask = offs < numel
    u = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) + tl.load(b_ptr + offs % n_cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    t = _tanh(K * (u + 0.044715 * u * u * u))
    grad = 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * K * (1.0 + 3.0 * 0.044715 * u * u)
    tl.store(dx_ptr + offs, (dy * grad).to(dx_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, b: torch.Tensor) -> None:
    if x.shape[-1] != b.shape[0] or b.dim() != 1:
        raise ValueError(f"bias of shape {tuple(b.shape)} does not match the last dimension of x {tuple(x.shape)}")
    if x.dtype != b.dtype:
        raise ValueError(f"x ({x.dtype}) and bias ({b.dtype}) must have one dtype: cast one (eager would promote)")


def bias_gelu_forward(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """y = gelu_tanh(x + b) for x of shape (..., N) and b of shape (N,); same dtype as x."""
    _check(x, b)
    x = x.contiguous()
    y = torch.empty_like(x)
    numel = x.numel()
    _bias_gelu_fwd[(triton.cdiv(numel, BLOCK),)](x, b.contiguous(), y, numel, x.shape[-1], BLOCK=BLOCK, K=SQRT_2_OVER_PI)
    return y


def bias_gelu_backward(x: torch.Tensor, b: torch.Tensor, dy: torch.Tensor,
                       need_db: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dx, db) for y = gelu_tanh(x + b); db = dx summed over all but the last dimension (fp32 sum),
    or None when ``need_db`` is false."""
    x, b, dy = x.contiguous(), b.contiguous(), dy.contiguous()
    dx = torch.empty_like(x)
    numel = x.numel()
    _bias_gelu_bwd[(triton.cdiv(numel, BLOCK),)](x, b, dy.contiguous(), dx, numel, x.shape[-1], BLOCK=BLOCK, K=SQRT_2_OVER_PI)
    db = dx.reshape(-1, x.shape[-1]).sum(0, dtype=torch.float32).to(b.dtype) if need_db else None
    return dx, db


class BiasGelu(torch.autograd.Function):
    """Autograd for :func:`bias_gelu`: saves x and b, recomputes the tanh in the backward."""

    @staticmethod
    def forward(ctx, x, b):
        x = x.contiguous()
        ctx.save_for_backward(x, b)
        return bias_gelu_forward(x, b)

    @staticmethod
    def backward(ctx, dy):
        x, b = ctx.saved_tensors
        return bias_gelu_backward(x, b, dy, need_db=ctx.needs_input_grad[1])


def bias_gelu(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Drop-in fused ``torch.nn.functional.gelu(x + b, approximate="tanh")`` (differentiable)."""
    return BiasGelu.apply(x, b)


class FusedGelu(torch.nn.Module):
    """Drop-in for a tanh-approximation GELU module (e.g. GPT-2's NewGELUActivation): the fused
    kernel with a zero bias (the preceding linear layer already added its own)."""

    def forward(self, x):
        # a zero bias that needs no gradient: the backward skips the bias reduction
        return bias_gelu(x, torch.zeros(x.shape[-1], device=x.device, dtype=x.dtype))


def reference(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The eager PyTorch chain the kernel replaces."""
    return torch.nn.functional.gelu(x + b, approximate="tanh")


def _inputs(shape, dtype, device, gen):
    rows, cols = shape
    return randn((rows, cols), dtype, device, gen), randn((cols,), dtype, device, gen)


KERNELS = [ReferenceKernel("bias_gelu", bias_gelu, reference, _inputs)]
