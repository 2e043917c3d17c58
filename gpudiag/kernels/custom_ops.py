"""gpudiag's reference kernels as PyTorch custom operators (namespace ``gpudiag``), so a model
patched with them compiles with ``torch.compile`` without a graph break and runs under CUDA graphs.

Each kernel of :mod:`gpudiag.kernels.ops` becomes a forward op and a backward op
(``torch.ops.gpudiag.rms_norm`` / ``rms_norm_backward``, ...), both calling the existing launchers,
with a fake (meta) implementation that gives output shapes, dtypes and strides without running
anything, and ``register_autograd`` tying the two. Tensors the backward needs (per-row statistics)
are outputs of the forward op, since a custom op keeps no state between calls.

The public functions below (``rms_norm``, ``swiglu``, ...) take the same arguments as the drop-in
functions in ``gpudiag.kernels.ops``. While Dynamo traces (``torch.compiler.is_compiling()``) they
call the custom ops; in eager mode they call the ops' ``autograd.Function`` directly, because a
custom op costs more host time per call (measured on the 2-core CPU development machine: 190 µs
against 35 µs per call with a trivial body, forward only), and an overhead-bound step pays it for
every kernel. ``EAGER_USES_OPS = True`` sends eager calls through the custom ops as well (tests).

Not ``torch.library.triton_op``: triton_op uses the op's body as its fake implementation and
traces it, which needs every launch written as ``torch.library.wrap_triton(kernel)[grid](...)``;
the launchers launch kernels directly, and in Triton's interpreter (the CPU tests) the body cannot
run on fake tensors at all. The custom ops are opaque to Inductor (it calls them as they are).

Dropout's seed is a 0-d int64 CPU tensor (drawn with torch's CPU generator, as the eager path
draws it): an ``int`` drawn while tracing would be a graph break or a constant of the graph.
"""

import math
from collections.abc import Sequence
from typing import Optional

import torch
from torch import Tensor
from torch.library import custom_op

from gpudiag.kernels.ops import add_layer_norm as _aln
from gpudiag.kernels.ops import bias_dropout_add as _bda
from gpudiag.kernels.ops import bias_gelu as _bg
from gpudiag.kernels.ops import cross_entropy as _ce
from gpudiag.kernels.ops import glu as _glu
from gpudiag.kernels.ops import rms_norm as _rms
from gpudiag.kernels.ops import softmax as _sm
from gpudiag.kernels.ops import swin_window as _sw

EAGER_USES_OPS = False  # True: eager calls go through the custom ops too (slower host side; for tests)


def _use_ops() -> bool:
    return EAGER_USES_OPS or torch.compiler.is_compiling()


class _Ctx:
    """Stands in for autograd's ``ctx`` where an op calls an ``autograd.Function``'s forward or
    backward (the launchers of add_layer_norm, glu's backward, softmax and swin_window live there)."""

    def __init__(self, saved: tuple = (), needs_input_grad: tuple = (), **attrs) -> None:
        self.saved_tensors, self.needs_input_grad = tuple(saved), tuple(needs_input_grad)
        self.__dict__.update(attrs)

    def save_for_backward(self, *tensors) -> None:
        self.saved_tensors = tensors


def _rows(x: Tensor) -> int:
    return math.prod(x.shape[:-1])


def _per_row(x: Tensor) -> Tensor:
    return x.new_empty(_rows(x), dtype=torch.float32)


# ----------------------------------------------------------------------------- RMSNorm

