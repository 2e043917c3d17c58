"""Scale + relative-position bias + window mask + softmax fused: y = softmax(scale·s + bias[h] + mask[w], -1).

Swin's windowed attention (timm ``WindowAttention``, Liu et al. 2021) computes, on scores s of shape
[B_, heads, N, N] (N = 49 for a 7x7 window, B_ = batch·nW with the window index fastest):
``attn = s + rel_pos_bias.unsqueeze(0)``, in shifted blocks ``attn.view(-1, nW, heads, N, N) +
mask.unsqueeze(1).unsqueeze(0)``, ``softmax(attn, -1)``, then under autocast a cast to bf16 for the
next matmul: four kernels (add, add, _softmax, _to_copy), each writing an fp32 [B_, heads, N, N]
tensor. Fused: one pass reading s and writing y in ``out_dtype``; math in fp32; a program loads its
bias + mask tile once (from cache: tens to hundreds of KiB in all) and applies it to several items.

Backward (the softmax derivative; g = the gradient of the logits): g = y·(dy − Σ_j dy·y),
ds = scale·g, dbias[h] = Σ_{B_} g (the bias table is learned), dmask[w] = Σ_{b_ ≡ w mod nW, heads} g
(Swin's mask is a constant buffer; its gradient is produced only when asked for). A program
accumulates g over items of one window class, so one fp32 partial buffer gives both sums.
Only y is saved (not s): the backward needs nothing else.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from gpudiag.fused.registry import ReferenceKernel, randn


# Both kernels: program split·n_tiles + tile takes rows tile·ROWS.. of each item b_ (the same
# bias rows every time, [ROWS, BLOCK] elements) for the items b_ = w + k·nW of one window w, k in chunk
# j (split = w·n_chunks + j). All index math (row -> head, window) is done once per program, not per
# element; only the item's base offset is int64 (B_·H·N·N may pass 2^31).


@triton.jit
def _fwd(s_ptr, bias_ptr, mask_ptr, y_ptr, rows_per_item, n_q, n_k, items_per_window, n_windows, n_chunks,
         n_tiles, scale, ITEMS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr,
         HAS_MASK: tl.constexpr):
    split, tile = tl.program_id(0) // n_tiles, tl.program_id(0) % n_tiles
    local = tile * ROWS + tl.arange(0, ROWS)  # row (h, i) within an item [H, N_q]
    w, j = split // n_chunks, split % n_chunks
    cols = tl.arange(0, BLOCK)
    col_ok = cols < n_k
    m = (local < rows_per_item)[:, None] & col_ok[None, :]
    add = tl.zeros([ROWS, BLOCK], dtype=tl.float32)  # bias + mask, loaded once for all the items
    if HAS_BIAS:
        add += tl.load(bias_ptr + local[:, None] * n_k + cols[None, :], mask=m, other=0.0).to(tl.float32)
    if HAS_MASK:  # window w = b_ mod nW, as timm's view(-1, nW, H, N, N)
        mrow = w * n_q + local % n_q
        add += tl.load(mask_ptr + mrow[:, None] * n_k + cols[None, :], mask=m, other=0.0).to(tl.float32)
    # Padding lanes get -inf (exp -> 0); rows past the end stay finite. A row of all -inf gives NaN,
    # as torch.softmax does.
    add = tl.where(col_ok[None, :], add, float("-inf"))
    for i in range(0, ITEMS):  # a compile-time trip count: the interpreter takes no runtime bounds
        k = j * ITEMS + i
        # the last chunk may be short: masked, not branched; the item test per row, not a scalar:
        # triton 3.9's interpreter rejects scalar & block masks
        mk = m & ((local * 0 + k) < items_per_window)[:, None]
        offs = ((w + k * n_windows).to(tl.int64) * rows_per_item + local)[:, None] * n_k + cols[None, :]
        x = tl.load(s_ptr + offs, mask=mk, other=0.0).to(tl.float32) * scale + add
        e = tl.exp(x - tl.max(x, axis=1)[:, None])
        y = e * (1.0 / tl.sum(e, axis=1))[:, None]
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mk)


@triton.jit
def _bwd(y_ptr, dy_ptr, ds_ptr, partial_ptr, rows_per_item, n_k, items_per_window, n_windows, n_chunks, n_tiles,
         scale, ITEMS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, STORE_DS: tl.constexpr,
         ACC: tl.constexpr):
    # g summed in fp32 over the program's items: partial[split] (one window's share of dbias and dmask)
    split, tile = tl.program_id(0) // n_tiles, tl.program_id(0) % n_tiles
    local = tile * ROWS + tl.arange(0, ROWS)
    w, j = split // n_chunks, split % n_chunks
    cols = tl.arange(0, BLOCK)
    m = (local < rows_per_item)[:, None] & (cols < n_k)[None, :]
    acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    for i in range(0, ITEMS):
        k = j * ITEMS + i
        mk = m & ((local * 0 + k) < items_per_window)[:, None]  # per row: see _fwd
        offs = ((w + k * n_windows).to(tl.int64) * rows_per_item + local)[:, None] * n_k + cols[None, :]
        y = tl.load(y_ptr + offs, mask=mk, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mk, other=0.0).to(tl.float32)
        g = y * (dy - tl.sum(dy * y, axis=1)[:, None])
        if STORE_DS:
            tl.store(ds_ptr + offs, (g * scale).to(ds_ptr.dtype.element_ty), mask=mk)
        if ACC:
            acc += g
    if ACC:
        tl.store(partial_ptr + (split.to(tl.int64) * rows_per_item + local)[:, None] * n_k + cols[None, :], acc, mask=m)


# Launch shapes, measured on an H200 at Swin-T's (2048, 3, 49, 64) in bf16: 49-wide rows cannot be
# loaded in 16-byte vectors (a row is 98 bytes), so throughput comes from many small programs in
# flight: tiles of ~256 elements, one warp per 256 (forward) or 128 (backward) of them. Programs per
# SM: the forward wants ~128 (8 items each); the backward ~32, since each program also writes an
# fp32 partial sum (16 items each: the partials stay ~4% of the traffic).
CONFIG = {"fwd": {"tile": 256, "per_warp": 256, "per_sm": 128}, "bwd": {"tile": 256, "per_warp": 128, "per_sm": 32}}
INTERPRETER_TILE = 2048  # on the CPU (Triton's interpreter, tests only): fewer, larger programs


def _plan(shape, n_w: int, device, kind: str) -> tuple[int, int, int, int, int, int]:
    """(ROWS, BLOCK, warps, tiles, items per program, chunks per window) for scores of ``shape``:
    a [ROWS, BLOCK] tile of ~CONFIG tile elements, ROWS chosen to pad H·N_q rows by at most ~1/8, and
    per_sm programs per multiprocessor; on the CPU, INTERPRETER_TILE and 8 programs."""
    cfg, gpu = CONFIG[kind], device.type == "cuda"
    b, h, n_q, n_k = shape
    block, rows_per_item = triton.next_power_of_2(n_k), h * n_q
    rows = min(triton.next_power_of_2(rows_per_item), max(1, (cfg["tile"] if gpu else INTERPRETER_TILE) // block))
    while rows > 1 and triton.cdiv(rows_per_item, rows) * rows * 8 > rows_per_item * 9:
        rows //= 2
    tiles, per_window = triton.cdiv(rows_per_item, rows), b // n_w
    target = cfg["per_sm"] * _sm_count(device.index) if gpu else 8
    items = triton.cdiv(per_window, max(1, min(per_window, triton.cdiv(target, tiles * n_w))))
    warps = min(16, max(1, rows * block // cfg["per_warp"]))
    return rows, block, warps, tiles, items, triton.cdiv(per_window, items)


@functools.lru_cache(maxsize=None)
def _sm_count(index) -> int:
    index = torch.cuda.current_device() if index is None else index
    return torch.cuda.get_device_properties(index).multi_processor_count


def _check(scores, bias, mask, out_dtype) -> None:
    if scores.dim() != 4:
        raise ValueError(f"scores must be [B_, heads, N_q, N_k], got shape {tuple(scores.shape)}")
    b, h, n_q, n_k = scores.shape
    if bias is not None and tuple(bias.shape) != (h, n_q, n_k):
        raise ValueError(f"bias of shape {tuple(bias.shape)} does not match scores {tuple(scores.shape)}: "
                         f"expected [heads, N_q, N_k] = {(h, n_q, n_k)}")
    if mask is not None and (mask.dim() != 3 or tuple(mask.shape[1:]) != (n_q, n_k) or mask.shape[0] < 1
                             or b % mask.shape[0]):
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not match scores {tuple(scores.shape)}: expected "
                         f"[nW, {n_q}, {n_k}] with B_ = {b} a multiple of nW")
    if out_dtype is not None and not out_dtype.is_floating_point:
        raise ValueError(f"out_dtype must be a floating dtype, got {out_dtype}")
    if n_k > 65536:
        raise ValueError(f"rows longer than 65536 elements (N_k = {n_k}) are not supported: one block holds a row")


class ScaledMaskedSoftmax(torch.autograd.Function):
    """Autograd for :func:`scaled_masked_softmax`: saves y only."""

    @staticmethod
    def forward(ctx, scores, bias, mask, scale, out_dtype):
        _check(scores, bias, mask, out_dtype)
        b, h, n_q, n_k = scores.shape
        s = scores.contiguous()
        y = torch.empty(s.shape, dtype=out_dtype or s.dtype, device=s.device)
        n_w = mask.shape[0] if mask is not None else 1
        if y.numel():
            rows, block, warps, tiles, items, chunks = _plan(s.shape, n_w, s.device, "fwd")
            _fwd[(tiles * n_w * chunks,)](
                s, bias.contiguous() if bias is not None else s, mask.contiguous() if mask is not None else s, y,
                h * n_q, n_q, n_k, b // n_w, n_w, chunks, tiles, float(scale), ITEMS=items, ROWS=rows, BLOCK=block,
                HAS_BIAS=bias is not None, HAS_MASK=mask is not None, num_warps=warps)
        ctx.save_for_backward(y)
        ctx.meta = (scores.dtype, bias.dtype if bias is not None else None, mask.dtype if mask is not None else None,
                    n_w, scale)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        s_dtype, bias_dtype, mask_dtype, n_w, scale = ctx.meta
        b, h, n_q, n_k = y.shape
        need_ds, need_db, need_dm = ctx.needs_input_grad[:3]
        if not y.numel():
            zeros = functools.partial(torch.zeros, device=y.device)
            return (zeros(y.shape, dtype=s_dtype) if need_ds else None,
                    zeros(y.shape[1:], dtype=bias_dtype) if need_db else None,
                    zeros((n_w, *y.shape[2:]), dtype=mask_dtype) if need_dm else None, None, None)
        rows, block, warps, tiles, items, chunks = _plan(y.shape, n_w, y.device, "bwd")
        ds = torch.empty(y.shape, dtype=s_dtype, device=y.device) if need_ds else None
        acc = need_db or need_dm
        partial = torch.empty((n_w, chunks, h, n_q, n_k), dtype=torch.float32, device=y.device) if acc else y
        if need_ds or acc:
            _bwd[(tiles * n_w * chunks,)](y, dy.contiguous(), ds if need_ds else y, partial, h * n_q, n_k, b // n_w,
                                        n_w, chunks, tiles, float(scale), ITEMS=items, ROWS=rows, BLOCK=block,
                                        STORE_DS=need_ds, ACC=acc, num_warps=warps)
        db = partial.sum((0, 1)).to(bias_dtype) if need_db else None
        dm = partial.sum((1, 2)).to(mask_dtype) if need_dm else None
        return ds, db, dm, None, None


def scaled_masked_softmax(scores: torch.Tensor, bias: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                          scale: float = 1.0, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Fused ``softmax(scale·scores + bias[h] + mask[b_ mod nW], -1)`` (differentiable in all three).

    scores [B_, heads, N_q, N_k] (any float dtype); bias [heads, N_q, N_k] or None; mask [nW, N_q, N_k]
    or None, with B_ a multiple of nW (window index fastest). Math in fp32; the output is ``out_dtype``
    (default scores.dtype: under autocast the bf16 cast for the next matmul is folded in).
    Raises ValueError on mismatched shapes."""
    return ScaledMaskedSoftmax.apply(scores, bias, mask, scale, out_dtype)


