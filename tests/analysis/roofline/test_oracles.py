"""Fast oracles of the analysis core (issue 25, part 0): classification, the per-step statistics and
the fusion savings, recomputed in this file from the run database of small real captures (row by
row, in plain Python, not with the analysis' own code) and held against what the analysis wrote.
These are the tests the mutation run (``scripts/mutation.sh``) selects for those modules: each
capture takes under a second to analyse, so a mutant is checked in seconds."""

from __future__ import annotations

import json
import math
import re
import statistics

import numpy as np
import pandas as pd
import pytest

from gpudiag.analysis.roofline.costmodel import CONTRACTION_OPS, SDPA_PREFIXES, op_cost
from gpudiag.analysis.attribution.families import CONTRACTION_FAMILIES
from conftest import status_of
from step_oracles import copies_by_step

# small real captures (H200 and H100): shapes, ncu, no shapes, data flow, an input stall, inference
CLASSIFIED = ["rmsnorm_train", "tiny_gemm_gelu", "zoo_vit", "towers_inference", "input_pipeline_bad"]
WITH_NCU = ["mlp_decode", "kernel_pathologies"]
DATA_FLOW = ["zoo_vit", "towers_inference", "gpt2_train_bf16"]


def _kernels(db) -> pd.DataFrame:
    return pd.read_sql_query(
        "SELECT k.kernel_id, k.name, k.duration_ns, k.start_ns, k.grid_x, k.grid_y, k.grid_z, k.block_x, k.block_y,"
        " k.block_z, a.step, a.module, a.op, a.op_args, a.op_call, a.api_start_ns, c.* FROM kernels k"
        " JOIN kernel_attribution a USING (kernel_id) JOIN kernel_class c USING (kernel_id) ORDER BY k.kernel_id",
        db.conn).loc[:, lambda f: ~f.columns.duplicated()]


def _blocks(row) -> float:
    return math.prod(1.0 if pd.isna(v) else float(v) for v in (row.grid_x, row.grid_y, row.grid_z))


def _roof(row) -> str:
    """The roof a kernel is held to by design.md's rules: its op's precision, except fp32 for a
    kernel whose name shows SIMT execution (cuDNN's ``sgemm`` and ``engine_float`` convolutions,
    CUTLASS ``simt``, cuBLAS ``ffma``/``f32f32_f32f32``) under a tensor-core precision."""
    import re

    simt = re.search(r"sgemm|simt|ffma|f32f32_f32f32|convolve_common_engine_float", str(getattr(row, "name", "")),
                     re.IGNORECASE)
    return "fp32" if simt and row.math_path in ("bf16", "fp16", "tf32", "fp8") else row.math_path


def _expected_class(row, device: dict) -> str:
    """The class of one kernel by design.md's rules, from its row alone."""
    launch, sms = device["launch_overhead_ns"], max(device["sm_count"], 1)
    if row.family == "communication":
        return "communication"
    if (row.duration_ns < launch and _blocks(row) < sms) or row.duration_ns < launch / 2:
        return "overhead"
    if row.evidence in ("shapes", "ncu"):
        ridge = device["peak_flop_per_s"][_roof(row)] / device["memory_bandwidth_bytes_per_s"]
        return "compute" if row.flop / row.bytes >= ridge else "bandwidth"
    return "compute" if row.family in CONTRACTION_FAMILIES else "bandwidth"


@pytest.mark.parametrize("name", CLASSIFIED + WITH_NCU)
def test_each_kernel_class_follows_the_rules_from_its_own_row(name, analysed, analysed_with_ncu):
    db, report = (analysed_with_ncu if name in WITH_NCU else analysed)(name)
    k = _kernels(db)
    device = report["device"]
    expected = [_expected_class(row, device) for row in k.itertuples()]
    assert list(k["kernel_class"]) == expected
    assert set(k["evidence"]) <= {"ncu", "shapes", "heuristic"}
    roof = k[k["evidence"] != "heuristic"]
    bandwidth = device["memory_bandwidth_bytes_per_s"]
    for row in roof.itertuples():
        peak = device["peak_flop_per_s"][_roof(row)]
        seconds = row.duration_ns * 1e-9
        assert row.intensity == pytest.approx(row.flop / row.bytes, rel=1e-12)
        assert row.ridge == pytest.approx(peak / bandwidth, rel=1e-12)
        assert row.achieved_flop_per_s == pytest.approx(row.flop / seconds, rel=1e-12)
        assert row.achieved_bytes_per_s == pytest.approx(row.bytes / seconds, rel=1e-12)
        assert row.efficiency == pytest.approx(max(row.flop / peak, row.bytes / bandwidth) / seconds, rel=1e-12)
    # a kernel classified by its name has no roofline numbers unless they came from shapes it could not use
    assert k.loc[k["evidence"] == "heuristic", "ridge"].isna().sum() + k["math_path"].notna().sum() >= len(roof)


@pytest.mark.parametrize("name", WITH_NCU)
def test_ncu_measurements_are_the_evidence_where_profiled(name, analysed_with_ncu):
    """The kernels Nsight Compute replayed carry its FLOPs and DRAM bytes (evidence ``ncu``); the
    report counts them."""
    db, report = analysed_with_ncu(name)
    k = _kernels(db)
    assert (k["evidence"] == "ncu").any()
    assert report["classification"]["ncu_kernels_profiled"] > 0
    assert (k.loc[k["evidence"] == "ncu", "bytes"] > 0).all()


