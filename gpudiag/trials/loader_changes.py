"""The input pipeline's trial changes: ``loader-workers`` and ``pin-memory``, applied inside the
script's process to every ``torch.utils.data.DataLoader`` it builds (no script edit).

- ``loader-workers`` (GD-INPUT-STALL: the GPU waits for the next batch): ``num_workers`` raised to
  the cores free (:func:`worker_target`; a larger value of the script is kept),
  ``persistent_workers=True`` and ``pin_memory=True``, and the host-to-device copies of the
  batches made ``non_blocking=True``. A loader over an ``IterableDataset`` is left alone: each
  worker runs the dataset's whole ``__iter__``, so workers would repeat every sample unless the
  dataset shards itself (``get_worker_info()``), which gpudiag cannot know.
- ``pin-memory`` (GD-PAGEABLE-COPY: copies from pageable memory): ``pin_memory=True`` on every
  loader, iterable ones included (pinning changes no sample), and the same ``non_blocking`` copies.

Neither touches a loader over a ``TensorDataset`` already on the GPU: there is nothing to load on
the host, PyTorch refuses to pin CUDA tensors, and a forked worker cannot use CUDA. Worker seeding
may change the loss of a script with random augmentations: the result check notes it rather than
calling it a changed result (:data:`gpudiag.trials.results.DATA_STREAM_CHANGES`).

Which copies become ``non_blocking``: only those of tensors the DataLoader itself pinned (the batch
it hands over, marked as it leaves the loader's pinning step), to a CUDA device, with
``non_blocking`` not given. Not every pinned tensor: a script that copies its own pinned staging
buffer, then refills it for the next batch, would race with a copy it no longer waits for; the
loader's batches are fresh tensors each time. A device-to-host copy never qualifies (its source is
not a CPU tensor). Inside Dynamo tracing the patched ``Tensor.to``/``Tensor.cuda`` return to
PyTorch's own at once, so compiled code traces what it would without gpudiag.
"""

from __future__ import annotations

import inspect
import os

from gpudiag.capture import frameworks, model_modules

LOADER_CHANGES = ("loader-workers", "pin-memory")
MAX_WORKERS = 16  # beyond this, more workers rarely feed one GPU faster and cost memory (gpudiag's cap)
PINNED_MARK = "_gpudiag_loader_pinned"  # set on the tensors a DataLoader pinned
NON_BLOCKING = "pinned DataLoader batches copied to CUDA with non_blocking=True"

# How to make each change in the script (to merge into gpudiag.trials.ranking.HOW_TO).
HOW_TO = {
    "loader-workers": "Load batches in worker processes: `DataLoader(dataset, num_workers=N, persistent_workers=True, "
                      "pin_memory=True)` with N up to the cores free for them (the trial used the machine's cores less "
                      "one, at most 16), and copy each batch with `.to(\"cuda\", non_blocking=True)`. An "
                      "`IterableDataset` must shard itself by `torch.utils.data.get_worker_info()` first.",
    "pin-memory": "Pin the batches: `DataLoader(..., pin_memory=True)`, and copy them with "
                  "`.to(\"cuda\", non_blocking=True)`.",
}

NOTHING_FOUND = {
    "loader-workers": "no torch.utils.data.DataLoader over a map-style dataset was built",
    "pin-memory": "no torch.utils.data.DataLoader was built (pinning the script's own tensors needs the script "
                  "edited: `tensor.pin_memory()`)",
}


