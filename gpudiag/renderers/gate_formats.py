"""Renderings of a gate result: terminal table, JSON, JUnit XML, Markdown, GitHub annotations.

All take the plain result dict built by :func:`result_dict`."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from dataclasses import asdict

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpudiag.analysis.gate import Comparison
from gpudiag.renderers.units import fmt_ns

VERDICT_STYLE = {"regression": "bold red", "warning": "yellow", "improvement": "green", "ok": "", "new": "dim", "gone": "dim"}
HEADLINE = ("step_time", "gpu_busy_time", "overhead_time", "kernel_launches", "peak_memory")


def result_dict(comparisons: list[Comparison], verdict: str, exit_code: int, baseline: str, current: str,
                env_differences: list[str], alpha: float) -> dict:
    """The gate result as plain data (also the ``--format json`` output)."""
    return {"verdict": verdict, "exit_code": exit_code, "baseline": baseline, "current": current, "alpha": alpha,
            "test": "two-sided Mann-Whitney U on per-step samples", "environment_differences": env_differences,
            "metrics": [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(c).items()}
                        for c in comparisons]}


def _value(value, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "ns":
        return fmt_ns(value)
    if unit == "percent":
        return f"{value:.1f} %"
    if unit == "bytes":
        return f"{value / 2**20:.1f} MiB"
    if unit == "per_s":
        return f"{value:.1f}/s"
    return f"{value:.0f}"


def _change(c: dict) -> str:
    return "–" if c["change"] is None else f"{100 * c['change']:+.1f} %"


def _p(c: dict) -> str:
    return "–" if c["p_value"] is None else f"{c['p_value']:.3g}"


def shown(result: dict, show_all: bool) -> list[dict]:
    """Rows worth showing: headline metrics and anything not ok (all rows with ``show_all``)."""
    return [c for c in result["metrics"] if show_all or c["name"] in HEADLINE or c["verdict"] not in ("ok", "new", "gone")]


def terminal(result: dict, console: Console | None = None, show_all: bool = False) -> None:
    console = console or Console()
    table = Table(show_header=True, header_style="bold", title=f"gpudiag gate: {result['verdict'].upper()}")
    table.add_column("metric", no_wrap=True, overflow="ellipsis", max_width=48)
    for col in ("before (median)", "after (median)", "Δ", "p", "verdict"):  # medians of per-step samples (latency_p90: the p90)
        table.add_column(col, justify="right")
    for c in shown(result, show_all):
        table.add_row(Text(c["name"]), _value(c["baseline_median"], c["unit"]), _value(c["current_median"], c["unit"]),
                      _change(c), _p(c), Text(c["verdict"], style=VERDICT_STYLE.get(c["verdict"], "")))
    console.print(table)
    hidden = len(result["metrics"]) - len(shown(result, show_all))
    if hidden:
        console.print(f"{hidden} more metrics within their thresholds or in one run only (--all shows them)", highlight=False)


def to_json(result: dict) -> str:
    return json.dumps(result, indent=1)


def markdown(result: dict, show_all: bool = False) -> str:
    lines = [f"### gpudiag gate: {result['verdict']}", "",
             f"Baseline `{result['baseline']}` vs current `{result['current']}`; {result['test']}, alpha {result['alpha']}.", "",
             "| metric | before (median) | after (median) | Δ | p | verdict |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    for c in shown(result, show_all):
        name = c["name"].replace("|", "\\|")
        lines.append(f"| `{name}` | {_value(c['baseline_median'], c['unit'])} | {_value(c['current_median'], c['unit'])} "
                     f"| {_change(c)} | {_p(c)} | {'**' + c['verdict'] + '**' if c['verdict'] == 'regression' else c['verdict']} |")
    return "\n".join(lines) + "\n"


def junit(result: dict) -> str:
    """One test case per metric; regressions are failures, warnings go to system-out."""
    suite = ET.Element("testsuite", name="gpudiag.gate", tests=str(len(result["metrics"])),
                       failures=str(sum(c["verdict"] == "regression" for c in result["metrics"])))
    for c in result["metrics"]:
        case = ET.SubElement(suite, "testcase", classname="gpudiag.gate", name=c["name"])
        message = (f"{c['name']}: {_value(c['baseline_median'], c['unit'])} -> {_value(c['current_median'], c['unit'])} "
                   f"({_change(c)}, p={_p(c)}, threshold {100 * c['threshold']:.0f} %)")
        if c["verdict"] == "regression":
            ET.SubElement(case, "failure", message=message, type="regression").text = message
        elif c["verdict"] == "warning":
            ET.SubElement(case, "system-out").text = "warning (large but not significant): " + message
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _escape_annotation(text: str) -> str:
    # GitHub workflow commands: %, CR and LF must be escaped in the message.
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def github(result: dict) -> str:
    """``::error``/``::warning`` workflow commands, one per regression/warning, then a summary line."""
    lines = []
    for c in result["metrics"]:
        if c["verdict"] in ("regression", "warning"):
            kind = "error" if c["verdict"] == "regression" else "warning"
            msg = (f"{c['name']} {c['verdict']}: {_value(c['baseline_median'], c['unit'])} -> "
                   f"{_value(c['current_median'], c['unit'])} ({_change(c)}, p={_p(c)})")
            lines.append(f"::{kind} title=gpudiag gate::{_escape_annotation(msg)}")
    lines.append(f"gpudiag gate: {result['verdict']}")
    return "\n".join(lines) + "\n"
