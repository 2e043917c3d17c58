"""The tables of report.json built from the kernel frame of one run: top kernels, the module table,
stream gaps, the kernels waited for, the instrumentation overhead, operator classes and roofline
points. ``k`` is every kernel with its attribution and classification, ``km`` those of the measured
steps, ``n`` the number of measured steps; times are ns (per step where the key says so).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpudiag import nvtx_names
from gpudiag.analysis.attribution.families import kernel_label, per_distinct
from gpudiag.analysis.steps.launches import kept_rows
from gpudiag.sources import int_keys
from gpudiag.sources.nsys_sqlite import kernel_summary

# Operator classes of Ivanov et al. 2020, "Data Movement Is All You Need" (MLSys 2021): tensor
# contractions, statistical normalizations, element-wise operators; the rest is "other".
OPERATOR_CLASS = {"gemm": "tensor contraction", "conv": "tensor contraction", "attention": "tensor contraction",
                  "norm": "normalization", "softmax": "normalization", "elementwise": "element-wise",
                  "copy": "element-wise"}


def num(value) -> float | None:
    """``value`` as a float, None for a missing one."""
    return None if value is None or pd.isna(value) else float(value)


def shares(df: pd.DataFrame, column: str) -> dict:
    """Percent of ``df``'s duration_ns per value of ``column`` ({} without any time)."""
    total = df["duration_ns"].sum()
    return {str(k): 100.0 * float(v) / total for k, v in df.groupby(column)["duration_ns"].sum().items()} if total else {}


def top_kernels(km: pd.DataFrame, top: int, n: int) -> list[dict]:
    """The ``top`` kernel names by total time over the measured steps, with their most frequent
    class and evidence, median intensity, ridge and efficiency, per-step time and instances."""
    summary = kernel_summary(km) if not km.empty else pd.DataFrame()
    first = _per_name(km, summary.head(top)["name"]) if not km.empty else pd.DataFrame()
    rows = []
    for row in summary.head(top).itertuples(index=False):
        info = first.loc[row.name]
        rows.append({
            "name": row.name, "short_name": info["short_name"], "label": kernel_label(row.name, info["short_name"]),
            "family": info["family"],
            "kernel_class": info["kernel_class"], "evidence": info["evidence"],
            "instances_per_step": row.instances / n, "time_ns_per_step": row.total_ns / n,
            "avg_ns": row.avg_ns, "med_ns": row.med_ns, "share_of_kernel_time_percent": row.time_percent,
            "intensity_flop_per_byte": num(info["intensity"]), "ridge_flop_per_byte": num(info["ridge"]),
            "efficiency": num(info["efficiency"]),
        })
    return rows


def _per_name(km: pd.DataFrame, names: pd.Series) -> pd.DataFrame:
    """Indexed by the names of ``names``: first short_name and family, most frequent kernel_class and
    evidence, median intensity, ridge and efficiency over its kernels in ``km``. Only these names'
    rows are grouped: the value_counts per name ran for every name (0.4 s on a 1 M-kernel export)."""
    listed = km.loc[km["name"].isin(names),
                    ["name", "short_name", "family", "kernel_class", "evidence", "intensity", "ridge", "efficiency"]]
    return listed.groupby("name").agg(short_name=("short_name", "first"), family=("family", "first"),
                                      kernel_class=("kernel_class", lambda s: s.value_counts().index[0]),
                                      evidence=("evidence", lambda s: s.value_counts().index[0]),
                                      intensity=("intensity", "median"), ridge=("ridge", "median"),
                                      efficiency=("efficiency", "median"))


def module_classes(nvtx: pd.DataFrame) -> dict[str, str]:
    """Module path -> module class, from the ``gpudiag:module path|class`` NVTX ranges."""
    texts = nvtx["text"].dropna()
    texts = texts[texts.str.startswith(nvtx_names.MODULE)].str[len(nvtx_names.MODULE):].drop_duplicates()
    split = texts.str.rsplit("|", n=1)
    return dict(zip(split.str[0], split.str[-1]))


