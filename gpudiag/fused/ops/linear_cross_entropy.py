"""Linear + cross-entropy fused over token chunks: the [tokens, vocab] logits are never materialized.

A language model's head computes logits = x·Wᵀ (+ b) for every token and then cross_entropy: eagerly
that stores the logits (tokens × vocab, e.g. 8192 × 128256 bf16 = 2.1 GB), an fp32 log_softmax of
them, and in the backward a gradient of the same size. Here the tokens are taken ``chunk_size`` at a
time (Liger-Kernel's FusedLinearCrossEntropy, Hsu et al. 2024, "Liger Kernel: Efficient Triton
Kernels for LLM Training"): per chunk, the logits come from a GEMM (torch, cuBLAS); the fused
cross-entropy kernels of :mod:`gpudiag.fused.ops.cross_entropy` write each row's loss and then the
gradient of the logits in place over them; and two more GEMMs turn that into this chunk's grad_x =
dlogits·W and its share of grad_W += dlogitsᵀ·x (grad_b += Σ dlogits). The gradients are computed in
the forward (with the mean's 1/n_valid) and only scaled by the incoming gradient in the backward, so
nothing of the logits is saved. Largest intermediate: chunk_size × vocab, where eager needs
tokens × vocab several times over.

Precision: logits and gradients are stored in the input dtype (as eager's bf16 linear does), the
cross-entropy math is fp32; grad_W accumulates in the weight's dtype across chunks (Liger's choice:
an fp32 accumulator would cost a vocab × hidden fp32 buffer and an extra pass per chunk).
"""

from __future__ import annotations

import torch
import triton

from gpudiag.fused.ops.cross_entropy import _block, _ce_bwd, _ce_fwd
from gpudiag.fused.registry import ReferenceKernel, randn


def default_chunk_size(tokens: int, hidden: int, vocab: int) -> int:
    """Tokens per chunk so one chunk of logits is about as large as x itself (tokens × hidden
    elements), rounded up to a power of two: Liger-Kernel's choice (8192 × 1024 x, vocab 32000 -> 256)."""
    return triton.next_power_of_2(max(1, triton.cdiv(tokens, triton.cdiv(vocab, max(hidden, 1)))))


def linear_cross_entropy_forward(x, weight, target, bias=None, ignore_index: int = -100, label_smoothing: float = 0.0,
                                 chunk_size: int | None = None, grads: tuple[bool, bool, bool] = (True, True, True)):
    """(mean loss as a 0-d fp32 tensor, grad_x, grad_weight, grad_bias) of
    cross_entropy(x·Wᵀ + b, target) for x [tokens, H] (contiguous), weight [V, H], target int [tokens],
    bias [V] or None; each gradient (of the mean loss, in its input's dtype) is None unless asked
    for in ``grads`` (x, weight, bias). The loss is nan when every target is ``ignore_index``."""
    tokens, vocab = x.shape[0], weight.shape[0]
    chunk = chunk_size or default_chunk_size(tokens, x.shape[1], vocab)
    n_valid = (target != ignore_index).sum()
    scale = (1.0 / n_valid.float()).reshape(1)  # a device scalar: no host sync for the mean
    loss_rows = torch.empty(tokens, dtype=torch.float32, device=x.device)
    lse = torch.empty(min(chunk, tokens), dtype=torch.float32, device=x.device)
    grad_x = torch.empty_like(x) if grads[0] else None
    grad_w = torch.zeros_like(weight) if grads[1] else None
    grad_b = torch.zeros(vocab, dtype=torch.float32, device=x.device) if grads[2] and bias is not None else None
    block, warps = _block(vocab)
    for start in range(0, tokens, chunk):
        x_c, t_c = x[start:start + chunk], target[start:start + chunk]
        rows = x_c.shape[0]
        logits = torch.nn.functional.linear(x_c, weight, bias)  # [rows, V]: the only vocab-wide buffer
        _ce_fwd[(rows,)](logits, t_c, loss_rows[start:start + rows], lse, vocab, logits.stride(0), ignore_index,
                         float(label_smoothing), BLOCK=block, CHUNKS=triton.cdiv(vocab, block), num_warps=warps)
        if not any(grads):
            continue
        # dlogits of the mean loss, written over the logits (each element read, then written, by one program)
        _ce_bwd[(rows, triton.cdiv(vocab, block))](logits, t_c, lse, scale, logits, vocab, logits.stride(0),
                                                   ignore_index, float(label_smoothing), BLOCK=block, num_warps=warps)
        if grad_x is not None:
            torch.mm(logits, weight, out=grad_x[start:start + rows])
        if grad_w is not None:
            grad_w.addmm_(logits.t(), x_c)
        if grad_b is not None:
            grad_b += logits.sum(0, dtype=torch.float32)
    loss = loss_rows.sum() / n_valid  # 0/0 = nan when all rows are ignored, as in eager
    return loss, grad_x, grad_w, grad_b.to(bias.dtype) if grad_b is not None else None


class LinearCrossEntropyFunction(torch.autograd.Function):
    """Autograd for :func:`linear_cross_entropy` on x [tokens, H]: the forward computes the
    gradients of the mean loss and saves them; the backward scales them by the incoming gradient."""

    @staticmethod
    def forward(ctx, x, weight, target, bias, ignore_index, label_smoothing, chunk_size, out_dtype):
        need = ctx.needs_input_grad
        with torch.autocast(x.device.type, enabled=False):  # the inputs are already in the compute dtype
            loss, *grads = linear_cross_entropy_forward(x, weight, target, bias, ignore_index, label_smoothing,
                                                        chunk_size, (need[0], need[1], need[3]))
        ctx.save_for_backward(*grads)
        return loss.to(out_dtype)

    @staticmethod
    def backward(ctx, grad_out):
        # Out of place: the saved gradients stay valid for a second backward (retain_graph).
        grad_x, grad_w, grad_b = (None if g is None else g * grad_out.to(g.dtype) for g in ctx.saved_tensors)
        return grad_x, grad_w, None, grad_b, None, None, None, None


