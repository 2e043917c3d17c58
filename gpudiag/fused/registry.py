"""Reference kernels by the pattern name the fusion-candidate matcher uses
(:data:`gpudiag.analysis.fusion.dataflow.REFERENCE_PATTERNS`).

Each module in ``gpudiag/fused/ops`` declares ``KERNELS``, a list of :class:`ReferenceKernel`:
the fused function, the eager PyTorch chain it replaces, an input maker, and the shapes it is tested
and benchmarked at. The generic tests (tests/fused/test_fused_registry.py) and benchmarks
(benchmarks/bench_kernels.py) iterate over this registry, so a new kernel is covered by adding it
to :data:`OP_MODULES`.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Callable

import torch

# Modules under gpudiag.fused.ops that declare KERNELS.
OP_MODULES = ("bias_gelu", "rms_norm", "glu", "add_layer_norm", "swin_window", "bias_dropout_add", "softmax", "cross_entropy",
              "rope", "linear_cross_entropy")

# (rows, cols) test shapes for row-wise kernels: odd widths (49: a 7x7 window, 1000: ImageNet
# classes, 4097: one past a power of two), one element, and row counts that give a backward
# program several rows.
ROW_TEST_SHAPES = ((7, 49), (3, 1000), (2, 4097), (1, 1), (37, 49), (100, 130))
# (tokens, hidden) benchmark shapes: tokens 8k-64k x hidden 768-8192 (GPT-2 to LLaMA-70B widths).
TRANSFORMER_SHAPES = ((8192, 768), (8192, 3072), (32768, 1024), (16384, 4096), (65536, 768), (8192, 8192))


def rows_cols(dims: list[int]) -> tuple[int, int]:
    """A recorded activation shape as (rows = product of the leading dimensions, cols = the last)."""
    return math.prod(dims[:-1]), dims[-1]


@dataclass(frozen=True)
class ReferenceKernel:
    """One reference kernel.

    ``make_inputs(shape, dtype, device, generator)`` returns the tuple of tensors ``fused`` and
    ``reference`` take (shape as in ``shape_doc``). ``fused`` may return a tuple of outputs.
    ``exact_reference`` is what outputs are checked against when ``reference`` is random (dropout
    draws its own mask): the same math with the fused kernel's random numbers. ``from_activation``
    turns the chain's recorded first input shape into a ``shape`` (``gpudiag profile --verify``)."""

    name: str
    fused: Callable
    reference: Callable
    make_inputs: Callable
    shape_doc: str = "ROWS,COLS"
    test_shapes: tuple = ROW_TEST_SHAPES
    bench_shapes: tuple = TRANSFORMER_SHAPES
    exact_reference: Callable | None = None
    from_activation: Callable = rows_cols


def randn(shape, dtype, device, gen, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    """Reproducible normal values made on the CPU (same values on any device), cast to ``dtype``."""
    return (shift + scale * torch.randn(shape, generator=gen, dtype=torch.float32)).to(device=device, dtype=dtype)


def kernels() -> dict[str, ReferenceKernel]:
    """The available reference kernels by name (imports Triton)."""
    out: dict[str, ReferenceKernel] = {}
    for module in OP_MODULES:
        for kernel in importlib.import_module(f"gpudiag.fused.ops.{module}").KERNELS:
            out[kernel.name] = kernel
    return out