def module_inclusive(in_module: pd.DataFrame, known: set[str]) -> pd.DataFrame:
    """Inclusive kernel time per (module, step, kernel_class): a kernel counts for its innermost
    module and every enclosing module in ``known``. Explodes distinct module paths, not kernels."""
    per = in_module.groupby(["module", "step", "kernel_class"])["duration_ns"].sum().reset_index()
    paths = per["module"].unique()

    def ancestors(path: str) -> list[str]:
        parts = path.split(".")
        return [p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if p in known]

    links = pd.DataFrame([(path, prefix) for path in paths for prefix in ancestors(path)], columns=["module", "ancestor"])
    out = per.merge(links, on="module").drop(columns="module").rename(columns={"ancestor": "module"})
    return out.groupby(["module", "step", "kernel_class"])["duration_ns"].sum().reset_index()


def module_table(incl: pd.DataFrame, self_ns: pd.Series, classes: dict[str, str], n_steps: int,
                 step_ns: float, min_share_percent: float = 0.5, max_rows: int = 60) -> list[dict]:
    """GPU time per module (forward pass), per measured step, in tree order: each module is
    followed by its children, largest first; modules under ``min_share_percent`` of the step are
    left out. ``incl`` comes from :func:`module_inclusive`. Each row also carries the inclusive
    time per kernel class per step (``compute_ns_per_step``, ``bandwidth_ns_per_step``,
    ``overhead_ns_per_step``, ns; 0.0 for a class the module has none of)."""
    by_class = incl.groupby(["module", "kernel_class"])["duration_ns"].sum()
    total = by_class.groupby(level=0).sum()
    class_ns = by_class.unstack(fill_value=0)
    dominant = class_ns.idxmax(axis=1)
    per_class = (class_ns.reindex(columns=["compute", "bandwidth", "overhead"], fill_value=0).astype(float) / n_steps
                 ).add_suffix("_ns_per_step").to_dict("index")
    children: dict[str | None, list[str]] = {}
    for path in total.index:  # one iteration per module path
        parents = [p for p in (path.rsplit(".", i)[0] for i in range(1, path.count(".") + 1)) if p in total.index]
        children.setdefault(parents[0] if parents else None, []).append(path)

    table: list[dict] = []

    def visit(parent: str | None, depth: int) -> None:
        for path in sorted(children.get(parent, []), key=lambda p: -total[p]):
            per = float(total[path]) / n_steps
            share = 100.0 * per / step_ns if step_ns else None
            if share is not None and share < min_share_percent:
                continue
            table.append({"module": path, "module_class": classes.get(path, ""), "depth": depth,
                          "inclusive_ns_per_step": per, "self_ns_per_step": float(self_ns.get(path, 0)) / n_steps,
                          "share_of_step_percent": share, **per_class[path], "dominant_class": dominant[path]})
            visit(path, depth + 1)

    visit(None, 0)
    return table[:max_rows]


def modules(km: pd.DataFrame, nvtx: pd.DataFrame, n: int, step_ns: float) -> tuple[pd.DataFrame, list[dict]]:
    """The measured kernels' inclusive time per (module, step, kernel_class) (:func:`module_inclusive`)
    and the module table (:func:`module_table`; [] without measured steps or modules)."""
    in_module = km[km["module"] != ""]
    classes = module_classes(nvtx)
    known_modules = set(classes) | set(in_module["module"])
    incl = module_inclusive(in_module, known_modules) if not in_module.empty else pd.DataFrame(
        columns=["module", "step", "kernel_class", "duration_ns"])
    table = (module_table(incl, in_module.groupby("module")["duration_ns"].sum(), classes, n, step_ns)
             if n and not incl.empty else [])
    return incl, table


