"""``gpudiag kernels``: the bundled reference fused kernels."""

from __future__ import annotations

import json

import click

from gpudiag.cli.errors import UserError


@click.group()
def kernels() -> None:
    """Reference fused kernels (Triton) for the fusion candidates gpudiag finds."""


@kernels.command("list")
def list_kernels() -> None:
    """List the reference kernels, the op chains they replace and the --shape each bench takes.

    \b
    Example:
        gpudiag kernels list
    """
    from gpudiag.analysis.fusion.dataflow import REFERENCE_PATTERNS

    try:
        from gpudiag.fused.registry import kernels as registry

        shapes = {name: k.shape_doc for name, k in registry().items()}
    except ImportError:  # listing needs no Triton
        shapes = {}
    for name, pattern in REFERENCE_PATTERNS:
        click.echo(f"{name:25s} --shape {shapes.get(name, '?'):22s} {pattern}")


@kernels.command("bench")
@click.argument("name")
@click.option("--shape", "shapes", multiple=True,
              help="Shape to time (repeatable), e.g. your recorded activation shape; ROWS,COLS for row-wise "
                   "kernels, see 'gpudiag kernels list' for the others.")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16", show_default=True)
@click.option("--backward", is_flag=True, help="Time forward + backward.")
@click.option("--json", "as_json", is_flag=True, help="Print the measurements as JSON.")
def bench_cmd(name: str, shapes: tuple[str, ...], dtype: str, backward: bool, as_json: bool) -> None:
    """Time NAME on this GPU against the eager PyTorch chain and torch.compile of it, checking outputs.

    \b
    Example:
        gpudiag kernels bench rms_norm --shape 32768,1024 --backward

    Without --shape, the kernel's first benchmark shape is timed.
    """
    try:
        import torch

        from gpudiag.fused.bench import bench
        from gpudiag.fused.registry import kernels as registry

        available = registry()
    except ImportError as exc:
        raise UserError(f"gpudiag kernels needs PyTorch and Triton on the GPU machine ({exc}): pip install torch triton") from None
    if name not in available:
        raise UserError(f"no reference kernel {name!r}; available: {', '.join(sorted(registry()))}")
    kernel = available[name]
    shapes = shapes or (",".join(map(str, kernel.bench_shapes[0])),)
    # "WINDOWS,HEADS,N[,NW]": the dimensions in brackets may be left out
    required, optional = kernel.shape_doc.split("[")[0].strip(",").split(","), kernel.shape_doc.count("[")
    try:
        parsed = [tuple(int(v) for v in s.split(",")) for s in shapes]
    except ValueError:
        parsed = []
    if not parsed or any(not len(required) <= len(p) <= len(required) + optional or min(p) < 1 for p in parsed):
        raise UserError(f"--shape {', '.join(shapes)}: {name} takes {kernel.shape_doc}, "
                        f"e.g. --shape {','.join(map(str, kernel.bench_shapes[0]))}")
    if not torch.cuda.is_available():
        raise UserError("gpudiag kernels bench needs a CUDA GPU: run it on the GPU machine")
    try:
        results = [bench(name, shape, getattr(torch, dtype), backward) for shape in parsed]
    except ValueError as exc:  # the kernel refuses the shape (e.g. a Swin grid that is not whole windows)
        raise UserError(f"--shape {', '.join(shapes)}: {exc}") from None
    except torch.OutOfMemoryError:
        raise UserError(f"--shape {', '.join(shapes)}: out of GPU memory; try a smaller shape") from None
    if as_json:
        click.echo(json.dumps(results, indent=1))
        return
    for r in results:
        compiled = f"{r['compiled_ms']:.3f} ms" if r["compiled_ms"] else "–"
        bandwidth = f"{r['fused_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s; " if r["fused_bandwidth_bytes_per_s"] else ""
        click.echo(f"{name} {'x'.join(map(str, r['shape']))} {r['dtype']}{' fwd+bwd' if backward else ''}: eager {r['eager_ms']:.3f} ms, "
                   f"fused {r['fused_ms']:.3f} ms, torch.compile {compiled}; {bandwidth}output error {r['max_rel_error']:.1e}")
