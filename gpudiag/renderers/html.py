"""``report.html``: a self-contained page (plotly.js inlined, no CDN) rendered from a jinja2
template with autoescaping on, so kernel names (``<``, ``>``, ``&``) are shown, never executed."""

from __future__ import annotations

# Lines marked "pragma: no mutate" are chart styling (sizes, margins, titles, colours of fixed
# series): mutation testing (docs/mutation.md) skips them; the charts' data and escaping are tested.

import ast
import functools
import html
import os
import re
from pathlib import Path

import jinja2
import markupsafe
import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline

from gpudiag.renderers import units
from gpudiag.renderers.labels import chain_summary, shorten
from gpudiag.renderers.terminal import overlap_pairs

# A kernel label in a table row is cut (in the middle) to this many characters; its details hold the
# whole name, as report.json does.
SUMMARY_WIDTH = 200
CLASS_COLORS = {"compute": "#4c78a8", "bandwidth": "#f58518", "overhead": "#e45756", "idle": "#bab0ac"}


def code_spans(text: str) -> markupsafe.Markup:
    """``text`` escaped, then each `backticked` span shown as <code> (escaping comes first, so the
    text can never inject markup)."""
    escaped = str(markupsafe.escape(text))
    return markupsafe.Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped))


# A storage address recorded after a tensor's shape ("bfloat16[32,768]@7f3a2c000000"): it links ops
# for the data-flow analysis and means nothing to a reader.
_ADDRESS = re.compile(r"(?<=\])@(?:0x)?[0-9a-fA-F]+\b")


def _readable(value) -> str:
    """One recorded op argument as text: lists comma-separated (nested ones in parentheses), keyword
    dicts as key=value."""
    if isinstance(value, (list, tuple)):
        return ", ".join(f"({_readable(v)})" if isinstance(v, (list, tuple)) else _readable(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_readable(v)}" for k, v in value.items())
    return str(value)


def _closing_bracket(text: str, start: int) -> int | None:
    """Index of the "]" closing the "[" at ``start``, skipping brackets inside quotes; None if none."""
    depth, quote = 0, None
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth == 0:
                return i
    return None


def evidence_text(text: str) -> str:
    """A recommendation's evidence line made readable: Python list literals of recorded op arguments
    ("['bfloat16[32,768]@7f3a...', ...]") become comma-separated shapes, storage addresses are
    dropped. Plain text, so autoescaping still applies to it."""
    out, i = [], 0
    while (start := text.find("[", i)) >= 0:
        end = _closing_bracket(text, start) if start == 0 or not (text[start - 1].isalnum() or text[start - 1] == "_") else None
        try:  # a shape such as float32[8,512] follows a word character and is left as it is
            value = ast.literal_eval(text[start:end + 1]) if end is not None else None
        except (ValueError, SyntaxError):
            value = None
        if isinstance(value, list):
            out.append(text[i:start] + _readable(value))
            i = end + 1
        else:
            out.append(text[i:start + 1])
            i = start + 1
    out.append(text[i:])
    return _ADDRESS.sub("", "".join(out))


class _QuietBytecodeCache(jinja2.FileSystemBytecodeCache):
    """A cache that a full or read-only disk never turns into a failed report: the compiled
    template is then not kept, and the next run compiles it again."""

    def dump_bytecode(self, bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """jinja2's cache of compiled templates in ``$XDG_CACHE_HOME/gpudiag/jinja`` (``~/.cache`` by
    default), None where that folder cannot be made: compiling report.html took 0.37 of a small
    report's 0.64 s of HTML on the CPU machine, each run (docs/scale.md, "gpudiag profile end to end").
    jinja2 keys each entry by the template's source checksum and its own version."""
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpudiag" / "jinja"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return _QuietBytecodeCache(str(folder))


@functools.lru_cache(maxsize=1)  # compiling the template takes ~0.3 s; once per process is enough
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gpudiag", "templates"), bytecode_cache=_bytecode_cache(),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(ns=units.fmt_ns, pct=units.fmt_pct, num=units.fmt_num, bytes=units.fmt_bytes, code=code_spans,
                       evidence=evidence_text, chain=chain_summary, overlap_pairs=overlap_pairs,
                       short=lambda label: shorten(label, SUMMARY_WIDTH), budget=units.budget_text)
    return env


def plotly_text(text: str) -> str:
    """``text`` for a plotly label or hover text: ``&``, ``<`` and ``>`` escaped, since plotly turns
    <b>, <a href>, <br> in labels into SVG elements (and shows entities as text); quotes are left as
    they are, since plotly shows ``&quot;`` as it is written, and with ``<`` escaped no tag can hold them."""
    return html.escape(text, quote=False)


def _figure_html(fig: go.Figure) -> str:
    # plotly escapes "</" inside its JSON, so names cannot close the script element.
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, config={"displaylogo": False})


