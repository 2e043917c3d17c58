"""What Dynamo did in the profiled process (``torch.compile``): graphs, graph breaks and
recompilations, read from ``torch._dynamo.utils.counters`` when the script ends."""

from __future__ import annotations

import sys


def _break_reason(text) -> str:
    """Dynamo's graph-break text shortened to its title and explanation lines (≤ 300 chars)."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    keep = lines[:1] + [line.removeprefix("Explanation: ") for line in lines[1:] if line.startswith("Explanation:")]
    return ": ".join(keep)[:300]


def compile_summary() -> dict | None:
    """What Dynamo did in this process, from ``torch._dynamo.utils.counters`` (None when
    torch.compile was never used): frames compiled, graphs captured, graph breaks (with their
    reasons' first lines and counts) and recompilations. Read at the end of the script."""
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import counters

    stats, frames = counters.get("stats", {}), counters.get("frames", {})
    if not stats and not frames:
        return None
    breaks = counters.get("graph_break", {})
    return {
        "frames_compiled": int(frames.get("ok", 0)),
        "unique_graphs": int(stats.get("unique_graphs", 0)),
        "calls_captured": int(stats.get("calls_captured", 0)),
        "graph_breaks": int(sum(breaks.values())),
        "graph_break_reasons": [{"reason": _break_reason(r), "count": int(n)}
                                for r, n in sorted(breaks.items(), key=lambda kv: -kv[1])[:10]],
        "recompiles": int(sum(counters.get("recompiles", {}).values())),
    }
