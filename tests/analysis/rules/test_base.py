"""Fast oracles of the host-side rules, some kernel rules and the rule registry (issue 25, part 0),
on real captures whose runs have what the rules look for: a bare run next to the profiled one (the overhead-bound
correction, the host-bound optimizer), a generate() loop (host syncs with GPU idle behind them,
device-to-host copies, the CUDA-graph floor of a loop of forwards), AdamW with foreach kernels
(the parameter count of its op calls), pinned copies of 1 MB or more (the pinned rate), fp32
matrix math, and attention built from bmm, softmax and bmm.

Each rule's output is recomputed here from the run database or the raw export (SQL), or from the
launcher's status file, not from the rule. The rules are called on the context the analysis built
for that capture (recorded with a spy on ``recommend_split``)."""

from __future__ import annotations

import dataclasses
import json
import lzma
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpudiag.analysis.ingest import ingest
from gpudiag.analysis.rules import host, kernels, registry

from conftest import FIXTURES, _mutation_run, status_of

TRIALS = {"trials_generate": FIXTURES / "trials" / "generate_h100",  # HF generate() on the H100, with its bare run
          "trials_vit": FIXTURES / "trials" / "vit_h100",  # ViT training in fp32 on the H100
          "nccl_gpt_ddp": FIXTURES / "nccl" / "gpt_ddp_shm"}  # GPT DDP on two GPUs (rank 0's export)
SYNC = re.compile(r"^(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|cudaMemcpy(_v\d+)?$|"
                  r"cudaMemcpy2D(_v\d+)?$)")


