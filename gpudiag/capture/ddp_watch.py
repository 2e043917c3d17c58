"""What a process's data-parallel wrapper does that the capture cannot show (issue 22): for
``DistributedDataParallel`` its bucket size, whether ``no_sync()`` is used, and how many
``backward()`` calls each step makes (gradient accumulation); for FSDP2's ``fully_shard`` (and
FSDP1's ``FullyShardedDataParallel``) the units it shards, ``reshard_after_forward`` and the
offload policy. Read by :mod:`gpudiag.analysis.rules.distributed`.

Installed by the launcher in every process; it wraps ``DistributedDataParallel.__init__`` and
``no_sync``, ``torch.distributed.fsdp.fully_shard`` and ``FullyShardedDataParallel.__init__``
(module and class attributes, before the script builds its model: a script's
``from torch.distributed.fsdp import fully_shard`` then gets the wrapper), no per-call hook.
"""

from __future__ import annotations

import functools
import inspect

_seen: dict = {"ddp": None, "no_sync_calls": 0, "fsdp": None}


def install() -> None:
    """Wrap DDP and FSDP once (each a no-op if torch lacks it)."""
    _install_ddp()
    _install_fsdp()


def _install_ddp() -> None:
    """Wrap ``torch.nn.parallel.DistributedDataParallel`` once."""
    try:
        from torch.nn.parallel import DistributedDataParallel as ddp
    except ImportError:  # a torch without distributed support
        return
    if getattr(ddp.__init__, "__gpudiag__", False):
        return
    original_init, original_no_sync = ddp.__init__, ddp.no_sync

    @functools.wraps(original_init)
    def __init__(self, module, *args, **kwargs):
        original_init(self, module, *args, **kwargs)
        params = [p for p in module.parameters() if p.requires_grad]
        _seen["ddp"] = {"bucket_cap_mb": kwargs.get("bucket_cap_mb") or 25,  # DDP's default (torch docs)
                        "gradient_bytes": int(sum(p.numel() * p.element_size() for p in params)),
                        "find_unused_parameters": bool(kwargs.get("find_unused_parameters", False)),
                        "static_graph": bool(kwargs.get("static_graph", False))}

    @functools.wraps(original_no_sync)
    def no_sync(self):
        _seen["no_sync_calls"] += 1
        return original_no_sync(self)

    __init__.__gpudiag__ = True
    ddp.__init__, ddp.no_sync = __init__, no_sync


def _param_bytes(module) -> int:
    modules = module if isinstance(module, (list, tuple)) else [module]  # fully_shard takes a list too
    return int(sum(p.numel() * p.element_size() for m in modules for p in m.parameters()))


def _record_fsdp(api: str, module, reshard, offload: bool) -> None:
    """One sharded unit, recorded without ever failing the user's call (lazy parameters, odd
    arguments: the unit is then left out)."""
    try:
        _record_unit(api, module, reshard, offload)
    except Exception:  # noqa: BLE001 - what gpudiag records must not change what the script does
        pass


def _record_unit(api: str, module, reshard, offload: bool) -> None:
    """The root is the largest module wrapped (its parameters include all). Sized first: a unit
    that cannot be sized changes nothing."""
    size = _param_bytes(module)
    seen = _seen["fsdp"] or {"api": api, "units": 0, "reshard_after_forward": [], "cpu_offload": False,
                             "parameter_bytes": 0}
    seen["units"] += 1
    if reshard not in seen["reshard_after_forward"]:
        seen["reshard_after_forward"].append(reshard)
    seen["cpu_offload"] = seen["cpu_offload"] or offload
    seen["parameter_bytes"] = max(seen["parameter_bytes"], size)
    _seen["fsdp"] = seen


def _install_fsdp() -> None:
    """Wrap FSDP2's ``fully_shard`` (module attribute) and FSDP1's ``__init__`` once."""
    try:
        import torch.distributed.fsdp as fsdp
    except ImportError:  # a torch without distributed support
        return
    original = getattr(fsdp, "fully_shard", None)
    if original is not None and not getattr(original, "__gpudiag__", False):
        @functools.wraps(original)  # keeps ``fully_shard.state`` (its __dict__)
        def fully_shard(module, *args, **kwargs):
            offload = type(kwargs.get("offload_policy")).__name__ == "CPUOffloadPolicy"
            # None: torch's default (True for the units inside, the root's own choice)
            _record_fsdp("fully_shard", module, kwargs.get("reshard_after_forward"), offload)
            return original(module, *args, **kwargs)

        fully_shard.__gpudiag__ = True
        fsdp.fully_shard = fully_shard
    cls = getattr(fsdp, "FullyShardedDataParallel", None)
    if cls is None or getattr(cls.__init__, "__gpudiag__", False):
        return
    original_init = cls.__init__

    signature = inspect.signature(original_init)

    @functools.wraps(original_init)
    def __init__(self, module, *args, **kwargs):
        try:  # the arguments as FSDP1 reads them, positional or not
            bound = signature.bind(self, module, *args, **kwargs).arguments
        except TypeError:
            bound = {}
        strategy = bound.get("sharding_strategy")
        # FULL_SHARD (the default) frees gathered parameters after forward, as reshard_after_forward=True
        reshard = strategy is None or getattr(strategy, "name", str(strategy)) in ("FULL_SHARD", "HYBRID_SHARD")
        offload = bool(getattr(bound.get("cpu_offload"), "offload_params", False))
        _record_fsdp("FullyShardedDataParallel", module, reshard, offload)
        original_init(self, module, *args, **kwargs)

    __init__.__gpudiag__ = True
    cls.__init__ = __init__


def summary() -> dict:
    """The status entries ``ddp`` and ``fsdp``: each None when no such wrapper was built. ``fsdp``:
    ``api``, ``units`` (modules sharded), ``reshard_after_forward`` (the values passed, None for
    torch's default), ``cpu_offload``, ``parameter_bytes`` (the root's unsharded parameters)."""
    fsdp = _seen["fsdp"]
    ddp = None if _seen["ddp"] is None else {**_seen["ddp"], "no_sync_calls": _seen["no_sync_calls"]}
    return {"ddp": ddp, "fsdp": dict(fsdp) if fsdp else None}