def stream_rows(gaps: pd.DataFrame, k: pd.DataFrame, measured_ids: set, n: int) -> list[dict]:
    """Per stream, the gaps between its kernels in the measured steps, per step: all, host-bound
    ones and their time, and the time of the others (ns)."""
    gaps_m = gaps.merge(k[["kernel_id", "step"]], on="kernel_id")
    gaps_m = kept_rows(gaps_m, gaps_m["step"].isin(measured_ids).to_numpy())
    rows = []
    for stream, g in gaps_m.groupby("stream_id"):
        hb = g[g["host_bound"]]
        rows.append({"stream_id": int(stream), "gaps_per_step": len(g) / n, "host_bound_gaps_per_step": len(hb) / n,
                     "host_bound_ns_per_step": float(hb["gap_ns"].sum()) / n,
                     "other_ns_per_step": float(g.loc[~g["host_bound"], "gap_ns"].sum()) / n})
    return rows


def top_waiting_kernels(idle_m: pd.DataFrame, k: pd.DataFrame, n: int) -> list[dict]:
    """The 10 kernels (by short name) after the most host-bound idle time of the measured steps
    (``idle_m``): idle ns and waits per step; idle ended by a copy or memset is one row of its own."""
    waited = _with_short_name(idle_m[idle_m["host_bound"]], k)
    top_waits = (waited.groupby("short_name", dropna=False)["duration_ns"].agg(["sum", "count"])
                 .sort_values("sum", ascending=False).head(10))
    # no kernel id: a copy or memset ended the idle time (timeline.idle_intervals), e.g. a `.cpu()`
    return [{"short_name": str(name) if isinstance(name, str) else "(a copy or memset, not a kernel)",
             "idle_ns_per_step": float(r["sum"]) / n, "waits_per_step": float(r["count"]) / n}
            for name, r in top_waits.iterrows()]


def _with_short_name(idle: pd.DataFrame, k: pd.DataFrame) -> pd.DataFrame:
    """``idle``'s duration_ns with the short_name of its next kernel (``next_kernel_id`` in ``k``'s
    kernel_id; NULL where none), in ``idle``'s order: a lookup by position, not a merge with a copy
    of the kernel frame's columns (0.47 s on a 1 M-kernel export); by arithmetic where the kernel ids
    run without a gap (:func:`gpudiag.sources.int_keys.positions`: 5 M kernels, 1.3 s of hashing saved).
    A merge where kernel ids repeat."""
    ids = k["kernel_id"].to_numpy()
    at = int_keys.positions(ids, idle["next_kernel_id"].to_numpy(dtype=float, na_value=np.nan)) \
        if ids.dtype.kind == "i" else None
    if at is None:
        index = pd.Index(k["kernel_id"])
        if not index.is_unique:
            return idle.merge(k[["kernel_id", "short_name"]], left_on="next_kernel_id", right_on="kernel_id", how="left")
        at = index.get_indexer(idle["next_kernel_id"])
    short = k["short_name"].array.take(at, allow_fill=True)  # -1 (no kernel): NULL, as the left merge gives
    return pd.DataFrame({"duration_ns": idle["duration_ns"].to_numpy(), "short_name": short})


def instrumentation(st: pd.DataFrame, measured: pd.DataFrame, nvtx: pd.DataFrame, detail_step: int | None,
                    n: int) -> dict | None:
    """The detail step's extra time over the median measured step (the per-op ranges' overhead)
    and the op calls recorded; None without a detail step in the step table ``st``."""
    if detail_step is None or detail_step not in set(st["step"]):
        return None
    d = st.loc[st["step"] == detail_step].iloc[0]
    med = float(measured["step_time_ns"].median()) if n else float("nan")
    return {"detail_step": int(detail_step), "detail_step_time_ns": float(d["step_time_ns"]),
            "median_step_time_ns": med, "op_ranges_overhead_ns": float(d["step_time_ns"]) - med,
            "op_ranges_overhead_percent": 100.0 * (float(d["step_time_ns"]) - med) / med if med else None,
            "op_calls_recorded": int(nvtx["text"].fillna("").str.startswith("gpudiag:op ").sum())}


