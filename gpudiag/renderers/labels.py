"""Kernel labels as the terminal, HTML and JSON renderers show them: the analysis's distinct
labels (:mod:`gpudiag.analysis.attribution.labels`, where the rules name kernels by them too)
written into a report's kernel lists, and the shortening of long labels and op chains."""

from __future__ import annotations

from gpudiag.analysis.attribution.labels import LABELLED, distinct_labels

__all__ = ["LABELLED", "distinct_labels", "with_distinct_labels", "shorten", "chain_summary"]


def with_distinct_labels(result: dict) -> dict:
    """A shallow copy of ``result`` whose kernel lists carry :func:`distinct_labels` (the input is
    left as it is: reports are shared between renderers). Idempotent: distinct labels stay."""
    labels = distinct_labels(result)
    out = dict(result)
    for key in LABELLED:
        if key in result:
            out[key] = [{**e, "label": labels.get(e["name"], e["label"])} for e in result[key]]
    return out


def shorten(label: str, width: int) -> str:
    """``label`` in at most ``width`` characters, cut in the middle so that its end (where the
    disambiguating suffix sits) stays visible."""
    if len(label) <= width:
        return label
    head = (width - 1) // 2
    return label[:head] + "…" + label[len(label) - (width - 1 - head):]


SUMMARY_MIN_KERNELS = 6  # a kernel-sequence chain longer than this is summarised (issue 21: one took 30 lines)


def chain_summary(candidate: dict) -> str:
    """A fusion candidate's chain as one line: ``mul → pow → add`` for op chains and short kernel
    sequences; for a kernel sequence of more than :data:`SUMMARY_MIN_KERNELS` kernels, its kernel
    families with counts, its first and last kernel and the total (the full list stays in
    report.json)."""
    ops = [str(op).replace("aten::", "") for op in candidate.get("ops") or []]
    if candidate.get("source") != "kernel_sequence" or len(ops) <= SUMMARY_MIN_KERNELS:
        return " → ".join(ops)
    families = candidate.get("families") or {}
    counts = ", ".join(f"{f} ×{n}" for f, n in sorted(families.items(), key=lambda kv: -kv[1]))
    return (f"{len(ops)} kernels ({counts}): {shorten(ops[0], 50)} → … → {shorten(ops[-1], 50)}"
            if counts else f"{len(ops)} kernels: {shorten(ops[0], 50)} → … → {shorten(ops[-1], 50)}")
