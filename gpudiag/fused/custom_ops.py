"""gpudiag's reference kernels as PyTorch custom operators (namespace ``gpudiag``), so a model
patched with them compiles with ``torch.compile`` without a graph break and runs under CUDA graphs.

Each kernel of :mod:`gpudiag.fused.ops` becomes a forward op and a backward op
(``torch.ops.gpudiag.rms_norm`` / ``rms_norm_backward``, ...), both calling the existing launchers,
with a fake (meta) implementation that gives output shapes, dtypes and strides without running
anything, and ``register_autograd`` tying the two. Tensors the backward needs (per-row statistics)
are outputs of the forward op, since a custom op keeps no state between calls.

Swin's ops (scaled masked softmax, the window shuffles) are in :mod:`gpudiag.fused.custom_ops_swin`.
The public functions below (``rms_norm``, ``swiglu``, ...) take the same arguments as the drop-in
functions in ``gpudiag.fused.ops``. While Dynamo traces (``torch.compiler.is_compiling()``) they
call the custom ops; in eager mode they call the ops' ``autograd.Function`` directly, because a
custom op costs more host time per call (measured on the 2-core CPU development machine: 190 µs
against 35 µs per call with a trivial body, forward only), and an overhead-bound step pays it for
every kernel. ``EAGER_USES_OPS = True`` sends eager calls through the custom ops as well (tests).

Not ``torch.library.triton_op``: triton_op uses the op's body as its fake implementation and
traces it, which needs every launch written as ``torch.library.wrap_triton(kernel)[grid](...)``;
the launchers launch kernels directly, and in Triton's interpreter (the CPU tests) the body cannot
run on fake tensors at all. The custom ops are opaque to Inductor (it calls them as they are).

Dropout's seed is a 0-d int64 tensor: on the CPU (torch's CPU generator, as the eager path draws
it), or on the GPU while a CUDA graph is captured, where a CPU value would be fixed in the graph
and every replay would drop the same elements (the kernel then reads it from memory; checked on an
H100 by benchmarks/zoo/graphs_check.py). An ``int`` drawn while tracing would be a graph break or
a constant of the graph. Under torch.compile the seed stays on the CPU; a GPU seed there, for
Inductor's CUDA graphs (``mode="reduce-overhead"``), has not been run on a GPU.
"""

import math
from typing import Optional

import torch
from torch import Tensor
from torch.library import custom_op

from gpudiag.fused.ops import add_layer_norm as _aln
from gpudiag.fused.ops import bias_dropout_add as _bda
from gpudiag.fused.ops import bias_gelu as _bg
from gpudiag.fused.ops import cross_entropy as _ce
from gpudiag.fused.ops import glu as _glu
from gpudiag.fused.ops import linear_cross_entropy as _lce
from gpudiag.fused.ops import rms_norm as _rms
from gpudiag.fused.ops import rope as _rope

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
    """(y, rstd fp32 (rows,)); see gpudiag.fused.ops.rms_norm."""
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
    """act(a) · b, act = SiLU (0) or tanh-GELU (1); see gpudiag.fused.ops.glu."""
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
    """gelu_tanh(x + bias); see gpudiag.fused.ops.bias_gelu."""
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
    """(y, s = x + residual, mean, rstd (fp32, rows)); see gpudiag.fused.ops.add_layer_norm."""
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

def _seed(seed: Optional[Tensor]):
    """The launchers' seed: an ``int`` from a CPU tensor (no device synchronization), a GPU tensor
    as it is (the kernel reads it: drawn on the GPU for CUDA graphs)."""
    if seed is None:
        return 0
    return seed if seed.device.type != "cpu" else int(seed)


@custom_op("gpudiag::bias_dropout_add", mutates_args=())
def _bda_op(x: Tensor, residual: Tensor, bias: Optional[Tensor], sample_scale: Optional[Tensor], p: float,
            seed: Optional[Tensor]) -> Tensor:
    """residual + keep · (x + bias) · sample_scale[b]; see gpudiag.fused.ops.bias_dropout_add."""
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
    ``seed`` None draws one from torch's CPU generator, or from its CUDA generator while a CUDA
    graph is captured (as :func:`gpudiag.fused.ops.bias_dropout_add.draw_seed`). Raises
    ValueError on mismatched shapes."""
    if not _use_ops():
        return _bda.bias_dropout_add(x, residual, bias, p, training, sample_scale, seed)
    p = float(p) if training else 0.0
    seed_t = None
    if p > 0.0 and seed is not None:
        seed_t = torch.full((), seed, dtype=torch.int64)
    elif p > 0.0:
        # Drawn on the GPU while a CUDA graph is captured: a CPU seed would be fixed in the graph
        # and every replay would drop the same elements (draw_seed).
        on_gpu = x.is_cuda and torch.cuda.is_current_stream_capturing()
        seed_t = torch.randint(2**31, (), dtype=torch.int64, device=x.device if on_gpu else "cpu")
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
_ce_bwd_op.register_fake(lambda logits, target, lse, scale, ignore_index, label_smoothing: logits.new_empty(
    logits.shape))


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


# ----------------------------------------------------------------------------- RoPE (HF layout)

@custom_op("gpudiag::rope", mutates_args=())
def _rope_op(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """(q_embed, k_embed) in q's and k's layout; see gpudiag.fused.ops.rope."""
    return _rope.rope_forward(q, k, cos, sin)


@custom_op("gpudiag::rope_backward", mutates_args=())
def _rope_bwd_op(dq: Tensor, dk: Tensor, cos: Tensor, sin: Tensor, q: Optional[Tensor],
                 k: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dcos, dsin); dcos and dsin only when the forward's q and k are given, else empty placeholders."""
    dq, dk, dcos, dsin = _rope.rope_backward(dq, dk, cos, sin, (q, k) if q is not None else None)
    return dq, dk, *((dcos, dsin) if q is not None else (cos.new_empty(0), sin.new_empty(0)))


