"""The reporters: report.json, report.html (escaping, self-contained, rendered in a real headless
Chromium) and the terminal summary."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess

import markupsafe
import pytest
from rich.console import Console

from gpudiag.analysis.fusion.dataflow import HOST_BOUND_ADVICE
from gpudiag.analysis.attribution.labels import distinct_labels
from gpudiag.analysis.finish import finish
from gpudiag.renderers import html, json_report, labels, terminal
from gpudiag.renderers.units import fmt_ns, fmt_pct

from conftest import ROOT

HOSTILE = '<script>document.title="pwned"</script> void f<int, 2>(T&) & <img src=x onerror=alert(1)>'


def hostile_result(report: dict) -> dict:
    """A real report whose top kernel, module and warning carry HTML-hostile text."""
    r = copy.deepcopy(report)
    r["top_kernels"][0].update(name=HOSTILE, short_name=HOSTILE, label=HOSTILE)
    r["modules"][0]["module"] = HOSTILE
    r["warnings"] = [HOSTILE]
    return r


def test_json_round_trips_without_nan(analysed, tmp_path):
    _, report = analysed("swin_t_train_bf16")
    path = json_report.write(report, tmp_path / "report.json")
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert data["schema_version"] == 1
    assert data["device"]["name"] == "NVIDIA H200"
    assert len(data["top_kernels"]) == 20 and data["top_kernels"][0]["time_ns_per_step"] > 0


def test_html_escapes_every_string_and_needs_no_network(analysed):
    _, report = analysed("swin_t_train_bf16")
    page = html.render(hostile_result(report))
    assert HOSTILE not in page
    assert "&lt;script&gt;document.title" in page  # shown, escaped, in the table
    assert "<img src=x" not in page
    # self-contained: no external script, stylesheet or image elements
    assert not re.search(r"<(script|img|iframe)[^>]*\ssrc=", page)
    assert not re.search(r"<link[^>]*\shref=", page)


def test_code_spans_escape_before_formatting():
    assert str(html.code_spans("use `fused=True` <b>now</b> & `a<b`")) == \
        "use <code>fused=True</code> &lt;b&gt;now&lt;/b&gt; &amp; <code>a&lt;b</code>"


def terminal_tables(text: str) -> dict[str, list[list[str]]]:
    """The tables of a rendered terminal summary: first header cell -> rows of stripped cells. A
    line whose last cell is empty continues the row above (rich wraps long cells)."""
    tables: dict[str, list[list[str]]] = {}
    rows: list[list[str]] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│" if line.startswith("│") else "┃")[1:-1]]
        if line.startswith("┃"):
            rows = tables.setdefault(cells[0], [])
        elif line.startswith("│") and rows and not cells[-1]:
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
        elif line.startswith("│"):
            rows.append(cells)
    return tables


def rendered(report: dict) -> str:
    console = Console(record=True, width=200)
    terminal.render(report, console)
    return console.export_text()


@pytest.mark.parametrize("name", ["swin_t_train_bf16_crash", "gpt2_train_bf16"])
def test_terminal_summary(analysed, name):
    """Every number of the terminal summary is report.json's, formatted as the terminal formats it."""
    _, report = analysed(name)
    data = json.loads(json_report.to_json(report))  # what report.json holds
    text = rendered(report)
    tables = terminal_tables(text)
    assert text.startswith(f"{data['device']['name']} · {data['steps']['measured']} measured steps")
    bp = data["breakdown_percent"]
    assert tables["step time (median)"] == [[
        fmt_ns(data["steps"]["step_time_ns"]["median"]), fmt_pct(data["gpu_busy_percent"]),
        fmt_pct(bp["compute"]), fmt_pct(bp["bandwidth"]), fmt_pct(bp["overhead"]), fmt_pct(bp["idle"])]]
    assert tables["kernel"] == [
        [k["label"], fmt_ns(k["time_ns_per_step"]), fmt_pct(k["share_of_kernel_time_percent"]), k["kernel_class"], k["evidence"]]
        for k in data["top_kernels"][:5]]
    def saving(r: dict) -> str:  # with the host floor's bound where it caps the GPU-time saving
        if r.get("throughput_gain"):  # a larger batch: a throughput gain, not a step-time saving
            return ", ".join(f"{g:.1f}x samples/s at {k}x batch" for k, g in r["throughput_gain"].items())
        bound = r.get("step_saving_bound_ns")
        capped = bound is not None and bound < 0.9 * r["saving_ns_per_step"]
        return fmt_ns(r["saving_ns_per_step"]) + (f" (step ≤ {fmt_ns(bound)})" if capped else "")

    # an export analysed without gpudiag profile's trials: nothing was measured
    assert tables.get("rule", []) == [[r["rule_id"], r["title"], saving(r), "not measured"]
                                      for r in data["recommendations"][:5]]
    assert tables.get("chain", []) == [
        [" → ".join(op.removeprefix("aten::") for op in c["ops"]), str(c["occurrences_per_step"]),
         fmt_ns(c["saving_ns_per_step"]), c["reference_kernel"] or "–"] for c in data["fusion_candidates"][:3]]
    if name == "swin_t_train_bf16_crash":
        assert "warning: the script failed (exit code 1): RuntimeError: planted failure at step 6" in text
    else:  # the README's fusion example: its candidates are in the summary
        assert len(tables["chain"]) == 3 and tables["chain"][0][3] == "bias_gelu"


