"""Timing of a reference kernel against the eager PyTorch chain it replaces and ``torch.compile`` of
that chain, on the present GPU, at given shapes (``gpudiag kernels bench`` and
``benchmarks/bench_kernels.py``).

Times are ``triton.testing.do_bench`` medians (CUDA events, after warm-up; METHOD.md). Bytes are the
fused kernel's minimum traffic (inputs read once, outputs written once); achieved bandwidth is
reported as a share of the measured copy bandwidth when given.
"""

from __future__ import annotations

import torch


def _bytes(tensors, outputs) -> int:
    return sum(t.numel() * t.element_size() for t in (*tensors, *outputs))


def bench(name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.bfloat16, backward: bool = False,
          copy_bytes_per_s: float | None = None, with_compile: bool = True) -> dict:
    """One measurement at ``shape`` (the kernel's ``shape_doc``, e.g. (rows, cols)): eager_ms,
    fused_ms, compiled_ms (None if skipped or failed), fused_bytes, fused_bandwidth_bytes_per_s,
    percent_of_copy_bandwidth (forward only; None with ``backward``), max_rel_error (fused vs the
    exact reference, the worst of the outputs), speedup_vs_eager, speedup_vs_compile.
    Raises RuntimeError without a CUDA GPU, KeyError for an unknown kernel, ValueError for a shape
    the kernel refuses (e.g. a Swin grid that is not whole windows)."""
    import triton.testing

    from gpudiag.fused.registry import kernels

    if not torch.cuda.is_available():
        raise RuntimeError("gpudiag kernels bench needs a CUDA GPU")
    kernel = kernels()[name]
    gen = torch.Generator().manual_seed(sum(shape) * 131 + len(shape))
    inputs = kernel.make_inputs(tuple(shape), dtype, "cuda", gen)
    if backward:  # integer inputs (labels, indices) take no gradient
        inputs = [t.requires_grad_(True) if t.is_floating_point() else t for t in inputs]
    differentiable = [t for t in inputs if t.requires_grad]

    def outputs(value):
        return list(value) if isinstance(value, tuple) else [value]

    grads = [torch.randn_like(o) for o in outputs(kernel.reference(*inputs))] if backward else []

    def run(fn):
        def step():
            y = outputs(fn(*inputs))
            if backward:
                torch.autograd.grad(y, differentiable, grads)
            return y
        return step

    eager, fused = run(kernel.reference), run(kernel.fused)
    with torch.no_grad():
        y_ref, y = outputs((kernel.exact_reference or kernel.reference)(*inputs)), outputs(kernel.fused(*inputs))
    error = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(y, y_ref))
    eager_ms = triton.testing.do_bench(eager, warmup=25, rep=100, return_mode="median")
    fused_ms = triton.testing.do_bench(fused, warmup=25, rep=100, return_mode="median")
    compiled_ms = None
    if with_compile:
        try:
            # A fresh Dynamo cache per measurement: compiled code is cached on the function, and past
            # the recompile limit (8 shapes) Dynamo silently runs eager, which would be timed as "compile".
            torch._dynamo.reset()
            compiled = run(torch.compile(kernel.reference, dynamic=False))
            compiled()
            compiled_ms = triton.testing.do_bench(compiled, warmup=25, rep=100, return_mode="median")
        except Exception:  # noqa: BLE001 - report the run without the compiled column
            compiled_ms = None
    # Minimum traffic is known for the forward (inputs + outputs once); with the backward it depends
    # on the kernel (what is recomputed, what is saved), so no bandwidth is claimed for it.
    moved = None if backward else _bytes(inputs, y)
    bandwidth = moved / (fused_ms * 1e-3) if moved else None
    return {"kernel": name, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."), "backward": backward,
            "eager_ms": eager_ms, "fused_ms": fused_ms, "compiled_ms": compiled_ms, "fused_bytes": moved,
            "fused_bandwidth_bytes_per_s": bandwidth,
            "percent_of_copy_bandwidth": 100 * bandwidth / copy_bytes_per_s if copy_bytes_per_s and bandwidth else None,
            "max_rel_error": error, "speedup_vs_eager": eager_ms / fused_ms,
            "speedup_vs_compile": compiled_ms / fused_ms if compiled_ms else None}
