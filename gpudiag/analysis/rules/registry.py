"""The rule list: every family's rules in the order they always had, run over one
:class:`~gpudiag.analysis.rules.base.RuleContext` and ranked by saving.

This is the only module that imports the rule families; they import
:mod:`~gpudiag.analysis.rules.base`, never this module, so the rules hold no import cycle.
"""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np

from gpudiag.analysis.attribution.families import COMMUNICATION
from gpudiag.analysis.rules.base import RuleContext
from gpudiag.analysis.rules.distributed import DISTRIBUTED_RULES
from gpudiag.analysis.rules.expert import EXPERT_RULES
from gpudiag.analysis.rules.host import (host_compute, host_syncs, input_stall, overhead_bound, pageable_copies,
                                         unfused_optimizer)
from gpudiag.analysis.rules.inference import INFERENCE_RULES
from gpudiag.analysis.rules.kernels import (fp32_matmul, gemm_alignment, inference_quantization, multi_stream,
                                            small_grids, unfused_attention, unfused_norm)
from gpudiag.analysis.rules.ncu import NCU_RULES

# host_compute after input_stall: on a tie (RANK_RESOLUTION) the stall before the step's first kernel, whose
# fix names the input pipeline, comes first
RULES = (fp32_matmul, gemm_alignment, overhead_bound, host_syncs, pageable_copies, input_stall, host_compute,
         unfused_optimizer, unfused_attention, unfused_norm, small_grids, *NCU_RULES, multi_stream,
         inference_quantization, *INFERENCE_RULES, *DISTRIBUTED_RULES, *EXPERT_RULES)


# Issue 11: a recommendation whose estimated saving is under 0.5 % of the step is noise, not advice;
# it stays out of the terminal and HTML and is kept in report.json under ``suppressed``.
SILENT_SHARE = 0.005


def recommend_split(ctx: RuleContext) -> tuple[list[dict], list[dict]]:
    """(shown, suppressed): every rule's recommendation (those that fired) as plain dicts, by
    expected saving; those with an estimated saving under :data:`SILENT_SHARE` of the step go to
    ``suppressed`` with ``suppressed_because``. Rules whose saving is not estimated stay shown.
    Savings are per rule and can overlap (e.g. the same GEMMs in the FP8 and small-grid rules):
    they are not meant to be added up."""
    shown, suppressed = [], []
    if not ctx.step_ns or ctx.step_ns <= 0:  # no step length (a broken export): no share to judge by
        return shown, suppressed
    if "kernel_class" in ctx.km:  # no roofline rule applies to collectives (NCCL's small grids are deliberate)
        comm = ctx.km["kernel_class"] == COMMUNICATION
        ctx = replace(ctx, km=ctx.km[~comm], communication_ns=float(ctx.km.loc[comm, "duration_ns"].sum()) / ctx.n_steps,
                      collectives=ctx.km[comm])
    for rule in RULES:
        try:
            rec = rule(ctx)
        except Exception as exc:  # noqa: BLE001 - one rule failing on an odd export must not lose the report
            suppressed.append({"rule": rule.__name__, "rule_id": None, "saving_ns_per_step": 0.0,
                               "suppressed_because": f"the rule failed on this export: {type(exc).__name__}: {exc}"})
            continue
        if rec is None:
            continue
        rec.saving_percent_of_step = 100.0 * rec.saving_ns_per_step / ctx.step_ns if ctx.step_ns else None
        row = asdict(rec) | {"rule": rule.__name__}
        if rec.saving_estimated and rec.saving_ns_per_step < SILENT_SHARE * ctx.step_ns:
            row["suppressed_because"] = (f"estimated saving {rec.saving_ns_per_step / 1e6:.3f} ms/step, under "
                                         f"{SILENT_SHARE:.1%} of the step")
            suppressed.append(row)
        else:
            shown.append(row)
    order = {rule.__name__: i for i, rule in enumerate(RULES)}
    return rank(shown, order), rank(suppressed, order)


# Savings within this factor of each other rank in RULES order, not by their digits: two captures of
# one workload differ by a few % in every saving (three ResNet-50 captures on the H100, 2026-11-23:
# 11.38-11.40 ms channels_last, 3.16-3.20 ms compile), and rules that share one estimate (batch
# headroom re-uses the small-grid saving) must not swap places on noise.
RANK_RESOLUTION = 1.10


def rank(recs: list[dict], order: dict[str, int] | None = None) -> list[dict]:
    """``recs`` sorted by saving on a log scale in steps of :data:`RANK_RESOLUTION` (larger first),
    then by ``order`` (rule function name -> place in :data:`RULES`, via each row's ``rule``)."""
    def key(rec: dict) -> tuple[float, int]:
        saving = max(float(rec.get("saving_ns_per_step") or 0.0), 1.0)
        return -float(np.floor(np.log(saving) / np.log(RANK_RESOLUTION))), (order or {}).get(rec.get("rule", ""), 0)

    return sorted(recs, key=key)


def recommend(ctx: RuleContext) -> list[dict]:
    """The recommendations shown (see :func:`recommend_split`), by expected saving."""
    return recommend_split(ctx)[0]
