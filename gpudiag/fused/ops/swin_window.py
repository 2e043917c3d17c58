"""Swin Transformer's window shuffles fused with their neighbours, forward and backward.

Swin (Liu et al. 2021, "Swin Transformer", Sec. 3.2) runs attention inside 7x7 windows of the
token grid, shifted by half a window every other block. Eagerly (timm ``SwinTransformerBlock``):

- before attention: ``LayerNorm(x)`` -> ``roll(-shift)`` (two kernels, one per rolled dimension) ->
  ``pad`` (a device-to-device copy even with zero padding) -> window partition (a permute copy):
  four or five passes over the activation. :func:`ln_roll_partition` is one: each program reads a
  tile of token rows from their rolled grid position, normalizes them and writes them at their
  window position, optionally already in the next GEMM's dtype (the autocast cast folded in).
- after attention: window reverse (a permute copy) -> ``roll(+shift)`` (two kernels) -> DropPath's
  per-sample scale -> residual add: :func:`window_reverse_roll_add` is one pass.

Both are the same permutation of token rows: window row ``d`` (window ``(wh, ww)`` of image
``b``, position ``(i, j)`` in it) holds grid token ``((wh·ws + i + shift) mod H,
(ww·ws + j + shift) mod W)``, so the backward of each is the same gather in the other direction.
LayerNorm's backward is the usual one (Ba et al. 2016): with x̂ = (x − mean)·rstd and g = dy·w,
dx = rstd·(g − mean(g) − x̂·mean(g·x̂)); dw = Σ dy·x̂ and db = Σ dy are accumulated per program in
fp32 over the tiles it visits, then summed. Math in fp32, int64 offsets.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from gpudiag.fused.registry import ReferenceKernel, randn


@triton.jit
def _window_to_grid(d, H, W, WS: tl.constexpr, shift):
    """Grid row (b·H·W + h·W + w) of window row d, for windows of WS x WS after roll(-shift), as
    int64. The row math runs in int32 (rows stay far below 2^31; only rows x channels may not): a
    64-bit division is a long software sequence, and with it the LayerNorm kernel was bound by
    instruction issue, not memory (ncu on the H200: SM 75 %, DRAM 31 %)."""
    d = d.to(tl.int32)
    hw = H * W
    b = d // hw
    rem = d % hw
    win = rem // (WS * WS)
    pos = rem % (WS * WS)
    n_ww = W // WS
    h = ((win // n_ww) * WS + pos // WS + shift) % H
    w = ((win % n_ww) * WS + pos % WS + shift) % W
    return (b * hw + h * W + w).to(tl.int64)


@triton.jit
def _ln_partition_fwd(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_rows, n_cols, H, W, shift, eps,
                      WS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    d = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    row_ok = d < n_rows
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    src = _window_to_grid(d, H, W, WS, shift)
    x = tl.load(x_ptr + src[:, None] * n_cols + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / n_cols
    diff = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=1) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    y = diff * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + d[:, None] * n_cols + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + d, mean, mask=row_ok)
    tl.store(rstd_ptr + d, rstd, mask=row_ok)


@triton.jit
def _ln_partition_bwd(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows,
                      n_cols, H, W, shift, tiles_per_program, WS: tl.constexpr, ROWS: tl.constexpr,
                      BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    col_ok = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    # a grid-stride walk over row tiles: a fixed number of programs, so few dw/db partials (a runtime
    # trip count: no recompilation per shape; a while loop, which Triton's interpreter also runs)
    tile = pid.to(tl.int64)
    while tile < tiles_per_program * tl.num_programs(0):
        d = tile * ROWS + tl.arange(0, ROWS)
        row_ok = d < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        src = _window_to_grid(d, H, W, WS, shift)
        x = tl.load(x_ptr + src[:, None] * n_cols + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + d[:, None] * n_cols + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + d, mask=row_ok, other=0.0)
        rstd = tl.load(rstd_ptr + d, mask=row_ok, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        g = dy * w[None, :]
        dx = rstd[:, None] * (g - (tl.sum(g, axis=1) / n_cols)[:, None] - xhat * (tl.sum(g * xhat, axis=1) / n_cols)[:, None])
        tl.store(dx_ptr + src[:, None] * n_cols + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * xhat, axis=0)
        db += tl.sum(dy, axis=0)
        tile += tl.num_programs(0)
    tl.store(dw_partial_ptr + pid * n_cols + cols, dw, mask=col_ok)
    tl.store(db_partial_ptr + pid * n_cols + cols, db, mask=col_ok)


@triton.jit
def _reverse_add(win_ptr, res_ptr, scale_ptr, out_ptr, n_rows, n_cols, H, W, shift, WS: tl.constexpr,
                 HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr, TO_WINDOWS: tl.constexpr, ROWS: tl.constexpr,
                 BLOCK: tl.constexpr):
    # TO_WINDOWS=False: out[grid(d)] = res[grid(d)] + scale[b] * win[d]   (forward)
    # TO_WINDOWS=True:  out[d] = scale[b] * res[grid(d)]                 (backward: res holds dy)
    d = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (d < n_rows)[:, None] & (cols < n_cols)[None, :]
    src = _window_to_grid(d, H, W, WS, shift)
    win_off = d[:, None] * n_cols + cols[None, :]
    grid_off = src[:, None] * n_cols + cols[None, :]
    value = tl.load((res_ptr + grid_off) if TO_WINDOWS else (win_ptr + win_off), mask=mask, other=0.0).to(tl.float32)
    if HAS_SCALE:
        value *= tl.load(scale_ptr + d.to(tl.int32) // (H * W), mask=d < n_rows, other=0.0).to(tl.float32)[:, None]
    if HAS_RES:
        value += tl.load(res_ptr + grid_off, mask=mask, other=0.0).to(tl.float32)
    tl.store((out_ptr + win_off) if TO_WINDOWS else (out_ptr + grid_off), value.to(out_ptr.dtype.element_ty), mask=mask)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int | None) -> int:
    # cached: the backward runs every step, and the host's time is what an overhead-bound step pays
    return torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index).multi_processor_count


def _tile(n_cols: int) -> tuple[int, int]:
    """(ROWS, BLOCK): a tile of about 4096 elements; Swin's 96-768 channels need several rows per
    program to keep loads wide (one 96-wide row per program leaves most lanes idle)."""
    block = triton.next_power_of_2(n_cols)
    return max(1, min(64, 4096 // block)), block


def _check_grid(x: torch.Tensor, window: int, what: str) -> None:
    if x.dim() != 4 or x.shape[1] % window or x.shape[2] % window:
        raise ValueError(f"{what} {tuple(x.shape)} must be (B, H, W, C) with H and W multiples of the window {window} "
                         "(pad the grid first, as timm does for odd resolutions)")


class LnRollPartition(torch.autograd.Function):
    """Autograd for :func:`ln_roll_partition`; saves x (grid layout), mean and rstd (fp32)."""

    @staticmethod
    def forward(ctx, x, weight, bias, window, shift, eps, out_dtype):
        _check_grid(x, window, "x")
        B, H, W, C = x.shape
        if weight.shape != (C,) or bias.shape != (C,):
            raise ValueError(f"LayerNorm weight {tuple(weight.shape)} / bias {tuple(bias.shape)} do not match C={C} of x {tuple(x.shape)}")
        x = x.contiguous()
        n_rows = B * H * W
        y = torch.empty(B * H * W // (window * window), window * window, C, dtype=out_dtype or x.dtype, device=x.device)
        mean = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty_like(mean)
        rows, block = _tile(C)
        _ln_partition_fwd[(triton.cdiv(n_rows, rows),)](x, weight.contiguous(), bias.contiguous(), y, mean, rstd, n_rows, C,
                                                        H, W, shift, eps, WS=window, ROWS=rows, BLOCK=block)
        ctx.save_for_backward(x, weight.contiguous(), mean, rstd)
        ctx.geometry = (window, shift)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        window, shift = ctx.geometry
        B, H, W, C = x.shape
        n_rows = B * H * W
        rows, block = _tile(C)
        sms = _sm_count(x.device.index) if x.is_cuda else 2
        programs = min(triton.cdiv(n_rows, rows), 4 * sms)
        tiles_per_program = triton.cdiv(triton.cdiv(n_rows, rows), programs)
        dx = torch.empty_like(x)
        dw_partial = torch.empty(programs, C, dtype=torch.float32, device=x.device)
        db_partial = torch.empty_like(dw_partial)
        _ln_partition_bwd[(programs,)](x, weight, dy.contiguous(), mean, rstd, dx, dw_partial, db_partial, n_rows, C,
                                       H, W, shift, tiles_per_program, WS=window, ROWS=rows, BLOCK=block)
        return dx, dw_partial.sum(0).to(weight.dtype), db_partial.sum(0).to(weight.dtype), None, None, None, None


class WindowReverseRollAdd(torch.autograd.Function):
    """Autograd for :func:`window_reverse_roll_add`; saves only the per-sample scale."""

    @staticmethod
    def forward(ctx, windows, residual, window, shift, sample_scale):
        _check_grid(residual, window, "residual")
        B, H, W, C = residual.shape
        if windows.numel() != residual.numel() or windows.shape[-1] != C:
            raise ValueError(f"windows {tuple(windows.shape)} do not hold the tokens of residual {tuple(residual.shape)}")
        if sample_scale is not None and sample_scale.numel() != B:
            raise ValueError(f"sample_scale has {sample_scale.numel()} values for a batch of {B}")
        out = torch.empty(residual.shape, dtype=torch.promote_types(windows.dtype, residual.dtype), device=residual.device)
        rows, block = _tile(C)
        n_rows = B * H * W
        scale = sample_scale.reshape(B).contiguous() if sample_scale is not None else windows
        _reverse_add[(triton.cdiv(n_rows, rows),)](windows.contiguous(), residual.contiguous(), scale, out, n_rows, C,
                                                   H, W, shift, WS=window, HAS_RES=True, HAS_SCALE=sample_scale is not None,
                                                   TO_WINDOWS=False, ROWS=rows, BLOCK=block)
        ctx.save_for_backward(sample_scale.reshape(B).contiguous() if sample_scale is not None else None)
        ctx.geometry = (windows.shape, windows.dtype, window, shift, (B, H, W, C))
        return out

    @staticmethod
    def backward(ctx, dout):
        (scale,) = ctx.saved_tensors
        shape, dtype, window, shift, (B, H, W, C) = ctx.geometry
        dwin = torch.empty(shape, dtype=dtype, device=dout.device)
        rows, block = _tile(C)
        n_rows = B * H * W
        dout = dout.contiguous()
        _reverse_add[(triton.cdiv(n_rows, rows),)](dwin, dout, scale if scale is not None else dout, dwin, n_rows, C, H, W,
                                                   shift, WS=window, HAS_RES=False, HAS_SCALE=scale is not None,
                                                   TO_WINDOWS=True, ROWS=rows, BLOCK=block)
        return dwin, dout, None, None, None


def ln_roll_partition(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, window: int = 7, shift: int = 0,
                      eps: float = 1e-5, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Fused ``window_partition(roll(layer_norm(x), -shift), window)`` for x (B, H, W, C) → windows
    (B·H·W/window², window², C), in ``out_dtype`` (default x's; pass the autocast dtype to fold the
    cast the next linear layer makes). Differentiable in x, weight and bias.
    Raises ValueError when H or W is not a multiple of ``window`` or the weight does not match C."""
    return LnRollPartition.apply(x, weight, bias, window, shift, eps, out_dtype)


