"""Fast oracles of the rules (issue 25, part 0): each rule's saving recomputed in this file from the
run database of a small real capture, and the rule tables (GEMM alignment, ranking, the silent
share) as decision tables. The mutation run selects these for ``analysis/rules``."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from gpudiag.analysis.rules import registry
from gpudiag.analysis.rules.kernels import _misaligned


def _measured_kernels(db) -> tuple[pd.DataFrame, int]:
    k = pd.read_sql_query(
        "SELECT k.kernel_id, k.duration_ns, k.grid_x, k.grid_y, k.grid_z, a.step, a.module, a.module_class, a.op_args,"
        " c.family, c.kernel_class FROM kernels k JOIN kernel_attribution a USING (kernel_id)"
        " JOIN kernel_class c USING (kernel_id) WHERE a.step IN (SELECT step FROM steps WHERE measured)", db.conn)
    n = db.conn.execute("SELECT count(*) FROM steps WHERE measured").fetchone()[0]
    return k, n


def _rec(report: dict, rule_id: str) -> dict | None:
    return next((r for r in report["recommendations"] + report["suppressed"] if r["rule_id"] == rule_id), None)


def _payload(op: str, *tensors) -> str:
    return json.dumps({"op": op, "in": list(tensors), "out": None})


@pytest.mark.parametrize("op, tensors, expected", [
    ("aten::mm", ["bfloat16[64,100]", "bfloat16[100,256]"], ["K=100"]),
    ("aten::mm", ["bfloat16[64,128]", "bfloat16[128,250]"], ["N=250"]),
    ("aten::mm", ["float16[64,100]", "float16[100,250]"], ["K=100", "N=250"]),
    ("aten::mm", ["bfloat16[64,128]", "bfloat16[128,256]"], []),
    ("aten::mm", ["float32[64,100]", "float32[100,250]"], []),  # fp32/TF32: no alignment rule
    ("aten::mm", ["float8_e4m3fn[64,136]", "float8_e4m3fn[136,256]"], ["K=136"]),  # fp8: multiples of 16
    ("aten::mm", ["float8_e4m3fn[64,144]", "float8_e4m3fn[144,256]"], []),
    ("aten::linear", ["bfloat16[64,128]", "bfloat16[250,128]"], ["N=250"]),  # linear's weight is (N, K)
    ("aten::linear", ["bfloat16[64,128]", "bfloat16[256,120]"], []),
    ("aten::addmm", ["bfloat16[250]", "bfloat16[64,128]", "bfloat16[128,250]"], ["N=250"]),  # the bias is not an operand
    ("aten::bmm", ["bfloat16[8,64,100]", "bfloat16[8,100,64]"], ["K=100"]),
    ("aten::mm", ["bfloat16[100]", "bfloat16[100,256]"], []),  # a vector: no GEMM shape
    ("aten::mm", ["float32[64,100]", "bfloat16[100,256]"], []),  # the first operand's type decides
    ("aten::mm", ["bfloat16[64,128]"], []),
])
def test_gemm_alignment_is_nvidias_tensor_core_table(op, tensors, expected):
    """NVIDIA's Matrix Multiplication Background User's Guide: K and N multiples of 8 for 16-bit
    types, 16 for fp8."""
    assert _misaligned(op, _payload(op, *tensors)) == expected


def test_gemm_alignment_of_an_unreadable_payload():
    assert _misaligned("aten::mm", "not json") == []
    assert _misaligned("aten::mm", json.dumps({"op": "aten::mm"})) == []


def test_unfused_norm_saving_is_the_forward_time_minus_one_fused_pass(analysed):
    """RMSNorm written op by op (rmsnorm_train, H200): per step, the norm modules' kernel time minus,
    per module, reading and writing its largest input once at peak bandwidth."""
    db, report = analysed("rmsnorm_train")
    k, n = _measured_kernels(db)
    norms = k[k["module_class"].fillna("").str.contains(r"Norm(?:\d*d)?$")]
    per_module = norms.groupby("module").agg(kernels=("duration_ns", "size"), ns=("duration_ns", "sum"),
                                             fused=("family", lambda f: (f == "norm").any()))
    unfused = per_module[(per_module["kernels"] / n >= 3) & ~per_module["fused"]]
    assert len(unfused) == 8
    detail = pd.read_sql_query("SELECT module, op_args FROM kernel_attribution WHERE step IN "
                               "(SELECT step FROM steps WHERE detail) AND op_args IS NOT NULL", db.conn)
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}
    largest = 0.0
    for args in detail.loc[detail["module"].isin(unfused.index), "op_args"]:
        for t in json.loads(args)["in"]:
            if isinstance(t, str) and "[" in t:
                dtype, shape = t.split("@")[0].rstrip("]").split("[")
                largest = max(largest, math.prod(int(x) for x in shape.split(",") if x) * itemsize.get(dtype, 4))
    bandwidth = report["device"]["memory_bandwidth_bytes_per_s"]
    saving = unfused["ns"].sum() / n - len(unfused) * 2 * largest / bandwidth * 1e9
    rec = _rec(report, "GD-UNFUSED-NORM")
    assert rec["title"] == "Normalization is written op by op (several kernels per call)"
    assert rec["saving_ns_per_step"] == pytest.approx(saving, rel=1e-9)
    assert f"{len(unfused)} calls x 2 x {largest / 1e6:.1f} MB" in rec["estimate"]
    assert rec["saving_percent_of_step"] == pytest.approx(100 * saving / report["steps"]["step_time_ns"]["mean"], rel=1e-9)


def test_small_grid_saving_is_the_idle_share_of_the_sms(analysed):
    """ResNet-50 (H100): kernels over 20 µs with fewer blocks than half the SMs; saving = their time
    x (1 - blocks / SMs), per step."""
    db, report = analysed("zoo_resnet50")
    k, n = _measured_kernels(db)
    sms = report["device"]["sm_count"]
    k = k[k["kernel_class"] != "communication"]
    blocks = k[["grid_x", "grid_y", "grid_z"]].fillna(1).prod(axis=1)
    small = k[(blocks < sms / 2) & (k["duration_ns"] > 20_000)]
    saving = float((small["duration_ns"] * (1 - blocks[small.index] / sms)).sum()) / n
    assert small["duration_ns"].sum() / n >= 0.02 * report["steps"]["step_time_ns"]["mean"]
    assert _rec(report, "GD-SMALL-GRID")["saving_ns_per_step"] == pytest.approx(saving, rel=1e-9)


def test_input_stall_is_the_mean_idle_before_each_steps_first_kernel(analysed):
    """input_pipeline_bad (H200): the data loader's wait shows as host-bound GPU idle before each
    step's first kernel; the rule's saving is its mean, over 10 % of the step."""
    _, report = analysed("input_pipeline_bad")
    rec = _rec(report, "GD-INPUT-STALL")
    per_step = report["idle"]["step_start_idle_ns_per_step"] if "step_start_idle_ns_per_step" in report["idle"] else None
    assert rec is not None and rec["saving_ns_per_step"] >= 0.10 * report["steps"]["step_time_ns"]["mean"]
    if per_step is not None:
        assert rec["saving_ns_per_step"] == pytest.approx(per_step, rel=1e-9)
    assert rec["saving_ns_per_step"] <= report["idle"]["host_bound_idle_ns_per_step"] + 1e-6
    _, good = analysed("input_pipeline_good")
    assert _rec(good, "GD-INPUT-STALL") is None


@pytest.mark.parametrize("savings, expected", [
    ([5.0e6, 1.0e6, 3.0e6], [0, 2, 1]),
    ([1.1 ** 144 * 1.05, 1.1 ** 144 * 1.01], [0, 1]),  # one step of the log scale: RULES order
    ([1.1 ** 144 * 1.09, 1.1 ** 145 * 1.01], [1, 0]),
    ([0.0, 0.5], [0, 1]),  # under 1 ns: both count as 1 ns, RULES order
    ([0.0, 2.0], [1, 0]),
    ([None, 5.0], [1, 0]),
])
def test_rank_is_by_saving_in_steps_of_ten_percent_then_rule_order(savings, expected):
    recs = [{"rule": f"r{i}", "saving_ns_per_step": s} for i, s in enumerate(savings)]
    order = {f"r{i}": i for i in range(len(savings))}
    assert [int(r["rule"][1:]) for r in registry.rank(recs, order)] == expected


def test_rules_under_the_silent_share_are_suppressed_and_said_why(analysed):
    """A rule with an estimated saving under 0.5 % of the step goes to ``suppressed`` with its
    reason; every shown estimated saving is at least that share."""
    for name in ("rmsnorm_train", "towers_inference", "zoo_vit", "input_pipeline_bad"):
        _, report = analysed(name)
        step = report["steps"]["step_time_ns"]["mean"]
        for rec in report["recommendations"]:
            assert not rec["saving_estimated"] or rec["saving_ns_per_step"] >= registry.SILENT_SHARE * step
        for rec in report["suppressed"]:
            if rec["rule_id"] is not None:
                assert rec["saving_ns_per_step"] < registry.SILENT_SHARE * step
                assert f"{rec['saving_ns_per_step'] / 1e6:.3f} ms/step, under 0.5% of the step" in rec["suppressed_because"]


@pytest.mark.parametrize("op, payload, expected", [
    ("aten::add", {"in": ["float32[4]@a", "float32[4]@b"], "out": "float32[4]@c"}, ({"a", "b"}, {"c"}, set())),
    ("aten::add_", {"in": ["float32[4]@a", "float32[4]@b"], "out": "float32[4]@a"}, ({"a", "b"}, set(), {"a"})),
    ("aten::cat", {"in": [["float32[4]@a", "float32[4]@b"], 0], "out": "float32[8]@c"}, ({"a", "b"}, {"c"}, set())),
    ("aten::copy_", {"in": ["float32[4]@d", "float32[4]@e"], "out": None}, ({"d", "e"}, set(), {"d"})),
])
def test_multi_stream_reads_fresh_outputs_and_in_place_writes(op, payload, expected):
    """The multi-stream rule's data dependencies: an in-place op (trailing underscore) writes its
    first argument, which is then not a fresh output."""
    from gpudiag.analysis.rules.kernels import _access

    assert _access(json.dumps({"op": op, **payload}), op) == expected
    assert _access("not json", op) == (set(), set(), set())


def test_evidence_lines_are_the_kernels_with_most_time(analysed):
    """top_evidence: the k kernel names with most time, as 'label: µs/step (launches)'."""
    from gpudiag.analysis.attribution.families import kernel_label
    from gpudiag.analysis.rules.base import top_evidence

    db, _ = analysed("rmsnorm_train")
    k, n = _measured_kernels(db)
    names = pd.read_sql_query("SELECT kernel_id, name, short_name FROM kernels", db.conn)
    k = k.merge(names, on="kernel_id")
    lines = top_evidence(k, n)
    totals = k.groupby("name")["duration_ns"].agg(["sum", "size"]).sort_values("sum", ascending=False).head(3)
    assert len(lines) == 3 and len(top_evidence(k, n, 2)) == 2
    for line, (name, row) in zip(lines, totals.iterrows()):
        short = k.loc[k["name"] == name, "short_name"].iloc[0]
        assert line.startswith(kernel_label(name, short))
        assert line.endswith(f": {row['sum'] / n / 1e3:.0f} µs/step ({row['size'] / n:.0f} launches)")


@pytest.mark.parametrize("name", ["rmsnorm_train", "towers_inference", "zoo_vit", "input_pipeline_bad",
                                  "zoo_resnet50", "gpt2_train_bf16", "mlp_chain_b4096"])
def test_no_rule_fails_on_a_real_capture(name, analysed):
    """A rule that raises is listed in ``suppressed`` so the report survives; on real captures none
    may (that would hide a rule's advice)."""
    _, report = analysed(name)
    failed = [r["suppressed_because"] for r in report["suppressed"] if r["rule_id"] is None]
    assert failed == []


def test_gemm_alignment_saving_and_the_vocabulary_gemm(analysed):
    """GPT-2 (H200): the LM head's GEMMs have N = 50257 (K in the backward). Saving: the misaligned configurations'
    time x (1 - their median efficiency / the median efficiency of the aligned contractions)."""
    from gpudiag.analysis.attribution.families import CONTRACTION_FAMILIES
    from gpudiag.analysis.roofline.costmodel import CONTRACTION_OPS

    db, report = analysed("gpt2_train_bf16")
    rows = pd.read_sql_query(
        "SELECT a.step, a.op, a.op_args, c.config_key, c.family, c.efficiency, k.duration_ns, s.detail, s.measured"
        " FROM kernels k JOIN kernel_attribution a USING (kernel_id) JOIN kernel_class c USING (kernel_id)"
        " JOIN steps s ON s.step = a.step", db.conn)
    gemm_ops = CONTRACTION_OPS - {"aten::convolution", "aten::_convolution", "aten::cudnn_convolution",
                                  "aten::convolution_backward"}
    detail = rows[(rows["detail"] == 1) & rows["op"].isin(gemm_ops)]
    bad = detail[[bool(_misaligned(o, a)) for o, a in zip(detail["op"], detail["op_args"])]]
    configs = set(bad["config_key"])
    km = rows[rows["measured"] == 1]
    n = km["step"].nunique()
    aligned = km[km["family"].isin(CONTRACTION_FAMILIES) & ~km["config_key"].isin(configs)]
    reference = aligned["efficiency"].median()
    per_config = km[km["config_key"].isin(configs)].groupby("config_key").agg(
        ns=("duration_ns", "sum"), eff=("efficiency", "median"))
    saving = sum(r.ns * (1 - min(r.eff / reference, 1.0)) for r in per_config.itertuples()) / n
    rec = _rec(report, "GD-GEMM-ALIGN")
    assert rec["saving_ns_per_step"] == pytest.approx(saving, rel=1e-9)
    assert rec["title"] == "GEMM dimensions are not multiples of 8"
    assert any(e.startswith("aten::mm ['bfloat16[4096,768]") and e.endswith("(N=50257)") for e in rec["evidence"])  # LM head
    assert any(e.startswith("aten::mm ") and e.endswith("(K=50257)") for e in rec["evidence"])  # its backward
    assert f"{reference:.2f}, the median roofline efficiency" in rec["estimate"]


def test_collective_kernels_are_outside_the_roofline(analysed):
    """A kernel of the collective library (family ``communication``) is class ``communication``
    with no roofline numbers, whatever op launched it (here a real capture's GEMM renamed)."""
    from gpudiag.analysis.roofline import peaks
    from gpudiag.analysis.roofline.classify import classify

    db, report = analysed("rmsnorm_train")
    kernels = pd.read_sql_query("SELECT * FROM kernels ORDER BY kernel_id", db.conn)
    attribution = pd.read_sql_query("SELECT * FROM kernel_attribution ORDER BY kernel_id", db.conn)
    classes = pd.read_sql_query("SELECT * FROM kernel_class ORDER BY kernel_id", db.conn)
    detail = db.conn.execute("SELECT step FROM steps WHERE detail").fetchone()[0]
    # detail-step kernels: their own op call gives them shapes (elsewhere the new name finds no partner)
    shaped = classes.index[(classes["evidence"] == "shapes") & (attribution["step"] == detail)][:5]
    kernels.loc[shaped, "name"] = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    out = classify(kernels, attribution, peaks.lookup(report["device"]["name"], report["device"]["sm_count"]))
    comm = out.loc[shaped]
    assert (comm["kernel_class"] == "communication").all() and (comm["evidence"] == "heuristic").all()
    roof = ["flop", "bytes", "intensity", "ridge", "achieved_flop_per_s", "achieved_bytes_per_s", "efficiency"]
    assert comm[roof].isna().all().all() and comm["math_path"].isna().all()
    assert list(out.columns) == list(classes.columns)
    rest = out.drop(index=shaped)
    assert (rest["kernel_class"].to_numpy() == classes.drop(index=shaped)["kernel_class"].to_numpy()).all()


def test_pageable_copy_saving_is_the_time_over_the_pinned_rate(analysed):
    """input_pipeline_bad (H200): host-to-device copies from pageable memory; saving = their time
    per step minus the same bytes at this run's pinned rate (pinned copies of 1 MB or more), here
    with no pinned copy to measure that rate, their whole time."""
    db, report = analysed("input_pipeline_bad")
    steps = pd.read_sql_query("SELECT step, cpu_start_ns, cpu_end_ns FROM steps WHERE measured", db.conn)
    copies = pd.read_sql_query("SELECT m.bytes, m.duration_ns, m.src_kind, m.dst_kind, r.start_ns AS api_ns FROM memcpy m"
                               " JOIN runtime_api r ON r.correlation_id = m.correlation_id"
                               " AND r.global_pid = m.global_pid", db.conn)
    inside = [any(s.cpu_start_ns <= t < s.cpu_end_ns for s in steps.itertuples()) for t in copies["api_ns"]]
    m, n = copies[inside], len(steps)
    pageable = m[(m["src_kind"] == "Pageable") | (m["dst_kind"] == "Pageable")]
    pinned = m[((m["src_kind"] == "Pinned") | (m["dst_kind"] == "Pinned")) & (m["bytes"] >= 1e6)]
    ns = pageable["duration_ns"].sum() / n
    rec = _rec(report, "GD-PAGEABLE-COPY")
    assert pageable["bytes"].sum() / n >= 1e6
    assert len(pinned) == 0  # this run made no pinned copy of 1 MB: no pinned rate, the whole time is the saving
    assert rec["saving_ns_per_step"] == pytest.approx(ns, rel=1e-9)
    assert rec["estimate"] == "pageable copy time per step"
    assert rec["evidence"][0].startswith(f"{len(pageable) / n:.1f} pageable copies/step, "
                                         f"{pageable['bytes'].sum() / n / 1e6:.1f} MB/step, {ns / 1e6:.2f} ms/step")


@pytest.mark.parametrize("name, fires", [("towers_inference", True), ("mlp_decode", True), ("rmsnorm_train", False),
                                         ("kernel_pathologies", False), ("input_pipeline_bad", False)])
def test_overhead_bound_fires_on_launch_bound_steps_only(name, fires, analysed):
    """GD-OVERHEAD-BOUND: host-bound idle between kernels (not before a step's first kernel) over
    15 % of the step. Its saving is at most that idle; its evidence counts the launches and the
    overhead-bound kernels per step."""
    db, report = analysed(name)
    rec = _rec(report, "GD-OVERHEAD-BOUND")
    idle = report["idle"]
    between = idle["host_bound_idle_ns_per_step"] - idle["step_start_idle_ns_per_step"]
    step = report["steps"]["step_time_ns"]["mean"]
    assert (rec is not None) == fires == (between >= 0.15 * step)
    if fires:
        k, n = _measured_kernels(db)
        assert 0 < rec["saving_ns_per_step"] <= between + 1e-6
        assert rec["evidence"][1] == (f"{len(k) / n:.0f} kernel launches/step, "
                                      f"{(k['kernel_class'] == 'overhead').sum() / n:.0f} of them overhead-bound")
        assert rec["title"] == "The GPU waits for the host to launch kernels"


def test_host_sync_evidence_counts_the_synchronizing_calls(analysed):
    """input_pipeline_bad (H200): GD-HOST-SYNC lists the synchronizing API calls per measured step
    (``_v`` suffixes folded) and the host time they block; it fires on any sync."""
    import re

    db, report = analysed("input_pipeline_bad")
    api = pd.read_sql_query("SELECT r.name, r.start_ns, r.end_ns FROM runtime_api r JOIN steps s"
                            " ON r.start_ns >= s.cpu_start_ns AND r.start_ns < s.cpu_end_ns WHERE s.measured", db.conn)
    n = db.conn.execute("SELECT count(*) FROM steps WHERE measured").fetchone()[0]
    syncs = api[api["name"].str.match(r"^(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|"
                                      r"cudaMemcpy(_v\d+)?$|cudaMemcpy2D(_v\d+)?$)")]
    assert len(syncs) > 0
    counts = syncs["name"].map(lambda s: re.sub(r"_v\d+$", "", s)).value_counts()
    blocked = (syncs["end_ns"] - syncs["start_ns"]).sum() / n
    rec = _rec(report, "GD-HOST-SYNC")
    assert rec["title"] == "The step synchronizes the host with the GPU"
    assert rec["evidence"][0] == (f"{len(syncs) / n:.1f} synchronizing calls/step blocking the host {blocked / 1e6:.2f} "
                                  "ms/step: " + ", ".join(f"{name} x{c / n:.1f}" for name, c in counts.items()))


def test_fp8_inference_counts_the_16_bit_contractions(analysed):
    """mlp_chain_b4096 (H200, bf16 inference): GD-FP8-INFERENCE fires on the bf16/fp16 GEMM time."""
    from gpudiag.analysis.attribution.families import CONTRACTION_FAMILIES

    db, report = analysed("mlp_chain_b4096")
    k, n = _measured_kernels(db)
    paths = pd.read_sql_query("SELECT kernel_id, math_path FROM kernel_class", db.conn)
    k = k.merge(paths, on="kernel_id")
    gemm = k[k["family"].isin(CONTRACTION_FAMILIES) & k["math_path"].isin(["bf16", "fp16"])]
    ns = gemm["duration_ns"].sum() / n
    rec = _rec(report, "GD-FP8-INFERENCE")
    assert ns > 0 and rec["evidence"][0].startswith(f"{ns / 1e6:.2f} ms/step in bf16/fp16 contractions")


def test_multi_stream_names_itself(analysed):
    _, report = analysed("towers_inference")
    rec = _rec(report, "GD-MULTI-STREAM")
    assert rec["title"] == "Independent kernels run one after another on one stream" and rec["saving_ns_per_step"] > 0
