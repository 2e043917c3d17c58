"""Cross-entropy fused: log_softmax + nll_loss (mean over non-ignored rows), forward and backward.

For a row x of V logits with target t: lse = log Σ_j exp(x_j), loss = lse − x_t; with label
smoothing ε (PyTorch's definition, Szegedy et al. 2016, "Rethinking the Inception Architecture"):
loss = (1−ε)·(lse − x_t) + ε·(lse − mean_j x_j). The mean divides by the number of rows whose
target is not ``ignore_index``. Gradient: dx_j = (softmax_j − (1−ε)·[j = t] − ε/V) · g / n_valid,
zero on ignored rows.

Forward: one program per row loops over the vocabulary in BLOCK-wide chunks with an online max and
rescaled sum of exponentials (Milakov & Gimelshein 2018, "Online normalizer calculation for
softmax"), so V = 128256 needs no row-sized block; it writes the row's loss and lse (fp32). Backward
reads x once more with the saved lse (softmax = exp(x − lse)); no softmax is stored. The logits are
read in their dtype (bf16 under autocast) and the math is fp32, which is what eager's fp32 copy of
the logits was for. Same scheme as Liger-Kernel's and Unsloth's fused cross-entropy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpudiag.fused.registry import ReferenceKernel, randn

_MAX_BLOCK = 4096  # chunk width: 16 KB of fp32 per chunk in registers (tests lower it to force many chunks)


@triton.jit
def _ce_fwd(x_ptr, t_ptr, loss_ptr, lse_ptr, n_cols, stride_row, ignore_index, smoothing, BLOCK: tl.constexpr,
            CHUNKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64: 32k tokens x 128k vocab passes 2^31 elements
    x_row = x_ptr + row * stride_row
    cols = tl.arange(0, BLOCK)
    m = float("-inf")  # running max
    s = 0.0  # running Σ exp(x − m)
    sum_x = 0.0  # Σ x, for the label-smoothing term
    # A compile-time trip count: one compilation per vocabulary size, which a model fixes (and
    # Triton 3.6's interpreter cannot loop to a runtime bound under NumPy 2.4).
    for chunk in range(0, CHUNKS):
        offs = chunk * BLOCK + cols
        mask = offs < n_cols
        x = tl.load(x_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        sum_x += tl.sum(tl.where(mask, x, 0.0), axis=0)
        m = m_new
    lse = m + tl.log(s)
    target = tl.load(t_ptr + row)
    valid = target != ignore_index
    # Out-of-range targets are not checked (eager raises a device assert); the load stays in bounds.
    x_t = tl.load(x_row + target, mask=valid & (target >= 0) & (target < n_cols), other=0.0).to(tl.float32)
    loss = (1.0 - smoothing) * (lse - x_t) + smoothing * (lse - sum_x / n_cols)
    tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))
    tl.store(lse_ptr + row, lse)


@triton.jit
def _ce_bwd(x_ptr, t_ptr, lse_ptr, scale_ptr, dx_ptr, n_cols, stride_row, ignore_index, smoothing,
            BLOCK: tl.constexpr):
    # One program per (row, chunk): the gradient is element-wise given lse, so chunks run in parallel.
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    target = tl.load(t_ptr + row)
    lse = tl.load(lse_ptr + row)
    scale = tl.load(scale_ptr)  # grad_out / n_valid, a device scalar (no host sync)
    x = tl.load(x_ptr + row * stride_row + offs, mask=mask, other=0.0).to(tl.float32)
    grad = tl.exp(x - lse) - smoothing / n_cols - tl.where(offs == target, 1.0 - smoothing, 0.0)
    grad = tl.where(target != ignore_index, grad * scale, 0.0)
    tl.store(dx_ptr + row * n_cols + offs, grad.to(dx_ptr.dtype.element_ty), mask=mask)


def _block(n_cols: int) -> tuple[int, int]:
    block = min(triton.next_power_of_2(n_cols), _MAX_BLOCK)
    return block, 8 if block >= 2048 else 4


def _check_options(weight, reduction: str, ignore_index, label_smoothing) -> None:
    if weight is not None or isinstance(ignore_index, torch.Tensor):  # F.cross_entropy's 3rd positional is weight
        raise ValueError("class weights are not supported by the fused cross-entropy: "
                         "use torch.nn.functional.cross_entropy(..., weight=...) for weighted losses")
    if reduction != "mean":
        raise ValueError(f"reduction={reduction!r} is not supported by the fused cross-entropy (mean only): use "
                         f"torch.nn.functional.cross_entropy(..., reduction={reduction!r}), or multiply the mean by "
                         "the number of non-ignored targets for a sum")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")


def cross_entropy_forward(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                          label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean loss as a 0-d fp32 tensor, per-row lse fp32 (rows,), n_valid int64 0-d) for logits
    [rows, V] (last-dim stride 1) and target int [rows]. The mean is nan when every row is ignored."""
    rows, n_cols = logits.shape
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
    block, warps = _block(n_cols)
    _ce_fwd[(rows,)](logits, target, loss, lse, n_cols, logits.stride(0), ignore_index, float(label_smoothing),
                     BLOCK=block, CHUNKS=triton.cdiv(n_cols, block), num_warps=warps)
    n_valid = (target != ignore_index).sum()
    return loss.sum() / n_valid, lse, n_valid  # 0/0 = nan when all rows are ignored, as in eager


