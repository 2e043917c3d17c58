"""Invariants every report must satisfy before it is written. A violation is a bug in gpudiag or an
export it misread: the tests fail on one (tests/test_invariants.py runs them on every committed
capture), and a user sees one warning naming it, with the report's ``invariants`` listing all.

Each invariant is a named function from the report dict to a list of violations (strings). They
read only report.json's fields, so they also check reports written by older runs.
"""

from __future__ import annotations

import math

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


INVARIANTS = (gpu_busy_within_0_100, step_times_positive, breakdown_sums_to_100, savings_within_the_step)


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
