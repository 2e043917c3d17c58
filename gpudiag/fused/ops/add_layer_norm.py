"""Residual add + LayerNorm fused: s = x + r; y = (s − mean) · rstd · w + b; returns (y, s).

Pre-norm transformer blocks compute ``h = h + attn(...)`` then ``ln(h)``: eagerly an add kernel and
a LayerNorm kernel, the sum written and read back. Forward: one pass per row reading x and r,
writing s and y (and fp32 mean, rstd). Backward, with x̂ = (s − mean)·rstd and g = dy·w:
ds = rstd·(g − mean(g) − x̂·mean(g·x̂)) + ds_residual (the gradient that reaches s through the
residual path); dx = dr = ds; dw = Σ_rows dy·x̂, db = Σ_rows dy, accumulated per program over a
stripe of rows in the same kernel (Ba et al. 2016, "Layer Normalization", for the derivative).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpudiag.fused.registry import ReferenceKernel, randn


@triton.jit
def _add_ln_fwd(x_ptr, r_ptr, w_ptr, b_ptr, s_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64: rows x cols may pass 2^31
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    s = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32) + tl.load(r_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    # Normalize the sum as stored (rounded to the storage dtype), as eager does and as the
    # backward will read it: statistics of the unrounded sum would not match the stored one.
    s = s.to(s_ptr.dtype.element_ty)
    tl.store(s_ptr + row * n_cols + cols, s, mask=mask)
    s = s.to(tl.float32)
    mean = tl.sum(s, axis=0) / n_cols
    diff = tl.where(mask, s - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, (diff * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _add_ln_bwd(s_ptr, w_ptr, dy_ptr, ds_res_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr,
                n_rows, n_cols, ROWS_PER_PROGRAM: tl.constexpr, BLOCK: tl.constexpr, HAS_DS_RES: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, ROWS_PER_PROGRAM):
        row = pid * ROWS_PER_PROGRAM + i
        row_ok = row < n_rows
        # the row test per element, not a scalar: triton 3.9's interpreter rejects scalar & block masks
        m = mask & ((cols * 0 + row) < n_rows)
        s = tl.load(s_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + row, mask=row_ok, other=0.0)
        rstd = tl.load(rstd_ptr + row, mask=row_ok, other=0.0)
        xhat = tl.where(m, (s - mean) * rstd, 0.0)
        g = dy * w
        ds = rstd * (g - tl.sum(g, axis=0) / n_cols - xhat * (tl.sum(g * xhat, axis=0) / n_cols))
        if HAS_DS_RES:
            ds += tl.load(ds_res_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(dx_ptr + row * n_cols + cols, ds.to(dx_ptr.dtype.element_ty), mask=m)
        dw += dy * xhat
        db += dy
    tl.store(dw_partial_ptr + pid * n_cols + cols, dw, mask=mask)
    tl.store(db_partial_ptr + pid * n_cols + cols, db, mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1, t.shape[-1])


class AddLayerNormFunction(torch.autograd.Function):
    """Autograd for :func:`add_layer_norm` (two outputs: y and the residual sum s)."""

    @staticmethod
    def forward(ctx, x, r, w, b, eps):
        if x.shape != r.shape or w.shape != (x.shape[-1],) or b.shape != (x.shape[-1],):
            raise ValueError(f"x {tuple(x.shape)}, residual {tuple(r.shape)}, weight {tuple(w.shape)} and bias "
                             f"{tuple(b.shape)} do not match")
        if len({x.dtype, r.dtype, w.dtype, b.dtype}) > 1:
            # e.g. an fp32 residual stream under autocast: the fused sum would be rounded to x's dtype
            raise ValueError(f"x, residual, weight and bias must have one dtype (got {x.dtype}, {r.dtype}, {w.dtype}, "
                             f"{b.dtype}): cast them (eager would promote)")
        x2, r2 = _rows(x), _rows(r)
        n_rows, n_cols = x2.shape
        s, y = torch.empty_like(x2), torch.empty_like(x2)
        mean = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty_like(mean)
        _add_ln_fwd[(n_rows,)](x2, r2, w.contiguous(), b.contiguous(), s, y, mean, rstd, n_cols, eps,
                               BLOCK=triton.next_power_of_2(n_cols))
        ctx.save_for_backward(s, w.contiguous(), mean, rstd)
        return y.reshape(x.shape), s.reshape(x.shape)

    @staticmethod
    def backward(ctx, dy, ds_res):
        s, w, mean, rstd = ctx.saved_tensors
        n_rows, n_cols = s.shape
        dy2 = _rows(dy)
        programs = min(n_rows, 4 * torch.cuda.get_device_properties(s.device).multi_processor_count if s.is_cuda else 8)
        rows_per_program = triton.cdiv(n_rows, programs)
        programs = triton.cdiv(n_rows, rows_per_program)
        dx = torch.empty_like(s)
        dw_partial = torch.empty(programs, n_cols, dtype=torch.float32, device=s.device)
        db_partial = torch.empty_like(dw_partial)
        has_res = ds_res is not None
        _add_ln_bwd[(programs,)](s, w, dy2, _rows(ds_res) if has_res else dy2, mean, rstd, dx, dw_partial, db_partial,
                                 n_rows, n_cols, ROWS_PER_PROGRAM=rows_per_program,
                                 BLOCK=triton.next_power_of_2(n_cols), HAS_DS_RES=has_res)
        dx = dx.reshape(dy.shape)
        return dx, dx, dw_partial.sum(0).to(w.dtype), db_partial.sum(0).to(w.dtype), None  # w and b share a dtype


def add_layer_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                   eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``s = x + r; y = layer_norm(s)``; returns (y, s). Differentiable in all inputs."""
    return AddLayerNormFunction.apply(x, r, w, b, eps)


def reference(x, r, w, b, eps: float = 1e-5):
    s = x + r
    return torch.nn.functional.layer_norm(s, (s.shape[-1],), w, b, eps), s


def _inputs(shape, dtype, device, gen):
    rows, cols = shape
    return (randn((rows, cols), dtype, device, gen), randn((rows, cols), dtype, device, gen),
            randn((cols,), dtype, device, gen, scale=0.1, shift=1.0), randn((cols,), dtype, device, gen, scale=0.1))


KERNELS = [ReferenceKernel("add_layer_norm", add_layer_norm, reference, _inputs)]