def test_terminal_fusion_note_for_an_overhead_bound_run(analysed):
    """An overhead-bound run's candidates come with the report's note (their saving is GPU time)."""
    _, report = analysed("gpt2_train_bf16")
    assert "note:" not in rendered(report)
    bound = dict(report, fusion_note=HOST_BOUND_ADVICE)
    assert f"note: {HOST_BOUND_ADVICE}" in " ".join(rendered(bound).split())


def test_kernel_labels_are_distinct_and_the_same_everywhere(analysed):
    """GPT-2's three CUTLASS GEMMs are all short-named Kernel2: the reports tell them apart by
    tile and layout, with the same label in report.json, report.html and the terminal."""
    _, report = analysed("gpt2_train_bf16")
    assert [k["label"] for k in report["top_kernels"]].count("Kernel2") == 3  # the analysis' labels
    report = finish(report)  # made distinct once, when the report is finished; renderers only show them
    data = json.loads(json_report.to_json(report))
    labels = [k["label"] for k in data["top_kernels"]]
    assert len(set(labels)) == len(labels)
    assert {"Kernel2 · 128x128_tn", "Kernel2 · 256x128_nn", "Kernel2 · 128x256_nt"} <= set(labels)
    by_name = {p["name"]: p["label"] for p in data["roofline_points"] + data["below_roof"]}
    assert all(by_name.get(k["name"], k["label"]) == k["label"] for k in data["top_kernels"])
    page, text = html.render(report), rendered(report)
    for k in data["top_kernels"]:
        assert f"<summary>{markupsafe.escape(k['label'])}</summary>" in page
    assert [row[0] for row in terminal_tables(text)["kernel"]] == labels[:5]
    assert finish(data) == data  # finishing is idempotent


def test_label_suffixes():
    """Rarest distinguishing token, trimmed of shared parts; #n where only numbers differ."""
    result = {"top_kernels": [
        {"name": "void cutlass::Kernel2<cutlass_75_gemm_128x128_tn_align1>(T1::Params)", "label": "Kernel2"},
        {"name": "void cutlass::Kernel2<cutlass_75_gemm_256x64_nn_align1>(T1::Params)", "label": "Kernel2"},
        {"name": "void k<(int)4>(T1)", "label": "k"}, {"name": "void k<(int)8>(T1)", "label": "k"},
        {"name": "solo", "label": "solo"}]}
    assert list(distinct_labels(result).values()) == [
        "Kernel2 · 128x128_tn", "Kernel2 · 256x64_nn", "k #1", "k #2", "solo"]
    assert labels.shorten("abcdefghij", 5) == "ab…ij" and labels.shorten("abc", 5) == "abc"