def window_reverse_roll_add(windows: torch.Tensor, residual: torch.Tensor, window: int = 7, shift: int = 0,
                            sample_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Fused ``residual + sample_scale[b] · roll(window_reverse(windows), +shift)``: windows
    (B·nW, window², C) or (B·nW, window, window, C), residual (B, H, W, C) → (B, H, W, C) in the
    promoted dtype (an fp32 residual stream plus a bf16 branch gives fp32, as eager does).
    ``sample_scale`` (B,) is DropPath's per-sample factor (keep / keep_prob), no gradient.
    Raises ValueError on mismatched shapes."""
    return WindowReverseRollAdd.apply(windows, residual, window, shift, sample_scale)


def window_partition_reference(x: torch.Tensor, window: int) -> torch.Tensor:
    """timm's window_partition + view: (B, H, W, C) → (B·nW, window², C)."""
    B, H, W, C = x.shape
    x = x.view(B, H // window, window, W // window, window, C).permute(0, 1, 3, 2, 4, 5)
    return x.contiguous().view(-1, window * window, C)


def reference(x, weight, bias, window: int = 7, shift: int = 0, eps: float = 1e-5):
    """The eager chain :func:`ln_roll_partition` replaces (timm SwinTransformerBlock._attn)."""
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    return window_partition_reference(torch.roll(y, (-shift, -shift), (1, 2)) if shift else y, window)


def reference_reverse(windows, residual, window: int = 7, shift: int = 0, sample_scale=None):
    """The eager chain :func:`window_reverse_roll_add` replaces."""
    B, H, W, C = residual.shape
    x = windows.reshape(B, H // window, W // window, window, window, C).permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, C)
    x = torch.roll(x, (shift, shift), (1, 2)) if shift else x
    return residual + (x * sample_scale.reshape(B, 1, 1, 1) if sample_scale is not None else x)


def _grid_activation(dims):
    # the chain's first input: (B, H, W, C), (B, H·W, C) of a square grid, or window_reverse's 6-D view
    # (B, H/7, 7, W/7, 7, C)
    if len(dims) == 6:
        return dims[0], dims[1] * dims[2], dims[3] * dims[4], dims[5]
    if len(dims) == 3:
        side = round(dims[1] ** 0.5)
        return dims[0], side, side, dims[2]
    return tuple(dims)


def _whole_windows(grid) -> None:
    if len(grid) != 4 or grid[1] % 7 or grid[2] % 7:
        raise ValueError(f"shape {tuple(grid)}: give BATCH,H,W,C with H and W multiples of the 7-token window")


def _ln_inputs(grid, dtype, device, gen):
    _whole_windows(grid)
    return (randn(grid, dtype, device, gen), randn(grid[-1:], dtype, device, gen, scale=0.1, shift=1.0),
            randn(grid[-1:], dtype, device, gen, scale=0.1))


def _reverse_inputs(grid, dtype, device, gen):
    _whole_windows(grid)
    B, H, W, C = grid
    return randn((B * H * W // 49, 49, C), dtype, device, gen), randn(grid, dtype, device, gen)


def _bind(fn, shift_of):
    # registry entries take tensors only; the shift follows the grid as in Swin
    return lambda *t: fn(*t, window=7, shift=shift_of(t))


_SHIFT_LN = lambda t: 3 if min(t[0].shape[1:3]) > 7 else 0  # noqa: E731 - Swin: no shift when one window covers the grid
_SHIFT_REV = lambda t: 3 if min(t[1].shape[1:3]) > 7 else 0  # noqa: E731
# Swin-T's four stages at batch 32 (the last one is a single window: no shift), and stage 1 at batch 128.
_SWIN_SHAPES = ((32, 56, 56, 96), (32, 28, 28, 192), (32, 14, 14, 384), (32, 7, 7, 768), (128, 56, 56, 96))
_TEST_SHAPES = ((2, 14, 14, 5), (1, 7, 7, 49), (1, 21, 14, 33), (1, 14, 14, 1000), (1, 7, 7, 4097))

KERNELS = [
    ReferenceKernel("ln_roll_window_partition", _bind(ln_roll_partition, _SHIFT_LN), _bind(reference, _SHIFT_LN),
                    _ln_inputs, shape_doc="BATCH,H,W,C", test_shapes=_TEST_SHAPES, bench_shapes=_SWIN_SHAPES,
                    from_activation=_grid_activation),
    ReferenceKernel("window_reverse_roll_add", _bind(window_reverse_roll_add, _SHIFT_REV),
                    _bind(reference_reverse, _SHIFT_REV), _reverse_inputs, shape_doc="BATCH,H,W,C",
                    test_shapes=_TEST_SHAPES, bench_shapes=_SWIN_SHAPES, from_activation=_grid_activation),
]
