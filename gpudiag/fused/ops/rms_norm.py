"""RMSNorm fused: y = x · rsqrt(mean(x², last dim) + eps) · w, forward and backward.

One program per row (the row fits one block: N up to 65536). Forward reads x and w once, writes y
and the per-row rstd (fp32). Backward, with g = dy·w and r = rstd: dx = r·(g − x·r²·mean(g·x))
(the derivative of x·r, Zhang & Sennrich 2019, "Root Mean Square Layer Normalization"); dw = Σ_rows
dy·x·r, accumulated per program over a stripe of rows in the same kernel, then a small sum of the
per-program partials. Math in fp32, storage in the input dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpudiag.fused.registry import ReferenceKernel, randn


@triton.jit
def _rms_norm_fwd(x_ptr, w_ptr, y_ptr, rstd_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64: rows x cols may pass 2^31
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _rms_norm_bwd(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, n_rows, n_cols,
                  ROWS_PER_PROGRAM: tl.constexpr, BLOCK: tl.constexpr):
    # Each program walks a stripe of rows, writes their dx, and keeps its share of dw in registers
    # (fp32); the partial sums are added by one small reduction afterwards.
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    first = pid * ROWS_PER_PROGRAM
    for i in range(0, ROWS_PER_PROGRAM):  # a compile-time trip count (one compilation per shape)
        row = first + i
        row_ok = row < n_rows  # the last stripe may be short: masked, not branched
        # the row test per element, not a scalar: triton 3.9's interpreter rejects scalar & block masks
        m = mask & ((cols * 0 + row) < n_rows)
        x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
        r = tl.load(rstd_ptr + row, mask=row_ok, other=0.0)
        g = dy * w
        dot = tl.sum(g * x, axis=0) / n_cols
        tl.store(dx_ptr + row * n_cols + cols, (r * (g - x * r * r * dot)).to(dx_ptr.dtype.element_ty), mask=m)
        dw += dy * x * r
    tl.store(dw_partial_ptr + pid * n_cols + cols, dw, mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().reshape(-1, x.shape[-1])


def rms_norm_forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd) for x of shape (..., N) and w of shape (N,); rstd is fp32 of shape (rows,).
    Raises ValueError if w does not match N or N exceeds 65536."""
    if w.shape != (x.shape[-1],):
        raise ValueError(f"weight of shape {tuple(w.shape)} does not match the last dimension of x {tuple(x.shape)}")
    if x.dtype != w.dtype:
        raise ValueError(f"x ({x.dtype}) and weight ({w.dtype}) must have one dtype: cast one (eager would promote)")
    if x.shape[-1] > 65536:
        raise ValueError("rows longer than 65536 elements are not supported by this one-block-per-row kernel")
    x2 = _rows(x)
    y = torch.empty_like(x2)
    rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(x2.shape[1])
    _rms_norm_fwd[(x2.shape[0],)](x2, w.contiguous(), y, rstd, x2.shape[1], eps, BLOCK=block)
    return y.reshape(x.shape), rstd


def rms_norm_backward(x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) of :func:`rms_norm_forward`."""
    x2, dy2 = _rows(x), _rows(dy)
    n_rows, n_cols = x2.shape
    dx = torch.empty_like(x2)
    block = triton.next_power_of_2(n_cols)
    # About 4 programs per SM on a GPU (enough to fill it, few partial rows to add up)
    programs = min(n_rows, 4 * torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 8)
    rows_per_program = triton.cdiv(n_rows, programs)
    programs = triton.cdiv(n_rows, rows_per_program)
    dw_partial = torch.empty(programs, n_cols, dtype=torch.float32, device=x.device)
    _rms_norm_bwd[(programs,)](x2, w.contiguous(), dy2, rstd, dx, dw_partial, n_rows, n_cols,
                               ROWS_PER_PROGRAM=rows_per_program, BLOCK=block)
    return dx.reshape(x.shape), dw_partial.sum(0).to(w.dtype)


class RMSNormFunction(torch.autograd.Function):
    """Autograd for :func:`rms_norm`: saves x, w and the per-row rstd."""

    @staticmethod
    def forward(ctx, x, w, eps):
        y, rstd = rms_norm_forward(x, w, eps)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward(x, w, rstd, dy)
        return dx, dw, None


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Drop-in fused RMSNorm over the last dimension (differentiable)."""
    return RMSNormFunction.apply(x, w, eps)


class FusedRMSNorm(torch.nn.Module):
    """Drop-in module for a hand-written ``RMSNorm(dim)`` (weight initialised to ones)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def reference(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The eager op-by-op chain the kernel replaces (as LLaMA-style model files write it)."""
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps)).to(x.dtype) * w


def _inputs(shape, dtype, device, gen):
    rows, cols = shape
    return randn((rows, cols), dtype, device, gen), randn((cols,), dtype, device, gen, scale=0.1, shift=1.0)


KERNELS = [ReferenceKernel("rms_norm", rms_norm, reference, _inputs)]
