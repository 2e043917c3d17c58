"""Fusion candidates from the kernel sequence alone (issue 11, part 2), on real captures: the zoo's
Llama-style and ResNet-50 training runs (H100) with gpudiag's op ranges deleted, as a plain
``nsys`` capture would lack them, and the Swin-T capture made without op ranges (H200).

Oracles: the op-dataflow candidates of the full export (same kernels), counts made with SQL on the
raw kernel table, and the bytes the cost model computes from the recorded shapes."""

from __future__ import annotations

import copy
import json
import lzma
import re
import shutil
import sqlite3

import numpy as np
import pandas as pd
import pytest
import sqlite_utils
from rich.console import Console

from gpudiag import nvtx_names, store
from gpudiag.analysis.roofline import peaks as peaks_mod
from gpudiag.analysis.fusion.kernel_sequence import (KERNEL_PATTERNS, MEMBER_COLUMNS, kernel_runs, kernel_sequence_candidates, launch_config_bytes,
                                              step_label)
from gpudiag.analysis.ingest import ingest
from gpudiag.analysis.pipeline import analyse
from gpudiag.renderers import html, terminal

from conftest import FIXTURES

ZOO = FIXTURES / "zoo"
# Kernels that end a run, written here independently of families.py: contractions (cuBLAS/nvjet/
# CUTLASS GEMMs, cuDNN convolutions and attention), library internals (cuDNN layout transforms),
# optimizer and collective kernels.
NOT_FUSABLE = re.compile(r"gemm|nvjet|cutlass|cublas|cudnn|xmma|implicit_gemm|sdpa|flash|fmha|multi_tensor_apply|"
                         r"foreach|nccl", re.IGNORECASE)

# The keys the reports read from an op-dataflow candidate (fusion.Candidate)
CANDIDATE_KEYS = {"ops", "occurrences_per_step", "modules", "chain_ns", "fused_floor_ns", "saving_ns_per_step",
                  "external_bytes", "kernels_per_occurrence", "compile_fusable", "reference_kernel", "example_shapes"}


def _text_sql() -> str:
    return "COALESCE(text, (SELECT value FROM StringIds WHERE id = textId))"


def strip_op_ranges(source, target) -> int:
    """Decompress ``source`` to ``target`` and delete gpudiag's op ranges (and the output ranges nested
    in them) from NVTX_EVENTS. Returns how many rows went."""
    with lzma.open(source) as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
    with sqlite3.connect(target) as con:
        cur = con.execute(f"DELETE FROM NVTX_EVENTS WHERE {_text_sql()} GLOB ? OR {_text_sql()} GLOB ?",
                          (nvtx_names.OP + "*", nvtx_names.OUT + "*"))
        return cur.rowcount


@pytest.fixture(scope="module")
def zoo_pair(tmp_path_factory):
    """name -> {"full": (report, db), "stripped": (report, db, export)}, analysed once."""
    folder, cache = tmp_path_factory.mktemp("kernel_sequence"), {}

    def get(name: str) -> dict:
        if name not in cache:
            status = json.loads(lzma.open(ZOO / f"{name}.status.json.xz", "rt").read())
            full_export, stripped_export = folder / f"{name}.sqlite", folder / f"{name}_no_ops.sqlite"
            with lzma.open(ZOO / f"{name}.sqlite.xz") as src, open(full_export, "wb") as dst:
                shutil.copyfileobj(src, dst)
            assert strip_op_ranges(ZOO / f"{name}.sqlite.xz", stripped_export) > 100
            full_db, stripped_db = folder / f"{name}.run.sqlite", folder / f"{name}_no_ops.run.sqlite"
            cache[name] = {"full": (analyse(ingest(full_export, full_db), status=status), full_db),
                           "stripped": (analyse(ingest(stripped_export, stripped_db), status=status), stripped_db,
                                        stripped_export)}
        return cache[name]

    return get


def kernels_of(db) -> pd.DataFrame:
    """Every kernel of a run database with its step, module, op call, family and class."""
    con = store.queryable(sqlite_utils.Database(db))  # the derived tables are Parquet in the file (schema 3)
    return pd.read_sql("SELECT k.*, a.step, a.module, a.op, a.op_call, c.family, c.kernel_class, c.bytes, c.evidence "
                       "FROM kernels k JOIN kernel_attribution a USING (kernel_id) JOIN kernel_class c USING (kernel_id)", con)


