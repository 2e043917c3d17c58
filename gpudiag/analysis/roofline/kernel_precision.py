"""The math path of a GEMM or convolution kernel read from its name, for captures with neither op
shapes nor Nsight Compute counters (an export made without gpudiag, or a whole-capture inference run
without a detail step): fp32 on SIMT cores, TF32, fp16 or bf16 on tensor cores, or FP8.

One data table, :data:`NAME_MATH_PATHS`, first match wins, matched case-insensitively against the
demangled kernel name. Every pattern is backed by names recorded in real exports (tests/fixtures,
examples/, H100/H200, cuBLAS 13, cuDNN 9, CUTLASS 2.x/3.x; tests/analysis/roofline/test_kernel_precision.py lists them):

- cuBLASLt ``nvjet_[sm90_]XYZ_...``: X is the input type; ``tst``/``tss`` in every bf16 capture,
  ``hsh`` in an fp16 one (``tiny_gemm_gelu``: ``c10::Half`` elementwise kernels around it);
- cuBLAS/cuDNN ``sm80_xmma_*`` / ``sm90_xmma_*``: the type list (``f32f32_f32f32_f32`` with
  ``ffma``: fp32 SIMT; ``bf16bf16_bf16f32``: bf16 tensor cores);
- CUTLASS ``cutlass_80_simt_sgemm`` (fp32 SIMT), ``cutlass_75_tensorop_bf16_s1688gemm_bf16``,
  ``cutlass_75_wmma_tensorop_bf16_s161616gemm`` (bf16 tensor cores); ``tensorop``/``hmma``/
  ``h1688``/``s16816`` without a type name: fp16 tensor cores;
- cuDNN ``precomputed_convolve_sgemm<__nv_bfloat16, ...>``: the template type wins over "sgemm";
- cuBLAS ``gemmSN_*_kernel<float, ..., cublasGemvTensorStridedBatched<const T>>``: T.
"""

from __future__ import annotations

import re

import pandas as pd

from gpudiag.analysis.attribution.families import per_distinct

NAME_MATH_PATHS: tuple[tuple[str, str], ...] = (
    (r"e4m3|e5m2|fp8", "fp8"),
    (r"tf32", "tf32"),
    (r"bf16|bfloat16|nvjet_(?:sm\d+_)?t[a-z]{2}_", "bf16"),
    (r"f16f16|fp16|_f16_|hmma|h1688|h16816|c10::half|__half|nvjet_(?:sm\d+_)?h[a-z]{2}_", "fp16"),
    (r"tensorop|s1688|s16816|wgmma|wmma", "fp16"),  # tensor-core kernels naming no input type
    (r"sgemm|ffma|f32f32|gemmsn_\w+_kernel<float", "fp32"),
)
_COMPILED = tuple((re.compile(p, re.IGNORECASE), path) for p, path in NAME_MATH_PATHS)


def math_path_from_name(name: str) -> str | None:
    """The math path of a contraction kernel named ``name`` (bf16, fp16, tf32, fp32, fp8), or None
    when the name says nothing about it."""
    text = str(name)
    return next((path for pattern, path in _COMPILED if pattern.search(text)), None)


def math_paths_from_names(names: pd.Series) -> pd.Series:
    """:func:`math_path_from_name` of each name (same index), each distinct name matched once."""
    unique = {n: math_path_from_name(n) for n in names.dropna().unique()}
    return names.map(unique).astype(object)  # a dictionary-encoded name column maps to codes: back to values


# Kernels that run on the SIMT (CUDA) cores whatever their data type: cuDNN's fp32-accumulating
# direct and implicit-GEMM convolutions (``convolve_common_engine_float_NHWC<__nv_bfloat16>``,
# ``precomputed_convolve_sgemm<__nv_bfloat16>``: a 3-channel stem, an odd-shaped convolution),
# CUTLASS ``simt``, cuBLAS ``ffma``/``f32f32_f32f32``. Every such kernel Nsight Compute measured in
# tests/fixtures/roofline48 (H200, 2026-11-28: 24 launches, 6 names) did 0 tensor-core FLOPs.
SIMT_KERNEL = re.compile(r"sgemm|simt|ffma|f32f32_f32f32|convolve_common_engine_float", re.IGNORECASE)


def simt_math_path(names: pd.Series, paths: pd.Series) -> pd.Series:
    """``paths`` (the math path an op's dtype gives: bf16, fp16, tf32, fp8, fp32; same index as
    ``names``), with a tensor-core path replaced by fp32 where the kernel's name shows it runs on the
    SIMT cores (:data:`SIMT_KERNEL`): a bf16 convolution cuDNN runs as an ``sgemm`` is held to the
    fp32 roof, as Nsight Compute holds it (:func:`gpudiag.sources.ncu.math_path`)."""
    simt = per_distinct(names, lambda n: bool(SIMT_KERNEL.search(str(n))), False, bool)
    return paths.where(~(simt & paths.isin(["bf16", "fp16", "tf32", "fp8"]).to_numpy()), "fp32")
