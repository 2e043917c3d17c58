"""Kernel and NVTX names with HTML/JS markup, injected into a real export (UPDATE StringIds and
NVTX_EVENTS), reach every table and chart of report.html as text: in headless Chromium's DOM no
element or attribute comes from them, neither from the tables nor from plotly's charts (plotly
turns <b>, <a href>, <br> in its labels into SVG elements unless they are escaped)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from collections import Counter
from html.parser import HTMLParser

import pytest
from click.testing import CliRunner

from gpudiag.cli.main import cli

PAYLOAD = ("<img src=x onerror=alert(1)></script><script>document.title='pwned'</script>"
           "<b>bold</b><a href=\"javascript:alert(2)\">link</a><svg onload=alert(3)>")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Elements(HTMLParser):
    """Counts of element names and of attribute names in a DOM dump."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: Counter = Counter()
        self.attrs: Counter = Counter()

    def handle_starttag(self, tag, attrs):
        self.tags[tag] += 1
        self.attrs.update(name for name, _ in attrs)
        # plotly renders <b> in a label as a bold tspan
        self.tags["bold tspan"] += tag == "tspan" and "font-weight:bold" in (dict(attrs).get("style") or "").replace(" ", "")


def _dom(page, tmp_path) -> str:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000"]
    return subprocess.run([CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                          timeout=120).stdout


def _report(export, tmp_path, name, inject: bool):
    path = tmp_path / f"{name}.sqlite"
    shutil.copyfile(export, path)
    if inject:
        con = sqlite3.connect(path)
        # in front: labels are shortened, the payload must survive that
        con.execute("UPDATE StringIds SET value = ? || value WHERE id IN (SELECT demangledName FROM "
                    "CUPTI_ACTIVITY_KIND_KERNEL UNION SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL)", (PAYLOAD,))
        con.execute("UPDATE StringIds SET value = value || ? WHERE id IN (SELECT textId FROM NVTX_EVENTS)", (PAYLOAD,))
        con.execute("UPDATE NVTX_EVENTS SET text = text || ? WHERE text LIKE 'gpudiag:module%'", (PAYLOAD,))
        con.commit()
        con.close()
    out = tmp_path / name
    result = CliRunner().invoke(cli, ["report", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out / "report.html"


@pytest.mark.parametrize("fixture", ["tiny_gemm_gelu", "mlp_decode"])
def test_injected_markup_creates_no_element(fixture, export_path, tmp_path):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI requires the browser test: Debian's chromium is not installed")
        pytest.skip("chromium is not installed")
    clean = _report(export_path(fixture), tmp_path, "clean", inject=False)
    hostile = _report(export_path(fixture), tmp_path, "hostile", inject=True)
    assert "bold" in hostile.read_text()  # the names made it into the page
    before, after = Elements(), Elements()
    dom_clean, dom = _dom(clean, tmp_path), _dom(hostile, tmp_path)
    before.feed(dom_clean)
    after.feed(dom)
    assert dom.count('class="main-svg"') >= 2 and dom.count('class="main-svg"') == dom_clean.count('class="main-svg"')
    assert "pwned" not in dom.split("</title>")[0]
    for tag in ("img", "script", "b", "a", "svg", "bold tspan"):
        assert after.tags[tag] == before.tags[tag], f"<{tag}> elements from injected names"
    for attr in ("onerror", "onload", "href", "xlink:href"):
        assert after.attrs[attr] == before.attrs[attr], f"{attr}= attributes from injected names"
    assert "&lt;img src=x onerror=alert(1)&gt;" in dom  # shown as text