_rope_op.register_fake(lambda q, k, cos, sin: (torch.empty_like(q), torch.empty_like(k)))
_rope_bwd_op.register_fake(lambda dq, dk, cos, sin, q, k: (
    torch.empty_like(dq), torch.empty_like(dk), cos.new_empty(cos.shape if q is not None else 0),
    sin.new_empty(sin.shape if q is not None else 0)))


def _rope_setup(ctx, inputs, output):
    q, k, cos, sin = inputs
    ctx.with_dcs = cos.requires_grad or sin.requires_grad  # HF makes cos/sin under no_grad: usually not
    ctx.save_for_backward(cos, sin, *((q, k) if ctx.with_dcs else (None, None)))


def _rope_backward(ctx, dq_out, dk_out):
    dq, dk, dcos, dsin = torch.ops.gpudiag.rope_backward(dq_out, dk_out, *ctx.saved_tensors)
    return dq, dk, *((dcos, dsin) if ctx.with_dcs else (None, None))


_rope_op.register_autograd(_rope_backward, setup_context=_rope_setup)


def rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Fused HF ``apply_rotary_pos_emb(q, k, cos, sin)``: q [B, Hq, S, D], k [B, Hk, S, D], cos/sin
    [B or 1, S, D], one dtype -> (q_embed, k_embed). Raises ValueError for other shapes or dtypes."""
    return torch.ops.gpudiag.rope(q, k, cos, sin) if _use_ops() else _rope.rope(q, k, cos, sin)


# ----------------------------------------------------------------------------- linear + cross-entropy

@custom_op("gpudiag::linear_cross_entropy", mutates_args=())
def _lce_op(x: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor], ignore_index: int,
            label_smoothing: float, chunk_size: Optional[int], need_x: bool, need_weight: bool,
            need_bias: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(mean loss fp32 0-d, grad_x, grad_weight, grad_bias) of the mean loss, computed in the forward
    (see gpudiag.fused.ops.linear_cross_entropy); a gradient not asked for is an empty placeholder."""
    with torch.autocast(x.device.type, enabled=False):  # autocast passes through custom ops: inputs are cast already
        loss, *grads = _lce.linear_cross_entropy_forward(x, weight, target, bias, ignore_index, label_smoothing,
                                                         chunk_size, (need_x, need_weight, need_bias))
    return loss, *(g if g is not None else x.new_empty(0) for g in grads)


@_lce_op.register_fake
def _(x, weight, target, bias, ignore_index, label_smoothing, chunk_size, need_x, need_weight, need_bias):
    grads = ((need_x, x), (need_weight, weight), (need_bias and bias is not None, bias))
    return x.new_empty((), dtype=torch.float32), *(t.new_empty(t.shape) if need else x.new_empty(0)
                                                   for need, t in grads)


def _lce_setup(ctx, inputs, output):
    ctx.save_for_backward(*output[1:])
    ctx.needs = inputs[7], inputs[8], inputs[9] and inputs[3] is not None


def _lce_backward(ctx, grad, *_):
    grads = [g * grad.to(g.dtype) if need else None for g, need in zip(ctx.saved_tensors, ctx.needs)]
    return grads[0], grads[1], None, grads[2], None, None, None, None, None, None


_lce_op.register_autograd(_lce_backward, setup_context=_lce_setup)


def linear_cross_entropy(x: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor] = None,
                         ignore_index: int = -100, chunk_size: Optional[int] = None,
                         label_smoothing: float = 0.0) -> Tensor:
    """Fused ``F.cross_entropy(F.linear(x, weight, bias), target)`` (mean) without the [tokens, V]
    logits: x [..., H], weight [V, H], bias [V] or None, target [...] -> 0-d loss in x's dtype (fp32
    under autocast). Raises ValueError as gpudiag.fused.ops.linear_cross_entropy does."""
    if not _use_ops():
        return _lce.linear_cross_entropy(x, weight, target, bias, ignore_index, chunk_size, label_smoothing)
    _lce._check(x, weight, target, bias, "mean", label_smoothing, chunk_size)
    out_dtype = x.dtype
    if torch.is_autocast_enabled(x.device.type):
        dtype, out_dtype = torch.get_autocast_dtype(x.device.type), torch.float32
        x, weight, bias = x.to(dtype), weight.to(dtype), bias.to(dtype) if bias is not None else None
    grad = torch.is_grad_enabled()
    needs = [grad and t is not None and t.requires_grad for t in (x, weight, bias)]
    loss = torch.ops.gpudiag.linear_cross_entropy(x.reshape(-1, x.shape[-1]).contiguous(), weight,
                                                  target.reshape(-1).contiguous(), bias, int(ignore_index),
                                                  float(label_smoothing), chunk_size, *needs)[0]
    return loss.to(out_dtype)
