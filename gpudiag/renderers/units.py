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
