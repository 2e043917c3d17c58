"""``gpudiag calibrate``: measure this GPU's copy bandwidth, matmul rates and launch cost."""

from __future__ import annotations

import json

import click

from gpudiag.capture import calibrate as calib
from gpudiag.cli.errors import UserError


@click.command()
@click.option("--force", is_flag=True, help="Measure again even if this GPU and driver are cached.")
@click.option("--json", "as_json", is_flag=True, help="Print the calibration as JSON.")
def calibrate(force: bool, as_json: bool) -> None:
    """Measure the present GPU's ceilings; gpudiag profile then uses them instead of the datasheet.

    Copy bandwidth (bytes read + written), matmul rate per dtype (bf16, fp16, TF32, fp32, fp8 where
    supported) on random 8192x8192 data, and the host cost of one eager op launch; each the median of
    CUDA-event-timed repeats after warm-up. Cached per GPU and driver in ~/.cache/gpudiag.

    \b
    Example:
        gpudiag calibrate
        gpudiag calibrate --force --json
    """
    try:
        import torch
    except ImportError:
        raise UserError("gpudiag calibrate needs PyTorch with CUDA on the GPU machine: pip install torch") from None
    if not torch.cuda.is_available():
        raise UserError("no CUDA GPU visible to PyTorch: run gpudiag calibrate on the GPU machine")
    name = torch.cuda.get_device_name(0)
    cached = None if force else calib.lookup(name, calib.driver_version())
    entry = cached or calib.measure(echo=(lambda _: None) if as_json else click.echo)
    if cached is None:
        path = calib.save(entry)
        if not as_json:
            click.echo(f"saved: {path}")
    elif not as_json:
        click.echo(f"cached calibration of {name} (driver {entry.get('driver_version')}); --force measures again")
    if as_json:
        click.echo(json.dumps(entry, indent=1))