def breakdown_chart(result: dict) -> str:
    """Stacked bars: compute / bandwidth / overhead / idle time per step (ms)."""
    steps = [s for s in result["steps"]["per_step"] if "compute_ns" in s]
    labels = [f"step {s['step']}" for s in steps]
    fig = go.Figure()
    for cls, key in (("compute", "compute_ns"), ("bandwidth", "bandwidth_ns"), ("overhead", "overhead_ns"),
                     ("idle", "other_idle_ns")):
        fig.add_bar(name=cls, x=labels, y=[s[key] / 1e6 for s in steps], marker_color=CLASS_COLORS[cls])
    fig.update_layout(barmode="stack", height=320, margin=dict(l=50, r=10, t=30, b=40),  # pragma: no mutate
                      yaxis_title="time per step (ms)", title="Where each measured step's time goes")  # pragma: no mutate
    return _figure_html(fig)


def top_kernels_chart(result: dict, top: int = 10) -> str:
    """Horizontal bars: the top kernels' time per step (µs), coloured by class."""
    kernels = list(reversed(result["top_kernels"][:top]))
    fig = go.Figure(go.Bar(
        x=[k["time_ns_per_step"] / 1e3 for k in kernels],
        # escaped: plotly turns <b>, <a href>, <br> in labels into SVG elements (entities show as text)
        y=[plotly_text(f"{i}. {shorten(k['label'], 60)}") for i, k in zip(range(len(kernels), 0, -1), kernels)],
        orientation="h", marker_color=[CLASS_COLORS.get(k["kernel_class"], "#888") for k in kernels],
        hovertext=[f"{k['family']} · {k['kernel_class']} ({k['evidence']})" for k in kernels]))
    fig.update_layout(height=40 + 28 * len(kernels), margin=dict(l=10, r=10, t=30, b=40),  # pragma: no mutate
                      xaxis_title="GPU time per step (µs)", title="Top kernels")  # pragma: no mutate
    return _figure_html(fig)


