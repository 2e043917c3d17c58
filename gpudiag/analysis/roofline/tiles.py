"""What a GEMM kernel's name says about its problem, for classes without shapes (issue 48).

An nsys export made without gpudiag holds no op shapes: a contraction kernel (GEMM, convolution,
attention) has only its name, launch configuration and duration. Most GEMM libraries name their
kernels by the CTA tile they compute:

- cuBLASLt's ``nvjet`` kernels: ``nvjet_sm90_tst_96x384_64x3_1x2_h_bz_coopA_bias_TNN`` (tile 96x384,
  K step 64, 3 stages, cluster 1x2, a bias epilogue);
- cuBLAS/xmma: ``sm80_xmma_gemm_f32f32_..._tilesize128x128x8_stage3_...``; implicit-GEMM convolutions
  the same (``..._fprop_implicit_gemm_..._tilesize64x64x64...``);
- CUTLASS: ``cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x10_nn_align8``,
  ``cutlass_80_simt_sgemm_128x32_8x5_nn_align1``; cuBLAS's ``ampere_bf16_s16816gemm_bf16_128x128_ldg8_...``.

The tile bounds the arithmetic intensity only one way. A GEMM of M x N x K elements of ``e`` bytes
does 2MNK FLOP and moves at least e(MK + KN + MN) bytes, so its intensity is below
(2/e) min(M, N, K) FLOP/byte. The libraries give a tile a side under 64 only when the problem's side is
that small (a wider tile would compute padding), so such a GEMM's intensity is bounded by its
small side: a few hundred FLOP/byte at most, near or below the bf16/fp16 tensor ridge (H100/H200:
~206). On the fixtures the highest measured was 190 FLOP/byte (a 64x24 tile of a decode's
prefill), the rest under 90. A large tile says nothing of K (persistent kernels launch one CTA per SM,
so the grid does not count tiles either): those GEMMs stay compute-bound by family, with a low
confidence, and ``--ncu`` settles them.

Measured on the issue 48 fixtures (tests/fixtures/roofline48, ncu on an H200, 2026-11-28;
docs/roofline_gemm.md): of the tensor-core GEMM configurations ncu profiled whose tile has a side
under 64, all but one (a 12.9 us CUTLASS wmma kernel of Swin-V2's) are bandwidth-bound by ncu.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpudiag.analysis.attribution.families import CONTRACTION_FAMILIES, per_distinct
from gpudiag.analysis.roofline.kernel_precision import SIMT_KERNEL

SMALL_TILE_SIDE = 64  # a tile side under this is a small problem side (module docstring)

# Ordered: the first pattern that matches names the tile (M side, N side).
_TILE_PATTERNS = (
    re.compile(r"tilesize(\d+)x(\d+)x\d+"),                   # cuBLAS/xmma, cuDNN implicit GEMM
    re.compile(r"nvjet_\w*?_(\d+)x(\d+)_\d+x\d+_\d+x\d+"),    # cuBLASLt nvjet: tile_kstep x stages_cluster
    re.compile(r"gemm\w*?_(\d+)x(\d+)_(?:\d+x\d+_)?(?:ldg|nn|nt|tn|tt)"),  # CUTLASS, cuBLAS ampere_*
)

# heuristic bases, by code: what the class of a kernel without shapes or ncu rests on
BASES = ["family", "small tile", "large tile", "no tile", "depthwise", "attention product", "Triton template"]

# Inductor's Triton GEMM templates (triton_tem_fused_..._mm_...): no tile in the name, and nothing in an
# export tells their K (docs/roofline_gemm.md, "Triton GEMMs": one config on one output, K = 64 and 512
# launched alike, opposite classes by ncu). Compute-bound by family, with their own, lower confidence.
_TRITON_TEMPLATE = re.compile(r"^triton_tem_")

# Depthwise convolutions (one input and one output channel per group): PyTorch's
# conv_depthwise2d/3d kernels, cuDNN's runtime-compiled ``conv2d_c1_k1_*`` (C=1, K=1 per group; on
# EfficientNet-B0 their ncu FLOPs are 2 x 3 x 3 or 2 x 5 x 5 per output element of its depthwise
# layers). Each output does 2RS FLOP and needs at least its own input element and itself: at most
# RS/2 FLOP/byte for 2-byte data (4.5 for 3x3, 12.5 for 5x5), under the SIMT fp32 ridge (~14 on
# the H200) they run on; ncu measured 2-6 FLOP/byte.
_DEPTHWISE = re.compile(r"depthwise|dwconv|conv2d_c1_k1", re.IGNORECASE)


def gemm_tile(name: str) -> tuple[int, int] | None:
    """(tile M side, tile N side) in elements, read from a GEMM or implicit-GEMM kernel's name,
    or None when the name states no tile (Triton, flash attention, cuDNN runtime-fused kernels)."""
    for pattern in _TILE_PATTERNS:
        if m := pattern.search(name):
            return int(m.group(1)), int(m.group(2))
    return None


# The K step of a tile: nvjet's tile_kstep (``_256x128_64x4_``: 64), cuBLAS/xmma's tilesizeMxNxK,
# CUTLASS's tile_kstep x stages.
_K_STEP_PATTERNS = (re.compile(r"nvjet_\w*?_\d+x\d+_(\d+)x\d+_\d+x\d+"), re.compile(r"tilesize\d+x\d+x(\d+)"),
                    re.compile(r"cutlass\w*?gemm\w*?_\d+x\d+_(\d+)x\d+_(?:nn|nt|tn|tt)"))  # CUTLASS: _64x64_32x10_nn


def gemm_k_step(name: str) -> float:
    """The K step (elements) a GEMM kernel's name states, NaN where it states none. The kernel
    computes K rounded up to it: Nsight Compute counts the FLOPs of the padding too (H200,
    tests/fixtures/roofline48/conv: 1x1 convolutions of 16, 24, 32, 40 and 48 input channels run
    by nvjet kernels with a K step of 64 measured 4, 2.67, 2, 1.6 and 1.33 times their 2MNK)."""
    for pattern in _K_STEP_PATTERNS:
        if m := pattern.search(name):
            return float(m.group(1))
    return np.nan


# fp32 SIMT GEMMs: their ridge (H200: ~14 FLOP/byte) is under the bound a small tile gives
# (2/4 x 64 = 32 FLOP/byte for 4-byte types), so a small tile proves nothing there
_SIMT = SIMT_KERNEL


def _depthwise(name: str) -> bool:
    return bool(_DEPTHWISE.search(name))


def _tile_side(name: str) -> float:
    tile = None if _SIMT.search(name) else gemm_tile(name)
    return float(min(tile)) if tile else np.nan


def heuristic_basis(names: pd.Series, family: pd.Series, attention_product: np.ndarray | None = None) -> pd.DataFrame:
    """Per kernel (aligned with ``names``): ``tile_side`` (the smaller side of the tile its name
    states, elements; NaN without one or for an fp32 SIMT GEMM), ``basis`` (a code into :data:`BASES`: ``family`` for a
    kernel outside the contraction families, ``depthwise``, ``small tile``, ``attention product``
    (``attention_product``: :func:`gpudiag.analysis.roofline.attention_products.attention_products`),
    ``large tile``, ``Triton template`` or ``no tile`` for a contraction) and ``bandwidth`` (True where the basis says
    bandwidth-bound: non-contractions, depthwise convolutions, small tiles and attention products)."""
    contraction = family.isin(CONTRACTION_FAMILIES).to_numpy()
    side = np.where(contraction, per_distinct(names, _tile_side, np.nan, float), np.nan)
    small = side < SMALL_TILE_SIDE
    depthwise = contraction & per_distinct(names, _depthwise, False, bool)
    product = contraction & ~small & (attention_product if attention_product is not None else False)
    template = contraction & per_distinct(names, lambda n: bool(_TRITON_TEMPLATE.match(n)), False, bool)
    no_tile = np.where(template, 6, 3)
    basis = np.where(~contraction, 0, np.where(depthwise, 4, np.where(small, 1, np.where(
        product, 5, np.where(np.isnan(side), no_tile, 2)))))
    return pd.DataFrame({"tile_side": side, "basis": basis.astype(np.int8),
                         "bandwidth": ~contraction | small | depthwise | product}, index=names.index)

# Per basis (BASES order): the share of kernel time on which a class resting on it agreed with
# Nsight Compute over the committed ncu fixtures of issue 48 (ten workloads; benchmarks/roofline_accuracy.py
# --by-basis; docs/roofline_gemm.md, H200, 2026-11-29; ncu rows paired by ncu_pairing). A prior, not a
# probability for one kernel. family 303.9 ms, small tile 1.1 ms, large tile 34.5 ms, no tile 27.1 ms,
# depthwise 1.9 ms, attention product 14.9 ms, Triton template 4.1 ms (one fixture: triton_gemm)
BASIS_CONFIDENCE = [0.996, 1.0, 0.834, 0.984, 1.0, 1.0, 0.837]