def _l2_bytes(db) -> float:
    """The L2 size the export names (nsys TARGET_INFO_GPU.l2CacheSize), NaN without one."""
    devices = pd.read_sql_query("SELECT * FROM devices", db.conn)
    sizes = devices["l2_cache_bytes"].dropna() if "l2_cache_bytes" in devices else pd.Series(dtype=float)
    return float(sizes.max()) if len(sizes) else float("nan")


def _output_bytes(args: str) -> float:
    """Bytes of the outputs an op payload names, read here from its text: dtype[shape] entries."""
    import re

    sizes = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "bool": 1, "uint8": 1, "int8": 1}
    out = json.dumps(json.loads(args).get("out"))
    return float(sum(sizes.get(d, 4) * int(np.prod([int(x) for x in dims.split(",") if x] or [1]))
                     for d, dims in re.findall(r"([a-z0-9_]+)\[([0-9,]*)\]", out)))


def _shape_costs_by_hand(detail: pd.DataFrame, l2_bytes: float) -> dict[int, tuple[float, float, str]]:
    """kernel_id -> (flop, bytes, math_path) of the detail step's kernels: each op call's cost
    shared by duration; a contraction's FLOPs and bytes go to its GEMM/conv/attention kernels only; a
    contraction's or an attention op's output is not DRAM traffic as far as half of ``l2_bytes`` holds
    it beside the inputs (it stays in the L2); a GEMM kernel computes K rounded up to its name's K step."""
    out = {}
    for _, call in detail[detail["op_call"] >= 0].groupby("op_call"):
        cost = op_cost(call["op"].iloc[0], call["op_args"].iloc[0])
        if cost is None or cost.math_path is None:
            continue
        op = call["op"].iloc[0]
        on_tensor_cores = op in CONTRACTION_OPS or op.startswith(SDPA_PREFIXES)
        written = _output_bytes(call["op_args"].iloc[0]) if on_tensor_cores else np.inf
        # the part of the output half the L2 still holds beside the inputs (classify's module docstring)
        kept = min(max(0.5 * l2_bytes - (cost.bytes - written), 0.0), written) if np.isfinite(written) and np.isfinite(l2_bytes) else 0.0
        nbytes = cost.bytes - kept
        total = call["duration_ns"].sum()
        contraction = call["family"].isin(CONTRACTION_FAMILIES)
        contraction_ns = call.loc[contraction, "duration_ns"].sum()
        for row, is_contraction in zip(call.itertuples(), contraction):
            share = row.duration_ns / total if total else 1.0
            if op in CONTRACTION_OPS and contraction_ns > 0:  # FLOPs and operands are the GEMM's
                flop_share = byte_share = row.duration_ns / contraction_ns if is_contraction else 0.0
            else:
                flop_share, byte_share = (share if total else 0.0), share
            out[row.kernel_id] = (cost.flop * flop_share * _k_padding(cost.k, row.name), nbytes * byte_share, cost.math_path)
    return out


