"""Formatting of numbers with their units, shared by the HTML and terminal reporters."""

from __future__ import annotations

import math


def fmt_ns(value) -> str:
    """A duration in ns as text with a readable unit: '812 ns', '3.41 µs', '12.3 ms', '1.20 s'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    v = float(value)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(v) >= scale:
            x = v / scale
            return f"{x:.3g} {unit}" if abs(x) < 100 else f"{x:.0f} {unit}"
    return f"{v:.0f} ns"


def fmt_pct(value) -> str:
    """A percentage with one decimal, '–' for missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{float(value):.1f} %"


def fmt_num(value, digits: int = 3) -> str:
    """A plain number with ``digits`` significant digits, '–' for missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{float(value):.{digits}g}"


def fmt_bytes(value) -> str:
    """A size in bytes with a decimal unit: '812 B', '46.1 MB', '1.05 GB'; '–' for missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    v = float(value)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.0f} B"


def budget_text(account: dict) -> str:
    """The trials' budget account (gpudiag.trials.runner.budget_account) in one line: seconds used
    of the budget, the runs made by kind, the planned runs not made and why, the changes decided
    early and those the budget left out."""
    runs = account.get("runs") or {}
    settle = runs.get("settle", 0)
    made = [f"{settle} settling ({'counted as a baseline' if account.get('settle_counted') else 'not counted'})"
            if settle else None, f"{runs.get('baseline', 0)} baseline", f"{runs.get('trial', 0)} trial"]
    not_run = account.get("not_run") or {}
    skipped = (f"{sum(not_run.values())} planned not made ({'; '.join(f'{n}: {why}' for why, n in not_run.items())})"
               if not_run else "every planned run made")
    early = ", ".join(f"{d['change']} ({d['decision']})" for d in account.get("decided_early") or []) or "none"
    left = ", ".join(account.get("left_out_for_budget") or []) or "none"
    cut = account.get("stopped_by_budget") or 0
    return (f"trials budget: {account.get('used_s', 0):.0f} s of {account.get('budget_s', 0):.0f} s used; "
            f"runs: {', '.join(m for m in made if m)}; {skipped}"
            + (f"; {cut} stopped by the budget" if cut else "")
            + f"; decided early: {early}; left out for the budget: {left}")
