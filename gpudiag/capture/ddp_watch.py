"""What a process's ``DistributedDataParallel`` does that the capture cannot show (issue 22): its
bucket size, whether ``no_sync()`` is used, and how many ``backward()`` calls each step makes
(gradient accumulation). Read by GD-DDP-NO-SYNC (:mod:`gpudiag.analysis.distributed_rules`).

Installed by the launcher in every process; it wraps ``DistributedDataParallel.__init__`` and
``no_sync`` (class attributes, before the script builds its model), no per-call hook.
"""

from __future__ import annotations

import functools

_seen: dict = {"ddp": None, "no_sync_calls": 0}


def install() -> None:
    """Wrap ``torch.nn.parallel.DistributedDataParallel`` once (a no-op if torch lacks it)."""
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


def summary() -> dict:
    """The status entry ``ddp``: None when no DistributedDataParallel was built."""
    if _seen["ddp"] is None:
        return {"ddp": None}
    return {"ddp": {**_seen["ddp"], "no_sync_calls": _seen["no_sync_calls"]}}
