"""Kernel labels that tell kernels apart: the analysis names kernels by them (the rules' evidence),
and the terminal, HTML and JSON renderers show them (:mod:`gpudiag.renderers.labels`).

The analysis labels a kernel by its short name (plus functor and dtype for ATen's generic
kernels), so different kernels can share a label: CUTLASS names every GEMM ``Kernel2`` and only its
template argument (tile shape, layout) differs. Where labels collide, the rarest tokens of the
demangled name that the others lack are appended (a single token trimmed of the ``_``-separated
parts they all share: ``Kernel2 · 128x128_tn``); where no token tells them apart (names differing
only in numbers), ``#1``, ``#2``... in order of appearance (top kernels come by time)."""

from __future__ import annotations

import re
from collections import Counter

# Lists of the report whose entries carry ``name`` (demangled) and ``label``.
LABELLED = ("top_kernels", "roofline_points", "below_roof")
_TOKEN = re.compile(r"\w+")


def _tokens(name: str) -> list[str]:
    return list(dict.fromkeys(_TOKEN.findall(name or "")))


def _distinguishing(names: list[str]) -> list[str] | None:
    """Per name, the tokens of its demangled name that tell it apart from the others: its rarest
    non-numeric token that not every name has, then the next rarest where two still coincide
    (up to three); None when that does not give each name a different suffix."""
    token_lists = [_tokens(n) for n in names]
    common = set.intersection(*(set(t) for t in token_lists))
    own = [[t for t in ts if t not in common and not t.isdigit()] for ts in token_lists]
    if not all(own):
        return None
    counts = Counter(t for ts in own for t in ts)
    ranked = [sorted(ts, key=counts.__getitem__) for ts in own]  # stable: ties keep name order
    take = [1] * len(names)
    for _ in range(3):
        picks = [tuple(t for t in ts if t in r[:k]) for ts, r, k in zip(own, ranked, take)]
        clashes = [i for i, p in enumerate(picks) if picks.count(p) > 1]
        if not clashes:
            singles = all(len(p) == 1 for p in picks)
            return _trim_common_parts([p[0] for p in picks]) if singles else [" · ".join(p) for p in picks]
        for i in clashes:
            take[i] += 1
    return None


def _trim_common_parts(tokens: list[str]) -> list[str]:
    """Drop the leading and trailing ``_``-parts every token shares (they do not distinguish), as
    long as what is left still tells the tokens apart."""
    parts = [t.split("_") for t in tokens]
    lead = 0
    while all(len(p) > lead + 1 and p[lead] == parts[0][lead] for p in parts):
        lead += 1
    trail = 0
    while all(len(p) > lead + trail + 1 and p[-1 - trail] == parts[0][-1 - trail] for p in parts):
        trail += 1
    trimmed = ["_".join(p[lead:len(p) - trail]) for p in parts]
    return trimmed if len(set(trimmed)) == len(trimmed) else tokens


def distinct_labels(result: dict) -> dict[str, str]:
    """Kernel name -> a label no other kernel name in ``result`` shares."""
    by_label: dict[str, list[str]] = {}
    for key in LABELLED:
        for entry in result.get(key) or []:
            names = by_label.setdefault(entry["label"], [])
            if entry["name"] not in names:
                names.append(entry["name"])
    out = {}
    for label, names in by_label.items():
        if len(names) == 1:
            out[names[0]] = label
            continue
        suffixes = _distinguishing(names) or [f"#{i}" for i in range(1, len(names) + 1)]
        sep = " " if suffixes[0].startswith("#") else " · "
        out.update({n: f"{label}{sep}{s}" for n, s in zip(names, suffixes)})
    return out
