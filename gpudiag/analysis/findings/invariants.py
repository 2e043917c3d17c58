"""Invariants every report must satisfy before it is written. A violation is a bug in gpudiag or an
export it misread: the tests fail on one (tests/analysis/findings/test_invariants.py runs them on every committed
capture), and a user sees one warning naming it, with the report's ``invariants`` listing all.

Each invariant is a named function from the report dict to a list of violations (strings). They
read only report.json's fields, so they also check reports written by older runs.
"""

from __future__ import annotations

import math

from gpudiag.analysis.rules.overlaps import largest_additive_total

# Rounding: percentages are sums of floats over many steps; ±0.5 points is the tolerance.
SHARE_TOLERANCE_POINTS = 0.5


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def gpu_busy_within_0_100(report: dict) -> list[str]:
    """GPU busy is a share of the step: between 0 and 100 %."""
    busy = report.get("gpu_busy_percent")
    if busy is None:
        return []
    if not _finite(busy) or not -1e-9 <= busy <= 100 + 1e-9:
        return [f"GPU busy is {busy} %"]
    return []


def step_times_positive(report: dict) -> list[str]:
    """Every measured step lasts longer than 0 ns, and min ≤ median ≤ max."""
    st = (report.get("steps") or {}).get("step_time_ns") or {}
    if not st or st.get("median") is None or not report["steps"].get("measured"):
        return []
    out = [f"step {s['step']} lasts {s['step_time_ns']} ns" for s in report["steps"]["per_step"]
           if s.get("measured") and not s["step_time_ns"] > 0]
    if not st["min"] <= st["median"] <= st["max"]:
        out.append(f"median step {st['median']} ns outside [{st['min']}, {st['max']}]")
    return out


def breakdown_sums_to_100(report: dict) -> list[str]:
    """compute + bandwidth + overhead + idle shares of the step add up to 100 % (±0.5)."""
    shares = report.get("breakdown_percent") or {}
    if not shares:
        return []
    total = sum(v for v in shares.values() if _finite(v))
    if abs(total - 100.0) > SHARE_TOLERANCE_POINTS:
        return [f"the breakdown adds up to {total:.2f} %"]
    return [f"{k} share is {v} %" for k, v in shares.items() if _finite(v) and v < -SHARE_TOLERANCE_POINTS]


def overhead_split_adds_up(report: dict) -> list[str]:
    """Launch-bound + host-compute idle = host-bound (overhead) idle (:mod:`gpudiag.analysis.steps.host_work`):
    per measured step, per step in ``idle``, and the breakdown's overhead = its two parts
    (``overhead_split_ns_per_step``), each part ≥ 0; within 1 ns or 1e-9 of the total. Reports
    written before the split are not checked."""
    out = []

    def check(where: str, total, parts: list) -> None:
        if not _finite(total) or not all(_finite(p) for p in parts):
            return
        if any(p < -1e-6 for p in parts):
            out.append(f"{where}: a negative part ({', '.join(f'{p:.0f}' for p in parts)} ns)")
        elif abs(sum(parts) - total) > max(1.0, 1e-9 * abs(total)):
            out.append(f"{where}: {' + '.join(f'{p:.0f}' for p in parts)} ns, not {total:.0f} ns")

    idle = report.get("idle") or {}
    if "host_compute_idle_ns_per_step" in idle:
        check("idle per step", idle.get("host_bound_idle_ns_per_step"),
              [idle.get("launch_bound_idle_ns_per_step"), idle["host_compute_idle_ns_per_step"]])
    for s in (report.get("steps") or {}).get("per_step") or []:
        if s.get("measured") and "host_compute_idle_ns" in s:
            check(f"step {s['step']}", s.get("host_bound_idle_ns"), [s.get("launch_bound_idle_ns"), s["host_compute_idle_ns"]])
    split = report.get("overhead_split_ns_per_step") or {}
    if split:
        check("the breakdown's overhead", (report.get("breakdown_ns_per_step") or {}).get("overhead_ns"),
              [split.get("launch_bound_ns"), split.get("host_compute_ns")])
    return out


def savings_within_the_step(report: dict) -> list[str]:
    """No saving exceeds the step it is a share of: recommendations (percent ≤ 100) and fusion
    candidates (≤ the mean step)."""
    mean = ((report.get("steps") or {}).get("step_time_ns") or {}).get("mean")
    out = []
    for rec in report.get("recommendations") or []:
        pct = rec.get("saving_percent_of_step")
        if rec["saving_ns_per_step"] < 0 or (_finite(pct) and pct > 100 + 1e-9):
            out.append(f"{rec['rule_id']} saves {rec['saving_ns_per_step'] / 1e6:.2f} ms/step ({pct} % of the step)")
    for cand in report.get("fusion_candidates") or []:
        if _finite(mean) and cand["saving_ns_per_step"] > mean:
            out.append(f"fusion candidate {' → '.join(cand['ops'][:3])} saves more than the mean step")
    return out


