"""The bundled reference fused kernels (``gpudiag kernels``): their list, and timing one on this GPU."""

from __future__ import annotations

from gpudiag.errors import UserError


def list_kernels() -> list[tuple[str, str, str]]:
    """(name, the --shape its bench takes or '?' without Triton, the op-chain pattern it replaces) per kernel."""
    from gpudiag.analysis.fusion.dataflow import REFERENCE_PATTERNS

    try:
        from gpudiag.fused.registry import kernels as registry

        shapes = {name: k.shape_doc for name, k in registry().items()}
    except ImportError:  # listing needs no Triton
        shapes = {}
    return [(name, shapes.get(name, "?"), pattern) for name, pattern in REFERENCE_PATTERNS]


def bench(name: str, shapes: tuple[str, ...], dtype: str, backward: bool) -> list[dict]:
    """Time kernel ``name`` at each of ``shapes`` ("ROWS,COLS" texts; none: its first benchmark
    shape) in ``dtype`` (bfloat16, float16, float32), forward or forward + ``backward``, against the
    eager chain and torch.compile (:func:`gpudiag.fused.bench.bench`'s dicts: eager_ms, fused_ms,
    compiled_ms, bandwidth, output error). Raises UserError without PyTorch, Triton or a GPU, for
    an unknown kernel, a shape it does not take, or one that does not fit in GPU memory."""
    try:
        import torch

        from gpudiag.fused.bench import bench as run_bench
        from gpudiag.fused.registry import kernels as registry

        available = registry()
    except ImportError as exc:
        raise UserError(f"gpudiag kernels needs PyTorch and Triton on the GPU machine ({exc}): pip install torch triton") from None
    if name not in available:
        raise UserError(f"no reference kernel {name!r}; available: {', '.join(sorted(registry()))}")
    kernel = available[name]
    shapes = shapes or (",".join(map(str, kernel.bench_shapes[0])),)
    parsed = _parsed_shapes(name, kernel, shapes)
    if not torch.cuda.is_available():
        raise UserError("gpudiag kernels bench needs a CUDA GPU: run it on the GPU machine")
    try:
        return [run_bench(name, shape, getattr(torch, dtype), backward) for shape in parsed]
    except ValueError as exc:  # the kernel refuses the shape (e.g. a Swin grid that is not whole windows)
        raise UserError(f"--shape {', '.join(shapes)}: {exc}") from None
    except torch.OutOfMemoryError:
        raise UserError(f"--shape {', '.join(shapes)}: out of GPU memory; try a smaller shape") from None


def _parsed_shapes(name: str, kernel, shapes: tuple[str, ...]) -> list[tuple[int, ...]]:
    """``shapes`` as integer tuples. Raises UserError unless each has the dimensions the kernel takes."""
    # "WINDOWS,HEADS,N[,NW]": the dimensions in brackets may be left out
    required, optional = kernel.shape_doc.split("[")[0].strip(",").split(","), kernel.shape_doc.count("[")
    try:
        parsed = [tuple(int(v) for v in s.split(",")) for s in shapes]
    except ValueError:
        parsed = []
    if not parsed or any(not len(required) <= len(p) <= len(required) + optional or min(p) < 1 for p in parsed):
        raise UserError(f"--shape {', '.join(shapes)}: {name} takes {kernel.shape_doc}, "
                        f"e.g. --shape {','.join(map(str, kernel.bench_shapes[0]))}")
    return parsed
