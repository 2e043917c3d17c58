"""gpudiag's version, in a module of its own: the stages that record it (the run database, the
report) import it from here, not from the package (whose ``__init__`` reaches up to the library)."""

__version__ = "0.1.0"