def _k_padding(k: float, name: str) -> float:
    """K rounded up to the K step the kernel's name states (nvjet tile_kstep, xmma tilesizeMxNxK,
    CUTLASS tile_kstep), over K; 1 without a step or a K."""
    m = re.search(r"nvjet_\w*?_\d+x\d+_(\d+)x\d+_\d+x\d+|tilesize\d+x\d+x(\d+)|"
                  r"cutlass\w*?gemm\w*?_\d+x\d+_(\d+)x\d+_(?:nn|nt|tn|tt)", str(name))
    if not m or not k > 0:
        return 1.0
    step = int(next(g for g in m.groups() if g))
    return -(-int(k) // step) * step / k


@pytest.mark.parametrize("name", ["rmsnorm_train", "mlp_chain_b4096", "zoo_vit", "towers_inference"])
def test_detail_step_flops_and_bytes_are_the_op_calls_shared_by_duration(name, analysed):
    db, _ = analysed(name)
    k = _kernels(db)
    detail_step = db.conn.execute("SELECT step FROM steps WHERE detail").fetchone()
    detail = k[k["step"] == detail_step[0]] if detail_step else k
    by_hand = _shape_costs_by_hand(detail, _l2_bytes(db))
    assert by_hand, "the capture has op shapes"
    rows = k.set_index("kernel_id")
    for kernel_id, (flop, nbytes, path) in by_hand.items():
        row = rows.loc[kernel_id]
        if row["family"] == "communication":
            continue
        assert row["flop"] == pytest.approx(flop, rel=1e-9, abs=1e-6)
        assert row["bytes"] == pytest.approx(nbytes, rel=1e-9)
        assert row["math_path"] == path
    # the n-th launch of a configuration in any step does what the detail step's n-th launch did
    k["ordinal"] = k.groupby(["step", "config_key"]).cumcount()
    source = k[k["kernel_id"].isin(by_hand)].drop_duplicates(["config_key", "ordinal"]).set_index(["config_key", "ordinal"])
    others = k[(k["step"] != (detail_step[0] if detail_step else None)) & k["math_path"].notna()]
    matched = others.merge(source[["flop", "bytes"]].add_suffix("_detail"), left_on=["config_key", "ordinal"],
                           right_index=True)
    assert len(matched) > 0
    assert (matched["bytes"] == matched["bytes_detail"]).all() and (matched["flop"] == matched["flop_detail"]).all()


def test_without_op_shapes_every_kernel_is_classified_by_its_name(analysed):
    db, _ = analysed("tiny_gemm_gelu")  # captured before gpudiag recorded op shapes
    k = _kernels(db)
    assert not k["op_call"].ge(0).any()
    assert set(k["evidence"]) == {"heuristic"} and k["flop"].isna().all()


# ---- per-step statistics -------------------------------------------------------------------------

def _steps(report) -> list[dict]:
    return report["steps"]["per_step"]


@pytest.mark.parametrize("name", ["rmsnorm_train", "input_pipeline_bad", "towers_inference", "mlp_chain_b4096"])
def test_per_step_class_times_are_kernel_sums_scaled_to_the_busy_time(name, analysed):
    db, report = analysed(name)
    k = _kernels(db)
    steps = pd.read_sql_query("SELECT * FROM steps", db.conn)
    copies = copies_by_step(db.conn, steps)
    measured = [e for e in _steps(report) if "compute_ns" in e]
    assert measured
    for e in measured:
        mine = k[k["step"] == e["step"]]
        by_class = {c: float(mine.loc[mine["kernel_class"] == c, "duration_ns"].sum())
                    for c in ("compute", "bandwidth", "overhead", "communication")}
        by_class["bandwidth"] += copies.get(e["step"], 0.0)
        scale = e["busy_ns"] / sum(by_class.values())
        host = e["host_bound_idle_ns"]
        assert e["compute_ns"] == pytest.approx(by_class["compute"] * scale, rel=1e-9)
        assert e["bandwidth_ns"] == pytest.approx(by_class["bandwidth"] * scale, rel=1e-9)
        assert e["overhead_ns"] == pytest.approx(by_class["overhead"] * scale + host, rel=1e-9)
        assert e["communication_ns"] == pytest.approx(by_class["communication"] * scale, rel=1e-9, abs=1e-6)
        assert e["other_idle_ns"] == pytest.approx(e["idle_ns"] - host, rel=1e-9, abs=1e-6)
        assert 0 <= host <= e["idle_ns"]
        assert e["step_time_ns"] == e["busy_ns"] + e["idle_ns"] and e["kernels"] == len(mine)


@pytest.mark.parametrize("name", ["rmsnorm_train", "input_pipeline_bad", "towers_inference", "mlp_chain_b4096"])
def test_breakdown_and_step_statistics_are_means_over_the_measured_steps(name, analysed):
    _, report = analysed(name)
    entries = _steps(report)
    measured = [e for e in entries if e["measured"]]
    times = [e["step_time_ns"] for e in measured]
    assert report["steps"]["step_time_ns"] == {"mean": pytest.approx(statistics.fmean(times)),
                                                "median": pytest.approx(statistics.median(times)),
                                                "min": min(times), "max": max(times)}
    both = [e["step_time_ns"] for e in entries if e["measured"] or e["outlier"]]
    assert report["steps"]["step_time_ns_with_outliers"] == {"mean": pytest.approx(statistics.fmean(both)),
                                                              "median": pytest.approx(statistics.median(both)),
                                                              "min": min(both), "max": max(both)}
    assert report["steps"]["measured"] == len(measured)
    # each entry's flags: the first steps warm up, the launcher's detail step, the rest measured or outliers
    warmup = report["steps"]["warmup_steps"]
    assert warmup > 0 and [e["warmup"] for e in entries] == [i < warmup for i in range(len(entries))]
    assert [e["step"] for e in entries if e["detail"]] == [report["steps"]["detail_step"]]
    assert all(e["measured"] != (e["warmup"] or e["detail"] or e["outlier"]) for e in entries)
    assert sum(e["outlier"] for e in entries) == report["steps"]["outliers"]
    step = statistics.fmean(times)
    with_classes = [e for e in measured if "compute_ns" in e]
    for key in ("compute", "bandwidth", "overhead", "communication"):
        mean = statistics.fmean(e[f"{key}_ns"] for e in with_classes)
        assert report["breakdown_ns_per_step"][f"{key}_ns"] == pytest.approx(mean, rel=1e-9, abs=1e-6)
        assert report["breakdown_percent"][key] == pytest.approx(100 * mean / step, rel=1e-9, abs=1e-9)
    idle = statistics.fmean(e["other_idle_ns"] for e in with_classes)
    assert report["breakdown_percent"]["idle"] == pytest.approx(100 * idle / step, rel=1e-9, abs=1e-9)
    # busy + idle is the step: the five shares add up to the mean step
    assert sum(report["breakdown_percent"].values()) == pytest.approx(
        100 * statistics.fmean(e["busy_ns"] + e["idle_ns"] for e in with_classes) / step, rel=1e-9)


@pytest.mark.parametrize("name", ["rmsnorm_train", "towers_inference"])
def test_per_step_metrics_are_the_gates_samples(name, analysed):
    db, report = analysed(name)
    k = _kernels(db)
    entries = {e["step"]: e for e in _steps(report)}
    metrics = report["per_step_metrics"]
    listed = [row["module"] for row in report["modules"]]
    measured_kernels = k[k["step"].isin([m["step"] for m in metrics])]
    seen = {mod for mod in listed
            if (measured_kernels["module"].eq(mod) | measured_kernels["module"].str.startswith(mod + ".")).any()}
    assert listed and seen
    assert [m["step"] for m in metrics] == [e["step"] for e in _steps(report) if e["measured"]]
    for m in metrics:
        e = entries[m["step"]]
        assert m["step_time_ns"] == e["step_time_ns"] and m["busy_ns"] == e["busy_ns"]
        assert m["kernel_launches"] == e["kernels"]
        assert m["overhead_percent"] == pytest.approx(100 * e["overhead_ns"] / e["step_time_ns"], rel=1e-12)
        mine = k[k["step"] == m["step"]]
        assert m["families_ns"] == pytest.approx(mine.groupby("family")["duration_ns"].sum().astype(float).to_dict())
        # a module of the module table: its kernels' time and its submodules' (dotted paths under it)
        inclusive = {mod: float(mine.loc[(mine["module"] == mod) | mine["module"].str.startswith(mod + "."),
                                         "duration_ns"].sum()) for mod in listed}
        assert m["modules_ns"] == pytest.approx({mod: ns for mod, ns in inclusive.items() if mod in seen})
        assert m["peak_memory_bytes"] == status_of(name)["peak_memory_bytes_per_step"][str(m["step"])]


def _gpu_idle_by_hand(db) -> list[tuple[int, int, bool]]:
    """(start, end, host_bound) of every interval where no kernel, copy or memset runs, between the
    first and the last GPU activity: a walk over the activities in start order; host-bound when the
    launch call of the activity that ends the interval returned after the GPU went idle."""
    rows = sorted(db.conn.execute(
        "SELECT a.start_ns, a.end_ns, r.end_ns FROM (SELECT start_ns, end_ns, correlation_id, global_pid FROM kernels"
        " UNION ALL SELECT start_ns, end_ns, correlation_id, global_pid FROM memcpy"
        " UNION ALL SELECT start_ns, end_ns, correlation_id, global_pid FROM memset) a LEFT JOIN runtime_api r"
        " ON r.correlation_id = a.correlation_id AND r.global_pid = a.global_pid").fetchall())
    assert len({r[0] for r in rows}) == len(rows), "no two activities start together: the one ending a gap is known"
    gaps, busy_until = [], rows[0][1]
    for start, end, api_end in rows[1:]:
        if start > busy_until:
            gaps.append((busy_until, start, api_end is not None and api_end > busy_until))
        busy_until = max(busy_until, end)
    return gaps


@pytest.mark.parametrize("name", ["input_pipeline_bad", "rmsnorm_train", "towers_inference"])
def test_idle_split_per_step_is_recomputed_from_the_gpu_timeline(name, analysed):
    """Each GPU-idle interval belongs to the measured step whose window (from the previous step's
    GPU end to its own) holds it; host-bound idle of a step is in its entry and counts as
    overhead; the report's idle section is the sum over the measured steps per step, split into
    host-bound and other, and host-bound idle ending at or before the step's first kernel (the
    input stall)."""
    db, report = analysed(name)
    k = _kernels(db)
    steps = pd.read_sql_query("SELECT * FROM steps WHERE measured", db.conn)
    n = len(steps)
    assert n
    windows = [(int(s.step), s.window_start_ns, s.gpu_end_ns) for s in steps.itertuples()]
    first_kernel = k.groupby("step")["start_ns"].min().to_dict()
    host, other, at_start = {}, {}, {}
    for start, end, host_bound in _gpu_idle_by_hand(db):
        holder = [step for step, w_start, w_end in windows if w_start <= start and end <= w_end]
        if not holder:
            continue
        step = holder[0]
        if host_bound:
            host[step] = host.get(step, 0) + (end - start)
            if end <= first_kernel[step]:
                at_start[step] = at_start.get(step, 0) + (end - start)
        else:
            other[step] = other.get(step, 0) + (end - start)
    idle = report["idle"]
    assert idle["host_bound_idle_ns_per_step"] == pytest.approx(sum(host.values()) / n, rel=1e-12)
    assert idle["other_idle_ns_per_step"] == pytest.approx(sum(other.values()) / n, rel=1e-12)
    assert idle["step_start_idle_ns_per_step"] == pytest.approx(sum(at_start.values()) / n, rel=1e-12)
    entries = {e["step"]: e for e in _steps(report)}
    for step in steps["step"]:
        e = entries[int(step)]
        assert e["host_bound_idle_ns"] == host.get(int(step), 0)
        assert e["other_idle_ns"] == e["idle_ns"] - host.get(int(step), 0)
    if name == "input_pipeline_bad":  # the loader stalls every step before its first kernel
        assert idle["step_start_idle_ns_per_step"] > 0.5 * idle["host_bound_idle_ns_per_step"] > 0


def test_without_measured_steps_the_step_statistics_are_empty_not_zero_division(analysed):
    """A step table without measured steps (every window empty of GPU work): no idle interval
    belongs to a step (-1), per-step sums are NaN, the step-time statistics None and the breakdown
    of no step zero ns (NaN percent of a NaN step), where a division by zero or a KeyError would stop
    the analysis."""
    from gpudiag.analysis.steps import step_stats

    db, report = analysed("input_pipeline_bad")
    gaps = pd.DataFrame(_gpu_idle_by_hand(db), columns=["start_ns", "end_ns", "host_bound"])
    gaps["duration_ns"] = gaps["end_ns"] - gaps["start_ns"]
    none = pd.read_sql_query("SELECT * FROM steps WHERE measured AND NOT measured", db.conn)
    assert len(gaps) and none.empty and "window_start_ns" in none
    idle = step_stats.idle_steps(gaps, none)
    assert len(idle) == len(gaps) and (idle["step"] == -1).all()
    assert math.isnan(step_stats.per_step(idle["duration_ns"], 0))
    assert step_stats.stats(none["step_time_ns"].astype(float)) == dict.fromkeys(("mean", "median", "min", "max"))
    unmeasured = [e for e in _steps(report) if not e["measured"]]  # warm-up, detail and outlier steps
    assert unmeasured
    ns, percent = step_stats.breakdown(unmeasured, float("nan"))
    assert ns == dict.fromkeys(("compute_ns", "bandwidth_ns", "overhead_ns", "communication_ns", "idle_ns"), 0.0)
    assert set(percent) == {"compute", "bandwidth", "overhead", "communication", "idle"}
    assert all(math.isnan(v) for v in percent.values())


# ---- fusion savings ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", DATA_FLOW)
def test_fusion_savings_are_the_chain_minus_the_fused_floor(name, analysed):
    """fused floor = external bytes at peak bandwidth + one launch; saving per step = (median chain
    time - floor, not below zero) x occurrences; candidates best first; the reference kernels'
    totals are the sums over the candidates they match."""
    _, report = analysed(name)
    device = report["device"]
    candidates = report["fusion_candidates"]
    assert candidates
    for c in candidates:
        floor = c["external_bytes"] / device["memory_bandwidth_bytes_per_s"] * 1e9 + device["launch_overhead_ns"]
        assert c["fused_floor_ns"] == pytest.approx(floor, rel=1e-12)
        assert c["saving_ns_per_step"] == pytest.approx(max(c["chain_ns"] - floor, 0.0) * c["occurrences_per_step"], rel=1e-12)
        assert c["kernels_per_occurrence"] >= 2 and len(c["ops"]) >= 2
        assert c["host_bound"] == any(r["rule_id"] == "GD-OVERHEAD-BOUND" for r in report["recommendations"])
    savings = [c["saving_ns_per_step"] for c in candidates]
    assert savings == sorted(savings, reverse=True)
    assert (report["fusion_note"] is not None) == candidates[0]["host_bound"]
    totals: dict[str, list] = {}
    for c in candidates:
        if c["reference_kernel"]:
            t = totals.setdefault(c["reference_kernel"], [0.0, 0, 0])
            t[0] += c["saving_ns_per_step"]
            t[1] += c["occurrences_per_step"]
            t[2] += 1
    by_kernel = {r["reference_kernel"]: r for r in report["fusion_saving_by_kernel"]}
    for kernel, (saving, chains, count) in totals.items():  # the report lists the top candidates only
        assert by_kernel[kernel]["saving_ns_per_step"] >= saving - 1e-6
        assert by_kernel[kernel]["chains_per_step"] >= chains and by_kernel[kernel]["candidates"] >= count
    ranked = [r["saving_ns_per_step"] for r in report["fusion_saving_by_kernel"]]
    assert ranked == sorted(ranked, reverse=True)


@pytest.mark.parametrize("name", DATA_FLOW)
def test_each_candidates_chain_time_is_its_kernels_time(name, analysed):
    """chain_ns (the median occurrence) lies between the shortest and the longest sum of kernel time
    of the op-call sequences made of the candidate's ops in the detail step, and no occurrence
    can take longer than the step's kernels of those ops together."""
    db, report = analysed(name)
    k = _kernels(db)
    detail = db.conn.execute("SELECT step FROM steps WHERE detail").fetchone()
    d = k[(k["step"] == detail[0]) & (k["op_call"] >= 0)] if detail else k[k["op_call"] >= 0]
    per_op = d.groupby("op")["duration_ns"].sum()
    for c in report["fusion_candidates"]:
        upper = sum(per_op.get(op, 0.0) for op in set(c["ops"]))
        assert 0 < c["chain_ns"] <= upper + 1e-6
        assert c["chain_ns"] * c["occurrences_per_step"] <= upper * len(c["ops"]) + 1e-6


def _tensor_bytes(spec: str) -> float:
    dtype, shape = spec.split("@")[0].rstrip("]").split("[")
    size = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "bool": 1}[dtype]
    return float(math.prod(int(n) for n in shape.split(",") if n) * size)