def _check(x, weight, target, bias, reduction, label_smoothing, chunk_size) -> None:
    if reduction != "mean":
        raise ValueError(f"reduction={reduction!r} is not supported by the fused linear cross-entropy (mean only): use "
                         "torch.nn.functional.cross_entropy(torch.nn.functional.linear(x, weight, bias), target, "
                         f"reduction={reduction!r})")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of tokens, got {chunk_size}")
    if x.dim() < 1 or weight.dim() != 2 or weight.shape[1] != x.shape[-1] or (
            bias is not None and bias.shape != (weight.shape[0],)):
        raise ValueError(f"x {tuple(x.shape)}, weight {tuple(weight.shape)} and bias "
                         f"{None if bias is None else tuple(bias.shape)} must be [..., H], [V, H] and [V] "
                         "(nn.Linear's)")
    if target.is_floating_point() or target.shape != x.shape[:-1]:
        raise ValueError(f"target must hold class indices of shape {tuple(x.shape[:-1])} (x's leading dimensions), "
                         f"got {target.dtype} {tuple(target.shape)}")
    dtypes = {x.dtype, weight.dtype} | ({bias.dtype} if bias is not None else set())
    if len(dtypes) != 1 and not torch.is_autocast_enabled(x.device.type):
        raise ValueError(f"x, weight and bias must have one dtype, got {sorted(map(str, dtypes))}: cast them "
                         "(eager F.linear refuses mixed dtypes too) or run under torch.autocast")


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None = None,
                         ignore_index: int = -100, chunk_size: int | None = None, label_smoothing: float = 0.0,
                         *, reduction: str = "mean") -> torch.Tensor:
    """Drop-in ``F.cross_entropy(F.linear(x, weight, bias), target)`` (mean) for x [..., H], weight
    [V, H], bias [V] or None and integer target [...], without materializing the [tokens, V] logits:
    a 0-d loss in x's dtype (fp32 under autocast, where x, weight and bias are cast to the autocast
    dtype first, as eager's linear and fp32 cross_entropy do), differentiable in x, weight and bias.
    ``chunk_size`` tokens per chunk (default :func:`default_chunk_size`) bounds the largest
    intermediate at chunk_size × V. Raises ValueError for a reduction other than 'mean', mismatched
    shapes or dtypes, or a chunk_size under 1."""
    _check(x, weight, target, bias, reduction, label_smoothing, chunk_size)
    out_dtype = x.dtype
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x, weight = x.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
        out_dtype = torch.float32
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    t2 = target.reshape(-1).contiguous()
    if not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))):
        with torch.autocast(x.device.type, enabled=False):
            return linear_cross_entropy_forward(x2, weight, t2, bias, int(ignore_index), float(label_smoothing),
                                                chunk_size, (False, False, False))[0].to(out_dtype)
    return LinearCrossEntropyFunction.apply(x2, weight, t2, bias, int(ignore_index), float(label_smoothing), chunk_size,
                                            out_dtype)


def reference(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None = None,
              ignore_index: int = -100) -> torch.Tensor:
    """The eager chain the kernel replaces: the LM head's linear, then cross_entropy on the full logits."""
    logits = torch.nn.functional.linear(x, weight, bias)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                             ignore_index=ignore_index)


def _inputs(shape, dtype, device, gen):
    tokens, hidden, vocab = shape
    x = randn((tokens, hidden), dtype, device, gen)
    # logits of spread ~2, as trained heads give
    weight = randn((vocab, hidden), dtype, device, gen, scale=hidden ** -0.5 * 2)
    target = torch.randint(0, vocab, (tokens,), generator=gen, dtype=torch.int64)
    if tokens > 2:  # a few padding positions, as in packed language-model batches
        target[torch.randperm(tokens, generator=gen)[: max(1, tokens // 8)]] = -100
    return x, weight, target.to(device), randn((vocab,), dtype, device, gen, scale=0.1)


def _from_activation(dims):
    """The vocabulary size is not in a recorded activation: always raises ValueError (time it with
    ``gpudiag kernels bench linear_cross_entropy --shape TOKENS,HIDDEN,VOCAB``)."""
    raise ValueError(f"the vocabulary size is not in the recorded shape {list(dims)}: use gpudiag kernels bench "
                     "linear_cross_entropy --shape TOKENS,HIDDEN,VOCAB")


KERNELS = [ReferenceKernel(
    "linear_cross_entropy", fused=linear_cross_entropy, reference=reference, make_inputs=_inputs,
    shape_doc="TOKENS,HIDDEN,VOCAB",
    test_shapes=((7, 16, 49), (37, 33, 130), (5, 1, 1), (64, 8, 300), (3, 20, 4097)),
    # Llama-style (8192 tokens, hidden 1024, vocab 32000), GPT-2 (768, 50257), Llama-3 8B (4096, 128256)
    bench_shapes=((8192, 1024, 32000), (8192, 768, 50257), (8192, 4096, 128256)),
    from_activation=_from_activation)]
