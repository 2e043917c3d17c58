"""The analysis of one run: from an nsys export to the plain data the reporters render.

``ingest`` loads an export into a run database; ``analyse`` reads the run database, writes the
attribution and classification back to it, and returns a JSON-able dict (``report.json``'s
content, documented in docs/architecture.md). Statistics are over *measured* steps: not warm-up,
not the detail step (whose per-op ranges slow it down; its extra time is the instrumentation
overhead the report shows).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import sqlite_utils

from gpudiag import __version__, nvtx_names, store
from gpudiag.analysis import comm, invariants, outliers, overlaps, ranks
from gpudiag.analysis import peaks as peaks_mod
from gpudiag.analysis.attribution import (Steps, attribute, find_steps, launch_calls, op_call_payloads, run_flags,
                                          window_index)
from gpudiag.analysis.errors import AnalysisError
from gpudiag.analysis.classify import classify
from gpudiag.analysis.families import kernel_label
from gpudiag.analysis import host_floor
from gpudiag.analysis.fusion import fusion_candidates, mark_host_bound, saving_by_kernel
from gpudiag.analysis.kernel_sequence import kernel_sequence_candidates
from gpudiag.analysis.compiled import attribute_compiled
from gpudiag.analysis.launches import in_measured_steps, launch_counts
from gpudiag.analysis.representative import apply_bare_run, compare_bare
from gpudiag.analysis.timeline import (gpu_activities, idle_intervals, launch_stats, step_table,
                                       stream_gaps)
from gpudiag.sources import row_checks
from gpudiag.sources.ncu import read_ncu
from gpudiag.sources.nsys_sqlite import kernel_summary, read_export

REPORT_SCHEMA_VERSION = 1
CLASSES = ("compute", "bandwidth", "overhead", "communication")  # communication: collectives, outside the roofline


def ingest(export_path: Path, db_path: Path, source_name: str | None = None,
           ncu_path: Path | None = None) -> sqlite_utils.Database:
    """Read the nsys SQLite export at ``export_path`` (and, if given, the Nsight Compute report at
    ``ncu_path``, into table ``ncu_kernels``) into a new run database at ``db_path``.
    Raises :class:`gpudiag.sources.nsys_sqlite.ExportError` for a file that is not an export and
    :class:`gpudiag.sources.ncu.NcuError` for an unreadable ncu report."""
    export = read_export(export_path)
    ncu = read_ncu(ncu_path) if ncu_path else None
    kernels = export.kernels.copy()
    kernels.insert(0, "kernel_id", np.arange(len(kernels), dtype=np.int64))
    tables = {"kernels": kernels, "runtime_api": export.runtime_api, "memcpy": export.memcpy,
              "memset": export.memset, "sync": export.sync, "nvtx_ranges": export.nvtx_ranges,
              "devices": export.devices}
    if ncu is not None:
        tables["ncu_kernels"] = ncu
    return store.create_run_db(db_path, tables, {"source": source_name or export_path.name,
                                                 "ncu_source": ncu_path.name if ncu_path else None,
                                                 "missing": export.missing, "environment": export.environment,
                                                 "dropped_rows": export.dropped, "rows_read": export.rows_read})


def _per_step(values: pd.Series, n_steps: int) -> float:
    return float(values.sum()) / n_steps if n_steps else float("nan")


def _stats(values: pd.Series) -> dict:
    if values.empty:
        return {"mean": None, "median": None, "min": None, "max": None}
    return {"mean": float(values.mean()), "median": float(values.median()),
            "min": float(values.min()), "max": float(values.max())}


def _module_inclusive(in_module: pd.DataFrame, known: set[str]) -> pd.DataFrame:
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


def _module_table(incl: pd.DataFrame, self_ns: pd.Series, module_classes: dict[str, str], n_steps: int,
                  step_ns: float, min_share_percent: float = 0.5, max_rows: int = 60) -> list[dict]:
    """GPU time per module (forward pass), per measured step, in tree order: each module is
    followed by its children, largest first; modules under ``min_share_percent`` of the step are
    left out. ``incl`` comes from :func:`_module_inclusive`. Each row also carries the inclusive
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
            table.append({"module": path, "module_class": module_classes.get(path, ""), "depth": depth,
                          "inclusive_ns_per_step": per, "self_ns_per_step": float(self_ns.get(path, 0)) / n_steps,
                          "share_of_step_percent": share, **per_class[path], "dominant_class": dominant[path]})
            visit(path, depth + 1)

    visit(None, 0)
    return table[:max_rows]


