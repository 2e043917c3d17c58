"""Rules for jobs of several ranks that the capture alone cannot see (issue 22), from what the
rank's launcher recorded (:mod:`gpudiag.capture.ddp_watch`): ``RuleContext.distributed``.

- GD-DDP-NO-SYNC: gradient accumulation (several ``backward()`` calls per optimizer step) under
  ``DistributedDataParallel`` without ``no_sync()``: DDP all-reduces the gradients after every
  micro-batch's backward, where only the last one's is needed (PyTorch DDP docs, ``no_sync``).
  Saving: the step's collective kernel time × (k − 1) / k for k backward calls per step; with no
  collective kernel in the capture (gloo: the all-reduce is host time) it is not estimated.

``recommend`` imports this module; it imports ``recommend`` at call time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudiag.analysis.recommend import Recommendation, RuleContext


def distributed_context(status: dict | None, measured_ids) -> dict | None:
    """``RuleContext.distributed``: the rank's DDP settings and its median ``backward()`` calls per
    measured step; None without DistributedDataParallel."""
    import statistics

    ddp = (status or {}).get("ddp")
    if not ddp:
        return None
    calls = (status or {}).get("backward_calls") or {}
    # the measured steps' counts; else every step's the launcher kept (the same loop each step)
    per_step = [calls[str(i)] for i in measured_ids if str(i) in calls] or list(calls.values())
    return {**ddp, "backward_per_step": statistics.median(per_step) if per_step else None}


def ddp_no_sync(ctx: "RuleContext") -> "Recommendation | None":
    """GD-DDP-NO-SYNC (see the module docstring)."""
    from gpudiag.analysis.recommend import Recommendation

    info = ctx.distributed
    k = (info or {}).get("backward_per_step")
    if not info or not k or k <= 1 or info.get("no_sync_calls"):
        return None
    comm = ctx.communication_ns
    estimated = comm > 0
    return Recommendation(
        "GD-DDP-NO-SYNC", "Gradient accumulation all-reduces after every micro-batch: use no_sync()",
        comm * (k - 1) / k if estimated else 0.0,
        "collective kernel time per step x (k - 1) / k, k backward() calls per optimizer step" if estimated
        else "not estimated: no collective kernel in the capture (gloo or CPU collectives are host time)",
        [f"{k:g} backward() calls per optimizer step under DistributedDataParallel, no_sync() never entered",
         f"{comm / 1e6:.2f} ms/step in collective kernels" if estimated else "no collective kernel captured",
         f"DDP buckets of {info.get('bucket_cap_mb')} MB for {info.get('gradient_bytes', 0) / 2**20:.0f} MiB of gradients"],
        "Wrap the backward of every micro-batch but the last in `with model.no_sync():` so DDP all-reduces once "
        "per optimizer step (PyTorch DistributedDataParallel.no_sync).",
        saving_estimated=estimated)


DISTRIBUTED_RULES = (ddp_no_sync,)
