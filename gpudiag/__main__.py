"""``python -m gpudiag`` is the ``gpudiag`` command."""

from gpudiag.cli.main import cli

cli()
