"""The report's charts hold the report's numbers, and every string a user's run supplies reaches
plotly escaped. The figures are read back from the page's own plotly JSON (what the browser
draws), on a real analysed capture and a real report with measured trials (ConvNeXt-T, H100)."""

from __future__ import annotations

import html as html_lib
import json
import lzma
import math
import re
from pathlib import Path

import pytest

from gpudiag.renderers import html, units
from gpudiag.renderers.labels import shorten

from conftest import FIXTURES

TRIALS_REPORT = FIXTURES / "trials" / "convnext_h100" / "report.json.xz"
PAYLOAD = "<b>x</b>"


def _traces(chart_html: str) -> list[dict]:
    """The traces of one chart, from the JSON that plotly.js is called with."""
    call = re.search(r'Plotly\.newPlot\(\s*"[^"]+",\s*(\[.*?\]),\s*\{', chart_html, re.S)
    assert call, "the chart calls Plotly.newPlot"
    return json.loads(call.group(1))


def _values(trace: dict, axis: str) -> list:
    """A trace's x or y values (plotly writes numeric arrays as typed-array dicts)."""
    value = trace[axis]
    if isinstance(value, dict):  # {"dtype": "f8", "bdata": base64}
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).tolist()
    return list(value)


@pytest.fixture(scope="module")
def trials_report():
    return json.loads(lzma.open(TRIALS_REPORT, "rt").read())


def test_breakdown_bars_are_each_measured_steps_class_times_in_ms(analysed):
    _, report = analysed("rmsnorm_train")
    steps = [s for s in report["steps"]["per_step"] if "compute_ns" in s]
    traces = _traces(html.breakdown_chart(report))
    assert [t["name"] for t in traces] == ["compute", "bandwidth", "overhead", "idle"]
    for trace, key in zip(traces, ("compute_ns", "bandwidth_ns", "overhead_ns", "other_idle_ns")):
        assert trace["type"] == "bar" and trace["x"] == [f"step {s['step']}" for s in steps]
        assert _values(trace, "y") == pytest.approx([s[key] / 1e6 for s in steps], rel=1e-12)
        assert trace["marker"]["color"] == html.CLASS_COLORS[trace["name"]]


def test_top_kernel_bars_are_the_top_kernels_time_in_us_with_escaped_labels(analysed):
    _, report = analysed("rmsnorm_train")
    report = json.loads(json.dumps(report))
    report["top_kernels"][0]["label"] = PAYLOAD + report["top_kernels"][0]["label"]
    report["top_kernels"][1]["label"] += PAYLOAD
    (trace,) = _traces(html.top_kernels_chart(report, top=10))
    top = report["top_kernels"][:10]
    shown = list(reversed(top))  # plotly draws the first bar at the bottom: the largest goes last
    assert _values(trace, "x") == pytest.approx([k["time_ns_per_step"] / 1e3 for k in shown], rel=1e-12)
    assert trace["orientation"] == "h"
    assert trace["y"][-1].startswith("1. &lt;b&gt;x&lt;/b&gt;") and trace["y"][-2].endswith("&lt;b&gt;x&lt;/b&gt;")
    assert [html_lib.unescape(y).split(". ", 1)[0] for y in trace["y"]] == [str(i) for i in range(len(top), 0, -1)]
    assert not any("<b>" in y for y in trace["y"])
    assert trace["marker"]["color"] == [html.CLASS_COLORS.get(k["kernel_class"], "#888") for k in shown]
    assert trace["hovertext"] == [f"{k['family']} · {k['kernel_class']} ({k['evidence']})" for k in shown]


def test_roofline_points_and_roofs_follow_the_device(analysed):
    """One roof per math path: (lo, bandwidth x lo) -> (ridge, peak) -> (hi, peak), lo = half the
    lowest intensity, hi = twice the highest (at least 1000 FLOP/byte); points at (intensity,
    achieved FLOP/s), area ~ time per step."""
    _, report = analysed("rmsnorm_train")
    points, device = report["roofline_points"], report["device"]
    assert points
    traces = _traces(html.roofline_chart(report))
    bandwidth = device["memory_bandwidth_bytes_per_s"]
    xs = [p["intensity_flop_per_byte"] for p in points]
    lo, hi = min(xs) / 2, max(max(xs) * 2, 1e3)
    paths = sorted({p["math_path"] for p in points if p["math_path"] in device["peak_flop_per_s"]})
    roofs = [t for t in traces if t["name"].startswith("roof ")]
    assert [t["name"] for t in roofs] == [f"roof {p}" for p in paths]
    for trace, path in zip(roofs, paths):
        peak = device["peak_flop_per_s"][path]
        assert _values(trace, "x") == pytest.approx([lo, peak / bandwidth, hi], rel=1e-12)
        assert _values(trace, "y") == pytest.approx([bandwidth * lo, peak, peak], rel=1e-12)
    biggest = max(p["time_ns_per_step"] for p in points)
    markers = [t for t in traces if not t["name"].startswith("roof ")]
    assert sum(len(_values(t, "x")) for t in markers) == len(points)
    for trace in markers:
        mine = [p for p in points if p["kernel_class"] == trace["name"]]
        assert _values(trace, "x") == pytest.approx([p["intensity_flop_per_byte"] for p in mine], rel=1e-12)
        assert _values(trace, "y") == pytest.approx([p["achieved_flop_per_s"] for p in mine], rel=1e-12)
        sizes = trace["marker"]["size"]
        sizes = _values({"v": sizes}, "v") if isinstance(sizes, dict) else sizes
        assert sizes == pytest.approx([6 + 30 * math.sqrt(p["time_ns_per_step"] / biggest) for p in mine], rel=1e-12)
        assert trace["marker"]["color"] == html.CLASS_COLORS[trace["name"]]
        assert trace["mode"] == "markers"
        for text, p in zip(trace["hovertext"], mine):
            assert html_lib.unescape(text) == (
                f"{shorten(p['label'], 80)} | AI {p['intensity_flop_per_byte']:.3g} FLOP/byte | "
                f"{p['achieved_flop_per_s'] / 1e12:.3g} TFLOP/s, {p['achieved_bytes_per_s'] / 1e9:.3g} GB/s | "
                f"{units.fmt_ns(p['time_ns_per_step'])}/step | {p['math_path']} | evidence {p['evidence']}")


