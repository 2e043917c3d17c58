"""docs/api.md is a notebook that runs: its ```python blocks, in order in one namespace, from the
repository's root, each printing exactly the ```text block shown under it (where one is)."""

from __future__ import annotations

import contextlib
import io
import re

from conftest import ROOT

DOC = ROOT / "docs" / "api.md"


def cells() -> list[tuple[str, str | None]]:
    """(code, expected output or None) for each ```python block of the doc, in order: the output is
    the ```text block that directly follows it (only blank lines between)."""
    text = DOC.read_text(encoding="utf-8")
    found = []
    for match in re.finditer(r"```python\n(.*?)```\n", text, flags=re.S):
        after = re.match(r"\s*```text\n(.*?)```", text[match.end():], flags=re.S)
        found.append((match.group(1), after.group(1) if after else None))
    return found


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.rstrip("\n").splitlines()]


def test_the_doc_has_the_walkthrough():
    code = "".join(c for c, _ in cells())
    for call in ("gpudiag.load(", ".steps", ".kernels", ".recommendations", ".compare(", ".to_html("):
        assert call in code, call
    text = DOC.read_text(encoding="utf-8")  # documented, not run (they need rank exports, nsys and a GPU)
    assert "gpudiag.load([" in text and "gpudiag.profile(" in text and "read_ranks(path)" in text
    assert sum(out is not None for _, out in cells()) >= 6


def test_the_docs_python_blocks_run_and_print_what_it_shows(monkeypatch):
    monkeypatch.chdir(ROOT)  # the doc's paths are the repository's
    namespace: dict = {"__name__": "__api_doc__"}
    for i, (code, expected) in enumerate(cells()):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"{DOC.name} block {i + 1}", "exec"), namespace)
        if expected is not None:
            assert _lines(out.getvalue()) == _lines(expected), f"block {i + 1}:\n{code}"


def test_the_readme_points_to_the_library():
    """The README's "As a library" section links this walkthrough; its example is valid Python."""
    import ast

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## As a library"):]
    section = section[:section.index("\n## ", 1)]
    assert "docs/api.md" in section and "gpudiag.load(" in section
    for block in re.findall(r"```python\n(.*?)```", section, flags=re.S):
        ast.parse(block)