def additive_savings_within_the_step(report: dict) -> list[str]:
    """Savings of rules that count different time (no rule in the other's ``overlaps``,
    :mod:`gpudiag.analysis.rules.overlaps`) may be added up: the largest such sum stays within the
    (steady-state mean) step. Rules that count the same time say so instead. Reports written
    before ``overlaps`` existed are not checked."""
    recs = report.get("recommendations") or []
    mean = ((report.get("steps") or {}).get("step_time_ns") or {}).get("mean")
    if not recs or not _finite(mean) or any("overlaps" not in r for r in recs):
        return []
    total, ids = largest_additive_total({r["rule_id"]: r["saving_ns_per_step"] for r in recs},
                                        {r["rule_id"]: r["overlaps"] for r in recs})
    if total > mean * (1 + 1e-9):
        return [f"{' + '.join(ids)} count different time and save {total / 1e6:.2f} ms/step together, "
                f"more than the {mean / 1e6:.2f} ms step"]
    return []


def steady_state_excludes_outliers(report: dict) -> list[str]:
    """The steady state (``measured`` steps) holds no step over the outlier threshold (factor ×
    the median of the measured and outlier steps) unless such steps are more than ``max_share`` of
    them (recurrent: none is an outlier), every outlier step is over it, and the counts
    agree (:mod:`gpudiag.analysis.steps.outliers`). Reports without ``outlier_steps`` are not checked."""
    found = report.get("outlier_steps")
    per_step = (report.get("steps") or {}).get("per_step") or []
    if not found or found.get("threshold_ns") is None:
        return []
    over = [s for s in per_step if s.get("measured") and s["step_time_ns"] > found["threshold_ns"]]
    share = found.get("max_share")  # slow steps over this share of the measured ones are the steady state's own
    recurrent = share is not None and not found["count"] and len(over) >= found.get("min_recurrent", 0) \
        and len(over) > share * sum(1 for s in per_step if s.get("measured"))
    out = [] if recurrent else [f"steady-state step {s['step']} lasts {s['step_time_ns']} ns, over the "
                                f"{found['threshold_ns']:.0f} ns threshold" for s in over]
    out += [f"outlier step {s['step']} lasts {s['step_time_ns']} ns, under the {found['threshold_ns']:.0f} ns threshold"
            for s in per_step if s.get("outlier") and not s["step_time_ns"] > found["threshold_ns"]]
    flagged = sum(1 for s in per_step if s.get("outlier"))
    if not flagged == found["count"] == report["steps"].get("outliers", flagged):
        out.append(f"{flagged} steps flagged, {found['count']} outlier steps reported")
    return out


INVARIANTS = (gpu_busy_within_0_100, step_times_positive, breakdown_sums_to_100, overhead_split_adds_up,
              savings_within_the_step, additive_savings_within_the_step, steady_state_excludes_outliers)


def same_steps(reports: dict[str, dict]) -> list[str]:
    """Across reports of one capture read from different inputs (``.sqlite``, ``.sqlite.xz``, a run
    directory; input name -> report): the same step count, measured and outlier counts and median
    step time. Not in :data:`INVARIANTS` (it needs several reports); tests run it."""
    keys = {name: (r["steps"]["count"], r["steps"]["measured"], r["steps"].get("outliers"),
                   r["steps"]["step_time_ns"]["median"]) for name, r in reports.items()}
    first = next(iter(keys.values()), None)
    return [f"{name}: steps, measured, outliers, median = {k}, not {first}" for name, k in keys.items() if k != first]


def check(report: dict) -> dict:
    """Runs every invariant on ``report``; sets ``report["invariants"]`` to {name: violations}
    for the violated ones (empty dict when all hold) and adds one warning per violated invariant.
    Returns ``report``."""
    violated = {}
    for invariant in INVARIANTS:
        found = invariant(report)
        if found:
            violated[invariant.__name__] = found
    report["invariants"] = violated
    for name, found in violated.items():
        report.setdefault("warnings", []).append(
            f"invariant {name} violated ({found[0]}{'; …' if len(found) > 1 else ''}): "
            "a gpudiag bug or a misread export; please report it")
    return report
