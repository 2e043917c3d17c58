"""Swin Transformer's fused kernels (:mod:`gpudiag.fused.ops.softmax`,
:mod:`gpudiag.fused.ops.swin_window`) as PyTorch custom operators in the ``gpudiag`` namespace, as
:mod:`gpudiag.fused.custom_ops` does for the others (same eager/compiled dispatch, same
``EAGER_USES_OPS`` switch); used by :mod:`gpudiag.fused.timm_swin`."""

from collections.abc import Sequence
from typing import Optional

import torch
from torch import Tensor
from torch.library import custom_op

from gpudiag.fused.custom_ops import _Ctx, _per_row, _use_ops
from gpudiag.fused.ops import softmax as _sm
from gpudiag.fused.ops import swin_window as _sw


# ----------------------------------------------------------------------------- Swin: scaled masked softmax

@custom_op("gpudiag::scaled_masked_softmax", mutates_args=())
def _sms_op(scores: Tensor, bias: Optional[Tensor], mask: Optional[Tensor], scale: float,
            out_dtype: Optional[torch.dtype]) -> Tensor:
    """softmax(scale·scores + bias[h] + mask[w]); see gpudiag.fused.ops.softmax."""
    return _sm.ScaledMaskedSoftmax.forward(_Ctx(), scores, bias, mask, scale, out_dtype)