# Operator classes of Ivanov et al. 2020, "Data Movement Is All You Need" (MLSys 2021): tensor
# contractions, statistical normalizations, element-wise operators; the rest is "other".
OPERATOR_CLASS = {"gemm": "tensor contraction", "conv": "tensor contraction", "attention": "tensor contraction",
                  "norm": "normalization", "softmax": "normalization", "elementwise": "element-wise",
                  "copy": "element-wise"}


def _operator_classes(km: pd.DataFrame) -> list[dict]:
    """FLOP share and time share per operator class over the measured steps. FLOPs are those of
    the classification (ncu-measured or shape-estimated); kernels without any count 0 FLOP and
    their time share is given as ``time_without_flop_percent``."""
    k = km.assign(op_class=km["family"].map(OPERATOR_CLASS).fillna("other"))
    flop, time = k.groupby("op_class")["flop"].sum(min_count=1), k.groupby("op_class")["duration_ns"].sum()
    unknown = k[k["flop"].isna()].groupby("op_class")["duration_ns"].sum()
    total_flop, total_time = float(flop.sum()), float(time.sum())
    order = ["tensor contraction", "normalization", "element-wise", "other"]
    flop = flop.fillna(0.0)
    total_flop = float(flop.sum())
    return [{"operator_class": c, "flop_share_percent": 100.0 * float(flop.get(c, 0.0)) / total_flop if total_flop else None,
             "time_share_percent": 100.0 * float(time.get(c, 0)) / total_time if total_time else None,
             "time_without_flop_percent": 100.0 * float(unknown.get(c, 0)) / total_time if total_time else None}
            for c in order if c in time.index]


def _roofline_points(km: pd.DataFrame, n_steps: int, limit: int = 200) -> list[dict]:
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


def _per_step_metrics(km: pd.DataFrame, measured: pd.DataFrame, per_step: list[dict], incl: pd.DataFrame,
                      modules: list[dict], peak_memory: dict) -> list[dict]:
    """Per measured step, the samples the CI gate tests: step time, GPU busy time, overhead share,
    kernel launches, GPU time per kernel family and per module of the module table (all ns), and
    the peak bytes allocated by PyTorch when the launcher recorded it (``peak_memory``: step -> bytes)."""
    families = km.groupby(["step", "family"])["duration_ns"].sum().unstack(fill_value=0)
    listed = [m["module"] for m in modules]
    mods = (incl[incl["module"].isin(listed)].groupby(["step", "module"])["duration_ns"].sum().unstack(fill_value=0)
            if not incl.empty else pd.DataFrame())
    by_step = {e["step"]: e for e in per_step}
    rows = []
    for row in measured.itertuples(index=False):
        entry = by_step[row.step]
        rows.append({
            "step": int(row.step), "step_time_ns": float(row.step_time_ns), "busy_ns": float(row.busy_ns),
            "overhead_percent": 100.0 * entry.get("overhead_ns", 0.0) / row.step_time_ns if row.step_time_ns else None,
            "kernel_launches": int(row.kernels),
            "families_ns": {f: float(v) for f, v in families.loc[row.step].items()} if row.step in families.index else {},
            "modules_ns": {m: float(v) for m, v in mods.loc[row.step].items()} if row.step in mods.index else {},
            "peak_memory_bytes": peak_memory.get(str(int(row.step))),
        })
    return rows


