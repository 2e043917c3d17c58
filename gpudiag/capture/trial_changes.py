"""The changes a trial applies inside the profiled process, found by name in a registry that
capture defines and the trials fill.

Why a registry. The changes belong to the trials (:mod:`gpudiag.trials.changes`), a layer above
capture: the trials' runner starts capture's launcher, so capture importing the trials would be an
arrow back up (and a circle between the two packages). Instead:

1. A module that has changes calls :func:`register` for each of them when it is imported
   (``gpudiag.trials.changes`` does, at its end).
2. The parent names that module in the run's config: ``CaptureConfig.change_modules``, a list of
   module paths, set with ``CaptureConfig.trial`` by the trials' runner
   (:func:`gpudiag.trials.changes.with_change`).
3. The changes act in the profiled process, so the registration must happen there too: the
   launcher (:mod:`gpudiag.capture.launch`) and each rank's start-up hook
   (:mod:`gpudiag.capture.rank_hook`, run by ``child_site/sitecustomize.py``) call :func:`install`,
   which first imports the named modules with ``importlib.import_module(path)``, then applies the
   change registered under ``CaptureConfig.trial``.

The module path is data read from the config at run time, not an import statement, so the import
graph (grimp, import-linter; tests/capture/test_capture_imports.py) has an arrow trials → capture and none
capture → trials.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Change:
    """One registered change. ``install(state)`` applies it in this process before the script runs
    (``state``: the :class:`~gpudiag.capture.steps_core.CaptureState`, for its step callbacks);
    ``summary()`` returns what it did, the run's status entry ``trial``, after the script ends."""

    name: str
    install: Callable[[object], None]
    summary: Callable[[], dict]


_registry: dict[str, Change] = {}


def register(name: str, install: Callable[[object], None], summary: Callable[[], dict]) -> None:
    """Register (or replace) the change ``name``: see :class:`Change`."""
    _registry[name] = Change(name, install, summary)


def registered() -> tuple[str, ...]:
    """The names of the changes registered in this process, in registration order."""
    return tuple(_registry)


def load(modules) -> None:
    """Import each module path of ``modules`` (``CaptureConfig.change_modules``): importing one
    registers its changes. Raises ImportError for a module that cannot be imported."""
    for path in modules:
        importlib.import_module(path)


def lookup(config) -> Change:
    """The change ``config.trial`` names, after loading ``config.change_modules``. Raises
    ValueError when no loaded module registered that name."""
    load(config.change_modules)
    change = _registry.get(config.trial)
    if change is None:
        known = ", ".join(_registry) or f"none registered (change_modules: {config.change_modules})"
        raise ValueError(f"unknown change {config.trial!r}: use one of {known}")
    return change


def install(config, state) -> Change:
    """Apply the change ``config.trial`` in this process (see the module docstring) and return it
    (its ``summary()`` is the trial's status entry). Raises ValueError for an unknown change."""
    change = lookup(config)
    change.install(state)
    return change
