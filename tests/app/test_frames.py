"""The API's frames (gpudiag.app.frames, docs/api.md "The frames' schemas"): on the bundled examples,
on captures of several ranks and on an empty run, every frame has exactly its documented columns and
dtypes, converts to Arrow, Polars and Parquet (and back) with the same types whether it has rows or
not, and holds what report.json holds."""

from __future__ import annotations

import io
import json
import lzma
import math
import shutil

import pandas as pd
import pyarrow as pa
import pytest

from gpudiag.analysis.ingest import ingest
from gpudiag.analysis.pipeline import analyse
from gpudiag.api import Run
from gpudiag.app import frames

from conftest import FIXTURES, ROOT

pl = pytest.importorskip("polars")

EXAMPLES = ("gpt2_train_bf16", "swin_t_train_bf16", "swin_t_train_fp32")  # examples/*.sqlite.xz
WRITTEN = ("ddp_a", "fsdp_a", "straggler", "ddp_b/rank0")  # tests/fixtures/ranks: reports gpudiag wrote
NCCL = "gpt_ddp_shm"  # tests/fixtures/nccl: two ranks, NCCL kernels in the export
EMPTY = {"schema_version": 1, "steps": {}}  # a report without any table


@pytest.fixture(scope="module")
def nccl_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp(NCCL)
    export = folder / "profile.sqlite"
    with lzma.open(FIXTURES / "nccl" / NCCL / "profile.sqlite.xz") as src, open(export, "wb") as dst:
        shutil.copyfileobj(src, dst)
    status = json.loads((FIXTURES / "nccl" / NCCL / "script_status.json").read_text())
    status["bare_run"] = json.loads((FIXTURES / "nccl" / NCCL / "bare_status.json").read_text())
    return analyse(ingest(export, folder / "run.sqlite"), status=status, rank_workers=1)


@pytest.fixture(scope="module")
def runs(analysed, nccl_report):
    """name -> Run: the bundled examples analysed, a capture of two ranks analysed, reports of
    several ranks written before, and a report with no rows in any table."""
    out = {name: Run(analysed(name)[1], name) for name in EXAMPLES}
    out[NCCL] = Run(nccl_report, NCCL)
    for name in WRITTEN:
        out[name] = Run(json.loads(lzma.open(FIXTURES / "ranks" / name / "report.json.xz").read()), name)
    out["empty"] = Run(EMPTY, "empty")
    return out


def _arrow_types(frame: pd.DataFrame) -> dict:
    return {f.name: f.type for f in pa.Table.from_pandas(frame, preserve_index=False).schema}


@pytest.mark.parametrize("name", list(frames.SCHEMAS))
def test_every_frame_has_its_schema_and_converts(runs, name):
    expected = frames.dtypes(name)
    arrow, polars = None, None
    sizes = []
    for run in runs.values():
        frame = getattr(run, name)
        sizes.append(len(frame))
        assert frame.dtypes.to_dict() == expected, run.source
        types = _arrow_types(frame)
        assert arrow is None or types == arrow, run.source  # the same Arrow types, rows or none
        arrow = types
        converted = pl.from_pandas(frame)
        assert polars is None or converted.schema == polars, run.source
        polars = converted.schema
        buffer = io.BytesIO()
        frame.to_parquet(buffer)
        back = pd.read_parquet(io.BytesIO(buffer.getvalue()))
        assert back.dtypes.to_dict() == expected and len(back) == len(frame), run.source
        pd.testing.assert_frame_equal(back, frame, check_index_type=False)
        assert pl.read_parquet(io.BytesIO(buffer.getvalue())).schema == polars
    assert 0 in sizes and max(sizes) > 0  # tested with rows and without
    kinds = {c.name: c.kind for c in frames.SCHEMAS[name]}
    wanted = {frames.INT: pl.Int64, frames.FLOAT: pl.Float64, frames.BOOL: pl.Boolean, frames.STR: pl.String,
              frames.JSON: pl.String}
    assert dict(polars) == {c: wanted[k] for c, k in kinds.items()}


def _records(report: dict, name: str) -> list[dict]:
    if name == "steps":
        return (report.get("steps") or {}).get("per_step") or []
    if name == "ranks":
        return [{k: v for k, v in r.items() if k != "breakdown_percent"} | {f"{k}_percent": v for k, v in
                (r.get("breakdown_percent") or {}).items()} for r in (report.get("ranks") or {}).get("ranks") or []]
    return report.get({"kernels": "top_kernels"}.get(name, name)) or []


def _value(value, kind: str):
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return json.loads(value) if kind == frames.JSON else value


@pytest.mark.parametrize("name", list(frames.SCHEMAS))
def test_frames_hold_every_field_of_report_json(runs, name):
    """Every key of the report's records is a column (none left out silently), and each cell is the
    record's value (a nested one decoded from its JSON text)."""
    columns = {c.name: c.kind for c in frames.SCHEMAS[name]}
    for run in runs.values():
        records = _records(run.report, name)
        frame = getattr(run, name)
        assert len(frame) == len(records)
        for i, record in enumerate(records):
            assert set(record) <= set(columns), (run.source, set(record) - set(columns))
            for key, value in record.items():
                assert _value(frame.at[i, key], columns[key]) == value, (run.source, i, key)


def test_example_shapes_mixing_types_is_json_text(runs):
    """The fusion candidates' example shapes mix strings, numbers, null and lists in report.json
    (the issue's polars.from_pandas failure): one JSON text per row."""
    shapes = [s for run in runs.values() for s in run.fusion_candidates["example_shapes"].dropna()]
    decoded = [json.loads(s) for s in shapes]
    assert shapes and all(isinstance(d, list) for d in decoded)
    assert {type(x) for d in decoded for x in d} - {str}, "the examples hold inputs other than tensors"


def test_the_documented_polars_decode_of_the_ops_runs(runs):
    """docs/api.md's Polars line, as written, gives the same lists as json.loads (issue 47: the
    tip without a dtype raised on the pinned Polars)."""
    for run in runs.values():
        fusion = run.fusion_candidates
        if fusion.empty:
            continue
        decoded = pl.from_pandas(fusion).select(pl.col("ops").str.json_decode(pl.List(pl.String)))["ops"].to_list()
        assert decoded == [json.loads(text) for text in fusion["ops"]]
    assert 'pl.col("ops").str.json_decode(pl.List(pl.String))' in (ROOT / "docs" / "api.md").read_text()


def test_the_ranks_frame_flags_the_straggler(runs):
    """One row per rank, the same 22 columns whatever the run; ``straggler`` marks the rank the
    report names (ranks.straggler; ``slowest`` in reports written before the rename)."""
    for name in (NCCL, *WRITTEN[:3]):
        run = runs[name]
        ranks = run.ranks
        section = run.report["ranks"]
        named = section.get("straggler") or section.get("slowest")
        assert len(ranks) == section["count"] == 2
        assert ranks["straggler"].sum() == (0 if named.get("balanced") else 1)
        if not named.get("balanced"):
            assert ranks.loc[ranks["straggler"], "pid"].item() == named["pid"]
    assert "slowest" not in runs[NCCL].report["ranks"] and runs[NCCL].report["ranks"]["straggler"]
    assert list(runs["empty"].ranks.columns) == list(runs[NCCL].ranks.columns) == [c.name for c in frames.RANKS]


def test_the_doc_lists_the_schemas():
    """docs/api.md shows each frame's columns and dtypes as the code defines them."""
    doc = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert frames.schema_text() in doc