def test_html_evidence_is_readable_text(analysed):
    """Recorded op arguments in evidence show as comma-separated shapes without storage addresses
    (report.json keeps the recorded text); hostile text inside them is still escaped."""
    _, report = analysed("gpt2_train_bf16")
    align = next(r for r in report["recommendations"] if r["rule_id"] == "GD-GEMM-ALIGN")
    assert any("@7f" in e and "['" in e for e in align["evidence"])  # as the analysis records it
    recommendations = html.render(report).split("<h2>Recommendations</h2>")[1].split("<h2>Fusion candidates</h2>")[0]
    assert "aten::mm bfloat16[4096,768], bfloat16[768,50257] (N=50257)<br>" in recommendations
    assert "@7f" not in recommendations and "[&#39;" not in recommendations
    hostile = copy.deepcopy(report)
    hostile["recommendations"][0]["evidence"] = ["aten::mm ['<img src=x onerror=alert(1)>@7f00', [1, 'a&b']]"]
    page = html.render(hostile)
    assert "aten::mm &lt;img src=x onerror=alert(1)&gt;@7f00, (1, a&amp;b)" in page and "<img src=x" not in page


def test_evidence_text():
    assert html.evidence_text("aten::cat [['float32[2,3]@7f0a', 'float32[2,3]@7f0b'], 1] and {'x': 1}") == \
        "aten::cat (float32[2,3], float32[2,3]), 1 and {'x': 1}"
    assert html.evidence_text("aten::add ['float32[8]@7fab', {'alpha': 2}, None]") == "aten::add float32[8], alpha=2, None"
    assert html.evidence_text("Kernel2: 3366 µs/step [unbalanced") == "Kernel2: 3366 µs/step [unbalanced"


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_report_renders_in_headless_chromium(analysed, tmp_path):
    """Chromium loads the page offline, runs plotly, draws both charts, and the hostile kernel
    name is text, not markup: no script from it ran (the title is unchanged) and no <img> exists.
    Required in CI (``CI`` set): a missing chromium fails there; elsewhere it skips."""
    if CHROMIUM is None:
        message = "Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail("CI requires the browser test: " + message)
        pytest.skip(message)
    _, report = analysed("swin_t_train_bf16")
    page = tmp_path / "report.html"
    html.write(hostile_result(report), page)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert "<title>gpudiag report" in dom and "pwned" not in dom.split("</title>")[0]
    assert "<img" not in dom  # the hostile <img> stayed text
    assert "&lt;img src=x onerror=alert(1)&gt;" in dom
    assert dom.count('class="main-svg"') >= 2  # plotly drew the two charts
    shot = tmp_path / "shot.png"
    subprocess.run(["bash", str(ROOT / "scripts" / "screenshot_report.sh"), str(page), str(shot), "1000x1400"],
                   check=True, capture_output=True, timeout=120)
    assert shot.stat().st_size > 20_000  # a real picture, not a blank page


@pytest.mark.parametrize("chart,key", [(html.top_kernels_chart, "top_kernels"), (html.roofline_chart, "roofline_points")])
@pytest.mark.parametrize("where", ["start", "end"])
def test_chart_labels_escape_a_short_payload_at_either_end(analysed, chart, key, where):
    """Plotly renders <b>, <a> and <br> in labels and hover text as SVG markup. A short payload
    survives the label shortening at either end of a kernel name (the long hostile one above is cut
    before it reaches a chart: removing the escape in the charts passed every test)."""
    _, report = analysed("swin_t_train_bf16")
    r = copy.deepcopy(report)
    payload = "<b>x</b>"
    name = payload + "gemm" if where == "start" else "gemm" + payload
    r[key][0]["label"] = name
    figure = chart(r)
    # the figure's JSON holds the label escaped once (plotly writes "/" as \u002f, "<" as itself or \u003c)
    assert "&lt;b&gt;x&lt;" in figure
    assert not re.search(r"(<|\\u003c)b(>|\\u003e)x", figure)


def _recommendations_section(page: str) -> str:
    start = page.index("<h2>Recommendations</h2>")
    return page[start:page.index("<h2", start + 10)]