def test_the_roofs_reach_at_least_1000_flop_per_byte(analysed):
    """With every point at low intensity, the roofs still run to 1000 FLOP/byte (past every ridge)."""
    _, report = analysed("rmsnorm_train")
    low = [{**p, "intensity_flop_per_byte": min(p["intensity_flop_per_byte"], 10.0)} for p in report["roofline_points"]]
    roofs = [t for t in _traces(html.roofline_chart({**report, "roofline_points": low})) if t["name"].startswith("roof ")]
    assert roofs and all(_values(t, "x")[-1] == 1e3 for t in roofs)


def test_no_roofline_without_points_or_bandwidth(analysed):
    _, report = analysed("rmsnorm_train")
    assert html.roofline_chart({**report, "roofline_points": []}) == ""
    no_bandwidth = {**report, "device": {**report["device"], "memory_bandwidth_bytes_per_s": None}}
    assert html.roofline_chart(no_bandwidth) == ""
    assert html.roofline_chart(report) != ""


def test_trials_bars_are_predicted_and_measured_savings_with_escaped_changes(trials_report):
    report = json.loads(json.dumps(trials_report))
    measured = [t for t in report["trials"] if t.get("saving_ns") is not None]
    assert len(measured) >= 2
    measured[0]["change"] = PAYLOAD + measured[0]["change"]
    measured[1]["change"] += PAYLOAD
    predicted, bare = _traces(html.trials_chart(report))
    labels = [html_lib.escape(t["change"]) for t in measured]
    assert predicted["name"] == "predicted" and bare["name"] == "measured (trial, bare)"
    assert predicted["x"] == bare["x"] == labels and not any("<b>" in x for x in labels)
    assert _values(predicted, "y") == pytest.approx([(t.get("predicted_saving_ns") or 0) / 1e6 for t in measured])
    assert _values(bare, "y") == pytest.approx([t["saving_ns"] / 1e6 for t in measured])
    assert html.trials_chart({**report, "trials": [{**t, "saving_ns": None} for t in report["trials"]]}) == ""


def _layout(chart_html: str) -> dict:
    """The layout of one chart: the JSON object after the traces in the Plotly.newPlot call."""
    call = re.search(r'Plotly\.newPlot\(\s*"[^"]+",\s*', chart_html)
    decoder = json.JSONDecoder()
    _, end = decoder.raw_decode(chart_html, call.end())
    layout, _ = decoder.raw_decode(chart_html, re.compile(r",\s*").match(chart_html, end).end())
    return layout


def test_each_axis_title_names_the_unit_its_values_are_plotted_in(analysed, trials_report):
    """The tests above check the plotted numbers' units (ms, µs, FLOP/byte, FLOP/s); each axis
    says which, and the roofline's axes are logarithmic (intensities and rates span decades)."""
    _, report = analysed("rmsnorm_train")
    breakdown = _layout(html.breakdown_chart(report))
    assert "(ms)" in breakdown["yaxis"]["title"]["text"] and breakdown["barmode"] == "stack"
    top = _layout(html.top_kernels_chart(report))
    assert "(µs)" in top["xaxis"]["title"]["text"]
    roofline = _layout(html.roofline_chart(report))
    assert roofline["xaxis"]["type"] == roofline["yaxis"]["type"] == "log"
    assert "(FLOP/byte)" in roofline["xaxis"]["title"]["text"]
    assert roofline["yaxis"]["title"]["text"].endswith("FLOP/s")
    trials = _layout(html.trials_chart(trials_report))
    assert "(ms)" in trials["yaxis"]["title"]["text"] and trials["barmode"] == "group"

