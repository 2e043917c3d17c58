"""Kernel labels as the terminal and HTML renderers shorten them (long labels and op chains). The
labels themselves are made distinct when the report is finished (:mod:`gpudiag.analysis.finish`)."""

from __future__ import annotations

__all__ = ["shorten", "chain_summary"]


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