def measured_steps(report: dict) -> list[int]:
    return [s["step"] for s in report["steps"]["per_step"] if s["measured"]]


def peaks_of(report: dict) -> peaks_mod.DevicePeaks:
    d = report["device"]
    return peaks_mod.DevicePeaks(name=d["name"], sm_count=d["sm_count"], bandwidth=d["memory_bandwidth_bytes_per_s"],
                                 launch_overhead_ns=d["launch_overhead_ns"])


def all_candidates(report: dict, db) -> list[dict]:
    """Every kernel-sequence candidate of a stripped export (the report keeps the top 10)."""
    k = kernels_of(db)
    steps = measured_steps(report)
    return kernel_sequence_candidates(k[k["step"].isin(steps)], peaks_of(report), len(steps), top=None)


def ordered_matches(sequence: list[str], ops: list[str]) -> int:
    """How many times ``ops`` occurs in ``sequence`` in order (gaps allowed), without overlap."""
    found, rest = 0, iter(sequence)
    while ops and all(any(x == o for x in rest) for o in ops):  # each ``any`` consumes ``rest`` up to its match
        found += 1
    return found


def run_op_sequences(full_db, stripped_db, step: int) -> tuple[pd.DataFrame, list[list[str]]]:
    """The stripped export's runs on ``step`` (members) and, per run in order, the ops that launched its
    kernels, taken from the full export (the kernel ids are the same: only NVTX rows were deleted)."""
    full, k = kernels_of(full_db).set_index("kernel_id"), kernels_of(stripped_db)
    runs = kernel_runs(k[k["step"] == step])
    return runs, [full.loc[r["kernel_id"], ["op_call", "op"]].drop_duplicates("op_call")["op"].tolist()
                  for _, r in runs.groupby("run", sort=False)]


def step_kernels_sql(export, report) -> pd.DataFrame:
    """The raw export's kernels launched inside a measured step (its gpudiag:step range holds the
    launch call's start), with name, stream and start: SQL on CUPTI's tables."""
    with sqlite3.connect(export) as con:
        ranges = pd.read_sql(f"SELECT {_text_sql()} AS text, start, end FROM NVTX_EVENTS WHERE eventType = 60", con)
        ranges = ranges[ranges["text"].fillna("").str.startswith(nvtx_names.STEP)]
        ranges["step"] = ranges["text"].str[len(nvtx_names.STEP):].astype(int)
        ranges[ranges["step"].isin(measured_steps(report))][["step", "start", "end"]].to_sql("m_steps", con, index=False, if_exists="replace")
        con.create_function("fusable", 1, lambda name: int(not NOT_FUSABLE.search(name or "")))
        return pd.read_sql("""
            WITH k AS (SELECT s.step, k.streamId AS stream, k.start, n.value AS name
                       FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds n ON n.id = k.demangledName
                       JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
                            AND (r.globalTid >> 24) = (k.globalPid >> 24)
                       JOIN m_steps s ON r.start >= s.start AND r.start < s.end)
            SELECT step, stream, start, name, fusable(name) AS fusable,
                   LAG(fusable(name)) OVER w AS prev_fusable, LEAD(fusable(name)) OVER w AS next_fusable,
                   LEAD(name) OVER w AS next_name
            FROM k WINDOW w AS (PARTITION BY step, stream ORDER BY start)""", con)


# ---- wiring: which source, flagged ------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama", "resnet50"])
def test_without_op_ranges_the_candidates_come_from_the_kernel_sequence(zoo_pair, name):
    full, _ = zoo_pair(name)["full"]
    stripped, db, _ = zoo_pair(name)["stripped"]
    assert full["fusion_source"] == "op_dataflow" and full["fusion_candidates"]
    assert (kernels_of(db)["op_call"] < 0).all()  # the op ranges are gone
    cands = stripped["fusion_candidates"]
    assert stripped["fusion_source"] == "kernel_sequence" and len(cands) == 10
    assert all(c["source"] == "kernel_sequence" and c["confidence"] == "low" for c in cands)
    assert CANDIDATE_KEYS <= set(full["fusion_candidates"][0]) and CANDIDATE_KEYS <= set(cands[0])
    savings = [c["saving_ns_per_step"] for c in cands]
    assert savings == sorted(savings, reverse=True) and savings[0] > 0
    for c in cands:
        assert c["saving_ns_per_step"] == pytest.approx(max(c["chain_ns"] - c["fused_floor_ns"], 0) * c["occurrences_per_step"])
        assert c["kernels_per_occurrence"] == len(c["ops"]) == len(c["grids"]) >= 2
        assert c["fused_floor_ns"] >= stripped["device"]["launch_overhead_ns"]