def test_saved_for_backward_are_the_groups_writes_that_backward_reads_before_they_are_rewritten(analysed):
    """GPT-2's first tanh-GELU forward (op calls of ``transformer.h.0.mlp.act``): a storage the group
    writes that a backward op reads before anything outside the group writes it again is what a
    fused forward must still write. Found here by walking the detail step's op calls in order."""
    import json

    db, report = analysed("gpt2_train_bf16")
    calls = pd.read_sql_query("SELECT DISTINCT op_call, op, op_args, module, phase FROM kernel_attribution"
                              " WHERE op_call >= 0 ORDER BY op_call", db.conn)
    payloads = [(row.op_call, row.op, row.phase, json.loads(row.op_args)) for row in calls.itertuples()]
    group = [p for p in payloads if calls.set_index("op_call").at[p[0], "module"] == "transformer.h.0.mlp.act"]
    last = group[-1][0]
    written = {}
    for call, op, _, payload in group:
        written[payload["out"].split("@")[1]] = (call, op, _tensor_bytes(payload["out"]))
    expected = []
    for storage, (call, op, nbytes) in written.items():
        for later_call, _, phase, payload in (p for p in payloads if p[0] > last):
            reads = {t.split("@")[1] for t in payload["in"] if isinstance(t, str) and "@" in t}
            if phase == "backward" and storage in reads:
                expected.append((call, op, nbytes))
                break
            outs = payload["out"] if isinstance(payload["out"], list) else [payload["out"]]
            if any(isinstance(o, str) and o.endswith("@" + storage) for o in outs):
                break  # overwritten: a new version, not the group's
    forward = next(c for c in report["fusion_candidates"] if "transformer.h.0.mlp.act" in c["modules"])
    assert expected, "the backward reads some of the GELU's intermediates"
    assert sorted((x["op"], x["bytes"]) for x in forward["saved_for_backward"]) == \
        sorted((op, nbytes) for _, op, nbytes in expected)


