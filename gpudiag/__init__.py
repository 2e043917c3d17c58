"""gpudiag: GPU profiling and bottleneck diagnosis for PyTorch.

The only name a user's script may need is :func:`step`, which marks the end of one training or
inference step when step boundaries cannot be detected from ``optimizer.step()``.

In a notebook, ``gpudiag.load(path)`` analyses a capture and returns a :class:`gpudiag.api.Run`
with its tables as DataFrames (docs/api.md). It is imported on first use, so ``import gpudiag``
(and the command line's start-up) stays light.
"""

__version__ = "0.1.0"


def step(samples: int | None = None) -> None:
    """Mark the end of one step (training or inference iteration) for ``gpudiag profile``.
    ``samples``: how many samples the step processed (else gpudiag takes the first input's batch
    dimension), used to compare an ``args:`` trial per sample.

    Outside ``gpudiag profile`` this does nothing, so scripts may call it unconditionally.
    """
    from gpudiag.capture import instrument

    instrument.user_step(samples)


def __getattr__(name: str):
    """``gpudiag.load``, ``gpudiag.Run`` and ``gpudiag.api`` itself (with ``UserError``), imported on
    first use (the library imports pandas)."""
    if name in ("load", "Run", "api"):
        import importlib

        # by name, not an import statement: the analysis stages import gpudiag (for __version__), and
        # the library above them must not count as their dependency (tests/test_layout.py)
        api = importlib.import_module("gpudiag.api")
        return api if name == "api" else getattr(api, name)
    raise AttributeError(f"module 'gpudiag' has no attribute {name!r}")
