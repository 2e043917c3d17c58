"""``gpudiag calibrate``: measure this GPU's copy bandwidth, matmul rates and launch cost."""

from __future__ import annotations

import json

import click

from gpudiag.app.calibrate import calibrate as calibrate_workflow


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
    entry, saved = calibrate_workflow(force, echo=(lambda _: None) if as_json else click.echo)
    if as_json:
        click.echo(json.dumps(entry, indent=1))
    elif saved is not None:
        click.echo(f"saved: {saved}")
    else:
        click.echo(f"cached calibration of {entry.get('gpu')} (driver {entry.get('driver_version')}); "
                   "--force measures again")