def cross_entropy_backward(logits, target, lse, scale, ignore_index: int = -100, label_smoothing: float = 0.0):
    """dlogits [rows, V] in the logits' dtype; ``scale`` is the fp32 0-d tensor grad_out / n_valid."""
    rows, n_cols = logits.shape
    dx = torch.empty((rows, n_cols), dtype=logits.dtype, device=logits.device)
    block, warps = _block(n_cols)
    _ce_bwd[(rows, triton.cdiv(n_cols, block))](logits, target, lse, scale, dx, n_cols, logits.stride(0),
                                                ignore_index, float(label_smoothing), BLOCK=block, num_warps=warps)
    return dx


class CrossEntropyFunction(torch.autograd.Function):
    """Autograd for :func:`cross_entropy` on 2-d logits: saves the logits, target and per-row lse."""

    @staticmethod
    def forward(ctx, logits, target, ignore_index, label_smoothing, out_dtype):
        loss, lse, n_valid = cross_entropy_forward(logits, target, ignore_index, label_smoothing)
        ctx.save_for_backward(logits, target, lse, n_valid)
        ctx.ignore_index, ctx.label_smoothing = ignore_index, label_smoothing
        return loss.to(out_dtype)

    @staticmethod
    def backward(ctx, grad_out):
        logits, target, lse, n_valid = ctx.saved_tensors
        scale = (grad_out.float() / n_valid).reshape(1)
        dx = cross_entropy_backward(logits, target, lse, scale, ctx.ignore_index, ctx.label_smoothing)
        return dx, None, None, None, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
                  *, weight=None, reduction: str = "mean") -> torch.Tensor:
    """Drop-in fused ``F.cross_entropy`` (mean) for logits [..., V] (classes last) and integer
    target [...]: a 0-d loss in the logits' dtype (fp32 under autocast, as eager's fp32-listed
    cross_entropy gives), differentiable in the logits. Raises ValueError for class weights, a
    reduction other than 'mean', probability targets or mismatched shapes."""
    _check_options(weight, reduction, ignore_index, label_smoothing)
    if target.is_floating_point() or target.shape != logits.shape[:-1]:
        raise ValueError(f"target must hold class indices of shape {tuple(logits.shape[:-1])} (logits' leading "
                         f"dimensions, classes last), got {target.dtype} {tuple(target.shape)}: for class "
                         "probabilities or class-dim-1 inputs use torch.nn.functional.cross_entropy")
    x2 = logits.reshape(-1, logits.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out_dtype = torch.float32 if torch.is_autocast_enabled(logits.device.type) else logits.dtype
    return CrossEntropyFunction.apply(x2, target.reshape(-1).contiguous(), int(ignore_index), float(label_smoothing),
                                      out_dtype)


class FusedCrossEntropyLoss(torch.nn.Module):
    """Drop-in ``torch.nn.CrossEntropyLoss`` (classes on the last dimension, mean reduction).
    Raises ValueError for ``weight``, ``reduction`` other than 'mean', or the deprecated
    ``size_average`` / ``reduce``."""

    def __init__(self, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean", label_smoothing: float = 0.0) -> None:
        super().__init__()
        if size_average is not None or reduce is not None:
            raise ValueError("size_average/reduce are deprecated and not supported: use reduction='mean'")
        _check_options(weight, reduction, ignore_index, label_smoothing)
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, logits, target):
        return cross_entropy(logits, target, self.ignore_index, self.label_smoothing)


def reference(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
              label_smoothing: float = 0.0) -> torch.Tensor:
    """The eager chain the kernel replaces (_log_softmax, nll_loss_forward), in the logits' dtype."""
    return torch.nn.functional.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing)


def _inputs(shape, dtype, device, gen):
    rows, vocab = shape
    logits = randn((rows, vocab), dtype, device, gen, scale=2.0)
    target = torch.randint(0, vocab, (rows,), generator=gen, dtype=torch.int64)
    if rows > 2:  # a few padding positions, as in packed language-model batches
        target[torch.randperm(rows, generator=gen)[: max(1, rows // 8)]] = -100
    return logits, target.to(device)


KERNELS = [ReferenceKernel("cross_entropy", fused=cross_entropy, reference=reference, make_inputs=_inputs,
                           shape_doc="TOKENS,VOCAB", test_shapes=((7, 49), (3, 1000), (2, 4097), (5, 1), (37, 130)),
                           bench_shapes=((32, 1000), (8192, 50257), (16384, 32000), (4096, 128256), (32768, 50257)))]
