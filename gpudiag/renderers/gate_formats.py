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


def plain_line(c: dict) -> str:
    """One metric in one line, nothing cut: ``step_time: 31.2 ms -> 34.0 ms (+9.0 %, p=0.0012) regression``."""
    return (f"{c['name']}: {_value(c['baseline_median'], c['unit'])} -> {_value(c['current_median'], c['unit'])} "
            f"({_change(c)}, p={_p(c)}) {c['verdict']}")


def terminal(result: dict, console: Console | None = None, show_all: bool = False) -> None:
    """The gate's rows: a table on a terminal (columns as wide as their longest cell, lines not
    cropped), plain lines (:func:`plain_line`) where the output is piped, so that a CI log never
    reads ``regres…`` or ``0.000…`` whatever its width."""
    from gpudiag.renderers.terminal import print_whole, whole_column

    console = console or Console()
    rows = shown(result, show_all)
    if not console.is_terminal:
        console.print(Text(f"gpudiag gate: {result['verdict'].upper()}"), highlight=False, soft_wrap=True)
        for c in rows:
            console.print(Text(plain_line(c)), highlight=False, soft_wrap=True)
    else:
        table = Table(show_header=True, header_style="bold", title=f"gpudiag gate: {result['verdict'].upper()}")
        cells = [[c["name"], _value(c["baseline_median"], c["unit"]), _value(c["current_median"], c["unit"]),
                  _change(c), _p(c), c["verdict"]] for c in rows]
        headers = ("metric", "before (median)", "after (median)", "Δ", "p", "verdict")  # latency_p90: the p90
        for i, header in enumerate(headers):
            whole_column(table, header, [r[i].replace(" ", "") for r in cells] + [header.split()[0]],
                         justify="left" if i == 0 else "right", no_wrap=True)
        for c, r in zip(rows, cells):
            table.add_row(*(Text(v) for v in r[:-1]), Text(r[-1], style=VERDICT_STYLE.get(c["verdict"], "")))
        print_whole(console, table)
    hidden = len(result["metrics"]) - len(rows)
    if hidden:
        console.print(f"{hidden} more metrics within their thresholds or in one run only (--all shows them)",
                      highlight=False, soft_wrap=True)


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


GITHUB_TOP = 5  # GitHub shows 10 annotations per step: one summary and the largest few


def github(result: dict) -> str:
    """GitHub workflow commands: one summary annotation (``::error`` when anything regressed, else
    ``::warning`` or ``::notice``) counting regressions and warnings, then one annotation for each of
    the :data:`GITHUB_TOP` largest changes among them (GitHub shows 10 per step), then a plain
    summary line."""
    flagged = [c for c in result["metrics"] if c["verdict"] in ("regression", "warning")]
    flagged.sort(key=lambda c: (c["verdict"] != "regression", -abs(c["change"] or 0.0)))
    regressions = sum(c["verdict"] == "regression" for c in flagged)
    kind = "error" if regressions else ("warning" if flagged else "notice")
    summary = (f"{result['verdict']}: {regressions} regression(s), {len(flagged) - regressions} warning(s) of "
               f"{len(result['metrics'])} metrics")
    if len(flagged) > GITHUB_TOP:
        summary += f"; the {GITHUB_TOP} largest follow, all in the job log (--format terminal)"
    lines = [f"::{kind} title=gpudiag gate::{_escape_annotation(summary)}"]
    for c in flagged[:GITHUB_TOP]:
        lines.append(f"::{'error' if c['verdict'] == 'regression' else 'warning'} title=gpudiag gate::"
                     f"{_escape_annotation(plain_line(c))}")
    lines.append(f"gpudiag gate: {result['verdict']}")
    return "\n".join(lines) + "\n"
