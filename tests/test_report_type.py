"""The report's type (issue 47, part 3): gpudiag.analysis.finish.Report is what report.json holds,
what docs/architecture.md lists and what gpudiag.api.Run keeps; renderers only render it."""

from __future__ import annotations

import copy
import glob
import io
import json
import lzma
import types
import typing

import pytest
from rich.console import Console

import gpudiag
from conftest import ROOT
from gpudiag.analysis.finish import REQUIRED, Report, finish
from gpudiag.renderers import html, json_report, terminal

HINTS = typing.get_type_hints(Report)


def _allowed(hint) -> tuple[type, ...]:
    """The JSON value types an annotation of Report admits (dict, list, str, int/float, None)."""
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    out = []
    for a in args:
        origin = typing.get_origin(a) or a
        out += {float: [float, int], type(None): [type(None)]}.get(origin, [origin])
    return tuple(out)


def _check(report: dict, where: str) -> None:
    assert REQUIRED <= set(report), (where, REQUIRED - set(report))
    unknown = set(report) - set(HINTS)
    assert not unknown, f"{where}: keys the Report type lacks: {unknown}"
    for key, value in report.items():
        assert isinstance(value, _allowed(HINTS[key])), (where, key, type(value))


COMMITTED = sorted(glob.glob(str(ROOT / "tests/fixtures/**/report.json*"), recursive=True)
                   + glob.glob(str(ROOT / "benchmarks/data/**/report.json*"), recursive=True))


def _load(path: str):
    data = lzma.open(path).read() if path.endswith(".xz") else open(path, "rb").read()
    return json.loads(data)


def test_every_committed_report_json_fits_the_type():
    reports = [(p, r) for p in COMMITTED if isinstance(r := _load(p), dict) and "schema_version" in r]
    assert len(reports) >= 30
    for path, report in reports:
        _check(report, path)


def test_the_architecture_doc_lists_every_key():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## report.json"):doc.index("## Fusion candidates")]
    assert [k for k in HINTS if f"`{k}`" not in section] == []


@pytest.fixture(scope="module")
def run():
    return gpudiag.load(ROOT / "examples" / "gpt2_train_bf16.sqlite.xz")


def test_api_run_holds_the_object_report_json_is_written_from(run):
    _check(run.report, "gpudiag.load")
    assert json.loads(run.to_json()) == run.report  # the text is this object, as JSON (no NaN, no numpy)
    assert finish(run.report) == run.report  # already finished
    labels = [k["label"] for k in run.report["top_kernels"]]
    assert len(set(labels)) == len(labels)  # distinct once, in the object itself


def test_renderers_do_not_write_into_the_report(run):
    before = copy.deepcopy(run.report)
    terminal.render(run.report, Console(file=io.StringIO(), width=120))
    html.render(run.report)
    json_report.to_json(run.report)
    assert run.report == before


def test_an_unfinished_report_is_refused_by_the_json_renderer():
    with pytest.raises(ValueError):
        json_report.to_json({"gpu_busy_percent": float("nan")})
