"""Which recommendations count the same time, so their savings are not added up past the step.

Each rule's saving is a share of one kind of time in the step: kernel time of some kernels, GPU
idle while the host launches, idle before the step's first kernel, copy time. Two rules whose
kinds of time meet (the same kernels, the same idle) claim part of the same time: the report says
so in each recommendation's ``overlaps`` (the other rules' ids), and the invariant
``additive_savings_within_the_step`` (:mod:`gpudiag.analysis.findings.invariants`) checks that the savings
of rules that do not overlap add up to no more than the step.

Kinds of time are ``:``-separated paths; a kind meets itself, its parents and its children
("kernels" meets "kernels:contraction"). The table is gpudiag's reading of each rule's docstring
(:mod:`gpudiag.analysis.rules.kernels`, :mod:`gpudiag.analysis.rules.expert`); a rule missing from it
is taken to meet every other (never claimed additive), and a test requires every rule to be listed.
"""

from __future__ import annotations

TIME_ACTED_ON: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    "GD-FP32-MATMUL": {"kernels:contraction"},
    "GD-HALF-WEIGHTS": {"kernels:contraction", "kernels:memory"},  # bf16 GEMMs, half the bytes elsewhere
    "GD-STATIC-KV-CACHE": {"kernels:memory", "idle:host"},  # the cache's copies; CUDA graphs of the decode step
    "GD-GEMM-ALIGN": {"kernels:contraction"},
    "GD-FP8-INFERENCE": {"kernels:contraction"},
    "GD-CUDNN-BENCHMARK": {"kernels:contraction"},
    "GD-OVERHEAD-BOUND": {"idle:host:launch"},  # launch-bound idle between kernels (steps.host_work)
    "GD-HOST-COMPUTE": {"idle:host:compute", "idle:step-start"},  # host compute, before the first kernel too
    "GD-DDP-NO-SYNC": {"communication"},  # the collectives of the micro-batches but the last
    "GD-HOST-SYNC": {"idle:host"},  # the part of it that begins during a sync
    "GD-INPUT-STALL": {"idle:step-start"},  # host-bound idle before the step's first kernel
    "GD-PAGEABLE-COPY": {"copies"},
    "GD-UNFUSED-OPTIMIZER": {"kernels:memory:optimizer"},
    "GD-UNFUSED-ATTENTION": {"kernels:memory:softmax"},
    "GD-ATTENTION-NOT-FLASH": {"kernels:memory:softmax"},
    "GD-UNFUSED-NORM": {"kernels:memory:norm"},
    "GD-CHANNELS-LAST": {"kernels:memory:layout", "kernels:memory:norm"},  # conversions, NCHW BatchNorm
    "GD-FP32-UNDER-AUTOCAST": {"kernels:memory:elementwise", "kernels:memory:norm", "kernels:memory:softmax"},
    "GD-TORCH-COMPILE": {"kernels:memory", "idle:host"},  # fused chains + the launches they remove
    # the overhead-bound or small-grid saving; its per-step idle includes the step start's, where an
    # input-bound loop waits (a larger batch there waits longer for its input: the same time)
    "GD-BATCH-HEADROOM": {"idle:host", "idle:step-start", "kernels"},
    "GD-SMALL-GRID": {"kernels"},
    "GD-MULTI-STREAM": {"kernels"},
    "GD-LOCAL-MEMORY": {"kernels"},
    "GD-UNCOALESCED": {"kernels"},
    "GD-LOW-OCCUPANCY": {"kernels"},
}.items()}
UNKNOWN = frozenset({""})  # "" is a parent of every kind: an unlisted rule meets all


def _meet(a: str, b: str) -> bool:
    return a == b or not a or not b or a.startswith(b + ":") or b.startswith(a + ":")


def overlap(rule_a: str, rule_b: str) -> bool:
    """Whether two rules' savings are made of the same kind of time (:data:`TIME_ACTED_ON`)."""
    kinds_a, kinds_b = TIME_ACTED_ON.get(rule_a, UNKNOWN), TIME_ACTED_ON.get(rule_b, UNKNOWN)
    return any(_meet(a, b) for a in kinds_a for b in kinds_b)


def mark_overlaps(recommendations: list[dict]) -> list[dict]:
    """Sets ``overlaps`` (the ids of the other recommendations in the list whose saving counts the
    same time) on each recommendation dict, in place; returns the list."""
    for rec in recommendations:
        rec["overlaps"] = [other["rule_id"] for other in recommendations
                           if other is not rec and overlap(rec["rule_id"], other["rule_id"])]
    return recommendations


def largest_additive_total(savings: dict[str, float], overlaps: dict[str, list[str]]) -> tuple[float, list[str]]:
    """The largest sum of savings (ns) over recommendations no two of which overlap, and their ids.
    ``savings``: rule id -> saving; ``overlaps``: rule id -> the ids it overlaps. Exhaustive
    branch and bound: a report has a few dozen rules at most."""
    ids = sorted(savings, key=lambda r: -savings[r])
    best: list = [0.0, []]

    def search(i: int, total: float, chosen: list[str], banned: set[str]) -> None:
        if total > best[0]:
            best[:] = [total, list(chosen)]
        rest = sum(max(savings[r], 0.0) for r in ids[i:] if r not in banned)
        if i == len(ids) or total + rest <= best[0]:
            return
        rule = ids[i]
        if rule not in banned and savings[rule] > 0:
            search(i + 1, total + savings[rule], chosen + [rule], banned | set(overlaps.get(rule, [])))
        search(i + 1, total, chosen, banned)

    search(0, 0.0, [], set())
    return best[0], best[1]
