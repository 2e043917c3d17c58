"""The profile's findings corrected by the run without the profiler (the bare run,
:func:`gpudiag.analysis.steps.representative.compare_bare`): ``representativeness``, the
overhead-bound numbers less the host time tracing added, and every share of the step taken of the
bare step.
"""

from __future__ import annotations

from gpudiag.analysis.fusion.dataflow import mark_host_bound
from gpudiag.analysis.rules.host_floor import graph_floor_ns
from gpudiag.analysis.rules.registry import RULES, rank
from gpudiag.analysis.steps.representative import compare_bare

# GD-OVERHEAD-BOUND's own threshold (rules.host.overhead_bound): host-bound idle ≥ 15 % of the step.
OVERHEAD_BOUND_SHARE = 0.15
# Above this inflation the report flags the profiled numbers (kernel times move ~1 % under tracing:
# shared/design.md, ResNet-50 on the H200).
FLAG_INFLATION_PERCENT = 5.0


def _correct_overhead_rule(report: dict, inflation_ns: float, bare_ns: float) -> None:
    """Re-judge GD-OVERHEAD-BOUND on host-bound idle less the inflation; move it to
    ``suppressed`` when it falls under its threshold of the bare step."""
    kept, suppressed = [], report.setdefault("suppressed", [])
    for rec in report.get("recommendations", []):
        if rec["rule_id"] != "GD-OVERHEAD-BOUND":
            kept.append(rec)
            continue
        raw = rec["saving_ns_per_step"]
        corrected = max(0.0, raw - inflation_ns)
        floor = rec.get("graph_floor")
        if floor:  # a loop of forwards: what CUDA graphs leave, scaled to the bare run (host_floor.graph_floor_ns)
            left = graph_floor_ns(floor, bare_ns / floor["profiled_step_ns"] if floor["profiled_step_ns"] else 1.0)
            corrected = min(max(floor["idle_ns"] - inflation_ns, 0.0), max(bare_ns - left, 0.0))
        rec["saving_ns_per_step_under_profiler"] = raw
        rec["saving_ns_per_step"] = corrected
        rec["saving_percent_of_step"] = 100.0 * corrected / bare_ns
        rec["evidence"].append(f"corrected for the profiler: {raw / 1e6:.2f} ms/step of host-bound idle under nsys, "
                               f"less {inflation_ns / 1e6:.2f} ms/step of host time tracing added (bare run)")
        if corrected < OVERHEAD_BOUND_SHARE * bare_ns:
            rec["suppressed_because"] = (f"without the profiler at most {corrected / 1e6:.2f} ms/step of host-bound idle "
                                         f"remains, under {OVERHEAD_BOUND_SHARE:.0%} of the {bare_ns / 1e6:.2f} ms bare step")
            suppressed.append(rec)
        else:
            kept.append(rec)
    # the corrected saving may change its place
    report["recommendations"] = rank(kept, {rule.__name__: i for i, rule in enumerate(RULES)})


def _cap_host_compute_rule(report: dict, bare_ns: float) -> None:
    """GD-HOST-COMPUTE's saving is GPU idle while the host computes, and tracing slows that host
    work and the launches around it alike: the saving keeps its share of the profiled step in the
    bare step (the rest of the step, launches, copies and the GPU's own work, stays after the
    change), and the GPU cannot idle longer than the bare step less its own busy time (the profiled
    kernels' time per step, which tracing moves by ~1 %). A bare step longer than the profiled one
    scales nothing up. H100, 2026-11-26: a server making its input on the CPU idled 38.5 ms/step
    under nsys in a 45.2 ms mean step, 85 % of it, against a 38.9 ms bare mean step; the input made
    on the GPU by hand saved 84 % [80, 88] (docs/real_scripts.md), where "bare step less GPU work"
    said 97 %."""
    mean = float((((report.get("steps") or {}).get("step_time_ns")) or {}).get("mean") or 0.0)
    busy = mean * float(report.get("gpu_busy_percent") or 0.0) / 100.0  # GPU busy time per profiled step
    if not mean:
        return
    for rec in report.get("recommendations", []):
        if rec["rule_id"] == "GD-HOST-COMPUTE":
            profiled = float(rec["saving_ns_per_step"])
            corrected = min(profiled * min(1.0, bare_ns / mean), max(bare_ns - busy, 0.0))
            if corrected < profiled:
                rec["saving_ns_per_step_under_profiler"] = profiled
                rec["saving_ns_per_step"] = corrected
                rec["evidence"].append(f"corrected for the profiler: {100 * profiled / mean:.0f} % of the "
                                       f"{mean / 1e6:.2f} ms profiled step, kept in the {bare_ns / 1e6:.2f} ms bare "
                                       f"step (the launches, copies and {busy / 1e6:.2f} ms/step of GPU work stay)")


def rebase_shares(report: dict, bare_ns: float) -> None:
    """One step reference for every share: each recommendation's ``saving_percent_of_step`` (shown
    and suppressed) becomes a share of the bare step, the step the user's script runs without the
    profiler; ``share_reference`` says so. (Issue 21: the corrected GD-OVERHEAD-BOUND was a share
    of the bare step while the next row's was of the profiled step.) ``bare_ns``: the larger of the
    bare run's mean and median step, since savings are means over the steady state and the median of
    steps that alternate (a loader keeping up with every other batch) is the fast half's."""
    for rec in [*report.get("recommendations", []), *report.get("suppressed", [])]:
        if rec.get("saving_ns_per_step") is not None and bare_ns:
            rec["saving_percent_of_step"] = 100.0 * float(rec["saving_ns_per_step"]) / bare_ns
    report["share_reference"] = {"step": "bare", "step_time_ns": bare_ns}


def apply_bare_run(report: dict) -> dict:
    """Adds ``representativeness`` to ``report`` (see :func:`compare_bare`) and corrects its
    overhead-bound numbers: ``idle.host_bound_idle_ns_per_step_corrected``, GD-OVERHEAD-BOUND
    (saving, or moved to ``suppressed``) and the fusion note that depends on it. Returns ``report``."""
    comparison = compare_bare(report)
    report["representativeness"] = comparison
    if not comparison or "unavailable" in comparison:
        return report
    inflation = max(0.0, comparison["inflation_ns"])
    idle = report.get("idle") or {}
    if idle.get("host_bound_idle_ns_per_step") is not None:
        idle["host_bound_idle_ns_per_step_corrected"] = max(0.0, idle["host_bound_idle_ns_per_step"] - inflation)
    mean_ns = comparison.get("bare_mean_step_time_ns") or comparison["bare_step_time_ns"]
    _cap_host_compute_rule(report, mean_ns)
    _correct_overhead_rule(report, inflation, comparison["bare_step_time_ns"])
    rebase_shares(report, max(mean_ns, comparison["bare_step_time_ns"]))
    report["fusion_note"] = mark_host_bound(report.get("fusion_candidates", []), report["recommendations"])
    if comparison["inflation_percent"] > FLAG_INFLATION_PERCENT:
        report.setdefault("warnings", []).append(
            f"the profiler slowed the step by {comparison['inflation_percent']:.0f} % "
            f"({comparison['profiled_step_time_ns'] / 1e6:.2f} ms under the profiler, "
            f"{comparison['bare_step_time_ns'] / 1e6:.2f} ms without it): overhead-bound numbers are corrected, "
            "per-kernel GPU times are as measured")
    return report