def test_an_export_with_op_ranges_but_no_data_flow_gets_no_guesses(analysed):
    """The Swin-T example has op ranges recorded before storage addresses: no op-dataflow
    candidates, and no kernel-sequence ones either (its op ranges say the capture is gpudiag's)."""
    _, report = analysed("swin_t_train_bf16")
    assert report["fusion_candidates"] == [] and report["fusion_source"] == "op_dataflow"


# ---- the oracle from the full export: the same kernels ----------------------------------------

@pytest.mark.parametrize("name", ["llama", "resnet50"])
def test_op_dataflow_candidates_lie_inside_kernel_sequence_runs(zoo_pair, name):
    """The full export's ten op-dataflow candidates (RoPE, RMSNorm backward, cross-entropy for Llama;
    BN + ReLU forward and backward for ResNet-50), on the detail step: the ops of each occur, in
    order, inside the stripped export's runs, within one run or, for a data-flow group that crosses a
    GEMM or convolution (SwiGLU's backward, ResNet's downsample branch), two consecutive runs, at
    least as often per step as the candidate occurs. Of the runs that hold the top candidate, one's
    candidate is among the stripped report's ten."""
    full, full_db = zoo_pair(name)["full"]
    stripped, db, _ = zoo_pair(name)["stripped"]
    runs, sequences = run_op_sequences(full_db, db, full["steps"]["detail_step"])
    for cand in full["fusion_candidates"]:
        in_one = sum(ordered_matches(s, cand["ops"]) for s in sequences)
        in_two = sum(ordered_matches(a + b, cand["ops"]) for a, b in zip(sequences, sequences[1:]))
        assert max(in_one, in_two) >= cand["occurrences_per_step"], cand["ops"]
    top = full["fusion_candidates"][0]
    holding = [rid for rid, seq in zip(runs["run"].unique(), sequences) if ordered_matches(seq, top["ops"])]
    assert len(holding) >= top["occurrences_per_step"] // 2  # RoPE: q and k can share a run
    shown = [(c["ops"], c["grids"]) for c in stripped["fusion_candidates"]]
    keys = [([step_label(n, s) for n, s in zip(run["name"], run["short_name"])],
             run[["grid_x", "grid_y", "grid_z"]].astype(int).values.tolist())
            for _, run in runs[runs["run"].isin(holding)].groupby("run")]
    assert any(key in shown for key in keys)


def test_llama_rmsnorm_and_loss_match_reference_kernels_by_name(zoo_pair):
    stripped, db, _ = zoo_pair("llama")["stripped"]
    refs = {c["reference_kernel"] for c in all_candidates(stripped, db)}
    assert {"rms_norm", "cross_entropy"} <= refs
    from gpudiag.fused.registry import kernels

    assert {name for name, _ in KERNEL_PATTERNS} <= set(kernels())


# ---- grouping and occurrences against SQL on the raw kernel table -----------------------------

@pytest.mark.parametrize("name", ["llama", "resnet50"])
def test_run_membership_matches_sql_on_the_raw_kernel_table(zoo_pair, name):
    """Every kernel in a run, counted two ways: occurrences x kernels over the candidates, and SQL on
    the raw export (a fusable kernel whose neighbour on its stream, in the same step, is fusable)."""
    stripped, db, export = zoo_pair(name)["stripped"]
    raw = step_kernels_sql(export, stripped)
    in_runs = raw[(raw["fusable"] == 1) & ((raw["prev_fusable"] == 1) | (raw["next_fusable"] == 1))]
    n = len(measured_steps(stripped))
    cands = all_candidates(stripped, db)
    assert sum(c["occurrences_per_step"] * c["kernels_per_occurrence"] for c in cands) * n == pytest.approx(len(in_runs))
    # ... and the runs themselves: a run starts at a fusable kernel whose predecessor is not
    starts = in_runs[in_runs["prev_fusable"] != 1]
    assert sum(c["occurrences_per_step"] for c in cands) * n == pytest.approx(len(starts))