@custom_op("gpudiag::scaled_masked_softmax_backward", mutates_args=())
def _sms_bwd_op(y: Tensor, dy: Tensor, bias: Optional[Tensor], mask: Optional[Tensor], scale: float,
                scores_dtype: torch.dtype, need_bias: bool, need_mask: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dscores, dbias, dmask); a gradient not asked for is an empty placeholder (ops return tensors)."""
    meta = (scores_dtype, bias.dtype if bias is not None else None, mask.dtype if mask is not None else None,
            mask.shape[0] if mask is not None else 1, scale)
    ds, db, dm, _, _ = _sm.ScaledMaskedSoftmax.backward(_Ctx((y,), (True, need_bias, need_mask), meta=meta), dy)
    return ds, db if need_bias else y.new_empty(0), dm if need_mask else y.new_empty(0)


_sms_op.register_fake(lambda scores, bias, mask, scale, out_dtype: scores.new_empty(
    scores.shape, dtype=out_dtype or scores.dtype))
_sms_bwd_op.register_fake(lambda y, dy, bias, mask, scale, scores_dtype, need_bias, need_mask: (
    y.new_empty(y.shape, dtype=scores_dtype), bias.new_empty(bias.shape) if need_bias else y.new_empty(0),
    mask.new_empty(mask.shape) if need_mask else y.new_empty(0)))


def _sms_setup(ctx, inputs, output):
    scores, bias, mask, ctx.scale, _ = inputs
    ctx.save_for_backward(output, bias, mask)
    ctx.scores_dtype = scores.dtype


def _sms_backward(ctx, dy):
    y, bias, mask = ctx.saved_tensors
    need_bias = bias is not None and ctx.needs_input_grad[1]
    need_mask = mask is not None and ctx.needs_input_grad[2]
    ds, db, dm = torch.ops.gpudiag.scaled_masked_softmax_backward(y, dy, bias, mask, ctx.scale, ctx.scores_dtype,
                                                                  need_bias, need_mask)
    return ds, db if need_bias else None, dm if need_mask else None, None, None


_sms_op.register_autograd(_sms_backward, setup_context=_sms_setup)


def scaled_masked_softmax(scores: Tensor, bias: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                          scale: float = 1.0, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """Fused ``softmax(scale·scores + bias[h] + mask[b_ mod nW], -1)``: scores [B_, heads, N_q, N_k],
    bias [heads, N_q, N_k], mask [nW, N_q, N_k]; output in ``out_dtype`` (default scores'). Raises
    ValueError on mismatched shapes."""
    if _use_ops():
        return torch.ops.gpudiag.scaled_masked_softmax(scores, bias, mask, float(scale), out_dtype)
    return _sm.scaled_masked_softmax(scores, bias, mask, scale, out_dtype)


# ----------------------------------------------------------------------------- Swin: window shuffles

@custom_op("gpudiag::ln_roll_partition", mutates_args=())
def _lrp_op(x: Tensor, weight: Tensor, bias: Tensor, window: int, shift: int, eps: float,
            out_dtype: Optional[torch.dtype]) -> tuple[Tensor, Tensor, Tensor]:
    """(windows, mean, rstd (fp32, B·H·W)); see gpudiag.fused.ops.swin_window."""
    ctx = _Ctx()
    y = _sw.LnRollPartition.forward(ctx, x, weight, bias, window, shift, eps, out_dtype)
    return y, ctx.saved_tensors[2], ctx.saved_tensors[3]


@custom_op("gpudiag::ln_roll_partition_backward", mutates_args=())
def _lrp_bwd_op(x: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor, dy: Tensor, window: int,
                shift: int) -> tuple[Tensor, Tensor, Tensor]:
    ctx = _Ctx((x.contiguous(), weight.contiguous(), mean, rstd), geometry=(window, shift))
    return _sw.LnRollPartition.backward(ctx, dy)[:3]


@_lrp_op.register_fake
def _(x, weight, bias, window, shift, eps, out_dtype):
    b, h, w, c = x.shape
    y = x.new_empty((b * h * w // (window * window), window * window, c), dtype=out_dtype or x.dtype)
    return y, _per_row(x), _per_row(x)


_lrp_bwd_op.register_fake(lambda x, weight, mean, rstd, dy, window, shift: (
    x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape)))


def _lrp_setup(ctx, inputs, output):
    x, weight, _, ctx.window, ctx.shift, _, _ = inputs
    ctx.save_for_backward(x, weight, output[1], output[2])


def _lrp_backward(ctx, dy, _dmean, _drstd):
    dx, dw, db = torch.ops.gpudiag.ln_roll_partition_backward(*ctx.saved_tensors, dy, ctx.window, ctx.shift)
    return dx, dw, db, None, None, None, None


_lrp_op.register_autograd(_lrp_backward, setup_context=_lrp_setup)


def ln_roll_partition(x: Tensor, weight: Tensor, bias: Tensor, window: int = 7, shift: int = 0, eps: float = 1e-5,
                      out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """Fused ``window_partition(roll(layer_norm(x), -shift), window)``: x (B, H, W, C) -> windows
    (B·H·W/window², window², C) in ``out_dtype``. Raises ValueError when H or W is not a multiple
    of ``window`` or the weight does not match C."""
    if _use_ops():
        return torch.ops.gpudiag.ln_roll_partition(x, weight, bias, window, shift, float(eps), out_dtype)[0]
    return _sw.ln_roll_partition(x, weight, bias, window, shift, eps, out_dtype)


@custom_op("gpudiag::window_reverse_roll_add", mutates_args=())
def _wrra_op(windows: Tensor, residual: Tensor, window: int, shift: int, sample_scale: Optional[Tensor]) -> Tensor:
    """residual + sample_scale[b] · roll(window_reverse(windows), +shift); see gpudiag.fused.ops.swin_window."""
    return _sw.WindowReverseRollAdd.forward(_Ctx(), windows, residual, window, shift, sample_scale)


@custom_op("gpudiag::window_reverse_roll_add_backward", mutates_args=())
def _wrra_bwd_op(dout: Tensor, windows_shape: Sequence[int], windows_dtype: torch.dtype, window: int, shift: int,
                 sample_scale: Optional[Tensor]) -> Tensor:
    scale = sample_scale.reshape(-1).contiguous() if sample_scale is not None else None
    ctx = _Ctx((scale,), geometry=(tuple(windows_shape), windows_dtype, window, shift, tuple(dout.shape)))
    return _sw.WindowReverseRollAdd.backward(ctx, dout)[0]


_wrra_op.register_fake(lambda windows, residual, window, shift, sample_scale: residual.new_empty(
    residual.shape, dtype=torch.promote_types(windows.dtype, residual.dtype)))
_wrra_bwd_op.register_fake(lambda dout, windows_shape, windows_dtype, window, shift, sample_scale: dout.new_empty(
    windows_shape, dtype=windows_dtype))


def _wrra_setup(ctx, inputs, output):
    windows, residual, ctx.window, ctx.shift, sample_scale = inputs
    ctx.save_for_backward(sample_scale)
    ctx.windows_meta, ctx.residual_dtype = (windows.shape, windows.dtype), residual.dtype


def _wrra_backward(ctx, dout):
    (sample_scale,) = ctx.saved_tensors
    shape, dtype = ctx.windows_meta
    dwin = torch.ops.gpudiag.window_reverse_roll_add_backward(dout, shape, dtype, ctx.window, ctx.shift, sample_scale)
    return dwin, dout.to(ctx.residual_dtype), None, None, None  # out = residual + ...: its gradient is dout


_wrra_op.register_autograd(_wrra_backward, setup_context=_wrra_setup)


def window_reverse_roll_add(windows: Tensor, residual: Tensor, window: int = 7, shift: int = 0,
                            sample_scale: Optional[Tensor] = None) -> Tensor:
    """Fused ``residual + sample_scale[b] · roll(window_reverse(windows), +shift)``: windows
    (B·nW, window², C), residual (B, H, W, C) -> (B, H, W, C) in the promoted dtype;
    ``sample_scale`` (B,) gets no gradient. Raises ValueError on mismatched shapes."""
    if _use_ops():
        return torch.ops.gpudiag.window_reverse_roll_add(windows, residual, window, shift, sample_scale)
    return _sw.window_reverse_roll_add(windows, residual, window, shift, sample_scale)