def analyse(db: sqlite_utils.Database, warmup_steps: int = 2, steps_from: str | None = None,
            status: dict | None = None, top: int = 20, calibration: dict | None = None,
            process: int | None = None, rank_workers: int | None = None) -> dict:
    """Analyse the run database ``db``; returns report.json's content (see module docstring).

    Writes ``kernel_attribution``, ``kernel_class`` and ``steps`` tables back into ``db``.
    Raises :class:`AnalysisError` when the export has no kernels or ``steps_from`` is an invalid
    regular expression (or ``process``, a ``global_pid``, launched no kernel). ``process`` restricts
    the analysis to that process. Without it, an export of several processes is reported for the
    one with the most kernel time (with a warning), and report.json's ``ranks`` compares every
    process, each analysed in a pool of ``rank_workers`` processes (:mod:`gpudiag.analysis.ranks`). ``calibration`` (a ``gpudiag calibrate`` entry of the same GPU)
    replaces datasheet peaks with measured ones."""
    meta = store.read_meta(db)
    kernels = store.read_table(db, "kernels")
    runtime_api = store.read_table(db, "runtime_api")
    nvtx = store.read_table(db, "nvtx_ranges")
    devices = store.read_table(db, "devices")
    memcpy, memset = store.read_table(db, "memcpy"), store.read_table(db, "memset")
    warnings: list[str] = []
    if kernels.empty:
        odd = (meta.get("dropped_rows") or {}).get("kernels")
        if odd:  # every kernel row was odd: say so rather than "no kernels"
            raise AnalysisError(f"all {(meta.get('rows_read') or {}).get('kernels', '?')} kernel rows hold impossible values "
                                f"({', '.join(f'{r}: {n}' for r, n in odd.items())}): export the report again")
        raise AnalysisError("the export holds no CUDA kernels: was the script run on a GPU with CUDA tracing on (nsys --trace=cuda)?")
    if nvtx.empty:
        nvtx = pd.DataFrame(columns=["start_ns", "end_ns", "text", "global_tid", "global_pid", "event_type", "domain_id"])
    if runtime_api.empty:
        warnings.append("no CUDA API calls in the export: steps, modules and host-bound idle time cannot be attributed")

    # One process per report: step numbers, stream ids and correlation ids are per process.
    kernel_ns_by_pid = kernels.groupby("global_pid")["duration_ns"].sum()
    procs = ranks.processes(kernels) if len(kernel_ns_by_pid) > 1 and process is None else None
    if process is not None and process not in kernel_ns_by_pid.index:
        raise AnalysisError(f"process {ranks.os_pid(process)} (globalPid {process}) launched no kernel in this export")
    if len(kernel_ns_by_pid) > 1:
        pid = kernel_ns_by_pid.idxmax() if process is None else process
        if process is None:
            warnings.append(f"{len(kernel_ns_by_pid)} processes launched kernels; this report covers the one with the most "
                            f"kernel time (pid {ranks.os_pid(pid)}, {100 * kernel_ns_by_pid[pid] / kernel_ns_by_pid.sum():.0f} %); "
                            "the ranks table compares them all")
        kernels = kernels[kernels["global_pid"] == pid].reset_index(drop=True)
        runtime_api, nvtx, memcpy, memset = (df[df["global_pid"] == pid].reset_index(drop=True) if not df.empty else df
                                             for df in (runtime_api, nvtx, memcpy, memset))
    # The GPU that ran most of the kernels sets the peaks (TARGET_INFO_GPU lists every GPU present).
    by_device = kernels.groupby("device_id")["duration_ns"].sum()
    if by_device.empty:  # no kernel names its device (a damaged export): the first GPU listed
        warnings.append("no kernel records its device; peaks are those of the first GPU the export lists")
    main_device = by_device.idxmax() if not by_device.empty else (devices["device_id"].iloc[0] if not devices.empty else None)
    if kernels["device_id"].nunique() > 1:
        warnings.append(f"kernels ran on {kernels['device_id'].nunique()} GPUs; peaks are those of device {main_device}")
    dev_rows = devices[devices["device_id"] == main_device] if not devices.empty else devices
    dev = dev_rows.iloc[0] if not dev_rows.empty else (devices.iloc[0] if not devices.empty else pd.Series(dtype=object))

    steps: Steps = find_steps(nvtx, kernels, steps_from, runtime_api)
    if steps.kind == "whole":
        warmup_steps = 0
        warnings.append("no step ranges found: the whole capture is treated as one step")
    payloads = op_call_payloads(nvtx)  # once: attribution and the fusion data flow both read them
    attribution = attribute(kernels, runtime_api, nvtx, steps, payloads)
    attribution, compiled = attribute_compiled(kernels, attribution, nvtx, (status or {}).get("inductor_provenance"))
    warnings.extend(compiled["warnings"] if compiled["graphs"] else [])
    device_peaks = peaks_mod.lookup(str(dev.get("name", "")), int(dev.get("sm_count", 0) or 0),
                                    dev.get("memory_bandwidth_bytes_per_s"))
    if calibration and calibration.get("gpu") == device_peaks.name:
        device_peaks = peaks_mod.with_calibration(device_peaks, calibration)
    elif calibration:
        warnings.append(f"calibration of {calibration.get('gpu')} ignored: the capture ran on {device_peaks.name}")
    ncu = store.read_table(db, "ncu_kernels")
    classes = classify(kernels, attribution, device_peaks, ncu if not ncu.empty else None)
    detail_step = (status or {}).get("detail_step")
    if detail_step is None and (attribution["op_call"] >= 0).any():
        detail_step = int(attribution.loc[attribution["op_call"] >= 0, "step"].mode().iloc[0])
    activities = gpu_activities(kernels, memcpy, memset, runtime_api)
    when = activities["api_start_ns"].to_numpy(dtype=float)
    if steps.kind == "whole":
        when = np.where(np.isnan(when), activities["start_ns"].to_numpy(dtype=float), when)
    widx = window_index(steps.table["start_ns"].to_numpy(), steps.table["end_ns"].to_numpy(), when)
    activities["step"] = np.where(widx >= 0, steps.table["step"].to_numpy()[np.maximum(widx, 0)], -1)
    # several launcher runs in one capture: each run has its own warm-up and detail step
    st = outliers.flag_outliers(run_flags(step_table(steps.table, activities, warmup_steps, detail_step), steps,
                                          warmup_steps, detail_step))
    if len(st) and not st["warmup"].any() and warmup_steps > 0:
        warnings.append(f"only {len(st)} step(s), not more than the {warmup_steps} warm-up steps: "
                        "the statistics include them (capture more steps, or lower --warmup-steps)")
    idle = idle_intervals(activities)
    gaps = stream_gaps(kernels, attribution)
    launches = launch_stats(kernels, attribution)

    store.write_table(db, "kernel_attribution", attribution)
    store.write_table(db, "kernel_class", classes)
    store.write_table(db, "steps", st)

    measured = st[st["measured"]]
    n = len(measured)
    measured_ids = set(measured["step"])
    k = kernels.assign(**{c: attribution[c].to_numpy() for c in ("step", "phase", "module", "module_class", "op", "op_args",
                                                                  "op_call", "graph")},
                       **{c: classes[c].to_numpy() for c in ("family", "kernel_class", "evidence", "intensity", "ridge", "efficiency",
                                                             "config_key", "flop", "bytes", "math_path", "achieved_flop_per_s",
                                                             "achieved_bytes_per_s")})
    k["queue_delay_ns"] = launches["queue_delay_ns"].to_numpy()
    k["shorter_than_launch"] = launches["shorter_than_launch"].to_numpy()
    km = k[k["step"].isin(measured_ids)]

    # Idle split per step: GPU-idle intervals inside each step's window.
    win = measured[["step", "window_start_ns", "gpu_end_ns"]].sort_values("window_start_ns")
    idle = idle.assign(step=-1)
    if not idle.empty and not win.empty:
        pos = np.searchsorted(win["window_start_ns"].to_numpy(), idle["start_ns"].to_numpy(), side="right") - 1
        ok = (pos >= 0) & (idle["end_ns"].to_numpy() <= win["gpu_end_ns"].to_numpy()[np.maximum(pos, 0)])
        idle["step"] = np.where(ok, win["step"].to_numpy()[np.maximum(pos, 0)], -1)
    idle_m = idle[idle["step"].isin(measured_ids)]
    host_idle = idle_m[idle_m["host_bound"]].groupby("step")["duration_ns"].sum()
    # Copies and memsets are memory traffic: they count as bandwidth time.
    copies = activities[(activities["kind"] != "kernel") & activities["step"].isin(measured_ids)]
    busy_parts = pd.concat([km[["step", "kernel_class", "duration_ns"]],
                            pd.DataFrame({"step": copies["step"], "kernel_class": "bandwidth",
                                          "duration_ns": copies["end_ns"] - copies["start_ns"]})])
    class_ns = busy_parts.groupby(["step", "kernel_class"])["duration_ns"].sum().unstack(fill_value=0)
    class_ns = class_ns.reindex(columns=list(CLASSES), fill_value=0)

    per_step = []
    for row in st.itertuples(index=False):
        entry = {"step": int(row.step), "step_time_ns": int(row.step_time_ns), "busy_ns": int(row.busy_ns),
                 "idle_ns": int(row.idle_ns), "kernels": int(row.kernels), "warmup": bool(row.warmup),
                 "detail": bool(row.detail), "measured": bool(row.measured), "outlier": bool(row.outlier)}
        if row.step in class_ns.index:
            kernel_total = float(class_ns.loc[row.step].sum())
            scale = row.busy_ns / kernel_total if kernel_total else 0.0  # concurrent work counts once
            host = float(host_idle.get(row.step, 0))
            entry.update({f"{c}_ns": float(class_ns.loc[row.step, c]) * scale for c in CLASSES})
            entry["overhead_ns"] += host
            entry["host_bound_idle_ns"] = host
            entry["other_idle_ns"] = float(row.idle_ns) - host
        per_step.append(entry)
    ps = pd.DataFrame([e for e in per_step if e["measured"] and "compute_ns" in e])
    step_ns = float(measured["step_time_ns"].mean()) if n else float("nan")
    breakdown = {}
    for key in ("compute_ns", "bandwidth_ns", "overhead_ns", "communication_ns", "other_idle_ns"):
        value = float(ps[key].mean()) if not ps.empty else 0.0
        breakdown[key.replace("other_idle", "idle")] = value
    breakdown_percent = {k2.replace("_ns", ""): 100.0 * v / step_ns if step_ns else None for k2, v in breakdown.items()}

    summary = kernel_summary(km) if not km.empty else pd.DataFrame()
    first = km.groupby("name").agg(short_name=("short_name", "first"), family=("family", "first"),
                                    kernel_class=("kernel_class", lambda s: s.value_counts().index[0]),
                                    evidence=("evidence", lambda s: s.value_counts().index[0]),
                                    intensity=("intensity", "median"), ridge=("ridge", "median"),
                                    efficiency=("efficiency", "median")) if not km.empty else pd.DataFrame()
    top_kernels = []
    for row in summary.head(top).itertuples(index=False):
        info = first.loc[row.name]
        top_kernels.append({
            "name": row.name, "short_name": info["short_name"], "label": kernel_label(row.name, info["short_name"]),
            "family": info["family"],
            "kernel_class": info["kernel_class"], "evidence": info["evidence"],
            "instances_per_step": row.instances / n, "time_ns_per_step": row.total_ns / n,
            "avg_ns": row.avg_ns, "med_ns": row.med_ns, "share_of_kernel_time_percent": row.time_percent,
            "intensity_flop_per_byte": _num(info["intensity"]), "ridge_flop_per_byte": _num(info["ridge"]),
            "efficiency": _num(info["efficiency"]),
        })

    in_module = km[km["module"] != ""]
    detail = k[(k["step"] == detail_step) & (k["op"] != "")] if detail_step is not None else k.iloc[0:0]
    # API calls of the measured steps, once: the rules and the launch counts both read them
    api_m = (in_measured_steps(runtime_api, runtime_api["start_ns"].to_numpy(dtype=float), steps.table, measured_ids)
             if not runtime_api.empty else runtime_api)
    all_candidates = fusion_candidates(detail, device_peaks, top=None, op_payloads=payloads.tolist() if len(payloads) else None)
    fusion_source = "op_dataflow"
    if not all_candidates and not (k["op_call"] >= 0).any():  # no op ranges: the kernel sequence alone (lower confidence)
        all_candidates, fusion_source = kernel_sequence_candidates(km, device_peaks, n, top=None), "kernel_sequence"
    recommendations, suppressed = _recommendations(
        km, detail, idle, runtime_api, api_m, memcpy, steps, measured_ids, n, step_ns, device_peaks, ncu,
        _rule_context(status, dev, compiled, all_candidates, measured_ids)) if n else ([], [])
    host_ns = host_floor.host_ns_per_step(api_m) if n else None  # the step cannot get shorter than this
    host_floor.bound_by_host(recommendations, float(measured["step_time_ns"].median()) if n else 0.0, host_ns)
    candidates = all_candidates[:10]
    fusion_note = mark_host_bound(candidates, recommendations)
    module_texts = nvtx["text"].dropna()
    module_texts = module_texts[module_texts.str.startswith(nvtx_names.MODULE)].str[len(nvtx_names.MODULE):].drop_duplicates()
    split = module_texts.str.rsplit("|", n=1)
    module_classes = dict(zip(split.str[0], split.str[-1]))
    known_modules = set(module_classes) | set(in_module["module"])
    incl = _module_inclusive(in_module, known_modules) if not in_module.empty else pd.DataFrame(
        columns=["module", "step", "kernel_class", "duration_ns"])
    modules = (_module_table(incl, in_module.groupby("module")["duration_ns"].sum(), module_classes, n, step_ns)
               if n and not incl.empty else [])
    gaps_m = gaps.merge(k[["kernel_id", "step", "name", "short_name"]], on="kernel_id")
    gaps_m = gaps_m[gaps_m["step"].isin(measured_ids)]
    stream_rows = []
    for stream, g in gaps_m.groupby("stream_id"):
        hb = g[g["host_bound"]]
        stream_rows.append({"stream_id": int(stream), "gaps_per_step": len(g) / n, "host_bound_gaps_per_step": len(hb) / n,
                            "host_bound_ns_per_step": float(hb["gap_ns"].sum()) / n,
                            "other_ns_per_step": float(g.loc[~g["host_bound"], "gap_ns"].sum()) / n})
    waited = idle_m[idle_m["host_bound"]].merge(k[["kernel_id", "name", "short_name", "module", "op"]],
                                                 left_on="next_kernel_id", right_on="kernel_id", how="left")
    top_waits = (waited.groupby("short_name", dropna=False)["duration_ns"].agg(["sum", "count"])
                 .sort_values("sum", ascending=False).head(10))
    phases = (km.groupby("phase")["duration_ns"].sum() / n).to_dict() if n else {}

    instrumentation = None
    if detail_step is not None and detail_step in set(st["step"]):
        d = st.loc[st["step"] == detail_step].iloc[0]
        med = float(measured["step_time_ns"].median()) if n else float("nan")
        instrumentation = {"detail_step": int(detail_step), "detail_step_time_ns": float(d["step_time_ns"]),
                           "median_step_time_ns": med, "op_ranges_overhead_ns": float(d["step_time_ns"]) - med,
                           "op_ranges_overhead_percent": 100.0 * (float(d["step_time_ns"]) - med) / med if med else None,
                           "op_calls_recorded": int(nvtx["text"].fillna("").str.startswith("gpudiag:op ").sum())}
    if meta.get("missing"):
        warnings.append("missing from the export: " + ", ".join(meta["missing"][:12]))
    warnings.extend(row_checks.warning_lines(meta.get("dropped_rows") or {}, meta.get("rows_read") or {}))
    if status and status.get("exit_code") not in (0, None):
        warnings.append(f"the script failed (exit code {status.get('exit_code')}): {status.get('exception') or 'see gpudiag.log'}; "
                        "this report covers what was captured until then")

    report = invariants.check(apply_bare_run({
        "schema_version": REPORT_SCHEMA_VERSION,
        "gpudiag_version": __version__,
        "source": meta.get("source"),
        # the provenance can run to hundreds of KB: it stays in script_status.json
        "script": {k: v for k, v in status.items() if k != "inductor_provenance"} if status else None,
        "compiled": {**compiled, "dynamo": (status or {}).get("compile")} if compiled["graphs"] or (status or {}).get("compile") else None,
        "environment": {**meta.get("environment", {}),
                        **{k: (status or {}).get(k) for k in ("torch_version", "torch_cuda_version") if (status or {}).get(k)}},
        "device": {"name": device_peaks.name, "sm_count": device_peaks.sm_count,
                   "memory_bandwidth_bytes_per_s": device_peaks.bandwidth, "peak_flop_per_s": device_peaks.flops,
                   "peaks_source": device_peaks.source, "launch_overhead_ns": device_peaks.launch_overhead_ns},
        "steps": {"source": steps.source, "kind": steps.kind, "count": int(len(st)), "warmup_steps": int(st["warmup"].sum()),
                  "detail_step": detail_step, "measured": n, "outliers": int(st["outlier"].sum()),
                  "statistics": outliers.STEADY_STATE_RULE,
                  "step_time_ns": _stats(measured["step_time_ns"].astype(float)),
                  "step_time_ns_with_outliers": _stats(st.loc[st["measured"] | st["outlier"], "step_time_ns"].astype(float)),
                  "per_step": per_step},
        # None when every measured window is empty (timestamps moved in a damaged export): no share of nothing
        "gpu_busy_percent": (100.0 * float(measured["busy_ns"].sum()) / float(measured["step_time_ns"].sum())
                             if n and measured["step_time_ns"].sum() > 0 else None),
        "outlier_steps": outliers.outlier_report(st, activities, idle, runtime_api, steps.table, k),
        "breakdown_ns_per_step": breakdown,
        "breakdown_percent": breakdown_percent,
        "classification": {"method": ("roofline: Nsight Compute measurements where profiled, else op shapes where recorded, "
                                      "else kernel name heuristics"),
                           "ncu_source": meta.get("ncu_source"),
                           "ncu_kernels_profiled": int(len(ncu)),
                           "evidence_share_percent": _shares(km, "evidence"),
                           "class_share_of_kernel_time_percent": _shares(km, "kernel_class")},
        "phases_ns_per_step": {p: float(v) for p, v in phases.items()},
        "top_kernels": top_kernels,
        "recommendations": overlaps.mark_overlaps(recommendations),
        "suppressed": suppressed,
        "fusion_candidates": candidates,
        "fusion_saving_by_kernel": saving_by_kernel(all_candidates),
        "fusion_note": fusion_note,
        "host_ns_per_step": host_ns,
        "fusion_source": fusion_source,
        "operator_classes": _operator_classes(km) if n else [],
        "roofline_points": (points := _roofline_points(km, n)) if n else [],
        "below_roof": sorted([p for p in (points if n else []) if p["lost_ns_per_step"] is not None],
                             key=lambda p: -p["lost_ns_per_step"])[:10],
        "families_ns_per_step": {f: float(v) / n for f, v in km.groupby("family")["duration_ns"].sum().items()} if n else {},
        "modules": modules,
        "per_step_metrics": _per_step_metrics(km, measured, per_step, incl, modules,
                                              (status or {}).get("peak_memory_bytes_per_step") or {}) if n else [],
        "idle": {
            "host_bound_idle_ns_per_step": _per_step(idle_m.loc[idle_m["host_bound"], "duration_ns"], n),
            "other_idle_ns_per_step": _per_step(idle_m.loc[~idle_m["host_bound"], "duration_ns"], n),
            "streams": stream_rows,
            "kernels_shorter_than_launch_per_step": float(km["shorter_than_launch"].sum()) / n if n else None,
            "median_queue_delay_ns": _num(km["queue_delay_ns"].median()),
            "top_waiting_kernels": [{"short_name": str(name), "idle_ns_per_step": float(r["sum"]) / n, "waits_per_step": float(r["count"]) / n}
                                    for name, r in top_waits.iterrows()],
        },
        "instrumentation": instrumentation,
        "launches_per_step": launch_counts(km, api_m, n),
        "communication": comm.communication(k, measured_ids, n, step_ns) if n else None,
        "warnings": warnings,
    }))
    if procs is not None:  # every process analysed on its own (the main one again: a plain function of the file)
        options = {"warmup_steps": warmup_steps, "steps_from": steps_from, "status": status, "top": top,
                   "calibration": calibration}
        db.conn.commit()
        path = ranks.database_file(db)
        reports = (ranks.analyse_processes(path, procs["global_pid"].tolist(), options, rank_workers) if path else {})
        report["ranks"] = ranks.merged_view(procs, reports, status)
    return report


