"""Rules for jobs of several ranks that the capture alone cannot see (issue 22), from what the
rank's launcher recorded (:mod:`gpudiag.capture.ddp_watch`): ``RuleContext.distributed``.

- GD-DDP-NO-SYNC: gradient accumulation (several ``backward()`` calls per optimizer step) under
  ``DistributedDataParallel`` without ``no_sync()``: DDP all-reduces the gradients after every
  micro-batch's backward, where only the last one's is needed (PyTorch DDP docs, ``no_sync``).
  Removed GPU time: the step's exposed transfer (:mod:`gpudiag.analysis.ranks.comm`; the exposed
  communication where the export has one rank) × (k − 1) / k for k backward calls per step; with
  no collective kernel in the capture (gloo: the all-reduce is host time) it is not estimated.
- GD-FSDP-RESHARD: FSDP with ``reshard_after_forward=True`` (the default; FSDP1 ``FULL_SHARD``)
  frees each unit's gathered parameters after its forward and all-gathers them again in the
  backward (PyTorch FSDP2 ``fully_shard`` docs). ``False`` keeps them from forward to backward:
  the backward all-gathers go, for (world − 1) / world of the parameters' bytes more memory.
  Removed time: on the GPU, the backward all-gathers' exposed transfer; on the host, each backward
  unshard's launches (copy-in, all-gather, copy-out) from the end of the launch before them to the
  start of the launch after them, scaled by bare / profiled step (the profiler slows the host).

Both savings follow the step's bound, since a step lasts about max(host path, GPU path)
(docs/ranks_proof.md): GPU time removed from a host-bound step (bare step longer than its GPU work
plus exposed transfer) saves nothing, and host time removed from a GPU-bound step saves nothing.
Measured on two H100s with NCCL (docs/ranks_proof.md): no_sync on host-bound steps saved nothing
(56.5 vs 57.0 ms, 98.5 vs 99.1 ms).

The registry imports this module; this one imports ``base``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpudiag.analysis.ranks.comm import collective_of, exposed_ns, exposed_transfer_ns
from gpudiag.analysis.rules.base import Recommendation, RuleContext
from gpudiag.analysis.rules.host_floor import LAUNCH_API
from gpudiag.script_status import ScriptStatus



def distributed_context(status: ScriptStatus | dict | None, measured_ids) -> dict | None:
    """``RuleContext.distributed``: the rank's DDP settings, its FSDP settings (``fsdp``), the
    world size and its median ``backward()`` calls per measured step; None without DDP or FSDP."""
    import statistics

    status = ScriptStatus.of(status) or ScriptStatus()
    ddp, fsdp = status.ddp, status.fsdp
    if not ddp and not fsdp:
        return None
    ddp = {**(ddp or {}), "fsdp": fsdp, "world_size": status.world_size}
    calls = status.backward_calls or {}
    # the measured steps' counts; else every step's the launcher kept (the same loop each step)
    per_step = [calls[str(i)] for i in measured_ids if str(i) in calls] or list(calls.values())
    return {**ddp, "backward_per_step": statistics.median(per_step) if per_step else None}


def gpu_path_ns(km: pd.DataFrame, comm: pd.DataFrame, n_steps: int) -> tuple[float, float]:
    """(GPU path, exposed transfer), ns per step: the union of the compute kernels ``km`` (no
    collectives) plus the collectives' exposed transfer (``comm``: collective kernels with
    ``transfer_ns`` where known, else their whole duration counts)."""
    busy = 0.0
    none = np.array([], np.int64)
    exposed = float(sum(exposed_transfer_ns(c, km[km["device_id"] == device]) for device, c in comm.groupby("device_id")))
    for _, k in km.groupby("step"):
        busy += exposed_ns(k["start_ns"].to_numpy(), k["end_ns"].to_numpy(), none, none)
    return (busy + exposed) / n_steps, exposed / n_steps


def _bare_step_ns(ctx: "RuleContext") -> float | None:
    return ctx.step_ns - ctx.bare_inflation_ns if ctx.bare_inflation_ns is not None else None


def bounded_saving(ctx: "RuleContext", gpu_path: float, gpu_ns: float, host_ns: float) -> tuple[float, str]:
    """(saving ns per step, why): ``gpu_ns`` removed GPU time counts on a GPU-bound step,
    ``host_ns`` removed host time on a host-bound one (module doc). Host-bound: the bare step
    (else the profiled one) is longer than the GPU path (:func:`gpu_path_ns`, ns per step) by more
    than 5 % (gpudiag's margin)."""
    bare = _bare_step_ns(ctx) or ctx.step_ns
    if bare > 1.05 * gpu_path:
        return host_ns, (f"host-bound: the step ({bare / 1e6:.2f} ms{' bare' if _bare_step_ns(ctx) else ''}) is longer "
                         f"than its GPU work and exposed transfer ({gpu_path / 1e6:.2f} ms), so GPU time removed saves "
                         "nothing; host time removed counts")
    return gpu_ns, (f"GPU-bound: the GPU work and exposed transfer ({gpu_path / 1e6:.2f} ms) fill the step, so the "
                    "GPU time removed counts")


def ddp_no_sync(ctx: "RuleContext") -> "Recommendation | None":
    """GD-DDP-NO-SYNC (see the module docstring)."""
    info = ctx.distributed
    k = (info or {}).get("backward_per_step")
    if not info or not info.get("bucket_cap_mb") or not k or k <= 1 or info.get("no_sync_calls"):
        return None
    estimated = not ctx.collectives.empty
    path, exposed = gpu_path_ns(ctx.km, ctx.collectives, ctx.n_steps) if estimated else (0.0, 0.0)
    saving, bound = bounded_saving(ctx, path, exposed * (k - 1) / k, 0.0) if estimated else (0.0, "")
    return Recommendation(
        "GD-DDP-NO-SYNC", "Gradient accumulation all-reduces after every micro-batch: use no_sync()", saving,
        f"exposed transfer per step x (k - 1) / k, k backward() calls per optimizer step; {bound}" if estimated
        else "not estimated: no collective kernel in the capture (gloo or CPU collectives are host time)",
        [f"{k:g} backward() calls per optimizer step under DistributedDataParallel, no_sync() never entered",
         f"{exposed / 1e6:.2f} ms/step of collective transfer not hidden by compute" if estimated
         else "no collective kernel captured",
         f"DDP buckets of {info.get('bucket_cap_mb')} MB for {info.get('gradient_bytes', 0) / 2**20:.0f} MiB of gradients"],
        "Wrap the backward of every micro-batch but the last in `with model.no_sync():` so DDP all-reduces once "
        "per optimizer step (PyTorch DistributedDataParallel.no_sync).",
        saving_estimated=estimated)


def _unshard_host_ns(ag: pd.DataFrame, api: pd.DataFrame) -> float:
    """Host time (ns, all of ``ag``) of the unshards around the all-gather kernels ``ag``: on the
    thread that launched each, from the end of the second launch before its launch (the one before
    the copy-in) to the start of the second launch after it (the one after the copy-out)."""
    launches = api[api["name"].astype(str).str.match(LAUNCH_API)].sort_values("start_ns")
    total = 0.0
    for _, thread in launches.groupby("global_tid"):
        thread = thread.reset_index(drop=True)
        at = thread.index[thread["correlation_id"].isin(ag["correlation_id"])]
        at = at[(at >= 2) & (at + 2 < len(thread))]
        total += float((thread["start_ns"].to_numpy()[at + 2] - thread["end_ns"].to_numpy()[at - 2]).sum())
    return total


def fsdp_reshard(ctx: "RuleContext") -> "Recommendation | None":
    """GD-FSDP-RESHARD (see the module docstring)."""
    info = (ctx.distributed or {}).get("fsdp")
    c = ctx.collectives
    values = info.get("reshard_after_forward") if info else None
    resharding = isinstance(values, list) and any(v is True or v is None for v in values)  # None: torch's default
    if not resharding or c.empty or "phase" not in c or ctx.api.empty:
        return None
    ag = c[(c["name"].map(collective_of) == "AllGather") & (c["phase"] == "backward")]
    if ag.empty:
        return None
    gpu = sum(exposed_transfer_ns(a, ctx.km[ctx.km["device_id"] == d]) for d, a in ag.groupby("device_id")) / ctx.n_steps
    bare = _bare_step_ns(ctx)
    host = _unshard_host_ns(ag, ctx.api) / ctx.n_steps * (bare / ctx.step_ns if bare else 1.0)
    saving, bound = bounded_saving(ctx, gpu_path_ns(ctx.km, c, ctx.n_steps)[0], gpu, host)
    world = (ctx.distributed or {}).get("world_size") or 2
    extra = info.get("parameter_bytes", 0) * (world - 1) / world
    return Recommendation(
        "GD-FSDP-RESHARD", "FSDP all-gathers every unit's parameters twice per step: reshard_after_forward=False",
        saving, f"the backward all-gathers' exposed transfer or their unshards' host time{' (x bare / profiled)' if bare else ''}; "
        f"{bound}",
        [f"{len(ag) / ctx.n_steps:.0f} all-gathers per step in the backward, {gpu / 1e6:.2f} ms/step of their transfer "
         "not hidden by compute", f"their unshards take {host / 1e6:.2f} ms/step of host time",
         f"{info.get('units')} units sharded with {info.get('api')}, reshard_after_forward={info.get('reshard_after_forward')}",
         f"cost: up to {extra / 2**30:.2f} GiB more memory per rank (the gathered parameters kept from forward to backward)"],
        "Pass `reshard_after_forward=False` to `fully_shard` (FSDP1: `sharding_strategy=SHARD_GRAD_OP`, or "
        "`_HYBRID_SHARD_ZERO2` in place of `HYBRID_SHARD`) on the units "
        "whose gathered parameters fit in memory, at least the root, so the backward reuses the forward's all-gathers.")


DISTRIBUTED_RULES = (ddp_no_sync, fsdp_reshard)
