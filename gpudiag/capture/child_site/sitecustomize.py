"""gpudiag's start-up hook for the worker processes of a launched job (``torchrun``, DDP, FSDP).

``gpudiag profile -m torch.distributed.run …`` runs the launcher module under gpudiag's launcher,
which puts this folder first on the children's ``PYTHONPATH`` with ``GPUDIAG_CHILD_CONFIG`` set.
Python imports ``sitecustomize`` at start-up in every child interpreter; this one instruments a
process that is a rank (``RANK`` set by the launcher module) exactly as a single-process script is
instrumented (:mod:`gpudiag.capture.rank_hook`), after running the next ``sitecustomize`` on the
path, if any, so a user's own keeps working. Launchers are not patched.
"""

import os as _os


def _chain() -> None:
    """Import the next ``sitecustomize`` on the path (this one shadows it)."""
    import importlib.util
    import sys

    here = _os.path.dirname(_os.path.abspath(__file__))
    for entry in sys.path:
        if entry and _os.path.abspath(entry) != here:
            candidate = _os.path.join(entry, "sitecustomize.py")
            if _os.path.isfile(candidate):
                spec = importlib.util.spec_from_file_location("_gpudiag_next_sitecustomize", candidate)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                return


# the next sitecustomize first: a user's own runs before gpudiag instruments the process, as it would
# without gpudiag (and what it sets up, e.g. NVTX or environment, is what gpudiag then sees)
_chain()

if _os.environ.get("GPUDIAG_CHILD_CONFIG") and (_os.environ.get("RANK") is not None
                                               or _os.environ.get("GPUDIAG_CHILD_ANY")):
    try:
        from gpudiag.capture import rank_hook as _rank_hook

        _rank_hook.install_from_environment()
    except Exception as _exc:  # noqa: BLE001 - never break the user's process: say why, run uninstrumented
        import sys as _sys

        print(f"gpudiag: rank {_os.environ.get('RANK')} not instrumented: {_exc}", file=_sys.stderr)