def reference(scores, bias=None, mask=None, scale: float = 1.0):
    """The eager chain of timm's WindowAttention under autocast: bf16 scores + fp32 bias -> fp32, + mask
    through the (-1, nW, H, N, N) view, softmax in fp32 (or float64), cast back to scores.dtype. timm
    scales q before the matmul; here the scale rides in the first add (``alpha``), still one kernel."""
    b, h, n_q, n_k = scores.shape
    if bias is not None:
        attn = torch.add(bias.unsqueeze(0), scores, alpha=scale)
    else:
        attn = scores if scale == 1.0 else scores * scale
    if mask is not None:
        attn = (attn.view(-1, mask.shape[0], h, n_q, n_k) + mask.unsqueeze(1).unsqueeze(0)).view(-1, h, n_q, n_k)
    return attn.softmax(-1, dtype=torch.promote_types(attn.dtype, torch.float32)).to(scores.dtype)


SWIN_SCALE = 32 ** -0.5  # Swin-T: head_dim 32


def _fused(scores, bias, mask):
    return scaled_masked_softmax(scores, bias, mask, scale=SWIN_SCALE)


def _reference(scores, bias, mask):
    return reference(scores, bias, mask, scale=SWIN_SCALE)


def _inputs(shape, dtype, device, gen):
    """(scores, bias, mask) for (B_, heads, N[, nW]): scores in ``dtype``; bias and mask fp32 as timm's
    relative-position table and attn_mask buffer are under autocast. The mask is Swin's kind: 0 between
    tokens of one region, -100 across regions (3 random regions per window)."""
    windows, heads, n, *rest = shape
    n_w = rest[0] if rest else 1
    scores = randn((windows, heads, n, n), dtype, device, gen, scale=4.0)  # scaled logits of std ~0.7
    bias = randn((heads, n, n), torch.float32, device, gen, scale=0.5)
    region = torch.randint(0, 3, (n_w, n), generator=gen)
    mask = ((region[:, :, None] != region[:, None, :]).float() * -100.0).to(device)
    return scores, bias, mask