def operator_classes(km: pd.DataFrame) -> list[dict]:
    """FLOP share and time share per operator class over the measured steps. FLOPs are those of
    the classification (ncu-measured or shape-estimated); kernels without any count 0 FLOP and
    their time share is given as ``time_without_flop_percent``."""
    # the class looked up once per distinct family, as a Categorical of the sorted class names (the
    # groups, and so the totals' order, as with the names as text), on a frame of the three columns
    # read, not a copy of the kernel frame
    classes = sorted({*OPERATOR_CLASS.values(), "other"})
    code = per_distinct(km["family"], lambda f: classes.index(OPERATOR_CLASS.get(f, "other")), classes.index("other"),
                        np.int64)
    k = pd.DataFrame({"op_class": pd.Categorical.from_codes(code, categories=classes), "flop": km["flop"],
                      "duration_ns": km["duration_ns"]})
    flop, time = k.groupby("op_class")["flop"].sum(min_count=1), k.groupby("op_class")["duration_ns"].sum()
    unknown = k[k["flop"].isna()].groupby("op_class")["duration_ns"].sum()
    total_time = float(time.sum())
    order = ["tensor contraction", "normalization", "element-wise", "other"]
    flop = flop.fillna(0.0)
    total_flop = float(flop.sum())
    return [{"operator_class": c, "flop_share_percent": 100.0 * float(flop.get(c, 0.0)) / total_flop if total_flop else None,
             "time_share_percent": 100.0 * float(time.get(c, 0)) / total_time if total_time else None,
             "time_without_flop_percent": 100.0 * float(unknown.get(c, 0)) / total_time if total_time else None}
            for c in order if c in time.index]


def roofline_points(km: pd.DataFrame, n_steps: int, limit: int = 200) -> list[dict]:
    """One point per kernel name and launch configuration with a known arithmetic intensity:
    median intensity (FLOP/byte), achieved FLOP/s and bytes/s, time per step (ns), class,
    evidence, ridge (FLOP/byte) and efficiency (roofline floor / duration); largest first."""
    k = km[np.isfinite(km["intensity"].astype(float)) & (km["intensity"].astype(float) > 0)]
    if k.empty:
        return []
    g = k.groupby("config_key")
    pts = pd.DataFrame({
        "name": g["name"].first(), "short_name": g["short_name"].first(),
        "kernel_class": g["kernel_class"].agg(lambda s: s.mode().iloc[0]), "evidence": g["evidence"].agg(lambda s: s.mode().iloc[0]),
        "math_path": g["math_path"].first(),
        "intensity_flop_per_byte": g["intensity"].median(), "ridge_flop_per_byte": g["ridge"].median(),
        "achieved_flop_per_s": g["achieved_flop_per_s"].median(), "achieved_bytes_per_s": g["achieved_bytes_per_s"].median(),
        "efficiency": g["efficiency"].median(), "time_ns_per_step": g["duration_ns"].sum() / n_steps,
        "instances_per_step": g.size() / n_steps})
    pts = pts.sort_values("time_ns_per_step", ascending=False).head(limit)
    pts["label"] = [kernel_label(n, s) for n, s in zip(pts["name"], pts["short_name"])]
    pts["lost_ns_per_step"] = pts["time_ns_per_step"] * (1 - pts["efficiency"].clip(upper=1))
    return [{k2: (None if isinstance(v, float) and not np.isfinite(v) else v) for k2, v in row.items()}
            for row in pts.drop(columns=["short_name"]).to_dict("records")]


def below_roof(points: list[dict]) -> list[dict]:
    """The 10 roofline points losing the most time per step under their roof."""
    return sorted([p for p in points if p["lost_ns_per_step"] is not None], key=lambda p: -p["lost_ns_per_step"])[:10]
