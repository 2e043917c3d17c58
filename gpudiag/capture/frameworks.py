"""Which training frameworks the script used, for the launcher's status, and the import hook
that reaches a framework's class when the script imports it.

Why it is recorded. Where a framework owns precision, compilation or the optimizer (a Lightning
``Trainer``, Hugging Face ``TrainingArguments``, an Accelerate ``Accelerator``), the advice must name
the switch the user flips there (``Trainer(precision="bf16-mixed")``), not a ``torch.autocast`` the
framework would fight; the trials set those switches themselves (``gpudiag.trials.framework_changes``).

What is recorded (the status's ``frameworks``, :func:`summary`): the frameworks imported
(``sys.modules`` at the end of the run: nothing is patched for it), how many times each framework
class was constructed (its ``__init__`` wrapped by a counter once its module is imported), and the
``torch.utils.data.DataLoader``\\ s built (their workers, pinning, map-style or iterable dataset).

Why an import hook. The script imports its framework after the launcher has started, so a class
cannot be patched when gpudiag installs; :func:`when_imported` runs a callback right after the
module that defines the class has executed (:mod:`gpudiag.capture.import_hook`), or at once where
it is already imported.
"""

from __future__ import annotations

import functools
import sys
import threading

from gpudiag.capture import import_hook, model_modules

# framework -> (the module defining its classes, the classes counted when constructed)
CLASSES = {
    "lightning": ("lightning.pytorch.trainer.trainer", ("Trainer",)),
    "pytorch_lightning": ("pytorch_lightning.trainer.trainer", ("Trainer",)),
    "transformers": ("transformers.trainer", ("Trainer",)),
    "accelerate": ("accelerate.accelerator", ("Accelerator",)),
}
# the top-level packages reported as imported, in the order advice prefers them
PACKAGES = ("transformers", "lightning", "pytorch_lightning", "accelerate", "timm")
MAX_LOADERS = 50  # DataLoaders described in the status (a script that builds one per epoch: the first 50)

_lock = threading.Lock()
_constructed: dict[str, int] = {}  # "transformers.Trainer" -> constructions
_loaders: list[dict] = []
_loaders_built = [0]
_errors: list[str] = []  # a callback that failed: reported, never raised into the script's import


# ---- callbacks ----------------------------------------------------------------------------------

def _call(what: str, fn, *args):
    """``fn(*args)``, or None when it raised: recorded in :func:`summary`'s ``errors``, never
    raised into the script (gpudiag must not break its imports or its constructors)."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        _errors.append(f"{what}: {type(exc).__name__}: {exc}")
        return None


def when_imported(name: str, callback) -> None:
    """Call ``callback(module)`` once the module ``name`` (a full dotted name) has executed
    (:func:`gpudiag.capture.import_hook.when_imported`). A callback that raises is recorded in
    :func:`summary`'s ``errors``, never raised into the script."""
    import_hook.when_imported(name, functools.partial(_call, name, callback))


def wrap_method(cls, name: str, before=None, after=None) -> None:
    """Wrap ``cls.<name>`` (``__init__``, a dataclass's ``__post_init__``): ``before(self, args,
    kwargs)`` returns the (args, kwargs) to call it with; ``after(self)`` runs once it returned.
    Either one raising is recorded (see :func:`_call`) and the script's own arguments are used.
    ``functools.wraps`` keeps the signature (``inspect.signature`` follows ``__wrapped__``:
    Lightning reads its Trainer's)."""
    original = getattr(cls, name)
    label = f"{cls.__module__}.{cls.__qualname__}.{name}"

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        if before is not None:
            args, kwargs = _call(label, before, self, args, kwargs) or (args, kwargs)
        out = original(self, *args, **kwargs)
        if after is not None:
            _call(label, after, self)
        return out

    setattr(cls, name, wrapper)


def wrap_init(cls, before=None, after=None) -> None:
    """:func:`wrap_method` of ``cls.__init__``."""
    wrap_method(cls, "__init__", before, after)


# ---- what the script used ------------------------------------------------------------------------

def _count(label: str):
    def after(_self) -> None:
        _constructed[label] = _constructed.get(label, 0) + 1
    return after


def _count_classes(framework: str, names: tuple[str, ...]):
    def patch(module) -> None:
        for name in names:
            cls = getattr(module, name, None)
            if isinstance(cls, type):
                wrap_init(cls, after=_count(f"{framework}.{name}"))
    return patch


def _describe_loader(loader) -> None:
    """Record one DataLoader as built (its own attributes: after the script's arguments and any
    trial's change)."""
    _loaders_built[0] += 1
    if len(_loaders) >= MAX_LOADERS:
        return
    from torch.utils.data import IterableDataset

    _loaders.append({"dataset": type(loader.dataset).__name__,
                     "iterable": isinstance(loader.dataset, IterableDataset),
                     "on_device": on_device(loader.dataset),
                     "num_workers": int(loader.num_workers), "pin_memory": bool(loader.pin_memory),
                     "persistent_workers": bool(getattr(loader, "persistent_workers", False))})


def on_device(dataset) -> bool:
    """Whether ``dataset`` is a ``TensorDataset`` (or a ``Subset`` of one) whose tensors are on a
    device already: nothing to load on the host, and PyTorch refuses to pin them. Other datasets
    cannot be told without reading a sample: False."""
    dataset = getattr(dataset, "dataset", dataset)  # torch.utils.data.Subset
    tensors = getattr(dataset, "tensors", None)
    return isinstance(tensors, tuple) and any(getattr(t, "device", None) is not None and t.device.type != "cpu"
                                              for t in tensors)


def install() -> None:
    """Count the framework classes' constructions and the DataLoaders built in this process (the
    launcher calls it before the script runs). Never raises: a framework that cannot be patched is
    reported as imported only."""
    for framework, (module, names) in CLASSES.items():
        when_imported(module, _count_classes(framework, names))
    when_imported("torch.utils.data.dataloader", _patch_dataloader)


def _patch_dataloader(module) -> None:
    def after(loader) -> None:
        if model_modules.owned():  # a DataLoader built in a forked worker is not the script's
            _describe_loader(loader)

    wrap_init(module.DataLoader, after=after)


def summary() -> dict:
    """The status's ``frameworks``: ``imported`` (of :data:`PACKAGES`, in that order),
    ``constructed`` ("lightning.Trainer", "pytorch_lightning.Trainer", "transformers.Trainer",
    "accelerate.Accelerator" -> count; an HF Trainer's own Accelerator counts too),
    ``dataloaders`` ({"built": count, "loaders": up to :data:`MAX_LOADERS` described}), ``errors``."""
    return {"imported": [p for p in PACKAGES if p in sys.modules],
            "constructed": dict(_constructed),
            "dataloaders": {"built": _loaders_built[0], "loaders": list(_loaders)},
            "errors": list(_errors)}


def used(frameworks: dict | None) -> list[str]:
    """The frameworks that own the training loop, from a status's ``frameworks``, in the order
    advice prefers them: "transformers" (its Trainer built), "lightning" (a Lightning Trainer,
    either package), "accelerate" (an Accelerator the script built, not only an HF Trainer's).
    [] for a status without the entry."""
    built = (frameworks or {}).get("constructed") or {}
    out = []
    if built.get("transformers.Trainer"):
        out.append("transformers")
    if built.get("lightning.Trainer") or built.get("pytorch_lightning.Trainer"):
        out.append("lightning")
    own_accelerators = built.get("accelerate.Accelerator", 0) - built.get("transformers.Trainer", 0)
    if own_accelerators > 0:
        out.append("accelerate")
    return out
