"""The score and value GEMMs of eager attention, found next to its softmax, for classes without shapes
(issue 48).

Eager attention (``softmax(Q K^T / sqrt(d)) V``, as DeBERTa, Llama with ``attn_implementation="eager"``
or Swin run it) launches its products as cuBLAS GEMMs with large tiles on a persistent grid, so neither
the kernel's name nor its grid tells their shape. The softmax kernel between them does. Every product
of an attention head has the head dimension ``d`` as one of its sides (``Q K^T``: K = d; ``P V``: N = d;
the backward's ``dO V^T``, ``P^T dO``, ``dS K``, ``dS^T Q`` likewise), so with 2-byte operands its
intensity is under ``d`` FLOP/byte: 2MNK over at least 2(MK + KN + MN) bytes is below min(M, N, K) when
one side is small. Heads are 32-128 wide in the models people train (BERT, GPT-2, DeBERTa, ViT, Swin:
32-64; Llama, Mistral: 128), under the bf16/fp16 tensor ridge of the GPUs gpudiag knows (H100/H200:
~206 FLOP/byte, A100: ~153): such a GEMM is bandwidth-bound. A head of 256 (Gemma) would break this
on an A100; the basis's confidence, measured, says how far it held.

Which GEMMs: in the order one stream runs its GEMM kernels and its attention softmaxes, a GEMM right
before or right after a softmax, with at most :data:`MAX_BETWEEN` other launches between them (the
scaling, masking, position terms, dropout and casts of attention: 2-21 on the fixtures; an MoE router's
softmax is followed by top-k, sort and index kernels, 65 and more launches before the next GEMM); then
the GEMMs linked to such a neighbour the same way through launches of configurations (name, grid,
block) that are neighbours somewhere (DeBERTa's position terms, the backward's four products), up to
the first GEMM of another configuration (GEMMs with a bias epilogue are passed over). A configuration
is not a product everywhere: GPT-2's ``Q K^T`` kernel also runs an MLP GEMM of its backward (19 GFLOP,
compute-bound by its shapes) 19-42 launches from any softmax, behind the attention projections' GEMMs.

Left out: GEMMs with a bias epilogue (a Linear layer: attention products have none), fp32 SIMT GEMMs
(their ridge, ~14 FLOP/byte, is under the bound), and softmaxes that are not attention's: log-softmax
(a loss), and any with fewer than :data:`ROWS_PER_ELEMENT` rows per row element (a classifier head's softmax over its classes; attention
has ``batch x heads`` rows per key position).

Measured on the issue 48 fixtures (ncu on an H200, 2026-11-29; docs/roofline_gemm.md): DeBERTa (the
encoder, built on) and, captured afterwards, Llama, BERT and GPT-2 training steps with eager attention.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpudiag.analysis.attribution.families import per_distinct
from gpudiag.analysis.roofline.kernel_precision import SIMT_KERNEL

# PyTorch's softmax kernels (aten/src/ATen/native/cuda/PersistentSoftmax.cuh, SoftMax.cu):
# softmax_warp_forward/backward<input_t, output_t, acc_t, log2_elements, is_log_softmax, is_masked>,
# rows of at most 2^log2_elements, launched as dim3(32, warps_per_block) threads and
# ceil(rows / (warps_per_block x WARP_BATCH)) blocks, WARP_BATCH 2 for rows of at most 128 elements, else
# 1; rows over 1024 elements: cunn_SoftMaxForward/Backward, one block per row, with a
# (Log)SoftMax(Forward|Backward)Epilogue.
_WARP_SOFTMAX = re.compile(r"softmax_warp_(?:forward|backward)<[^<>]*?\(int\)(\d+),\s*\(bool\)0")
_BLOCK_SOFTMAX = re.compile(r"cunn_SoftMax(?:Forward|Backward)\w*<.*(?<!Log)SoftMax(?:Forward|Backward)Epilogue")
_BLOCK_SOFTMAX_MIN_ELEMENTS = 1025  # rows of up to 1024 elements take the warp kernels
ROWS_PER_ELEMENT = 4  # attention: batch x heads rows per key position; a classifier: batch / classes
MAX_BETWEEN = 24  # launches between a product and its softmax (module docstring)
_BIAS = re.compile(r"bias", re.IGNORECASE)


def _softmax_row_elements(name: str) -> int:
    """A softmax kernel's row length in elements (an upper bound: the power of two a warp softmax's
    name states), -1 for a block softmax (rows over 1024 elements), 0 for any other kernel (a
    log-softmax included)."""
    if m := _WARP_SOFTMAX.search(name):
        return 2 ** int(m.group(1))
    if _BLOCK_SOFTMAX.search(name):
        return -1
    return 0


def _attention_softmax(kernels: pd.DataFrame) -> np.ndarray:
    """True per kernel for a softmax over attention scores: its rows (blocks x rows per block)
    number at least :data:`ROWS_PER_ELEMENT` per row element."""
    length = per_distinct(kernels["name"], _softmax_row_elements, 0, np.int64)
    if not (length != 0).any():
        return np.zeros(len(kernels), dtype=bool)
    one = pd.Series(1, index=kernels.index)  # a frame without launch dimensions: one block, one warp
    blocks = kernels.get("grid_x", one).fillna(1).to_numpy(np.int64)
    warps = kernels.get("block_y", one).fillna(1).to_numpy(np.int64)
    per_warp = np.where((length > 0) & (length <= 128), 2, 1)
    rows = np.where(length > 0, blocks * warps * per_warp, blocks)  # block softmax: one block a row
    elements = np.where(length > 0, length, _BLOCK_SOFTMAX_MIN_ELEMENTS)
    return (length != 0) & (rows >= ROWS_PER_ELEMENT * elements)


def _product_candidate(name: str) -> bool:
    return not (SIMT_KERNEL.search(name) or _BIAS.search(name))


def attention_products(kernels: pd.DataFrame, family: pd.Series, config_key: pd.Series) -> np.ndarray:
    """True per kernel (aligned with ``kernels``) for a GEMM taken to be an attention product (module
    docstring). ``kernels`` needs name, grid_x and block_y (taken as 1 where missing) and, to order
    launches, stream_id and start_ns (ns; without them the rule finds nothing); ``family`` its kernel
    families; ``config_key`` one integer per name and launch configuration. 1 M kernels: 0.05 s
    (this CPU machine, 2026-11-29; docs/notes/measurements.md)."""
    if not {"stream_id", "start_ns"} <= set(kernels.columns) or kernels.empty:
        return np.zeros(len(kernels), dtype=bool)
    gemm = (family == "gemm").to_numpy() & per_distinct(kernels["name"], _product_candidate, False, bool)
    softmax = _attention_softmax(kernels)
    if not (softmax.any() and gemm.any()):
        return np.zeros(len(kernels), dtype=bool)
    stream = kernels["stream_id"].fillna(-1).to_numpy(np.int64)
    order = np.lexsort((kernels["start_ns"].to_numpy(np.int64), stream))
    rank = np.flatnonzero((gemm | softmax)[order])  # the events' places in the streams' launch order
    events = order[rank]  # the GEMMs and softmaxes, stream by stream, in launch order
    is_softmax, ev_stream = softmax[events], stream[events]
    same_as_previous = (ev_stream[1:] == ev_stream[:-1]) & (np.diff(rank) <= MAX_BETWEEN + 1)
    after = np.r_[False, is_softmax[:-1] & same_as_previous]
    before = np.r_[is_softmax[1:] & same_as_previous, False]
    neighbour = np.zeros(len(kernels), dtype=bool)
    neighbour[events[~is_softmax & (after | before)]] = True
    # the runs of launches of such configurations that reach a softmax: a neighbour's neighbours
    cfg = pd.factorize(config_key.to_numpy())[0]
    seed = np.bincount(cfg, weights=neighbour, minlength=cfg.max(initial=0) + 1) > 0
    valid = is_softmax | seed[cfg[events]]
    starts = np.r_[True, ~(valid[1:] & valid[:-1] & same_as_previous)]
    run = np.cumsum(starts) - 1
    reaches = np.bincount(run, weights=is_softmax) > 0
    product = np.zeros(len(kernels), dtype=bool)
    product[events[valid & ~is_softmax & reaches[run]]] = True
    return product