@pytest.mark.parametrize("name", ["rmsnorm_train", "zoo_vit", "gpt2_train_bf16"])
def test_every_op_call_has_a_json_payload_with_its_output(name, analysed):
    """Each kernel of an op call carries the call's payload, ``"out"`` included (null when the op
    range has no output range nested in it)."""
    import json

    db, _ = analysed(name)
    rows = db.conn.execute("SELECT op_call, op, op_args FROM kernel_attribution WHERE op_call >= 0").fetchall()
    assert rows
    for _, op, args in rows:
        payload = json.loads(args)
        assert payload["op"] == op and "out" in payload and "in" in payload


def test_a_launch_without_a_detail_step_partner_gets_its_configurations_median(analysed):
    """A step that launches a configuration more often than the detail step did: the extra launch
    takes the median FLOPs and bytes of the detail step's launches of that configuration."""
    from gpudiag.analysis.roofline import peaks
    from gpudiag.analysis.roofline.classify import classify

    db, report = analysed("rmsnorm_train")
    kernels = pd.read_sql_query("SELECT * FROM kernels ORDER BY kernel_id", db.conn)
    attribution = pd.read_sql_query("SELECT * FROM kernel_attribution ORDER BY kernel_id", db.conn)
    classes = pd.read_sql_query("SELECT * FROM kernel_class ORDER BY kernel_id", db.conn)
    detail = db.conn.execute("SELECT step FROM steps WHERE detail").fetchone()[0]
    # a configuration the detail step launched several times with different costs
    shaped = classes.assign(step=attribution["step"])[lambda f: (f["step"] == detail) & f["math_path"].notna()]
    config = shaped.groupby("config_key")["bytes"].nunique().idxmax()
    extra = kernels[classes["config_key"] == config].iloc[[0]].assign(kernel_id=kernels["kernel_id"].max() + 1)
    extra_attr = attribution[classes["config_key"] == config].iloc[[0]].assign(
        kernel_id=extra["kernel_id"].iloc[0], step=detail + 1, op_call=-1, op=None, op_args=None)
    device = peaks.lookup(report["device"]["name"], report["device"]["sm_count"])
    out = classify(pd.concat([kernels, extra], ignore_index=True), pd.concat([attribution, extra_attr], ignore_index=True),
                   device)
    mine = shaped[shaped["config_key"] == config]
    assert out["flop"].iloc[-1] == pytest.approx(mine["flop"].median(), rel=1e-12)
    assert out["bytes"].iloc[-1] == pytest.approx(mine["bytes"].median(), rel=1e-12)
    assert out["math_path"].iloc[-1] == mine["math_path"].iloc[0]
    assert (out.iloc[:-1]["kernel_class"].to_numpy() == classes["kernel_class"].to_numpy()).all()


