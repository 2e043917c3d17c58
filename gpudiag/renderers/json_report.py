"""``report.json``: the finished report as JSON (schema in docs/architecture.md).

The report comes finished (:func:`gpudiag.analysis.finish.finish`: distinct labels, JSON values):
this renderer only writes it out."""

from __future__ import annotations

import json
from pathlib import Path


def to_json(report: dict) -> str:
    """The finished report as indented JSON text. Raises ValueError for a report that was not
    finished (a NaN in it) and TypeError for one holding numpy values."""
    return json.dumps(report, indent=1, ensure_ascii=False, allow_nan=False)


def write(report: dict, path: Path) -> Path:
    """Write ``report`` to ``path`` as JSON; returns the path."""
    path.write_text(to_json(report), encoding="utf-8")
    return path