def roofline_chart(result: dict) -> str:
    """Log-log roofline: one point per kernel name and launch configuration (area ~ time per
    step), the memory roof and a flat roof per math path present; empty when no point is known."""
    points = result.get("roofline_points") or []
    device = result["device"]
    bandwidth = device.get("memory_bandwidth_bytes_per_s") or 0
    if not points or not bandwidth:
        return ""
    import math

    fig = go.Figure()
    xs = [p["intensity_flop_per_byte"] for p in points]
    lo, hi = min(xs) / 2, max(max(xs) * 2, 1e3)
    paths = sorted({p["math_path"] for p in points if p["math_path"] in device["peak_flop_per_s"]})
    for path in paths:
        peak = device["peak_flop_per_s"][path]
        ridge = peak / bandwidth
        fig.add_scatter(x=[lo, ridge, hi], y=[bandwidth * lo, peak, peak], mode="lines", name=f"roof {path}",
                        line=dict(dash="dot", width=1), hoverinfo="name")  # pragma: no mutate
    biggest = max(p["time_ns_per_step"] for p in points)
    for cls, color in CLASS_COLORS.items():
        mine = [p for p in points if p["kernel_class"] == cls]
        if not mine:
            continue
        fig.add_scatter(
            x=[p["intensity_flop_per_byte"] for p in mine], y=[p["achieved_flop_per_s"] for p in mine], mode="markers",
            name=cls, marker=dict(color=color, size=[6 + 30 * math.sqrt(p["time_ns_per_step"] / biggest) for p in mine],
                                  line=dict(width=0.5, color="#333"), opacity=0.75),  # pragma: no mutate
            hovertext=[plotly_text(f"{shorten(p['label'], 80)} | AI {p['intensity_flop_per_byte']:.3g} FLOP/byte | "
                                   f"{p['achieved_flop_per_s'] / 1e12:.3g} TFLOP/s, {p['achieved_bytes_per_s'] / 1e9:.3g} GB/s | "
                                   f"{units.fmt_ns(p['time_ns_per_step'])}/step | {p['math_path']} | evidence {p['evidence']}")
                       for p in mine], hoverinfo="text")
    fig.update_layout(height=420, margin=dict(l=60, r=10, t=30, b=50), title="Roofline (point area ~ time per step)",  # pragma: no mutate
                      xaxis=dict(type="log", title="arithmetic intensity (FLOP/byte)"),  # pragma: no mutate
                      yaxis=dict(type="log", title="achieved FLOP/s"))  # pragma: no mutate
    return _figure_html(fig)


def trials_chart(result: dict) -> str:
    """Grouped bars per tried change: predicted vs measured saving per step (ms), the measured one
    with its 95 % interval as error bars and greyed when inconclusive; empty without measured
    trials."""
    trials = [t for t in result.get("trials") or [] if t.get("saving_ns") is not None]
    if not trials:
        return ""
    labels = [plotly_text(t["change"]) for t in trials]  # plotly renders markup in labels
    saving = [t["saving_ns"] / 1e6 for t in trials]
    ci = [t.get("saving_ci_ns") or [t["saving_ns"], t["saving_ns"]] for t in trials]
    fig = go.Figure()
    fig.add_bar(name="predicted", x=labels, y=[(t.get("predicted_saving_ns") or 0) / 1e6 for t in trials],
                marker_color="#bab0ac")  # pragma: no mutate
    fig.add_bar(name="measured (trial, bare)", x=labels, y=saving,
                error_y=dict(type="data", symmetric=False, array=[hi / 1e6 - s for (_, hi), s in zip(ci, saving)],
                             arrayminus=[s - lo / 1e6 for (lo, _), s in zip(ci, saving)]),
                marker_color=["#4c78a8" if t.get("verdict", "measured") == "measured" else "#d0d0d0"
                              for t in trials])  # pragma: no mutate
    fig.update_layout(barmode="group", height=320, margin=dict(l=50, r=10, t=30, b=40),  # pragma: no mutate
                      yaxis_title="saving per step (ms)",  # pragma: no mutate
                      title="Predicted vs measured saving of each change (95 % intervals; grey: inconclusive)")  # pragma: no mutate
    return _figure_html(fig)


def render(result: dict) -> str:
    """The whole report page as HTML text."""
    template = _environment().get_template("report.html")
    return template.render(
        r=result, colors=CLASS_COLORS,
        charts={"breakdown": breakdown_chart(result), "top_kernels": top_kernels_chart(result),
                "roofline": roofline_chart(result), "trials": trials_chart(result)},
        plotly_js=plotly.offline.get_plotlyjs(),
    )


def write(result: dict, path: Path) -> Path:
    """Write the report page to ``path``; returns the path."""
    path.write_text(render(result), encoding="utf-8")
    return path