def _classify_inputs(db) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(kernels, attribution, stored classes) of a run database, in kernel order."""
    return tuple(pd.read_sql_query(f"SELECT * FROM {table} ORDER BY kernel_id", db.conn)
                 for table in ("kernels", "kernel_attribution", "kernel_class"))


def _device_dict(device) -> dict:
    return {"launch_overhead_ns": device.launch_overhead_ns, "sm_count": device.sm_count,
            "peak_flop_per_s": device.flops, "memory_bandwidth_bytes_per_s": device.bandwidth}


def _rows(kernels: pd.DataFrame, out: pd.DataFrame) -> pd.DataFrame:
    return kernels[["duration_ns", "grid_x", "grid_y", "grid_z"]].join(
        out[["family", "evidence", "math_path", "flop", "bytes"]])


def test_a_kernel_exactly_at_the_ridge_is_compute_bound(analysed):
    """design.md: at or above the ridge point of its math path a kernel is compute-bound. A device
    whose ridge is exactly one real kernel's intensity (its FLOPs as the peak, its bytes as the
    bandwidth) puts that kernel on the ridge; every kernel still follows the rules from its row."""
    import dataclasses

    from gpudiag.analysis.roofline import peaks
    from gpudiag.analysis.roofline.classify import classify

    db, report = analysed("rmsnorm_train")
    kernels, attribution, classes = _classify_inputs(db)
    device = peaks.lookup(report["device"]["name"], report["device"]["sm_count"])
    long_enough = kernels["duration_ns"] >= device.launch_overhead_ns
    shaped = classes[(classes["evidence"] == "shapes") & long_enough & (classes["flop"] > 0) & (classes["bytes"] > 0)]
    assert len(shaped)
    on_ridge = shaped.index[0]
    row = classes.loc[on_ridge]
    at_ridge = dataclasses.replace(device, bandwidth=float(row["bytes"]),
                                   flops={**device.flops, row["math_path"]: float(row["flop"])})
    out = classify(kernels, attribution, at_ridge)
    assert out.at[on_ridge, "intensity"] == out.at[on_ridge, "ridge"]
    assert out.at[on_ridge, "kernel_class"] == "compute"
    rows = _rows(kernels, out)
    assert list(out["kernel_class"]) == [_expected_class(r, _device_dict(at_ridge)) for r in rows.itertuples()]


def test_a_contraction_whose_kernels_have_unrecognized_names_shares_its_flops_by_duration(analysed):
    """A matmul whose kernels the name rules do not know (a new library's kernel names, as cuBLAS's
    ``nvjet`` once were) still does the op's multiply-adds: with no contraction-family kernel in
    the call, its FLOPs are shared among the call's kernels by duration, like its bytes."""
    from gpudiag.analysis.attribution.families import families
    from gpudiag.analysis.roofline import peaks
    from gpudiag.analysis.roofline.classify import classify

    db, report = analysed("rmsnorm_train")
    kernels, attribution, classes = _classify_inputs(db)
    contraction = classes["family"].isin(CONTRACTION_FAMILIES)
    in_calls = contraction & attribution["op"].isin(CONTRACTION_OPS) & (attribution["op_call"] >= 0)
    assert in_calls.any()
    renamed = kernels.copy()
    renamed.loc[contraction, "name"] = [f"renamed_kernel_{i}" for i in pd.factorize(kernels.loc[contraction, "name"])[0]]
    device = peaks.lookup(report["device"]["name"], report["device"]["sm_count"])
    out = classify(renamed, attribution, device)
    assert not families(renamed["name"]).isin(CONTRACTION_FAMILIES).any()
    frame = attribution[["kernel_id", "op_call", "op", "op_args"]].assign(
        duration_ns=kernels["duration_ns"], family=out["family"], name=renamed["name"])
    detail = db.conn.execute("SELECT step FROM steps WHERE detail").fetchone()[0]
    by_hand = _shape_costs_by_hand(frame[attribution["step"] == detail], device.l2_bytes)
    rows = out.set_index("kernel_id")
    checked = 0
    for kernel_id in kernels.loc[in_calls & (attribution["step"] == detail), "kernel_id"]:
        flop, nbytes, path = by_hand[kernel_id]
        assert flop > 0
        assert rows.at[kernel_id, "flop"] == pytest.approx(flop, rel=1e-9)
        assert rows.at[kernel_id, "bytes"] == pytest.approx(nbytes, rel=1e-9)
        checked += 1
    assert checked


