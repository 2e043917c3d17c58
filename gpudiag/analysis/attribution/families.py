"""Kernel families from kernel names (the first-cut classifier and the gate group by them).

Patterns are matched in order, case-insensitively, on the demangled name. They cover the names
PyTorch's ATen, cuBLAS/cuBLASLt (incl. nvjet and CUTLASS sm90 kernels), cuDNN, FlashAttention and
Triton (Inductor) emit; anything else is ``other``. Collective-library kernels (NCCL/RCCL
``ncclDevKernel_*``/``ncclKernel_*``, MSCCL, NVSHMEM, vLLM's ``cross_device_reduce`` custom
all-reduce, PyTorch symmetric-memory all-reduce) are family ``communication``, matched first: their
names hold "Reduce" and would otherwise land in ``reduce``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd

FAMILY_PATTERNS: tuple[tuple[str, str], ...] = (
    ("communication", r"nccl|msccl|nvshmem|cross_device_reduce|(?:one|two)_shot_all_reduce|multimem_all_(?:reduce|gather)"),
    # An attention backward's helpers (FlashAttention-2's flash_bwd_dot_do_o_kernel and
    # flash_bwd_convert_dq_kernel; cuDNN's compute_dot_do_o_specialized, convert_dq_to_16bits and
    # fmha_reduce_head): rowsum(dO * O), the fp32 dQ cast to 16 bits, a sum over grouped heads.
    # None does the attention's matrix products (bandwidth-bound by ncu: tests/fixtures/roofline48/compiled/vit_compiled)
    ("reduce", r"dot_do_o|reduce_head"),
    ("copy", r"convert_dq"),
    ("attention", r"flash|fmha|attention|sdpa|mha_|_attn"),
    ("conv", r"conv(olution|_|\d)|implicit_gemm|winograd|fprop|dgrad|wgrad"),
    # cuBLASLt's split-K reduction sums the partial products a split-K GEMM wrote: no multiply-add of
    # its own (a compiled ViT's extern matmuls, tests/fixtures/roofline48/compiled: bandwidth-bound by ncu)
    ("reduce", r"splitk_?reduce"),
    # Inductor's Triton GEMM templates name the ops they fuse: triton_tem_fused__to_copy_addmm_t_3
    # (a cast, an addmm) is a GEMM, not a copy
    ("gemm", r"gemm|cutlass|cublas|nvjet|xmma|wgmma|sm\d+_xmma|matmul|_mma_|triton_tem_\w*?_(?:add|b|_scaled_)?mm(?:_|$)"),
    # not a bare "lamb": every ATen kernel name contains "lambda"
    ("optimizer", r"multi_tensor_apply|foreach|fused_adam|adamw?_|\blamb_|sgd_"),
    ("norm", r"layer_norm|layernorm|rms_?norm|batch_norm|batchnorm|group_norm|groupnorm|welford"),
    ("softmax", r"softmax"),
    ("reduce", r"reduce_kernel|reduction|reduce"),
    ("copy", r"copy|cat_|catarray|transpose|permute|index|gather|scatter|(?<!un)roll|memcpy|fill"),  # not "unrolled_"
    ("elementwise", r"elementwise|vectorized|unrolled|pointwise|triton_poi"),
)

_COMPILED = [(family, re.compile(pattern, re.IGNORECASE)) for family, pattern in FAMILY_PATTERNS]
# The patterns see a name's first SCAN_CHARS characters: their cost grows with the text (8 s for a
# 10 MB name, and a report classifies a name many times), while real names are short (the longest
# in the committed exports: 5815 characters); a longer name is damage, classified by its start.
SCAN_CHARS = 65_536

# Collective communication: outside the roofline (its time is link/peer bound, its small grids deliberate).
COMMUNICATION = "communication"

# Families whose kernels are tensor contractions (the compute-bound candidates).
CONTRACTION_FAMILIES = frozenset({"gemm", "conv", "attention"})


def family_of(name: str) -> str:
    """Family of one kernel name (see :data:`FAMILY_PATTERNS`), from its first :data:`SCAN_CHARS`
    characters."""
    text = (name or "")[:SCAN_CHARS]
    for family, pattern in _COMPILED:
        if pattern.search(text):
            return family
    return "other"


def per_distinct(values: pd.Series, fn: Callable, na_value: object = None, dtype: object = object) -> np.ndarray:
    """``fn`` of every value of ``values``, called once per distinct value (``na_value`` where a
    value is NULL): an array of ``dtype`` aligned with ``values``.

    Why: a step launches thousands of kernels of a few hundred long demangled names. pandas'
    factorize finds the distinct values in C; ``Series.map`` with a dict looks every row up
    through a Python object (:func:`families` of 1 M kernel names: 0.64 s with ``map``, 0.18 s
    with this; docs/notes/measurements.md, 2026-11-26). A dictionary-encoded ``values`` (the run's
    names) is not factorized again: ``fn`` of each category its rows use, looked up by their codes
    (5 M kernels: 14 calls took 0.74 s in factorize; docs/scale.md)."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        codes = values.cat.codes.to_numpy().astype(np.intp)  # -1 for a NULL: the last element below
        categories = values.cat.categories
        results = [na_value] * (len(categories) + 1)
        for i in np.flatnonzero(np.bincount(codes + 1, minlength=len(categories) + 1)[1:]):
            results[i] = fn(categories[i])
        return np.asarray(results, dtype=dtype)[codes]
    codes, uniques = pd.factorize(values)  # a NULL gets code -1: the last element below
    return np.asarray([*(fn(u) for u in uniques), na_value], dtype=dtype)[codes]


