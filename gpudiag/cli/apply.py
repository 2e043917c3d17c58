"""``gpudiag apply``: a verified patch written to your files (the workflow is :mod:`gpudiag.app.apply`)."""

from __future__ import annotations

from pathlib import Path

import click

from gpudiag.app import apply as apply_app


@click.command("apply")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.argument("change", required=False)
@click.option("--dry-run", is_flag=True, help="Print the diff and check it still applies; write nothing.")
def apply(run_dir: Path, change: str | None, dry_run: bool) -> None:
    """Apply the verified patch of CHANGE (default: the largest measured win's) from RUN_DIR to your files.

    gpudiag profile writes each measured win as RUN_DIR/changes/CHANGE.patch and verifies it by
    running the patched script. This command writes only a verified patch, only inside the
    script's folder, and refuses when a file changed since the run.

    \b
    Example:
        gpudiag apply gpudiag-runs/train-20261128-1200 --dry-run
        gpudiag apply gpudiag-runs/train-20261128-1200 channels-last
    """
    done = apply_app.apply(run_dir, change, dry_run)
    patch = done.patch
    if dry_run:
        click.echo(patch.diff, nl=False)
        state = (patch.verification or {}).get("status", "not verified")
        click.echo(f"{patch.change}: {state}; applies cleanly to {', '.join(str(p) for p in done.files)} (dry run)",
                   err=True)
        return
    v = patch.verification or {}
    ci = v.get("saving_ci_percent")
    saving = f" (verified: {v['saving_percent']:.1f} % [{ci[0]:.1f}, {ci[1]:.1f}])" if ci and v.get("saving_percent") else ""
    click.echo(f"applied {patch.change} to {', '.join(str(p) for p in done.files)}{saving}")