@pytest.mark.parametrize("name", ["llama", "resnet50"])
def test_run_keys_are_the_members_launch_configurations_in_order(zoo_pair, name):
    """Each run's ``key`` names its members' launch configurations in stream order, one id per
    distinct (name, grid, block, ...) tuple: recomputed here row by row from the raw columns, and
    two runs share a key exactly when their members' configuration tuples are equal."""
    from gpudiag.analysis.fusion.kernel_sequence import CONFIG_COLUMNS

    stripped, db, _ = zoo_pair(name)["stripped"]
    k = kernels_of(db)
    runs = kernel_runs(k[k["step"].isin(measured_steps(stripped))])
    assert len(runs) > 100
    tuples = {}  # run -> its members' configuration tuples, in order
    for row in runs.itertuples(index=False):
        tuples.setdefault(row.run, []).append(tuple(-1 if pd.isna(getattr(row, c)) else getattr(row, c) for c in CONFIG_COLUMNS))
    keys = runs.groupby("run", sort=False)["key"].agg(["first", "nunique"])
    assert (keys["nunique"] == 1).all() and all(len(t) >= 2 for t in tuples.values())
    config_of = dict(zip(map(tuple, runs[CONFIG_COLUMNS].fillna(-1).itertuples(index=False)), runs["config"]))
    for run, members in tuples.items():
        assert keys.loc[run, "first"] == " ".join(str(config_of[m]) for m in members)
    by_key = {}
    for run, members in tuples.items():
        by_key.setdefault(keys.loc[run, "first"], set()).add(tuple(members))
    assert all(len(v) == 1 for v in by_key.values())


def test_llama_rmsnorm_occurs_once_per_norm(zoo_pair):
    """LLaMA's RMSNorm (pow -> mean -> ...): 2 per layer x 8 layers + the final norm. The candidates
    matched to rms_norm occur, together, as often per step as SQL finds a pow kernel followed on its
    stream by a MeanOps reduction."""
    stripped, db, export = zoo_pair("llama")["stripped"]
    raw = step_kernels_sql(export, stripped)
    norms = raw[raw["name"].str.contains("pow_tensor_scalar") & raw["next_name"].fillna("").str.contains("MeanOps")]
    per_step = norms.groupby("step").size()
    assert per_step.nunique() == 1 and per_step.iloc[0] == 17
    matched = [c for c in all_candidates(stripped, db) if c["reference_kernel"] == "rms_norm"]
    assert sum(c["occurrences_per_step"] for c in matched) == 17
    assert all(m.startswith("model.") for c in matched for m in c["modules"])  # the decoder's modules


def test_resnet50_every_batchnorm_is_counted_once(zoo_pair):
    """ResNet-50 has 53 BatchNorms; every forward one's statistics kernel sits in exactly one run
    between two convolutions, so occurrences x appearances over the candidates = the SQL count."""
    stripped, db, export = zoo_pair("resnet50")["stripped"]
    raw = step_kernels_sql(export, stripped)
    sql = raw["name"].str.contains("batch_norm_collect_statistics_kernel").groupby(raw["step"]).sum()
    assert sql.nunique() == 1 and sql.iloc[0] == 53
    cands = all_candidates(stripped, db)
    counted = sum(c["occurrences_per_step"] * c["ops"].count("batch_norm_collect_statistics_kernel") for c in cands)
    assert counted == 53


# ---- bytes without shapes -------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama", "resnet50"])
def test_launch_config_bytes_agree_with_the_recorded_shapes(zoo_pair, name):
    """ATen element-wise kernels whose op call launched only them, on the full export: the bytes the
    launch configuration gives vs the cost model's bytes from the recorded shapes (fills, which the
    cost model does not count, and kernels under 16 blocks, where a partial block dominates, left out)."""
    _, full_db = zoo_pair(name)["full"]
    k = kernels_of(full_db)
    k = k[(k["evidence"] == "shapes") & (k.groupby("op_call")["kernel_id"].transform("size") == 1)
          & ~k["name"].str.contains("FillFunctor") & (k["grid_x"] >= 16)].drop_duplicates(["name", "grid_x", "block_x"])
    estimate = np.array([launch_config_bytes(n, gx, bx) or np.nan for n, gx, bx in zip(k["name"], k["grid_x"], k["block_x"])])
    ok = np.isfinite(estimate)
    assert ok.sum() >= 10
    ratio = estimate[ok] / k["bytes"].to_numpy()[ok]
    assert 0.9 <= np.median(ratio) <= 1.1
    assert ((ratio > 0.5) & (ratio < 2.0)).mean() >= 0.9
    assert launch_config_bytes("void at::native::reduce_kernel<(int)512>(T3)", 512, 32) is None


