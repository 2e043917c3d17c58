"""The report, finished once (issue 47, part 3): its type and the one step that finishes it.

:func:`gpudiag.analysis.pipeline.analyse` returns the report's content; the application adds the
run's trials, patches and warnings; :func:`finish` then makes the kernel labels distinct
(:func:`gpudiag.analysis.attribution.labels.distinct_labels`) and the values plain JSON (numpy
scalars as Python numbers, NaN and infinities as None). What it returns is what report.json holds,
what :class:`gpudiag.api.Run` keeps and what every renderer shows: renderers only render it.
"""

from __future__ import annotations

import math
from typing import Any, TypedDict

Json = dict[str, Any]


class Report(TypedDict, total=False):
    """report.json's content (docs/architecture.md, "report.json"); units are in the key names."""

    schema_version: int
    gpudiag_version: str
    source: str | None
    script: Json | None  # the launcher's status of a gpudiag profile run
    compiled: Json | None
    environment: Json
    device: Json
    steps: Json
    gpu_busy_percent: float | None
    outlier_steps: Json | None
    breakdown_ns_per_step: Json
    breakdown_percent: Json
    overhead_split_ns_per_step: Json
    overhead_split_percent: Json
    classification: Json
    phases_ns_per_step: Json
    top_kernels: list[Json]
    recommendations: list[Json]
    suppressed: list[Json]
    fusion_candidates: list[Json]
    fusion_saving_by_kernel: list[Json]
    fusion_note: str | None
    fusion_source: str | None
    host_ns_per_step: float | None
    share_reference: Json | None
    operator_classes: list[Json]
    roofline_points: list[Json]
    below_roof: list[Json]
    families_ns_per_step: Json
    modules: list[Json]
    per_step_metrics: list[Json]
    idle: Json
    instrumentation: Json
    launches_per_step: Json | None
    communication: Json | None
    ranks: Json | None
    inference: Json | None
    representativeness: Json | None
    invariants: Json
    warnings: list[str]
    trials: list[Json]
    trials_left_out: list[Json]
    trials_budget: Json | None
    patches: list[Json]


# Keys every finished report has, whatever the capture (the rest depend on the run: trials, ranks...).
REQUIRED = frozenset({"schema_version", "gpudiag_version", "source", "script", "device", "steps", "breakdown_percent",
                      "classification", "top_kernels", "recommendations", "warnings"})


def _plain(value: Any) -> Any:
    """``value`` as JSON types: numpy scalars as Python numbers, NaN and infinities as None."""
    import numpy as np  # here: the type above is imported by `gpudiag --help`'s modules

    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def finish(result: Json) -> Report:
    """The finished report of the analysis's ``result`` (a new object; ``result`` is left as it
    is): kernel lists (``labels.LABELLED``) labelled with distinct labels, values as JSON types.
    Idempotent. Raises nothing of its own."""
    from gpudiag.analysis.attribution.labels import LABELLED, distinct_labels

    labels = distinct_labels(result)
    out = dict(result)
    for key in LABELLED:
        if key in out and out[key] is not None:
            out[key] = [{**e, "label": labels.get(e["name"], e.get("label"))} for e in out[key]]
    return _plain(out)