@custom_op("gpudiag::rms_norm", mutates_args=())
def _rms_norm_op(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(y, rstd fp32 (rows,)); see gpudiag.kernels.ops.rms_norm."""
    return _rms.rms_norm_forward(x, weight, eps)


@custom_op("gpudiag::rms_norm_backward", mutates_args=())
def _rms_norm_bwd_op(x: Tensor, weight: Tensor, rstd: Tensor, dy: Tensor) -> tuple[Tensor, Tensor]:
    return _rms.rms_norm_backward(x, weight, rstd, dy)


_rms_norm_op.register_fake(lambda x, weight, eps: (x.new_empty(x.shape), _per_row(x)))
_rms_norm_bwd_op.register_fake(lambda x, weight, rstd, dy: (x.new_empty(x.shape), weight.new_empty(weight.shape)))


def _rms_norm_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1], output[1])


def _rms_norm_backward(ctx, dy, _drstd):
    dx, dw = torch.ops.gpudiag.rms_norm_backward(*ctx.saved_tensors, dy)
    return dx, dw, None


_rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """Fused RMSNorm over the last dimension: x (..., N), weight (N,) of x's dtype -> (..., N).
    Raises ValueError on a shape or dtype mismatch."""
    return torch.ops.gpudiag.rms_norm(x, weight, eps)[0] if _use_ops() else _rms.rms_norm(x, weight, eps)


# ----------------------------------------------------------------------------- SwiGLU / GeGLU

@custom_op("gpudiag::glu", mutates_args=())
def _glu_op(a: Tensor, b: Tensor, activation: int) -> Tensor:
    """act(a) · b, act = SiLU (0) or tanh-GELU (1); see gpudiag.kernels.ops.glu."""
    return _glu.glu_forward(a, b, activation)


@custom_op("gpudiag::glu_backward", mutates_args=())
def _glu_bwd_op(a: Tensor, b: Tensor, dy: Tensor, activation: int) -> tuple[Tensor, Tensor]:
    da, db, _ = _glu.GLUFunction.backward(_Ctx((a.contiguous(), b.contiguous()), activation=activation), dy)
    return da, db


_glu_op.register_fake(lambda a, b, activation: a.new_empty(a.shape))
_glu_bwd_op.register_fake(lambda a, b, dy, activation: (a.new_empty(a.shape), b.new_empty(b.shape)))


def _glu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.activation = inputs[2]


def _glu_backward(ctx, dy):
    da, db = torch.ops.gpudiag.glu_backward(*ctx.saved_tensors, dy, ctx.activation)
    return da, db, None


_glu_op.register_autograd(_glu_backward, setup_context=_glu_setup)


def swiglu(a: Tensor, b: Tensor) -> Tensor:
    """Fused ``F.silu(a) * b`` for same-shape, same-dtype a and b."""
    return torch.ops.gpudiag.glu(a, b, _glu.SILU) if _use_ops() else _glu.swiglu(a, b)


def geglu(a: Tensor, b: Tensor) -> Tensor:
    """Fused ``F.gelu(a, approximate="tanh") * b`` for same-shape, same-dtype a and b."""
    return torch.ops.gpudiag.glu(a, b, _glu.GELU) if _use_ops() else _glu.geglu(a, b)


# ----------------------------------------------------------------------------- bias + GELU (tanh)

@custom_op("gpudiag::bias_gelu", mutates_args=())
def _bias_gelu_op(x: Tensor, bias: Tensor) -> Tensor:
    """gelu_tanh(x + bias); see gpudiag.kernels.ops.bias_gelu."""
    return _bg.bias_gelu_forward(x, bias)


@custom_op("gpudiag::bias_gelu_backward", mutates_args=())
def _bias_gelu_bwd_op(x: Tensor, bias: Tensor, dy: Tensor) -> tuple[Tensor, Tensor]:
    return _bg.bias_gelu_backward(x, bias, dy, need_db=True)


_bias_gelu_op.register_fake(lambda x, bias: x.new_empty(x.shape))
_bias_gelu_bwd_op.register_fake(lambda x, bias, dy: (x.new_empty(x.shape), bias.new_empty(bias.shape)))


def _bias_gelu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _bias_gelu_backward(ctx, dy):
    return torch.ops.gpudiag.bias_gelu_backward(*ctx.saved_tensors, dy)


_bias_gelu_op.register_autograd(_bias_gelu_backward, setup_context=_bias_gelu_setup)


def bias_gelu(x: Tensor, bias: Tensor) -> Tensor:
    """Fused ``F.gelu(x + bias, approximate="tanh")``: x (..., N), bias (N,) of x's dtype."""
    return torch.ops.gpudiag.bias_gelu(x, bias) if _use_ops() else _bg.bias_gelu(x, bias)


# ----------------------------------------------------------------------------- residual add + LayerNorm

@custom_op("gpudiag::add_layer_norm", mutates_args=())
def _add_ln_op(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor,
               eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(y, s = x + residual, mean, rstd (fp32, rows)); see gpudiag.kernels.ops.add_layer_norm."""
    ctx = _Ctx()
    y, s = _aln.AddLayerNormFunction.forward(ctx, x, residual, weight, bias, eps)
    return y, s, ctx.saved_tensors[2], ctx.saved_tensors[3]


@custom_op("gpudiag::add_layer_norm_backward", mutates_args=())
def _add_ln_bwd_op(s: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor, dy: Tensor,
                   ds: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    saved = (s.reshape(-1, s.shape[-1]), weight.contiguous(), mean, rstd)
    dx, _, dw, db, _ = _aln.AddLayerNormFunction.backward(_Ctx(saved), dy, ds)
    return dx, dw, db


_add_ln_op.register_fake(lambda x, residual, weight, bias, eps: (
    x.new_empty(x.shape), x.new_empty(x.shape), _per_row(x), _per_row(x)))
_add_ln_bwd_op.register_fake(lambda s, weight, mean, rstd, dy, ds: (
    s.new_empty(dy.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape)))


def _add_ln_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1], inputs[2], output[2], output[3])


def _add_ln_backward(ctx, dy, ds, _dmean, _drstd):
    dx, dw, db = torch.ops.gpudiag.add_layer_norm_backward(*ctx.saved_tensors, dy, ds)
    return dx, dx, dw, db, None


_add_ln_op.register_autograd(_add_ln_backward, setup_context=_add_ln_setup)


def add_layer_norm(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor,
                   eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """Fused ``s = x + residual; y = layer_norm(s)``; returns (y, s). All four of one dtype;
    raises ValueError otherwise (cast first, as eager's promotion would)."""
    if _use_ops():
        y, s, _, _ = torch.ops.gpudiag.add_layer_norm(x, residual, weight, bias, eps)
        return y, s
    return _aln.add_layer_norm(x, residual, weight, bias, eps)


# ----------------------------------------------------------------------------- bias + dropout + residual

def _seed(seed: Optional[Tensor]) -> int:
    return int(seed) if seed is not None else 0  # a CPU tensor: no device synchronization


@custom_op("gpudiag::bias_dropout_add", mutates_args=())
def _bda_op(x: Tensor, residual: Tensor, bias: Optional[Tensor], sample_scale: Optional[Tensor], p: float,
            seed: Optional[Tensor]) -> Tensor:
    """residual + keep · (x + bias) · sample_scale[b]; see gpudiag.kernels.ops.bias_dropout_add."""
    return _bda.bias_dropout_add_forward(x, residual, bias, p, _seed(seed), sample_scale)


@custom_op("gpudiag::bias_dropout_add_backward", mutates_args=())
def _bda_bwd_op(dy: Tensor, x_dtype: torch.dtype, sample_scale: Optional[Tensor], p: float,
                seed: Optional[Tensor]) -> Tensor:
    return _bda.bias_dropout_add_backward(dy, x_dtype, p, _seed(seed), sample_scale)


@_bda_op.register_fake
def _(x, residual, bias, sample_scale, p, seed):
    dtype = x.dtype if bias is None else torch.promote_types(x.dtype, bias.dtype)
    return x.new_empty(x.shape, dtype=torch.promote_types(dtype, residual.dtype))


_bda_bwd_op.register_fake(lambda dy, x_dtype, sample_scale, p, seed: dy.new_empty(dy.shape, dtype=x_dtype))


def _bda_setup(ctx, inputs, output):
    x, residual, bias, sample_scale, p, seed = inputs
    ctx.save_for_backward(sample_scale, seed)
    ctx.p, ctx.dtypes = p, (x.dtype, residual.dtype, bias.dtype if bias is not None else None)


def _bda_backward(ctx, dy):
    sample_scale, seed = ctx.saved_tensors
    x_dtype, r_dtype, b_dtype = ctx.dtypes
    need_x, need_r, need_b = ctx.needs_input_grad[:3]
    dx = None
    if need_x or need_b:  # with neither dropout nor a scale, y = residual + x + bias: dx is dy
        dx = (dy.to(x_dtype) if ctx.p == 0.0 and sample_scale is None
              else torch.ops.gpudiag.bias_dropout_add_backward(dy, x_dtype, sample_scale, ctx.p, seed))
    db = dx.reshape(-1, dx.shape[-1]).sum(0, dtype=torch.float32).to(b_dtype) if need_b else None
    return dx if need_x else None, dy.to(r_dtype) if need_r else None, db, None, None, None


_bda_op.register_autograd(_bda_backward, setup_context=_bda_setup)


def bias_dropout_add(x: Tensor, residual: Tensor, bias: Optional[Tensor] = None, p: float = 0.0,
                     training: bool = True, sample_scale: Optional[Tensor] = None,
                     seed: Optional[int] = None) -> Tensor:
    """Fused ``residual + F.dropout(x + bias, p, training) * sample_scale[b]``: x, residual
    (B, ..., C), bias (C,), sample_scale (B,) (no gradient); output in the promoted dtype.
    ``seed`` None draws one from torch's CPU generator. Raises ValueError on mismatched shapes."""
    if not _use_ops():
        return _bda.bias_dropout_add(x, residual, bias, p, training, sample_scale, seed)
    p = float(p) if training else 0.0
    seed_t = None
    if p > 0.0:
        seed_t = torch.randint(2**31, (), dtype=torch.int64) if seed is None else torch.full((), seed, dtype=torch.int64)
    return torch.ops.gpudiag.bias_dropout_add(x, residual, bias, sample_scale, p, seed_t)


def drop_path_add(x: Tensor, residual: Tensor, drop_prob: float, training: bool = True,
                  scale_by_keep: bool = True) -> Tensor:
    """Fused ``residual + timm.layers.drop_path(x, drop_prob, training, scale_by_keep)``; the
    per-sample factor is drawn with torch on x's device, as timm draws it."""
    if drop_prob == 0.0 or not training:
        return bias_dropout_add(x, residual)
    keep = 1.0 - drop_prob
    scale = x.new_empty(x.shape[0]).bernoulli_(keep)
    if keep > 0.0 and scale_by_keep:
        scale.div_(keep)
    return bias_dropout_add(x, residual, sample_scale=scale)


# ----------------------------------------------------------------------------- cross-entropy

@custom_op("gpudiag::cross_entropy", mutates_args=())
def _ce_op(logits: Tensor, target: Tensor, ignore_index: int, label_smoothing: float) -> tuple[Tensor, Tensor, Tensor]:
    """(mean loss fp32 0-d, lse fp32 (rows,), n_valid int64 0-d) for logits [rows, V]."""
    return _ce.cross_entropy_forward(logits, target, ignore_index, label_smoothing)


@custom_op("gpudiag::cross_entropy_backward", mutates_args=())
def _ce_bwd_op(logits: Tensor, target: Tensor, lse: Tensor, scale: Tensor, ignore_index: int,
               label_smoothing: float) -> Tensor:
    return _ce.cross_entropy_backward(logits, target, lse, scale, ignore_index, label_smoothing)


_ce_op.register_fake(lambda logits, target, ignore_index, label_smoothing: (
    logits.new_empty((), dtype=torch.float32), _per_row(logits), target.new_empty((), dtype=torch.int64)))
_ce_bwd_op.register_fake(lambda logits, target, lse, scale, ignore_index, label_smoothing: logits.new_empty(logits.shape))


def _ce_setup(ctx, inputs, output):
    logits, target, ctx.ignore_index, ctx.label_smoothing = inputs
    ctx.save_for_backward(logits, target, output[1], output[2])


def _ce_backward(ctx, grad, _dlse, _dn):
    logits, target, lse, n_valid = ctx.saved_tensors
    scale = (grad.float() / n_valid).reshape(1)
    dx = torch.ops.gpudiag.cross_entropy_backward(logits, target, lse, scale, ctx.ignore_index, ctx.label_smoothing)
    return dx, None, None, None


_ce_op.register_autograd(_ce_backward, setup_context=_ce_setup)


def cross_entropy(logits: Tensor, target: Tensor, ignore_index: int = -100, label_smoothing: float = 0.0) -> Tensor:
    """Fused ``F.cross_entropy`` (mean) for logits [..., V] and integer target [...]: a 0-d loss
    in the logits' dtype (fp32 under autocast). Raises ValueError for probability targets or
    mismatched shapes."""
    if not _use_ops():
        return _ce.cross_entropy(logits, target, ignore_index, label_smoothing)
    _ce._check_options(None, "mean", ignore_index, label_smoothing)
    if target.is_floating_point() or target.shape != logits.shape[:-1]:
        raise ValueError(f"target must hold class indices of shape {tuple(logits.shape[:-1])}, got "
                         f"{target.dtype} {tuple(target.shape)}: use torch.nn.functional.cross_entropy")
    x2 = logits.reshape(-1, logits.shape[-1])
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    out_dtype = torch.float32 if torch.is_autocast_enabled(logits.device.type) else logits.dtype
    loss = torch.ops.gpudiag.cross_entropy(x2, target.reshape(-1).contiguous(), int(ignore_index),
                                           float(label_smoothing))[0]
    return loss.to(out_dtype)


# ----------------------------------------------------------------------------- Swin: scaled masked softmax

@custom_op("gpudiag::scaled_masked_softmax", mutates_args=())
def _sms_op(scores: Tensor, bias: Optional[Tensor], mask: Optional[Tensor], scale: float,
            out_dtype: Optional[torch.dtype]) -> Tensor:
    """softmax(scale·scores + bias[h] + mask[w]); see gpudiag.kernels.ops.softmax."""
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
    """(windows, mean, rstd (fp32, B·H·W)); see gpudiag.kernels.ops.swin_window."""
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
    """residual + sample_scale[b] · roll(window_reverse(windows), +shift); see gpudiag.kernels.ops.swin_window."""
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