def test_ncu_rows_without_roofline_counters_are_left_out(analysed, analysed_with_ncu):
    """An Nsight Compute report without the roofline counters (FLOPs not collected) measures
    nothing: every kernel keeps the classification the op shapes give (the analysis of the same
    export without the report), and none has evidence ``ncu``."""
    import dataclasses

    from gpudiag import store
    from gpudiag.analysis.roofline import peaks
    from gpudiag.analysis.roofline.classify import classify

    ncu = store.read_table(analysed_with_ncu("mlp_decode")[0], "ncu_kernels")
    assert len(ncu)
    db, report = analysed("mlp_decode")
    kernels, attribution, without_ncu = _classify_inputs(db)
    device = dataclasses.replace(peaks.lookup(report["device"]["name"], report["device"]["sm_count"]),
                                 l2_bytes=_l2_bytes(db))  # as the analysis reads it from the export
    out = classify(kernels, attribution, device, ncu.assign(flop=np.nan))
    assert "ncu" not in set(out["evidence"]) and (out["evidence"] == "shapes").any()
    assert list(out["kernel_class"]) == list(without_ncu["kernel_class"])
    assert list(out["evidence"]) == list(without_ncu["evidence"])
    pd.testing.assert_series_equal(out["flop"], without_ncu["flop"], check_names=False)
    pd.testing.assert_series_equal(out["bytes"], without_ncu["bytes"], check_names=False)


@pytest.mark.parametrize("name", ["tiny_gemm_gelu", "rmsnorm_train", "zoo_vit"])
def test_a_kernel_outside_any_range_has_empty_names_not_nulls(name, analysed):
    """Attribution writes '' (not NULL) where a kernel has no op, module or module class, and every
    kernel a phase: the tables group and filter on these text columns."""
    db, _ = analysed(name)
    nulls = db.conn.execute("SELECT count(*) FROM kernel_attribution WHERE op IS NULL OR module IS NULL"
                            " OR module_class IS NULL OR phase IS NULL OR phase = ''").fetchone()[0]
    assert nulls == 0
    assert db.conn.execute("SELECT count(*) FROM kernel_attribution WHERE module = '' AND module_class != ''").fetchone() == (0,)
    total = db.conn.execute("SELECT count(*) FROM kernel_attribution").fetchone()[0]
    without_op = db.conn.execute("SELECT count(*) FROM kernel_attribution WHERE op = ''").fetchone()[0]
    assert 0 < without_op <= total


