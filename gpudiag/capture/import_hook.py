"""Callbacks run right after a module has executed: how capture reaches a library's classes (a
framework's ``Trainer``, Inductor's code generation) that the script imports after gpudiag
installed. One ``sys.meta_path`` finder, first in the list, wraps the loader of a module with
callbacks waiting, for that one load; every other import costs one dict lookup.

Used by :mod:`gpudiag.capture.frameworks` (the frameworks' classes, DataLoader) and
:mod:`gpudiag.capture.inductor_provenance` (Inductor's debug and output-code modules).
"""

from __future__ import annotations

import importlib.abc
import sys
import threading

_hooks: dict[str, list] = {}  # module name -> callbacks waiting for it to execute
_lock = threading.Lock()


class _Finder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: for a module with callbacks waiting, the spec the other finders
    give, with its loader wrapped (:class:`_Loader`); None for every other module (the import
    system then asks the next finder, at the cost of one dict lookup)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the callbacks. The module's ``__loader__`` and spec get the
    real loader back once it has executed: code reading them later (``inspect``, resource readers)
    sees the loader it would have seen without gpudiag."""

    def __init__(self, loader, name: str) -> None:
        self._loader, self._name = loader, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            module.__loader__ = self._loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self._loader
        _run_callbacks(self._name, module)

    def __getattr__(self, name):  # get_source, get_resource_reader, ...: the real loader's
        return getattr(self._loader, name)


def _run_callbacks(name: str, module) -> None:
    with _lock:
        callbacks = _hooks.pop(name, [])
    for callback in callbacks:
        callback(module)


def when_imported(name: str, callback) -> None:
    """Call ``callback(module)`` once the module ``name`` (a full dotted name) has executed: at
    once when it is already imported, else right after the script's import of it. ``callback``
    must not raise (it runs inside the script's import statement): callers guard it."""
    module = sys.modules.get(name)
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        callback(module)
        return
    with _lock:
        _hooks.setdefault(name, []).append(callback)
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