def _from_activation(dims):
    """Recorded scores [B_, heads, N, N] -> (B_, heads, N, 1), or timm's masked view
    [B, nW, heads, N, N] -> (B·nW, heads, N, nW). Without nW in the shape: 1 (a [1, N, N] mask; the
    real [nW, N, N] one is read from cache as well, so the traffic is the same to within it).
    Raises ValueError for other shapes."""
    if len(dims) == 5 and dims[-1] == dims[-2]:
        return (dims[0] * dims[1], dims[2], dims[3], dims[1])
    if len(dims) != 4 or dims[-1] != dims[-2]:
        raise ValueError(f"expected attention scores [B_, heads, N, N], got {list(dims)}")
    return (dims[0], dims[1], dims[2], 1)


KERNELS = [ReferenceKernel(
    "softmax_bias_mask", fused=_fused, reference=_reference, make_inputs=_inputs, shape_doc="WINDOWS,HEADS,N[,NW]",
    test_shapes=((8, 3, 49, 4), (4, 2, 49, 1), (6, 1, 7, 2), (2, 2, 100, 1), (3, 2, 1, 3)),
    bench_shapes=((2048, 3, 49, 64), (512, 6, 49, 16), (128, 12, 49, 4), (32, 24, 49, 1), (8192, 3, 49, 64)),
    from_activation=_from_activation)]
