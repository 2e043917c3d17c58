"""``gpudiag kernels``: the bundled reference fused kernels (the workflow is :mod:`gpudiag.app.kernels`)."""

from __future__ import annotations

import json

import click

from gpudiag.app import kernels as kernels_app


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
    for name, shape, pattern in kernels_app.list_kernels():
        click.echo(f"{name:25s} --shape {shape:22s} {pattern}")


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
    results = kernels_app.bench(name, shapes, dtype, backward)
    if as_json:
        click.echo(json.dumps(results, indent=1))
        return
    for r in results:
        compiled = f"{r['compiled_ms']:.3f} ms" if r["compiled_ms"] else "–"
        bandwidth = f"{r['fused_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s; " if r["fused_bandwidth_bytes_per_s"] else ""
        click.echo(f"{name} {'x'.join(map(str, r['shape']))} {r['dtype']}{' fwd+bwd' if backward else ''}: eager {r['eager_ms']:.3f} ms, "
                   f"fused {r['fused_ms']:.3f} ms, torch.compile {compiled}; {bandwidth}output error {r['max_rel_error']:.1e}")