def test_html_overlaps_are_shown_once_below_the_recommendations(analysed):
    """Issue 35: every row repeated its overlap note, so one recommendation wrapped to ~15 lines.
    The page names each overlapping pair once, under the table, as the terminal does, and the
    predicted-saving column has its minimum width."""
    _, report = analysed("gpt2_train_bf16")
    recs = report["recommendations"]
    assert any(r.get("overlaps") for r in recs)
    section = _recommendations_section(html.render(report))
    assert "counts the same time as" not in section
    pairs = terminal.overlap_pairs(recs)
    assert pairs and section.count("Not to be added up") == 1
    note = re.search(r'<p class="note overlaps">(.*?)</p>', section, re.S).group(1)
    assert note == "Not to be added up (they count the same time): " + "; ".join(pairs) + "."
    assert section.count('<td class="pred">') == len(recs) and '<th class="pred">' in section
    assert re.search(r"th\.pred, td\.pred \{ min-width: \d+rem; \}", html.render(report))


def test_html_without_overlaps_has_no_overlap_note(analysed):
    _, report = analysed("gpt2_train_bf16")
    report = copy.deepcopy(report)
    for r in report["recommendations"]:
        r["overlaps"] = []
    assert "Not to be added up" not in html.render(report)


def test_a_quote_in_a_kernel_name_shows_as_a_quote_in_the_charts(analysed):
    """Issue 35: a ``"`` in a kernel name showed as ``&quot;`` in the chart labels (escaped for HTML,
    where plotly shows entities as text). Plotly gets ``"`` and ``'`` as they are, ``<``, ``>`` and
    ``&`` escaped; the page's tables still escape every character."""
    _, report = analysed("gpt2_train_bf16")
    report = copy.deepcopy(report)
    name = 'kernel<"q", \'s\'> & co'
    report["top_kernels"][0].update(name=name, label=name)
    chart = html.top_kernels_chart(report)
    call = re.search(r'Plotly\.newPlot\(\s*"[^"]+",\s*(\[.*?\]),\s*\{', chart, re.S)
    labels = json.loads(call.group(1))[0]["y"]
    assert labels[-1] == "1. kernel&lt;\"q\", 's'&gt; &amp; co"
    assert not any("&quot;" in y or "&#x27;" in y for y in labels)
    page = html.render(report)
    assert name not in page and str(markupsafe.escape(name)) in page


def _fresh_render(report: dict, cache_home, monkeypatch) -> str:
    """report.html rendered with jinja2's compiled-template cache under ``cache_home``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    html._environment.cache_clear()
    try:  # plotly names each chart's element with a random UUID
        return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "UUID", html.render(report))
    finally:
        html._environment.cache_clear()


def test_the_compiled_template_cache_never_changes_the_page_or_fails_it(analysed, tmp_path, monkeypatch):
    """The page is the same rendered with no cache folder, with a fresh one (which then holds the
    compiled template), from that cache, from a damaged cache file, where the folder cannot be made
    (its parent is a file) and where the compiled template cannot be written (a full disk)."""
    _, report = analysed("tiny_gemm_gelu")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    plain = _fresh_render(report, blocked, monkeypatch)  # gpudiag/jinja cannot be made under a file
    fresh = tmp_path / "cache"
    assert _fresh_render(report, fresh, monkeypatch) == plain
    kept = list((fresh / "gpudiag" / "jinja").iterdir())
    assert len(kept) == 1 and kept[0].stat().st_size > 0
    assert _fresh_render(report, fresh, monkeypatch) == plain  # read back from the cache
    kept[0].write_bytes(b"not a compiled template")
    assert _fresh_render(report, fresh, monkeypatch) == plain
    # a full disk while the compiled template is written (the tests may run as root: no read-only folder)
    import jinja2.bccache

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jinja2.bccache.tempfile, "NamedTemporaryFile", full)
    assert _fresh_render(report, tmp_path / "full", monkeypatch) == plain
    assert not any((tmp_path / "full" / "gpudiag" / "jinja").iterdir())