@pytest.fixture(scope="session")
def rule_ctx(analysed, rule_contexts, tmp_path_factory):
    """Capture name -> (run database, report, the RuleContext the analysis gave the rules, the
    launcher's status). Exports of conftest's list share `analysed`'s cache."""
    folder = tmp_path_factory.mktemp("rule_ctx")
    cache: dict[str, tuple] = {}
    analyse_recording, contexts = rule_contexts

    def get(name: str):
        if name not in TRIALS:
            db, report = analysed(name)
            return db, report, contexts[name], status_of(name)
        if name not in cache or _mutation_run():
            status = json.loads((TRIALS[name] / "script_status.json").read_text())
            if (TRIALS[name] / "bare_status.json").exists():
                status["bare_run"] = json.loads((TRIALS[name] / "bare_status.json").read_text())
            export = folder / f"{name}.sqlite"
            if not export.exists():
                with lzma.open(TRIALS[name] / "profile.sqlite.xz") as src, open(export, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            db = ingest(export, folder / f"{name}.run.sqlite")
            report = analyse_recording(db, name, status, rank_workers=1)
            cache[name] = (db, report, contexts[name], status)
        return cache[name]

    return get


def _measured(db) -> tuple[pd.DataFrame, int]:
    steps = pd.read_sql_query("SELECT step, cpu_start_ns, cpu_end_ns, step_time_ns FROM steps WHERE measured", db.conn)
    return steps, len(steps)


def _in_steps(times: pd.Series, steps: pd.DataFrame) -> np.ndarray:
    """Whether each host timestamp falls in a measured step's host range [cpu_start, cpu_end)."""
    t = np.asarray(times, dtype=float)[:, None]
    return ((steps["cpu_start_ns"].to_numpy()[None, :] <= t) & (t < steps["cpu_end_ns"].to_numpy()[None, :])).any(axis=1)


def _between_kernels_idle(report: dict) -> float:
    """Launch-bound idle between kernels per step: the launch-bound idle less its part before the
    steps' first kernels (GD-OVERHEAD-BOUND leaves host compute to GD-HOST-COMPUTE)."""
    idle = report["idle"]
    return idle["launch_bound_idle_ns_per_step"] - (idle["step_start_idle_ns_per_step"]
                                                    - idle["step_start_host_compute_idle_ns_per_step"])


def _inflation(status: dict, measured: list[int]) -> float:
    """The bare run's inflation from the launcher's status: median profiled minus median bare step
    time over the measured steps both runs completed (CUDA-event times where both have them)."""
    bare = status["bare_run"]
    key = "step_gpu_ns" if status.get("step_gpu_ns") and bare.get("step_gpu_ns") else "step_wall_ns"
    common = [i for i in measured if status[key].get(str(i), 0) > 0 and bare[key].get(str(i), 0) > 0]
    return float(np.median([status[key][str(i)] for i in common]) - np.median([bare[key][str(i)] for i in common]))


def _rec(report: dict, rule_id: str) -> dict | None:
    return next((r for r in report["recommendations"] + report["suppressed"] if r["rule_id"] == rule_id), None)


# --- GD-OVERHEAD-BOUND and its bare-run correction ---------------------------------------------------------------


def test_overhead_saving_is_the_idle_less_the_bare_runs_inflation(rule_ctx):
    """Compiled BERT training (H100), profiled and bare: the launch-bound idle between kernels per step
    less what the profiler added to the step (median step time, status file), judged against 15 % of
    the bare step."""
    db, report, ctx, status = rule_ctx("zoo_bert_compile")
    steps, n = _measured(db)
    assert ctx.n_steps == n
    inflation = _inflation(status, steps["step"].tolist())
    assert ctx.bare_inflation_ns == pytest.approx(inflation, rel=1e-9)
    between = _between_kernels_idle(report)
    assert between > inflation > 0 and between - inflation >= 0.15 * (ctx.step_ns - inflation)
    assert host.overhead_bound(ctx).saving_ns_per_step == pytest.approx(between, rel=1e-9)
    assert host.overhead_saving(ctx) == pytest.approx(between - inflation, rel=1e-9)
    assert host.overhead_saving(dataclasses.replace(ctx, bare_inflation_ns=None)) == pytest.approx(between, rel=1e-9)
    # the report's verdict after the bare-run correction
    assert _rec(report, "GD-OVERHEAD-BOUND")["saving_ns_per_step"] == pytest.approx(between - inflation, rel=1e-9)


@pytest.mark.parametrize("side", [0.98, 1.02])
def test_overhead_saving_at_the_threshold_of_the_bare_step(rule_ctx, side):
    """The corrected idle (idle - x) stays a verdict while it is at least 15 % of the bare step
    (step - x): the inflation where the two meet is x0 = (idle - 0.15 step) / 0.85; just under x0
    the saving is idle - x, just over it 0."""
    _, report, ctx, _ = rule_ctx("zoo_bert_compile")
    between = _between_kernels_idle(report)
    x0 = (between - 0.15 * ctx.step_ns) / 0.85
    x = side * x0
    saving = host.overhead_saving(dataclasses.replace(ctx, bare_inflation_ns=x))
    assert saving == (pytest.approx(between - x, rel=1e-9) if x < x0 else 0.0)
    # a bare run slower than the profiled one corrects nothing
    assert host.overhead_saving(dataclasses.replace(ctx, bare_inflation_ns=-x0)) == pytest.approx(between, rel=1e-9)


def test_overhead_verdict_that_the_bare_run_explains_away(rule_ctx):
    """GPT-2 decode (H100): under the profiler 0.31 ms/step of host-bound idle between kernels (over
    15 % of the step), but the bare run is 0.51 ms/step faster: no verdict is left (saving 0)."""
    _, report, ctx, status = rule_ctx("zoo_gpt2_decode")
    between = _between_kernels_idle(report)
    inflation = _inflation(status, ctx.measured_steps)
    assert between >= 0.15 * ctx.step_ns and inflation > between
    assert host.overhead_bound(ctx).saving_ns_per_step == pytest.approx(between, rel=1e-9)
    assert host.overhead_saving(ctx) == 0.0


def test_overhead_bound_in_a_generate_loop_is_capped_by_the_graph_floor(rule_ctx):
    """HF generate() (H100): one forward per token, so CUDA graphs of the model leave the loop's own
    host time outside the forwards plus the kernels; the saving is the idle between kernels, at most
    the step less that floor. Outside time: the step's host range less the union of the module
    ranges (SQL on the run database); kernel time per step from the kernels table."""
    db, report, ctx, _ = rule_ctx("trials_generate")
    steps, n = _measured(db)
    kernel_ns = db.conn.execute("SELECT sum(k.duration_ns) FROM kernels k JOIN kernel_attribution a USING (kernel_id)"
                                " WHERE a.step IN (SELECT step FROM steps WHERE measured)").fetchone()[0] / n
    rec = host.overhead_bound(ctx)
    assert rec.rule_id == "GD-OVERHEAD-BOUND" and rec.how_to_fix and rec.title
    floor = rec.graph_floor
    assert floor["kernel_ns"] == pytest.approx(kernel_ns, rel=1e-9)
    assert floor["profiled_step_ns"] == ctx.step_ns and floor["forwards_per_step"] >= 2
    between = _between_kernels_idle(report)
    assert floor["idle_ns"] == pytest.approx(between, rel=1e-9)
    cap = ctx.step_ns - (floor["outside_ns"] + kernel_ns)
    assert 0 < cap < between  # the cap binds on this capture
    assert rec.saving_ns_per_step == pytest.approx(cap, rel=1e-9)
    assert rec.evidence[2] == (f"{floor['forwards_per_step']:.0f} forward calls per step with "
                               f"{floor['outside_ns'] / 1e6:.2f} ms/step of host time outside them (the loop's own: "
                               f"CUDA graphs of the model keep it) and {kernel_ns / 1e6:.2f} ms/step of kernels")
    assert rec.evidence[0].startswith(f"{between / 1e6:.2f} ms/step of GPU idle with an empty launch queue "
                                      f"while the host issued work ({100 * between / ctx.step_ns:.0f} % of the step)")
    assert "at most the step less what CUDA graphs of the model leave" in rec.estimate


# --- GD-HOST-SYNC ---------------------------------------------------------------------------------------------------


def test_host_sync_saving_is_the_idle_that_begins_while_a_sync_blocks(rule_ctx):
    """generate() (H100) reads each new token on the host (cudaStreamSynchronize per token): the
    saving is the host-bound GPU idle (not before a step's first kernel) whose start falls inside a
    synchronizing call, per step, checked call by call; the evidence counts the device-to-host
    copies (one per token) and their bytes from the run database."""
    db, _, ctx, _ = rule_ctx("trials_generate")
    steps, n = _measured(db)
    api = pd.read_sql_query("SELECT name, start_ns, end_ns FROM runtime_api", db.conn)
    api = api[_in_steps(api["start_ns"], steps)]
    syncs = api[api["name"].str.match(SYNC)]
    idle = ctx.idle[ctx.idle["host_bound"] & ~ctx.idle["at_step_start"]]
    starts, ends = syncs["start_ns"].to_numpy(), syncs["end_ns"].to_numpy()
    t = idle["start_ns"].to_numpy()[:, None]
    during = ((starts[None, :] <= t) & (t <= ends[None, :])).any(axis=1)
    saving = idle.loc[during, "duration_ns"].sum() / n
    copies = pd.read_sql_query("SELECT m.bytes, m.copy_kind, r.start_ns FROM memcpy m JOIN runtime_api r"
                               " ON r.correlation_id = m.correlation_id AND r.global_pid = m.global_pid", db.conn)
    d2h = copies[(copies["copy_kind"] == "Device-to-Host") & _in_steps(copies["start_ns"], steps)]
    rec = host.host_syncs(ctx)
    assert rec.rule_id == "GD-HOST-SYNC" and rec.estimate and rec.how_to_fix
    assert saving > 0.01 * ctx.step_ns
    assert rec.saving_ns_per_step == pytest.approx(saving, rel=1e-9)
    assert rec.evidence[1] == (f"{len(d2h) / n:.1f} device-to-host copies/step "
                               f"({d2h['bytes'].sum() / n:.0f} bytes/step)")
    assert len(d2h) / n > 10
    blocked = (syncs["end_ns"] - syncs["start_ns"]).sum() / n
    assert rec.evidence[0].startswith(f"{len(syncs) / n:.1f} synchronizing calls/step blocking the host "
                                      f"{blocked / 1e6:.2f} ms/step: ")


def test_host_sync_idle_between_the_first_two_syncs_is_not_counted(rule_ctx):
    """Idle that begins after the window's first sync has returned and before the second one is
    called does not begin while a sync blocks the host: generate()'s first host-bound idle between
    kernels moved into that gap leaves the saving at the idle that starts inside a sync (checked
    call by call)."""
    _, _, ctx, _ = rule_ctx("trials_generate")
    syncs = ctx.api[ctx.api["name"].str.match(SYNC)].sort_values("start_ns")
    first_end, second_start = int(syncs["end_ns"].iloc[0]), int(syncs["start_ns"].iloc[1])
    assert second_start - first_end > 2
    idle = ctx.idle.copy()
    row = idle.index[idle["host_bound"] & ~idle["at_step_start"]][0]
    idle.loc[row, "start_ns"] = (first_end + second_start) // 2
    edited = dataclasses.replace(ctx, idle=idle)
    between = idle[idle["host_bound"] & ~idle["at_step_start"]]
    starts, ends = syncs["start_ns"].to_numpy(), syncs["end_ns"].to_numpy()
    t = between["start_ns"].to_numpy()[:, None]
    during = ((starts[None, :] <= t) & (t <= ends[None, :])).any(axis=1)
    assert not during[between.index.get_loc(row)]  # the moved idle starts in no sync
    assert during.any()
    saving = between.loc[during, "duration_ns"].sum() / ctx.n_steps
    assert host.host_syncs(edited).saving_ns_per_step == pytest.approx(saving, rel=1e-12)


# --- GD-PAGEABLE-COPY with a pinned rate -----------------------------------------------------------------------------


def test_pageable_copy_saving_at_the_pinned_rate_of_the_same_workload(rule_ctx):
    """input_pipeline_bad copies its batches from pageable memory; input_pipeline_good, the same
    model and batch on the same H200, from pinned memory (copies of 12 MB). With both runs' copies
    in one step list the saving is the pageable time less the same bytes at the pinned rate
    (pinned bytes / pinned time, copies of 1 MB or more: not the 4-byte .item() reads)."""
    bad_db, _, bad, _ = rule_ctx("input_pipeline_bad")
    good_db, _, good, _ = rule_ctx("input_pipeline_good")

    def copies(db):
        steps, n = _measured(db)
        m = pd.read_sql_query("SELECT m.bytes, m.duration_ns, m.src_kind, m.dst_kind, r.start_ns AS api_ns FROM memcpy m"
                              " JOIN runtime_api r ON r.correlation_id = m.correlation_id AND r.global_pid = m.global_pid",
                              db.conn)
        return m[_in_steps(m["api_ns"], steps)], n

    m_bad, n = copies(bad_db)
    m_good, _ = copies(good_db)
    pageable = m_bad[(m_bad["src_kind"] == "Pageable") | (m_bad["dst_kind"] == "Pageable")]
    pinned = m_good[(m_good["src_kind"] == "Pinned") & (m_good["bytes"] >= 1e6)]
    small = pd.concat([m_bad, m_good])
    small = small[((small["src_kind"] == "Pinned") | (small["dst_kind"] == "Pinned")) & (small["bytes"] < 1e6)]
    assert len(pinned) > 0 and len(small) > 0  # .item() reads: pinned, 4 bytes, left out of the rate
    rate = pinned["bytes"].sum() / pinned["duration_ns"].sum()  # bytes per ns
    ns = pageable["duration_ns"].sum() / n
    saving = ns - pageable["bytes"].sum() / n / rate
    both = dataclasses.replace(bad, memcpy=pd.concat([bad.memcpy, good.memcpy], ignore_index=True))
    rec = host.pageable_copies(both)
    assert 0 < saving < ns
    assert rec.saving_ns_per_step == pytest.approx(saving, rel=1e-9)
    assert rec.estimate == "pageable copy time minus the same bytes at this run's pinned rate (copies of 1 MB or more)"
    assert rec.evidence[0] == (f"{len(pageable) / n:.1f} pageable copies/step, {pageable['bytes'].sum() / n / 1e6:.1f} "
                               f"MB/step, {ns / 1e6:.2f} ms/step "
                               f"({pageable['bytes'].sum() / pageable['duration_ns'].sum():.1f} GB/s)")
    # the good run alone: its pageable copies are under 1 MB per step
    assert m_good.loc[m_good["src_kind"] == "Pageable", "bytes"].sum() / n < 1e6
    assert host.pageable_copies(good) is None


def test_pageable_copies_of_exactly_1_mb_per_step_fire(rule_ctx):
    """The threshold is 1 MB of pageable copies per step, inclusive: input_pipeline_bad's batches
    (one 12 MB copy and one 512-byte copy per step, both pageable) cut to 999,488 bytes make
    exactly 1,000,000 bytes per step, and the rule fires with the whole copy time as its saving (no
    pinned copy of 1 MB or more in this run); one byte less per step and it is silent."""
    _, _, ctx, _ = rule_ctx("input_pipeline_bad")
    m = ctx.memcpy.copy()
    batch = m["bytes"] == 12582912
    assert batch.sum() == ctx.n_steps and (m.loc[m["bytes"] == 512, "src_kind"] == "Pageable").sum() == ctx.n_steps
    m.loc[batch, "bytes"] = 1_000_000 - 512
    pageable = m[(m["src_kind"] == "Pageable") | (m["dst_kind"] == "Pageable")]
    assert pageable["bytes"].sum() == 1_000_000 * ctx.n_steps
    rec = host.pageable_copies(dataclasses.replace(ctx, memcpy=m))
    assert rec is not None and rec.rule_id == "GD-PAGEABLE-COPY"
    ns = pageable["duration_ns"].sum() / ctx.n_steps
    assert rec.saving_ns_per_step == pytest.approx(ns, rel=1e-12)
    assert rec.estimate == "pageable copy time per step"
    assert rec.evidence[0].startswith(f"{len(pageable) / ctx.n_steps:.1f} pageable copies/step, 1.0 MB/step, ")
    m.loc[m.index[batch][0], "bytes"] -= 1
    assert host.pageable_copies(dataclasses.replace(ctx, memcpy=m)) is None


def test_a_pinned_copy_of_exactly_1_mb_is_in_the_pinned_rate(rule_ctx):
    """The pinned rate counts copies of 1 MB or more: with one of input_pipeline_good's 12 MB
    pinned batches cut to exactly 1,000,000 bytes (its time kept), that copy is part of the rate the
    pageable copies of input_pipeline_bad are measured against (the rate moves by several %)."""
    _, _, bad, _ = rule_ctx("input_pipeline_bad")
    _, _, good, _ = rule_ctx("input_pipeline_good")
    g = good.memcpy.copy()
    g.loc[g.index[g["bytes"] == 12582912][0], "bytes"] = 1_000_000
    m = pd.concat([bad.memcpy, g], ignore_index=True)
    pinned = m[((m["src_kind"] == "Pinned") | (m["dst_kind"] == "Pinned")) & (m["bytes"] >= 1_000_000)]
    above = pinned[pinned["bytes"] > 1_000_000]
    rate = pinned["bytes"].sum() / pinned["duration_ns"].sum()
    assert abs(rate / (above["bytes"].sum() / above["duration_ns"].sum()) - 1) > 0.02
    pageable = m[(m["src_kind"] == "Pageable") | (m["dst_kind"] == "Pageable")]
    n = bad.n_steps
    saving = pageable["duration_ns"].sum() / n - pageable["bytes"].sum() / n / rate
    rec = host.pageable_copies(dataclasses.replace(bad, memcpy=m))
    assert rec.saving_ns_per_step == pytest.approx(saving, rel=1e-12)


# --- GD-INPUT-STALL ---------------------------------------------------------------------------------------------------


def test_input_stall_evidence_is_the_mean_and_median_over_the_measured_steps(rule_ctx):
    """input_pipeline_bad (H200): per measured step the host-bound idle before its first kernel
    (0 for a step without one), mean and median, and the mean's share of the step."""
    _, _, ctx, _ = rule_ctx("input_pipeline_bad")
    per_step = []
    for step in ctx.measured_steps:
        rows = ctx.idle[(ctx.idle["step"] == step) & ctx.idle["host_bound"] & ctx.idle["at_step_start"]]
        per_step.append(float(rows["duration_ns"].sum()))
    mean, median = float(np.mean(per_step)), float(np.median(per_step))
    rec = host.input_stall(ctx)
    assert rec.saving_ns_per_step == pytest.approx(mean, rel=1e-9)
    assert rec.evidence == [f"{mean / 1e6:.2f} ms of GPU idle before each step's first kernel (mean over "
                            f"{len(per_step)} steps, median {median / 1e6:.2f} ms; {100 * mean / ctx.step_ns:.0f} % "
                            "of the step)"]
    assert rec.estimate == "mean host-bound GPU idle before each step's first kernel"
    # 10 % of the step is the threshold: at a step 10x the mean stall (a hair over) it does not fire
    assert host.input_stall(dataclasses.replace(ctx, step_ns=10 * mean * 1.001)) is None
    assert host.input_stall(dataclasses.replace(ctx, step_ns=10 * mean * 0.999)) is not None


# --- GD-UNFUSED-OPTIMIZER ---------------------------------------------------------------------------------------------


def _optimizer_kernels(db) -> tuple[pd.DataFrame, int]:
    steps, n = _measured(db)
    k = pd.read_sql_query("SELECT k.name, k.duration_ns FROM kernels k JOIN kernel_attribution a USING (kernel_id)"
                          " WHERE a.phase = 'optimizer' AND a.step IN (SELECT step FROM steps WHERE measured)", db.conn)
    return k, n


def _parameters(db) -> int:
    """The largest numel of the first argument (the parameter or state list) of the detail step's
    foreach ops: the model's parameter count."""
    rows = db.conn.execute("SELECT DISTINCT op_args FROM kernel_attribution WHERE op LIKE 'aten::\\_foreach%' ESCAPE '\\'"
                           " AND step IN (SELECT step FROM steps WHERE detail)").fetchall()
    best = 0
    for (args,) in rows:
        first = (json.loads(args).get("in") or [None])[0]
        if isinstance(first, dict):
            best = max(best, int(first.get("numel", 0)))
    return best


def test_unfused_optimizer_saving_is_the_gpu_time_less_one_fused_pass(rule_ctx):
    """GPT-2 training (H200), AdamW with foreach kernels: 124 M parameters recorded on the detail
    step; saving = optimizer kernel time per step - 7 fp32 values x 124 M at peak bandwidth."""
    db, report, ctx, _ = rule_ctx("gpt2_train_bf16")
    k, n = _optimizer_kernels(db)
    params = _parameters(db)
    assert 120e6 < params < 130e6
    gpu_ns = k["duration_ns"].sum() / n
    floor = 7 * 4 * params / report["device"]["memory_bandwidth_bytes_per_s"] * 1e9
    rec = host.unfused_optimizer(ctx)
    assert rec.saving_ns_per_step == pytest.approx(gpu_ns - floor, rel=1e-9)
    assert rec.estimate == (f"optimizer GPU time minus one fused pass (7 x 4 bytes x {params / 1e6:.1f} M parameters at "
                            "peak bandwidth)")
    assert rec.evidence[0] == f"{len(k) / n:.0f} optimizer kernels/step, {gpu_ns / 1e6:.2f} ms/step of GPU time"
    top = k.groupby("name")["duration_ns"].agg(["sum", "size"]).sort_values("sum", ascending=False).head(2)
    assert len(rec.evidence) == 3
    for line, (_, row) in zip(rec.evidence[1:], top.iterrows()):
        assert line.endswith(f": {row['sum'] / n / 1e3:.0f} µs/step ({row['size'] / n:.0f} launches)")
    assert _rec(report, "GD-UNFUSED-OPTIMIZER")["saving_ns_per_step"] == pytest.approx(gpu_ns - floor, rel=1e-9)


def test_unfused_optimizer_on_a_host_bound_step_is_its_host_time(rule_ctx, export_path):
    """Compiled BERT (H100) is overhead-bound: the fused optimizer saves the optimizer.step() host
    time (gpudiag's phase range in the raw export, median over the measured steps), scaled by
    bare / profiled step, less one launch, more than its GPU time would. Without the bare run the
    host time is as traced."""
    import sqlite3

    db, report, ctx, status = rule_ctx("zoo_bert_compile")
    steps, n = _measured(db)
    con = sqlite3.connect(export_path("zoo_bert_compile"))
    ranges = con.execute("SELECT start, end FROM NVTX_EVENTS WHERE text = 'gpudiag:phase optimizer'").fetchall()
    per_step = [sum(e - s for s, e in ranges if r.cpu_start_ns <= s < r.cpu_end_ns) for r in steps.itertuples()]
    traced = float(np.median([p for p in per_step if p]))
    inflation = _inflation(status, steps["step"].tolist())
    launch = ctx.peaks.launch_overhead_ns
    host_bare = traced * (ctx.step_ns - inflation) / ctx.step_ns - launch
    k, _ = _optimizer_kernels(db)
    gpu = k["duration_ns"].sum() / n - 7 * 4 * _parameters(db) / ctx.peaks.bandwidth * 1e9
    assert host_bare > gpu > 0
    rec = host.unfused_optimizer(ctx)
    assert rec.saving_ns_per_step == pytest.approx(host_bare, rel=1e-9)
    assert rec.estimate == (f"host-bound step: the optimizer step's host time (scaled to the run without the profiler), "
                            f"less one fused launch ({host_bare / 1e6:.2f} ms/step); by GPU time alone: optimizer GPU "
                            f"time minus one fused pass (7 x 4 bytes x {_parameters(db) / 1e6:.1f} M parameters at peak "
                            f"bandwidth), {gpu / 1e6:.2f} ms")
    # an export without gpudiag's phase ranges: the span of the optimizer's launch calls per step, median
    launches = pd.read_sql_query("SELECT a.step, a.api_start_ns FROM kernel_attribution a WHERE a.phase = 'optimizer'"
                                 " AND a.step IN (SELECT step FROM steps WHERE measured)", db.conn)
    span = float(launches.groupby("step")["api_start_ns"].agg(lambda t: t.max() - t.min()).median())
    unranged = host.unfused_optimizer(dataclasses.replace(ctx, phase_host_ns={}))
    assert unranged.saving_ns_per_step == pytest.approx(span * (ctx.step_ns - inflation) / ctx.step_ns - launch, rel=1e-9)
    traced_rec = host.unfused_optimizer(dataclasses.replace(ctx, bare_inflation_ns=None))
    assert traced_rec.saving_ns_per_step == pytest.approx(traced - launch, rel=1e-9)
    assert "(as traced (no bare run: an upper bound))" in traced_rec.estimate


def test_a_fused_optimizer_is_silent_however_many_kernels_it_launches(rule_ctx):
    """input_pipeline_good's AdamW(fused=True) launches 2 optimizer kernels per step (the fused
    Adam kernel and a step-count add): repeated to 10 per step, still no recommendation, since
    there is a fused kernel; the same 10 with the fused kernel renamed to a foreach one fire."""
    _, _, ctx, _ = rule_ctx("input_pipeline_good")
    opt = ctx.km[ctx.km["phase"] == "optimizer"]
    fused = opt["name"].str.contains("FusedAdam")
    assert fused.sum() == ctx.n_steps and len(opt) == 2 * ctx.n_steps
    km = pd.concat([ctx.km] + [opt] * 4, ignore_index=True)
    assert (km["phase"] == "optimizer").sum() == 10 * ctx.n_steps
    assert host.unfused_optimizer(dataclasses.replace(ctx, km=km)) is None
    renamed = km.copy()
    renamed.loc[renamed["name"].str.contains("FusedAdam"), "name"] = opt.loc[~fused, "name"].iloc[0]
    rec = host.unfused_optimizer(dataclasses.replace(ctx, km=renamed))
    assert rec.evidence[0].startswith("10 optimizer kernels/step, ")


# --- the registry ------------------------------------------------------------------------------------------------------


def test_a_failing_rule_is_listed_and_the_others_still_run(rule_ctx, monkeypatch):
    """A rule that raises on an export goes to ``suppressed`` with the exception, and every other
    rule's recommendation is as without it."""
    _, _, ctx, _ = rule_ctx("input_pipeline_bad")
    shown, suppressed = registry.recommend_split(ctx)

    def broken_rule(_ctx):
        raise ValueError("no such column")

    monkeypatch.setattr(registry, "RULES", (broken_rule, *registry.RULES))
    shown2, suppressed2 = registry.recommend_split(ctx)
    assert shown2 == shown
    failed = {"rule": "broken_rule", "rule_id": None, "saving_ns_per_step": 0.0,
              "suppressed_because": "the rule failed on this export: ValueError: no such column"}
    assert failed in suppressed2 and [r for r in suppressed2 if r != failed] == suppressed


def test_every_rule_sees_the_context_and_its_rows_carry_the_share_of_the_step(rule_ctx):
    """input_pipeline_bad (H200): the rows are the rules' recommendations with their function name
    and the saving as a share of the step; none is lost between the rules and the lists."""
    from gpudiag.analysis.rules.base import Recommendation

    _, _, ctx, _ = rule_ctx("input_pipeline_bad")
    shown, suppressed = registry.recommend_split(ctx)
    expected = {}
    for rule in registry.RULES:
        rec = rule(ctx)
        if isinstance(rec, Recommendation):
            expected[rule.__name__] = rec
    rows = {r["rule"]: r for r in shown + suppressed}
    assert set(rows) == set(expected) and len(rows) == len(shown) + len(suppressed)
    for name, rec in expected.items():
        row = rows[name]
        assert row["rule_id"] == rec.rule_id and row["saving_ns_per_step"] == rec.saving_ns_per_step
        assert row["saving_percent_of_step"] == pytest.approx(100 * rec.saving_ns_per_step / ctx.step_ns, rel=1e-12)
        quiet = rec.saving_estimated and rec.saving_ns_per_step < registry.SILENT_SHARE * ctx.step_ns
        assert (row in suppressed) == quiet
        if quiet:
            assert row["suppressed_because"] == (f"estimated saving {rec.saving_ns_per_step / 1e6:.3f} ms/step, under "
                                                 "0.5% of the step")
    assert {"GD-INPUT-STALL", "GD-PAGEABLE-COPY"} <= {r["rule_id"] for r in shown}
    assert "GD-HOST-SYNC" in {r["rule_id"] for r in suppressed}
    assert registry.recommend(ctx) == shown


@pytest.mark.parametrize("step_ns", [0.0, -1.0])
def test_no_rule_runs_without_a_step_length(rule_ctx, step_ns):
    """A broken export with no step length (0, or an end before the start): no share of the step
    to judge a saving by, so no rule runs."""
    _, _, ctx, _ = rule_ctx("input_pipeline_bad")
    assert registry.recommend_split(dataclasses.replace(ctx, step_ns=step_ns)) == ([], [])


# --- kernel rules ------------------------------------------------------------------------------------------------------

# NVIDIA H100 Tensor Core GPU datasheet (SXM5), dense peaks: FP32 67 TFLOPS, TF32 494.7, BF16 989.4.
H100_FP32, H100_TF32, H100_BF16 = 67e12, 494.7e12, 989.4e12


def test_fp32_matmul_saving_is_the_fp32_gemm_time_on_the_bf16_roof(rule_ctx):
    """ViT training in fp32 (H100, trial fixture): compute-bound fp32 contraction kernels (math path
    and class from the run database; overhead-bound ones and the TF32 convolution left out);
    saving = their time x (1 - fp32 peak / bf16 peak) from NVIDIA's datasheet, TF32's in the estimate."""
    db, report, ctx, _ = rule_ctx("trials_vit")
    steps, n = _measured(db)
    k = pd.read_sql_query("SELECT k.duration_ns, c.family, c.math_path, c.kernel_class FROM kernels k"
                          " JOIN kernel_attribution a USING (kernel_id) JOIN kernel_class c USING (kernel_id)"
                          " WHERE a.step IN (SELECT step FROM steps WHERE measured)", db.conn)
    contraction = k[k["family"].isin(["gemm", "conv", "attention"])]
    assert contraction["math_path"].notna().all()  # shapes recorded: no path read from names
    fp32 = contraction[(contraction["math_path"] == "fp32") & (contraction["kernel_class"] == "compute")]
    assert ((contraction["math_path"] == "fp32") & (contraction["kernel_class"] == "overhead")).any()
    assert (contraction["math_path"] == "tf32").any()
    ns = fp32["duration_ns"].sum() / n
    rec = kernels.fp32_matmul(ctx)
    assert rec.rule_id == "GD-FP32-MATMUL"
    assert rec.saving_ns_per_step == pytest.approx(ns * (1 - H100_FP32 / H100_BF16), rel=1e-6)
    assert rec.estimate == (f"compute-bound fp32 GEMM/conv time x (1 - fp32 peak / bf16 peak = {H100_FP32 / H100_BF16:.3f});"
                            f" TF32 would give {ns * (1 - H100_FP32 / H100_TF32) / 1e6:.2f} ms")
    assert rec.evidence[0] == (f"{ns / 1e6:.2f} ms/step in compute-bound fp32 GEMM/conv kernels "
                               f"({100 * ns / ctx.step_ns:.0f} % of the step)")
    assert len(rec.evidence) == 4
    # under 5 % of the step it is silent; an inference step gets GD-HALF-WEIGHTS instead
    assert kernels.fp32_matmul(dataclasses.replace(ctx, step_ns=ns / 0.05 * 1.001)) is None
    assert kernels.fp32_matmul(dataclasses.replace(ctx, step_ns=ns / 0.05 * 0.999)) is not None
    assert kernels.fp32_matmul(dataclasses.replace(ctx, inference={"step_mode": "request"})) is None
    assert _rec(report, "GD-FP32-MATMUL")["saving_ns_per_step"] == pytest.approx(rec.saving_ns_per_step, rel=1e-12)


def test_fp32_matmul_is_silent_on_a_bf16_run(rule_ctx):
    """ViT under bf16 autocast (H100, zoo): its contractions run on the bf16 path."""
    _, _, ctx, _ = rule_ctx("zoo_vit")
    assert kernels.fp32_matmul(ctx) is None


def test_unfused_attention_saving_is_the_softmax_time_of_the_attention_modules(rule_ctx):
    """Swin-T (H200): timm's WindowAttention runs q @ k, softmax (an nn.Softmax child) and @ v in
    each of its 2 + 2 + 6 + 2 = 12 blocks. Saving: per step, the kernels of the softmax
    configurations launched in those modules on the detail step plus the softmax backward ones."""
    db, _, ctx, _ = rule_ctx("swin_t_train_bf16")
    steps, n = _measured(db)
    depths = (2, 2, 6, 2)  # Swin-T (Liu et al. 2021, table 1 / timm's swin_tiny_patch4_window7_224)
    expected = {f"layers.{i}.blocks.{j}.attn" for i, d in enumerate(depths) for j in range(d)}
    rows = pd.read_sql_query("SELECT a.op, a.module, c.config_key FROM kernel_attribution a JOIN kernel_class c"
                             " USING (kernel_id) WHERE a.step IN (SELECT step FROM steps WHERE detail)", db.conn)
    forward = rows[(rows["op"] == "aten::_softmax") & rows["module"].str.rsplit(".", n=1).str[0].isin(expected)]
    configs = set(forward["config_key"]) | set(rows.loc[rows["op"] == "aten::_softmax_backward_data", "config_key"])
    assert len(set(forward["module"])) == 12
    k = pd.read_sql_query("SELECT c.config_key, k.duration_ns FROM kernels k JOIN kernel_class c USING (kernel_id)"
                          " JOIN kernel_attribution a USING (kernel_id) WHERE a.step IN (SELECT step FROM steps WHERE"
                          " measured)", db.conn)
    saving = k.loc[k["config_key"].isin(configs), "duration_ns"].sum() / n
    rec = kernels.unfused_attention(ctx)
    assert rec.saving_ns_per_step == pytest.approx(saving, rel=1e-9)
    assert rec.evidence[0] == f"12 modules, e.g. {', '.join(sorted(expected)[:3])}"
    forward = pd.read_sql_query("SELECT a.module, k.duration_ns FROM kernels k JOIN kernel_attribution a USING (kernel_id)"
                                " WHERE a.step IN (SELECT step FROM steps WHERE measured)", db.conn)
    in_modules = forward[[m in expected or any(m.startswith(e + ".") for e in expected) for m in forward["module"]]]
    assert rec.evidence[1] == (f"{in_modules['duration_ns'].sum() / n / 1e6:.2f} ms/step of forward kernels in them, "
                               f"{saving / 1e6:.2f} ms/step in their softmax kernels")


def test_convolutions_are_not_checked_for_gemm_alignment(rule_ctx):
    """ResNet-50 under bf16 autocast (H100): its convolutions have 7 and 14 wide feature maps (not
    multiples of 8 in the shape's last place), but only GEMM ops are checked, and its one GEMM
    (the classifier, K = 2048, N = 1000) is aligned per NVIDIA's table: the rule is silent."""
    db, _, ctx, _ = rule_ctx("zoo_resnet50")
    rows = pd.read_sql_query("SELECT DISTINCT a.op, a.op_args FROM kernel_attribution a WHERE a.step IN (SELECT step FROM"
                             " steps WHERE detail) AND a.op_args IS NOT NULL", db.conn)
    shapes = [json.loads(a)["in"] for a in rows.loc[rows["op"] == "aten::convolution", "op_args"]]
    assert any(s[0].startswith("bfloat16[") and s[0].split("@")[0].endswith(",7]") for s in shapes)
    gemm = rows[rows["op"].isin(["aten::mm", "aten::addmm", "aten::linear", "aten::bmm", "aten::matmul"])]
    assert len(gemm) > 0
    for args in gemm["op_args"]:
        dims = [t.split("@")[0] for t in json.loads(args)["in"] if isinstance(t, str) and "[" in t]
        assert all(int(d) % 8 == 0 for t in dims for d in t.split("[")[1].rstrip("]").split(",")[-1:])
    assert kernels.gemm_alignment(ctx) is None


def test_collective_kernels_are_taken_out_of_the_rules_kernels(rule_ctx, monkeypatch):
    """GPT DDP (two GPUs, rank 0): the rules see the kernels without NCCL's (whose small grids and
    waits are deliberate), the collectives apart, and their time per measured step (run database)."""
    db, _, ctx, _ = rule_ctx("nccl_gpt_ddp")
    steps, n = _measured(db)
    nccl = pd.read_sql_query("SELECT k.kernel_id, k.duration_ns FROM kernels k JOIN kernel_attribution a USING (kernel_id)"
                             " WHERE k.name LIKE 'ncclDevKernel%' AND a.step IN (SELECT step FROM steps WHERE measured)",
                             db.conn)
    assert len(nccl) >= n > 0
    seen = []
    monkeypatch.setattr(registry, "RULES", (lambda c: seen.append(c),))
    assert registry.recommend_split(ctx) == ([], [])
    (rules_ctx,) = seen
    assert set(rules_ctx.collectives["kernel_id"]) == set(nccl["kernel_id"])
    assert not rules_ctx.km["kernel_id"].isin(nccl["kernel_id"]).any()
    assert len(rules_ctx.km) + len(nccl) == len(ctx.km)
    assert rules_ctx.communication_ns == pytest.approx(nccl["duration_ns"].sum() / n, rel=1e-12)
    assert rules_ctx.n_steps == n and rules_ctx.step_ns == ctx.step_ns


def test_multi_stream_saving_is_the_serialized_time_above_one_towers_chain(rule_ctx):
    """towers_inference (H200): examples/towers_inference.py runs 8 independent towers (linear,
    relu, linear) over one input, then concatenates their outputs and sums them, all on one stream;
    no kernel fills the GPU's SMs. The dependency chain is therefore the slowest tower plus the cat
    and the sum; saving = the detail step's serialized kernel time minus that chain (the structure
    from the script, not from the storage addresses the rule reads)."""
    db, _, ctx, _ = rule_ctx("towers_inference")
    calls = pd.read_sql_query("SELECT a.op_call, a.op, sum(k.duration_ns) AS ns, max(k.grid_x * k.grid_y * k.grid_z)"
                              " AS blocks FROM kernels k JOIN kernel_attribution a USING (kernel_id) WHERE a.step IN"
                              " (SELECT step FROM steps WHERE detail) AND a.op_call >= 0 GROUP BY a.op_call"
                              " ORDER BY min(k.start_ns)", db.conn)
    assert calls["op"].tolist() == ["aten::linear", "aten::relu", "aten::linear"] * 8 + ["aten::cat", "aten::sum"]
    assert (calls["blocks"] < ctx.peaks.sm_count).all()
    towers = calls["ns"].iloc[:24].to_numpy().reshape(8, 3).sum(axis=1)
    chain = towers.max() + calls["ns"].iloc[24:].sum()
    serialized = calls["ns"].sum()
    assert serialized < ctx.step_ns
    rec = kernels.multi_stream(ctx)
    assert rec.saving_ns_per_step == pytest.approx(serialized - chain, rel=1e-9)
    assert rec.evidence == [f"the detail step's kernels take {serialized / 1e6:.2f} ms serialized; their dependency "
                            f"chain needs {chain / 1e6:.2f} ms", "26 op calls on 1 stream(s)"]
    # the step is the cap: at a step shorter than the serialized time the saving is the step less the chain
    short = dataclasses.replace(ctx, step_ns=float(serialized - 1000))
    assert kernels.multi_stream(short).saving_ns_per_step == pytest.approx(serialized - 1000 - chain, rel=1e-9)


@pytest.mark.parametrize("first, second", [(1.1 ** 144 * 1.09, 1.1 ** 144 * 1.01), (0.0, 0.4)])
def test_rank_breaks_ties_by_the_rule_list_not_the_input_order(first, second):
    """Savings in one step of the log scale (or both under 1 ns) rank in RULES order, whatever order
    the rows come in: input_stall's row first, fp32_matmul's (earlier in RULES) must still lead."""
    order = {rule.__name__: i for i, rule in enumerate(registry.RULES)}
    assert order["fp32_matmul"] < order["input_stall"]
    recs = [{"rule": "input_stall", "saving_ns_per_step": first}, {"rule": "fp32_matmul", "saving_ns_per_step": second}]
    assert [r["rule"] for r in registry.rank(recs, order)] == ["fp32_matmul", "input_stall"]
    assert [r["rule"] for r in registry.rank(recs)] == ["input_stall", "fp32_matmul"]  # no order: stable


def test_fp8_inference_counts_only_16_bit_contractions(rule_ctx):
    """ViT inference under bf16 autocast (H100, zoo): the rule's time is the bf16/fp16 GEMM/conv/
    attention kernels per step (the run's bf16 element-wise and other kernels are not GEMMs); saving =
    that time x (1 - bf16 peak / fp8 peak), NVIDIA's H100 SXM datasheet: 989.4 and 1978.9 TFLOPS."""
    db, _, ctx, _ = rule_ctx("zoo_vit")
    steps, n = _measured(db)
    k = pd.read_sql_query("SELECT k.duration_ns, c.family, c.math_path FROM kernels k JOIN kernel_attribution a"
                          " USING (kernel_id) JOIN kernel_class c USING (kernel_id) WHERE a.step IN (SELECT step FROM"
                          " steps WHERE measured)", db.conn)
    sixteen = k["math_path"].isin(["bf16", "fp16"])
    contraction = k["family"].isin(["gemm", "conv", "attention"])
    assert (sixteen & ~contraction).any()
    ns = k.loc[sixteen & contraction, "duration_ns"].sum() / n
    fires = ns >= 0.5 * ctx.step_ns
    assert (kernels.inference_quantization(ctx) is not None) == fires
    at = dataclasses.replace(ctx, step_ns=ns / 0.5 * 0.999)
    rec = kernels.inference_quantization(at)
    assert rec.saving_ns_per_step == pytest.approx(ns * (1 - 989.4 / 1978.9), rel=1e-6)
    assert rec.evidence[0] == f"{ns / 1e6:.2f} ms/step in bf16/fp16 contractions ({100 * ns / at.step_ns:.0f} % of the step)"
    assert kernels.inference_quantization(dataclasses.replace(ctx, step_ns=ns / 0.5 * 1.001)) is None


def test_gemm_alignment_evidence_shows_the_window_attention_bmms(rule_ctx):
    """Swin-T (H200): the misaligned GEMMs are the window attention's bmm calls (7 x 7 = 49 tokens:
    q @ k^T has N = 49, attn @ v has K = 49; NVIDIA's table: multiples of 8 for bf16). The
    evidence lists the first three distinct such calls of the detail step with their operands."""
    db, _, ctx, _ = rule_ctx("swin_t_train_bf16")
    rows = pd.read_sql_query("SELECT a.op, a.op_args FROM kernels k JOIN kernel_attribution a USING (kernel_id) WHERE"
                             " a.step IN (SELECT step FROM steps WHERE detail) AND a.op IN ('aten::mm', 'aten::bmm',"
                             " 'aten::addmm', 'aten::linear') ORDER BY k.start_ns", db.conn)

    def dims(op: str, args: str) -> list[str]:
        tensors = [t.split("@")[0] for t in json.loads(args)["in"] if isinstance(t, str) and "[" in t]
        a, b = tensors[-2:] if op == "aten::addmm" else tensors[:2]
        shape_a = [int(x) for x in a.split("[")[1].rstrip("]").split(",")]
        shape_b = [int(x) for x in b.split("[")[1].rstrip("]").split(",")]
        k, n = shape_a[-1], shape_b[-2] if op == "aten::linear" else shape_b[-1]
        return [f"{label}={v}" for label, v in (("K", k), ("N", n)) if v % 8]

    bad = rows.assign(dims=[dims(o, a) for o, a in zip(rows["op"], rows["op_args"])])
    bad = bad[bad["dims"].str.len() > 0].drop_duplicates("op_args").head(3)
    assert set(bad["op"]) == {"aten::bmm"} and {d for ds in bad["dims"] for d in ds} == {"K=49", "N=49"}
    rec = kernels.gemm_alignment(ctx)
    assert rec.evidence[1:4] == [f"{o} {json.loads(a)['in'][:3]} ({', '.join(d)})"
                                 for o, a, d in zip(bad["op"], bad["op_args"], bad["dims"])]
    assert rec.rule_id == "GD-GEMM-ALIGN" and rec.how_to_fix and rec.title


@pytest.mark.parametrize("name, fires", [("zoo_llama", True), ("zoo_resnet50", False), ("swin_t_train_bf16", False)])
def test_unfused_norm_counts_norm_modules_without_a_norm_kernel(rule_ctx, name, fires):
    """A normalization module is unfused when it launches 3 or more kernels per step and none of
    them is a normalization kernel: Llama's RMSNorm written op by op (H100) is; ResNet-50's
    BatchNorm2d (4 kernels per call, one of them cuDNN's batch norm) and Swin's LayerNorm are not.
    Per module from the run database."""
    db, _, ctx, _ = rule_ctx(name)
    steps, n = _measured(db)
    k = pd.read_sql_query("SELECT a.module, a.module_class, c.family FROM kernels k JOIN kernel_attribution a USING"
                          " (kernel_id) JOIN kernel_class c USING (kernel_id) WHERE a.step IN (SELECT step FROM steps"
                          " WHERE measured)", db.conn)
    norms = k[k["module_class"].fillna("").str.contains(r"Norm(?:\d*d)?$")]
    per = norms.groupby("module").agg(kernels=("family", "size"), fused=("family", lambda f: (f == "norm").any()))
    unfused = per[(per["kernels"] / n >= 3) & ~per["fused"]]
    assert len(per) > 0 and ((per["kernels"] / n >= 3) & per["fused"]).any() != fires
    rec = kernels.unfused_norm(ctx)
    assert (rec is not None) == fires == (len(unfused) > 0)
    if fires:
        classes = sorted(set(norms.loc[norms["module"].isin(unfused.index), "module_class"]))
        assert rec.evidence[0].startswith(f"{len(unfused)} {', '.join(classes)} modules, "
                                          f"{unfused['kernels'].sum() / n / len(unfused):.0f} kernels per call")


def test_small_grid_evidence_is_the_time_of_the_long_kernels_on_few_blocks(rule_ctx):
    """ResNet-50 (H100, 132 SMs): the evidence's time per step of kernels over 20 µs with fewer
    blocks than half the SMs, from the kernels table."""
    db, _, ctx, _ = rule_ctx("zoo_resnet50")
    steps, n = _measured(db)
    k = pd.read_sql_query("SELECT k.duration_ns, k.grid_x, k.grid_y, k.grid_z FROM kernels k JOIN kernel_attribution a"
                          " USING (kernel_id) JOIN kernel_class c USING (kernel_id) WHERE c.kernel_class !="
                          " 'communication' AND a.step IN (SELECT step FROM steps WHERE measured)", db.conn)
    blocks = k[["grid_x", "grid_y", "grid_z"]].fillna(1).prod(axis=1)
    small = k[(blocks < 132 / 2) & (k["duration_ns"] > 20_000)]
    rec = kernels.small_grids(ctx)
    assert ctx.peaks.sm_count == 132
    assert rec.evidence[0] == (f"{small['duration_ns'].sum() / n / 1e6:.2f} ms/step in kernels over 20 µs with fewer "
                               "than 66 blocks (132 SMs)")