def worker_target() -> int:
    """The workers ``loader-workers`` gives a DataLoader: the CPU cores this process may run on
    (``os.sched_getaffinity``, else ``os.cpu_count()``) less one for the main process, at most
    :data:`MAX_WORKERS`, at least 0."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return max(0, min(cores - 1, MAX_WORKERS))


# ---- the DataLoader's arguments ----------------------------------------------------------------------

ITERABLE = ("the DataLoader reads an IterableDataset: each worker would yield the whole dataset unless it shards "
            "itself by get_worker_info()")
ON_DEVICE = "the DataLoader's TensorDataset is on the GPU already: nothing to load or pin on the host"


def loader_arguments(change: str, given: dict, iterable: bool, target: int,
                     device_data: bool = False) -> tuple[dict, list[str], str | None]:
    """(the DataLoader's arguments with ``change`` applied, what changed, why nothing did or None).
    ``given``: the arguments the script passed, by name (``inspect.Signature.bind``: defaults not
    included); ``iterable``: the dataset is an ``IterableDataset``; ``target``: the workers to
    give (:func:`worker_target`); ``device_data``: the dataset's tensors are on a device
    (:func:`gpudiag.capture.frameworks.on_device`), left alone. An explicit ``pin_memory=False``
    or ``persistent_workers=False`` is overridden, as an explicit ``num_workers`` below the target
    is: they are what the trial measures. Pure: the tests call it directly."""
    if device_data:
        return given, [], ON_DEVICE
    if change == "loader-workers" and iterable:
        return given, [], ITERABLE
    out, what = dict(given), []
    if change == "loader-workers":
        workers = int(given.get("num_workers") or 0)
        if target > workers:
            out["num_workers"] = target
            what.append(f"num_workers {workers} -> {target}")
        if not out.get("num_workers"):  # one core: pinning alone would be the pin-memory trial mislabelled
            return given, [], "no CPU core is free for a DataLoader worker (this process may run on one core)"
        if not given.get("persistent_workers"):
            out["persistent_workers"] = True
            what.append("persistent_workers=True")
    if not given.get("pin_memory"):
        out["pin_memory"] = True
        what.append("pin_memory=True")
    if what:
        return out, what, None
    return given, [], ("the DataLoader already pins memory" if change == "pin-memory" else
                       f"the DataLoader already has {given.get('num_workers')} persistent workers and pins memory")


def _patch_loader(module, change: str, applied: dict) -> None:
    """Wrap ``DataLoader.__init__``: its arguments through :func:`loader_arguments`, recorded in
    ``applied``."""
    cls = module.DataLoader
    signature = inspect.signature(cls.__init__)
    target = worker_target()

    def before(loader, args, kwargs):
        if not model_modules.owned():  # a loader built in a forked worker is not the script's
            return args, kwargs
        from torch.utils.data import IterableDataset

        bound = signature.bind(loader, *args, **kwargs)
        given = {k: v for k, v in bound.arguments.items() if k != "self"}
        dataset = given.get("dataset")
        new, what, reason = loader_arguments(change, given, isinstance(dataset, IterableDataset), target,
                                             frameworks.on_device(dataset))
        if what:
            name = type(given.get("dataset")).__name__
            _applied(applied, f"DataLoader({name}): {', '.join(what)}")
        elif reason and not applied["applied"]:
            applied["not_applicable"] = reason
        bound.arguments.update(new)
        return bound.args[1:], bound.kwargs

    frameworks.wrap_init(cls, before=before)


def _applied(applied: dict, what: str) -> None:
    if what not in applied["applied"]:
        applied["applied"].append(what)
    applied["not_applicable"] = None


# ---- non_blocking copies of the loader's pinned batches ------------------------------------------------

def _mark_pinned(module) -> None:
    """Wrap the loader's pinning function (``torch.utils.data._utils.pin_memory.pin_memory``, called
    on each batch and, recursively through the module's own name, on each of its elements) to mark
    every tensor it returns pinned."""
    import torch

    original = module.pin_memory

    def pin_memory(data, device=None):
        out = original(data, device)
        if isinstance(out, torch.Tensor) and out.is_pinned():
            try:
                setattr(out, PINNED_MARK, True)
            except (AttributeError, TypeError):  # a tensor subclass without attributes: copied as before
                pass
        return out

    pin_memory.__wrapped__ = original
    module.pin_memory = pin_memory


def _device_type(value) -> str | None:
    """The device type ``value`` names as a ``.to()`` target ("cuda", "cpu"...), None for a
    dtype or anything else. An int is a CUDA device index."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.device.type
    if isinstance(value, (str, torch.device)):
        try:
            return torch.device(value).type
        except (RuntimeError, ValueError):
            return None
    if isinstance(value, int) and not isinstance(value, bool):
        return "cuda"
    return None


def make_non_blocking(tensor, method: str, args: tuple, kwargs: dict) -> bool:
    """Whether ``tensor.<method>(*args, **kwargs)`` (method "to" or "cuda") is a copy this change
    makes ``non_blocking=True``: the source a CPU tensor the DataLoader pinned
    (:data:`PINNED_MARK`), the target a CUDA device, ``non_blocking`` given neither by name nor by
    position. Pure: the tests call it directly (there is no CUDA on CPU machines)."""
    if "non_blocking" in kwargs or not getattr(tensor, PINNED_MARK, False) or tensor.device.type != "cpu":
        return False
    if method == "cuda":
        return len(args) < 2  # cuda(device, non_blocking, ...)
    if any(isinstance(a, bool) for a in args):  # to(device, dtype, non_blocking, ...) given positionally
        return False
    target = kwargs.get("device", args[0] if args else None)
    return _device_type(target) == "cuda"


def _copy_wrapper(torch, method: str, original, applied: dict):
    """``original`` (``Tensor.to`` or ``Tensor.cuda``) given ``non_blocking=True`` where
    :func:`make_non_blocking` says so; PyTorch's own at once under Dynamo."""
    def copy(self, *args, **kwargs):
        if torch.compiler.is_compiling():  # first: Dynamo traces PyTorch's method, not gpudiag's
            return original(self, *args, **kwargs)
        if make_non_blocking(self, method, args, kwargs):
            kwargs["non_blocking"] = True
            if NON_BLOCKING not in applied["applied"]:
                _applied(applied, NON_BLOCKING)
        return original(self, *args, **kwargs)

    copy.__wrapped__, copy.__name__, copy.__doc__ = original, method, original.__doc__
    return copy


def _patch_copies(torch, applied: dict) -> None:
    for method in ("to", "cuda"):
        setattr(torch.Tensor, method, _copy_wrapper(torch, method, getattr(torch.Tensor, method), applied))


def install(change: str, applied: dict) -> None:
    """Install ``change`` (one of :data:`LOADER_CHANGES`) in this process, recording in
    ``applied`` (the trial's ``APPLIED``) what it changed. Raises ValueError for another change."""
    if change not in LOADER_CHANGES:
        raise ValueError(f"not an input-pipeline change: {change!r}")
    import torch

    frameworks.when_imported("torch.utils.data.dataloader", lambda m: _patch_loader(m, change, applied))
    frameworks.when_imported("torch.utils.data._utils.pin_memory", _mark_pinned)
    _patch_copies(torch, applied)
    applied["form"] = ("the script's DataLoaders built with "
                       + ("more workers, persistent and pinned" if change == "loader-workers" else "pin_memory=True")
                       + "; their pinned batches copied to CUDA with non_blocking=True")


# ---- whether a trial can help (the plan's) -------------------------------------------------------------

def why_not(change: str, used: dict | None) -> str | None:
    """Why ``change`` cannot help the script (None when it may), from the profiled run's status
    entry ``frameworks`` (``used``: :func:`gpudiag.capture.frameworks.summary`; None for a status
    recorded before gpudiag described the DataLoaders: then it is tried)."""
    if not used:
        return None
    loaders = used.get("dataloaders") or {}
    if not loaders.get("built"):
        return "the script builds no torch.utils.data.DataLoader"
    host = [d for d in loaders.get("loaders") or [] if not d.get("on_device")]
    if not host:
        return "every DataLoader's TensorDataset is on the GPU already: nothing to load or pin on the host"
    if change == "pin-memory":
        return None if any(not d.get("pin_memory") for d in host) else \
            "the script's DataLoaders pin memory already (the pageable copies are of its own tensors)"
    mapped = [d for d in host if not d.get("iterable")]
    if not mapped:
        return "every DataLoader reads an IterableDataset: workers would each yield the whole dataset"
    target = worker_target()
    if target == 0:
        return "no CPU core is free for a DataLoader worker"
    if all(d.get("num_workers", 0) >= target and d.get("persistent_workers") and d.get("pin_memory") for d in mapped):
        return f"the DataLoaders already have {target} or more persistent workers and pin memory"
    return None