def test_external_bytes_are_what_the_group_reads_from_outside_and_leaves_for_others(analysed):
    """GPT-2's first tanh-GELU forward: its inputs are the storages it reads before writing them,
    its outputs those it writes that an op outside it reads before they are written again (or its
    result); external bytes = their sizes (here 10 x 25.2 MB: x in, and five tensors out)."""
    import json

    db, report = analysed("gpt2_train_bf16")
    calls = pd.read_sql_query("SELECT DISTINCT op_call, op_args, module FROM kernel_attribution"
                              " WHERE op_call >= 0 ORDER BY op_call", db.conn)
    payloads = [(row.op_call, row.module, json.loads(row.op_args)) for row in calls.itertuples()]

    def storages(value):
        if isinstance(value, str) and "@" in value:
            yield value.split("@")[1], _tensor_bytes(value)
        elif isinstance(value, list):
            for v in value:
                yield from storages(v)

    group = [p for p in payloads if p[1] == "transformer.h.0.mlp.act"]
    members = {c for c, _, _ in group}
    inputs, outputs, first, size = set(), set(), {}, {}
    for call, _, payload in group:
        for s, nbytes in storages(payload["in"]):
            first.setdefault(s, "r")
            size.setdefault(s, nbytes)
        for s, nbytes in storages(payload["out"]):
            first.setdefault(s, "w")
            size[s] = nbytes
    inputs = {s for s, kind in first.items() if kind == "r"}
    for s in (s for s, kind in first.items() if kind == "w" or s in inputs):
        written = [c for c, _, p in group if any(t == s for t, _ in storages(p["out"]))]
        if not written:
            continue
        for call, _, payload in (p for p in payloads if p[0] > max(written) and p[0] not in members):
            if any(t == s for t, _ in storages(payload["in"])):
                outputs.add(s)
                break
            if any(t == s for t, _ in storages(payload["out"])):
                break
    outputs |= {s for s, _ in storages(group[-1][2]["out"])}
    forward = next(c for c in report["fusion_candidates"] if "transformer.h.0.mlp.act" in c["modules"])
    assert forward["external_bytes"] == sum(size[s] for s in inputs | outputs)
    assert len(inputs) == 1 and len(outputs) == 5


def test_the_overhead_bounds_are_strict(analysed):
    """docs/architecture.md: overhead-bound is *shorter than* one launch with a grid *under* one
    wave, or *shorter than* half a launch. Devices whose launch overhead or SM count put a real
    kernel exactly on each bound (its duration as the launch, twice its duration as the launch,
    its block count as the SM count; an unknown SM count, 0, counts as one) leave it out of the
    overhead class; a nanosecond more launch overhead, or one SM more, puts it in. Every kernel still follows the rules from its own row."""
    import dataclasses

    from gpudiag.analysis.roofline import peaks
    from gpudiag.analysis.roofline.classify import classify

    db, report = analysed("rmsnorm_train")
    kernels, attribution, _ = _classify_inputs(db)
    device = peaks.lookup(report["device"]["name"], report["device"]["sm_count"])
    blocks = kernels[["grid_x", "grid_y", "grid_z"]].fillna(1).prod(axis=1)
    wide = kernels.index[blocks >= device.sm_count][0]  # a grid of a wave or more: only the half-launch bound
    narrow = kernels.index[(blocks < device.sm_count) & (blocks > 1)][0]
    single = kernels.index[blocks == 1][0]
    dur = kernels["duration_ns"].astype(float)
    cases = [
        (wide, dataclasses.replace(device, launch_overhead_ns=2 * dur[wide])),  # exactly half a launch
        (narrow, dataclasses.replace(device, launch_overhead_ns=dur[narrow])),  # exactly one launch, under a wave
        # half to one launch, with exactly a wave of blocks: not under a wave
        (narrow, dataclasses.replace(device, launch_overhead_ns=dur[narrow] * 1.5, sm_count=int(blocks[narrow]))),
        # an unknown SM count (0) is one SM: a one-block grid is not under a wave of it
        (single, dataclasses.replace(device, launch_overhead_ns=dur[single] * 1.5, sm_count=0)),
    ]
    for i, at_bound in cases:
        out = classify(kernels, attribution, at_bound)
        assert out.at[i, "kernel_class"] != "overhead"
        assert list(out["kernel_class"]) == [_expected_class(r, _device_dict(at_bound))
                                             for r in _rows(kernels, out).itertuples()]
        past = dataclasses.replace(at_bound, launch_overhead_ns=at_bound.launch_overhead_ns + 1)
        if at_bound.sm_count != device.sm_count:  # one SM more than the grid's blocks: under a wave
            past = dataclasses.replace(at_bound, sm_count=int(blocks[i]) + 1)
        assert classify(kernels, attribution, past).at[i, "kernel_class"] == "overhead"
