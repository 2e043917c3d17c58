"""Which ``nn.Module`` calls are the model's, and which process is gpudiag's (issue 34).

Steps come from the model, never from its data pipeline:

- torchvision v1/v2, torchaudio and torchtext transforms are ``nn.Module``s; a ``Dataset`` that
  calls a ``transforms.Compose`` runs one outermost module call per sample. Taken as the model's
  forward, they made the step window end inside the first batch's loading (H100, 2026-11-26: an
  ImageNet-style script stopped after 22 "steps", before any kernel; issue 34).
- A module is the model when it holds a parameter or buffer on the device the script computes on
  (CUDA where torch sees a GPU, else the CPU), or when its call returned a CUDA tensor. A
  transform holds neither (its mean and std are Python numbers) and runs on CPU tensors.

gpudiag owns the process its launcher started (and a rank's process, which instruments itself):
a forked child (a ``DataLoader`` worker with the fork or forkserver start method, a
``multiprocessing`` pool's worker, ``os.fork()``) inherits the hooks, and must neither count
steps nor end itself at the window's end (that killed the workers: "DataLoader worker (pid …)
exited unexpectedly"). :func:`on_fork_in_child` runs each registered disown function in the child.
A spawned child (spawn start method, ``subprocess``) is a fresh interpreter: it is instrumented
only as a rank (:mod:`gpudiag.capture.rank_hook`).
"""

from __future__ import annotations

import itertools
import os
import sys
import weakref

# Modules whose classes are data-pipeline transforms, never the model (by the class's module).
TRANSFORM_MODULES = ("torchvision.transforms", "torchaudio.transforms", "torchtext.transforms",
                     "torchvision.io", "transformers.tokenization")

_learned_models: "weakref.WeakSet" = weakref.WeakSet()  # modules whose call returned a CUDA tensor


def is_data_transform(module) -> bool:
    """True for a module of a data-pipeline package (:data:`TRANSFORM_MODULES`), e.g. torchvision's
    ``transforms.v2.Compose`` or ``Normalize``; these are never steps."""
    return type(module).__module__.startswith(TRANSFORM_MODULES)


def compute_device_type() -> str:
    """``"cuda"`` where torch sees a GPU (and has not been told otherwise), else ``"cpu"``: the
    device a model's parameters must be on for its calls to be steps."""
    torch = sys.modules.get("torch")
    try:
        return "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001 - a broken CUDA install: treat as CPU, never fail the script
        return "cpu"


def holds_device_state(module, device_type: str) -> bool:
    """Whether ``module`` (or a submodule) holds a parameter or buffer on ``device_type``; stops
    at the first one found."""
    try:
        tensors = itertools.chain(module.parameters(), module.buffers())
        return any(t.device.type == device_type for t in tensors)
    except Exception:  # noqa: BLE001 - a module whose parameters() is overridden oddly: not the model
        return False


def returned_device_tensor(output, device_type: str = "cuda", depth: int = 0) -> bool:
    """Whether ``output`` (a tensor, tuple/list, dict, or an object with such fields, three
    levels deep) holds a tensor on ``device_type``."""
    device = getattr(output, "device", None)
    if device is not None and getattr(device, "type", None) == device_type:
        return True
    if depth > 2:
        return False
    items = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else ()
    return any(returned_device_tensor(item, device_type, depth + 1) for item in itertools.islice(items, 8))


def is_model(module) -> bool:
    """Whether a module call may be the model's (see the module docstring): not a transform, and
    holding state on the compute device or known to have returned a CUDA tensor."""
    if is_data_transform(module):
        return False
    if module in _learned_models:
        return True
    return holds_device_state(module, compute_device_type())


def learn_from_output(module, output) -> None:
    """After a call: a module without parameters whose call returned a CUDA tensor launched CUDA
    work, so it may be the model (e.g. a functional wrapper around kernels)."""
    if module not in _learned_models and not is_data_transform(module) and returned_device_tensor(output):
        try:
            _learned_models.add(module)
        except TypeError:  # not weak-referenceable
            pass


# ---- the process gpudiag owns ----------------------------------------------------------------------

_owner_pid = os.getpid()
_disowners: list = []


def owner_pid() -> int:
    """The pid of the process gpudiag instruments (this one, unless this is a forked child)."""
    return _owner_pid


def owned() -> bool:
    """True in the process gpudiag instruments; False in a child forked from it."""
    return os.getpid() == _owner_pid


def claim() -> None:
    """This process is gpudiag's (the launcher, or a rank's start-up hook)."""
    global _owner_pid
    _owner_pid = os.getpid()


def register_disown(fn) -> None:
    """``fn()`` runs in every child forked from now on, before the child's own code: it drops
    gpudiag's state there (hooks left installed then see none and return at once)."""
    if fn not in _disowners:
        _disowners.append(fn)


def on_fork_in_child() -> None:
    """``os.register_at_fork(after_in_child=…)``: the child is not gpudiag's."""
    for fn in _disowners:
        try:
            fn()
        except Exception:  # noqa: BLE001 - never break the user's child process
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=on_fork_in_child)