def test_floor_is_the_largest_kernel_at_peak_and_never_above_the_run(zoo_pair):
    """The floor is the largest member's estimated bytes at peak bandwidth + one launch, and a
    member's estimate never exceeds its time at peak, so floor <= the longest member + one launch."""
    stripped, db, _ = zoo_pair("llama")["stripped"]
    launch = stripped["device"]["launch_overhead_ns"]
    bw = stripped["device"]["memory_bandwidth_bytes_per_s"]
    for c in all_candidates(stripped, db):
        assert c["fused_floor_ns"] == pytest.approx(c["external_bytes"] / bw * 1e9 + launch)
        assert c["bytes_method"] in ("launch_config", "time_at_peak")
        assert c["fused_floor_ns"] <= c["chain_ns"] + launch


# ---- a real capture without op ranges, and the reports ----------------------------------------

def test_swin_capture_without_op_ranges_terminal_and_html(analysed):
    """swin_t_train_bf16_bare was captured with neither op nor module ranges: the terminal and the
    HTML say where its candidates come from, and the HTML escapes the kernel labels."""
    db, report = analysed("swin_t_train_bf16_bare")
    assert report["fusion_source"] == "kernel_sequence" and report["fusion_candidates"]
    assert not any(NOT_FUSABLE.search(op) for c in report["fusion_candidates"] for op in c["ops"])
    console = Console(record=True, width=200)
    terminal.render_fusion(report, console)
    assert terminal.KERNEL_SEQUENCE_NOTE in console.export_text()
    page = html.render(report)
    assert "Candidates from the kernel sequence (no op ranges in this export): lower confidence." in page
    r = copy.deepcopy(report)
    r["fusion_candidates"][0]["ops"][0] = "void f<int, 2>(T&) <script>x</script>"
    assert "<script>x</script>" not in html.render(r) and "&lt;script&gt;x" in html.render(r)


def test_op_dataflow_reports_do_not_show_the_note(analysed):
    _, report = analysed("gpt2_train_bf16")
    console = Console(record=True, width=200)
    terminal.render_fusion(report, console)
    assert report["fusion_source"] == "op_dataflow"
    assert terminal.KERNEL_SEQUENCE_NOTE not in console.export_text()
    assert "Candidates from the kernel sequence" not in html.render(report)


@pytest.mark.parametrize("name", ["llama", "resnet50"])
def test_runs_from_the_classification_config_key_equal_the_groupby(zoo_pair, name):
    """kernel_runs given classify's ``config_key`` (the analysis' kernel frame carries it) numbers the
    configurations without its groupby of seven columns: the members, their config ids, runs and keys
    are those the groupby gives (the frame without the column), on a real capture's measured steps."""
    stripped, db, _ = zoo_pair(name)["stripped"]
    con = store.queryable(sqlite_utils.Database(db))
    keys = pd.read_sql("SELECT kernel_id, config_key FROM kernel_class", con)
    k = kernels_of(db).merge(keys, on="kernel_id")
    k = k[k["step"].isin(measured_steps(stripped))]
    # the fast path is taken (no launch dimension of -1), on many configurations
    assert not (k[["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]] == -1).to_numpy().any()
    assert k["config_key"].nunique() > 20
    by_groupby = kernel_runs(k.drop(columns="config_key"))
    by_key = kernel_runs(k)
    assert len(by_key) > 100
    pd.testing.assert_frame_equal(by_key.drop(columns="config_key"), by_groupby)


def test_members_keep_only_the_columns_asked_for(zoo_pair):
    """kernel_runs with ``columns``: the same members, config ids, runs and keys, with only those columns
    of the kernel frame (what kernel_sequence_candidates reads: MEMBER_COLUMNS), on a real capture."""
    stripped, db, _ = zoo_pair("llama")["stripped"]
    k = kernels_of(db)
    k = k[k["step"].isin(measured_steps(stripped))].assign(module="")
    every = kernel_runs(k)
    lean = kernel_runs(k, columns=MEMBER_COLUMNS)
    assert len(lean) > 100 and list(lean.columns) == [*MEMBER_COLUMNS, "config", "run", "key"]
    pd.testing.assert_frame_equal(lean, every[list(lean.columns)])
