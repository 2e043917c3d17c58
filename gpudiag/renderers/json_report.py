"""``report.json``: the analysis result as JSON (schema in docs/architecture.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from gpudiag.renderers.labels import with_distinct_labels


def _clean(value):
    """Make numpy scalars and NaN JSON-safe (NaN becomes null)."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def to_json(result: dict) -> str:
    """The analysis result as indented JSON text (kernel labels made distinct, as the other reports show them)."""
    return json.dumps(_clean(with_distinct_labels(result)), indent=1, ensure_ascii=False)


def write(result: dict, path: Path) -> Path:
    """Write ``result`` to ``path`` as JSON; returns the path."""
    path.write_text(to_json(result), encoding="utf-8")
    return path
