"""Reference kernels by the pattern name the fusion-candidate matcher uses
(:data:`gpudiag.analysis.fusion.REFERENCE_PATTERNS`): the fused function, the PyTorch reference
chain, and an input maker for tests and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class ReferenceKernel:
    name: str
    fused: Callable
    reference: Callable
    make_inputs: Callable  # (rows, cols, dtype, device, generator) -> tuple of tensors


def _bias_gelu_inputs(rows, cols, dtype, device, gen):
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    b = torch.randn(cols, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    return x, b


def _rms_norm_inputs(rows, cols, dtype, device, gen):
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(cols, generator=gen, dtype=torch.float32)).to(device=device, dtype=dtype)
    return x, w


def _glu_inputs(rows, cols, dtype, device, gen):
    a = torch.randn(rows, cols, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    b = torch.randn(rows, cols, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    return a, b


def _add_ln_inputs(rows, cols, dtype, device, gen):
    x, r = (torch.randn(rows, cols, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(cols, generator=gen, dtype=torch.float32)).to(device=device, dtype=dtype)
    b = (0.1 * torch.randn(cols, generator=gen, dtype=torch.float32)).to(device=device, dtype=dtype)
    return x, r, w, b


def kernels() -> dict[str, ReferenceKernel]:
    """The available reference kernels (imports Triton). A kernel may return a tuple of outputs."""
    from gpudiag.kernels.ops import add_layer_norm, bias_gelu, glu, rms_norm

    return {
        "bias_gelu": ReferenceKernel("bias_gelu", bias_gelu.bias_gelu, bias_gelu.reference, _bias_gelu_inputs),
        "rms_norm": ReferenceKernel("rms_norm", rms_norm.rms_norm, rms_norm.reference, _rms_norm_inputs),
        "swiglu": ReferenceKernel("swiglu", glu.swiglu, glu.reference_swiglu, _glu_inputs),
        "geglu": ReferenceKernel("geglu", glu.geglu, glu.reference_geglu, _glu_inputs),
        "add_layer_norm": ReferenceKernel("add_layer_norm", add_layer_norm.add_layer_norm, add_layer_norm.reference,
                                          _add_ln_inputs),
    }
