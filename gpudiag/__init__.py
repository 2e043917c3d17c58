"""gpudiag: GPU profiling and bottleneck diagnosis for PyTorch.

The only name a user's script may need is :func:`step`, which marks the end of one training or
inference step when step boundaries cannot be detected from ``optimizer.step()``.

In a notebook, ``gpudiag.load(path)`` analyses a capture and returns a :class:`gpudiag.api.Run`
with its tables as DataFrames, and ``gpudiag.profile(script)`` profiles a script and returns its Run
(docs/api.md). They are imported on first use, so ``import gpudiag`` (and the command line's
start-up) stays light.
"""

from gpudiag.version import __version__

__all__ = ["__version__", "step", "load", "profile", "Run", "UserError"]


def step(samples: int | None = None) -> None:
    """Mark the end of one step (training or inference iteration) for ``gpudiag profile``.
    ``samples``: how many samples the step processed (else gpudiag takes the first input's batch
    dimension), used to compare an ``args:`` trial per sample.

    Outside ``gpudiag profile`` this does nothing, so scripts may call it unconditionally.
    """
    from gpudiag.capture import instrument

    instrument.user_step(samples)


def __getattr__(name: str):
    """``gpudiag.load``, ``gpudiag.profile``, ``gpudiag.Run``, ``gpudiag.UserError`` and ``gpudiag.api``
    itself, imported on first use (the library imports pandas)."""
    if name == "UserError":
        from gpudiag.errors import UserError

        return UserError
    if name in ("load", "profile", "Run", "api"):
        # an import statement, so that the import graph (tests/test_layout.py) sees the package
        # face reach the library; the stages import gpudiag.version, not this package
        import gpudiag.api  # binds the package; its submodule is then an attribute (no __getattr__ loop)

        api = gpudiag.api
        return api if name == "api" else getattr(api, name)
    raise AttributeError(f"module 'gpudiag' has no attribute {name!r}")