def families(names: pd.Series) -> pd.Series:
    """Family per kernel (same index as ``names``; a NULL name is matched as ""), computed once
    per distinct name."""
    return pd.Series(per_distinct(names.fillna(""), family_of), index=names.index)


# Functor or implementation names inside ATen's generic kernels' template arguments: they say what
# an "elementwise_kernel" actually computes. A word (a run of \w) ending in one of these suffixes
# names one, from its first ASCII letter or "_" on, with at least one character before the suffix.
_INNER_SUFFIXES = ("_kernel_cuda", "_functor", "Functor", "KernelImpl", "_kernel_impl", "Kernel", "_kernel", "_op")
_WORD = re.compile(r"\w+")
_NAME_START = re.compile(r"[A-Za-z_]")
_GENERIC = {"gpu_kernel_impl_nocast", "gpu_kernel_impl", "elementwise_kernel", "unrolled_elementwise_kernel",
            "vectorized_elementwise_kernel", "reduce_kernel", "func_wrapper_t", "ReduceOp"}
_DTYPES = (("BFloat16", "bf16"), ("Half", "fp16"), ("float", "fp32"), ("double", "fp64"))


def inner_names(name: str) -> Iterator[str]:
    r"""The functor or implementation names in ``name``, in order: what the regular expression
    ``([A-Za-z_]\w*?(?:SUFFIXES))\b`` finds, in time linear in the name's length (that expression
    retries from every letter of a long word without a suffix: time quadratic in its length,
    30 s for 40,000 letters, days for 10 MB)."""
    for word in _WORD.finditer(name):
        text = word.group()
        if not text.endswith(_INNER_SUFFIXES):
            continue
        start = _NAME_START.search(text)
        rest = text[start.start():] if start else ""
        if len(rest) > min(len(s) for s in _INNER_SUFFIXES if text.endswith(s)):
            yield rest


def kernel_label(name: str, short_name: str | None) -> str:
    """A readable label for a kernel: its short name plus, for ATen's generic kernels, the functor
    that says what it computes and the dtype, e.g. ``elementwise_kernel · direct_copy_kernel_cuda · bf16``."""
    short = short_name or (name or "")[:80]
    if not name or short not in _GENERIC:
        return short
    inner = next((m for m in inner_names(name) if m not in _GENERIC and m != short), None)
    dtype = next((label for token, label in _DTYPES if token in name), None)
    return " · ".join(p for p in (short, inner, dtype) if p)