def _rule_context(status: dict | None, dev: pd.Series, compiled: dict, candidates: list[dict], measured_ids) -> dict:
    """The rules' context beyond the kernels: the launcher's per-step peak memory, cudnn.benchmark and
    autocast dtype, the GPU's memory, the compiled-graph summary, all fusion candidates and the
    bare run's inflation (profiled - bare median step time, ns; None without a bare run)."""
    status = status or {}
    bare = compare_bare({"script": status, "steps": {"per_step": [{"step": s, "measured": True} for s in measured_ids]}})
    return {"peak_memory_bytes": {int(s): int(v) for s, v in (status.get("peak_memory_bytes_per_step") or {}).items() if v},
            "device_memory_bytes": _num(dev.get("total_memory_bytes")),
            "cudnn_benchmark": status.get("cudnn_benchmark"), "autocast_dtype": status.get("autocast_dtype"),
            "compiled": {**compiled, "dynamo": status.get("compile")} if compiled["graphs"] else None,
            "candidates": candidates, "bare_inflation_ns": (bare or {}).get("inflation_ns")}


def _recommendations(km, detail, idle, runtime_api, api, memcpy, steps, measured_ids, n, step_ns,
                     device_peaks, ncu, context: dict) -> tuple[list[dict], list[dict]]:
    """Build the rules' context (measured steps only; ``api``: the measured steps' API calls;
    ``context``: :func:`_rule_context`) and run them (:mod:`gpudiag.analysis.recommend`):
    (shown, suppressed under 0.5 % of the step)."""
    from gpudiag.analysis.recommend import RuleContext, recommend_split

    copies = (in_measured_steps(memcpy, launch_calls(memcpy, runtime_api)["api_start_ns"].to_numpy(dtype=float),
                                steps.table, measured_ids)
              if not memcpy.empty else memcpy.assign(step=pd.Series(dtype=int)))

    # Idle before a step's first kernel is the input stall (copies such as the previous step's
    # `.item()` may run earlier in the window, so "before the first kernel", not "at the window start").
    first_kernel = km.groupby("step")["start_ns"].min()
    idle_ctx = idle[idle["step"].isin(measured_ids)].copy()
    idle_ctx["at_step_start"] = idle_ctx["end_ns"].to_numpy() <= idle_ctx["step"].map(first_kernel).to_numpy()
    ctx = RuleContext(km=km, detail=detail, api=api, memcpy=copies, idle=idle_ctx,
                      n_steps=n, step_ns=step_ns, peaks=device_peaks, ncu=ncu, measured_steps=sorted(measured_ids),
                      **context)
    return recommend_split(ctx)


def _num(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _shares(df: pd.DataFrame, column: str) -> dict:
    total = df["duration_ns"].sum()
    return {str(k): 100.0 * float(v) / total for k, v in df.groupby(column)["duration_ns"].sum().items()} if total else {}
