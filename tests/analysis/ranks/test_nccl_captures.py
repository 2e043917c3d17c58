"""Issue 22 with real NCCL on two H100s (2026-11-25; benchmarks/zoo/run_nccl_proof.sh;
docs/ranks_proof.md, "Two GPUs, NCCL"). Captures of two data-parallel jobs, NCCL through host
memory (NCCL_P2P_DISABLE=1, as on GPUs without peer access):

- ``gpt_*``: benchmarks/zoo/ddp_train.py (GPT-2-style), the workload the transfer/wait split and
  the rules were built on;
- ``vit_*``: benchmarks/zoo/ddp_vit.py (timm ViT-B/16), held out: captured in the same call, first
  analysed after the rules were written.

``hand_*.tsv``: the same jobs changed by hand under torchrun, bare (rank 0's median step, ms).
Oracles: the NCCL kernels' own timestamps paired by call order in SQL (not by gpudiag's overlap
pairing), and the hand-made measurements."""

from __future__ import annotations

import csv
import json
import lzma
import shutil
import sqlite3
from pathlib import Path

import pytest

from gpudiag.analysis.rules.registry import SILENT_SHARE
from gpudiag.analysis.ingest import ingest
from gpudiag.analysis.pipeline import analyse

from conftest import FIXTURES

NCCL = FIXTURES / "nccl"


def _hand(script: str) -> dict[str, float]:
    with open(NCCL / f"hand_{script}.tsv") as f:
        return {row[0]: float(row[3]) for row in csv.reader(f, delimiter="\t")}


@pytest.fixture(scope="module")
def nccl_run(tmp_path_factory):
    """name -> (export path, report), analysed once per module."""
    cache = {}

    def get(name: str):
        if name not in cache:
            folder = tmp_path_factory.mktemp(name)
            export = folder / "profile.sqlite"
            with lzma.open(NCCL / name / "profile.sqlite.xz") as src, open(export, "wb") as dst:
                shutil.copyfileobj(src, dst)
            status = json.loads((NCCL / name / "script_status.json").read_text())
            status["bare_run"] = json.loads((NCCL / name / "bare_status.json").read_text())
            cache[name] = export, analyse(ingest(export, folder / "run.sqlite"), status=status, rank_workers=1)
        return cache[name]

    return get


def _nccl_calls(export: Path) -> dict[int, list[tuple[int, int]]]:
    """(start, end) ns of each NCCL kernel, per OS pid, in launch order."""
    with sqlite3.connect(export) as db:
        rows = db.execute("SELECT (k.globalPid >> 24) & 16777215, k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                          "JOIN StringIds s ON k.demangledName = s.id WHERE s.value LIKE 'ncclDevKernel%' "
                          "ORDER BY k.correlationId").fetchall()
    calls: dict[int, list] = {}
    for pid, start, end in rows:
        calls.setdefault(pid, []).append((start, end))
    return calls


def test_transfer_is_the_part_after_the_last_rank_arrives(nccl_run):
    """DDP's all-reduces, the k-th call of each rank paired by launch order: the transfer part of
    the pair is end - the later start, the rest wait. The ranks move the same bytes, so their
    transfer per step agrees; which rank waits is what names the straggler."""
    export, report = nccl_run("gpt_ddp_shm")
    calls = _nccl_calls(export)
    (a, first), (b, second) = calls.items()
    assert len(first) == len(second)
    wait = {a: 0, b: 0}
    transfer = {a: 0, b: 0}
    for (s0, e0), (s1, e1) in zip(first, second):
        assert s0 < e1 and s1 < e0  # the same call overlaps on both ranks
        arrival = max(s0, s1)
        wait[a] += arrival - s0
        wait[b] += arrival - s1
        transfer[a] += e0 - arrival
        transfer[b] += e1 - arrival
    rows = {r["pid"]: r for r in report["ranks"]["ranks"]}
    assert set(rows) == {a, b}
    assert transfer[a] == pytest.approx(transfer[b], rel=0.1)
    comm = report["communication"]
    assert comm["kernel_ns_per_step"] == pytest.approx(comm["transfer_ns_per_step"] + comm["wait_ns_per_step"])
    assert comm["exposed_transfer_ns_per_step"] <= comm["transfer_ns_per_step"] + 1
    late = min(wait, key=wait.get)
    named = report["ranks"]["straggler"]
    assert named["collective_waits"] and named["pid"] == late
    assert f"rank {rows[late]['rank']}" in named["text"] and "wait" in named["text"]
    # the report covers the rank the others wait for, not the one spinning longest in NCCL
    assert any(f"pid {late}," in w for w in report["warnings"])


@pytest.mark.parametrize("name, script", [("gpt_fsdp_shm", "ddp_train"), ("vit_fsdp_shm", "ddp_vit")])
def test_fsdp_reshard_predicts_the_hand_made_change(nccl_run, name, script):
    """GD-FSDP-RESHARD against reshard_after_forward=False made by hand (bare, rank 0), as shares
    of the step (gpudiag's bare step and the hand-made baseline are different processes): within
    25 % of the measured share (issue 24's tolerance for a predicted saving). The report covers the
    rank the others wait for; GPT-2 12.5 % against 13.0 %, ViT-B (held out) 16.0 % against 12.9 %."""
    _, report = nccl_run(name)
    hand = _hand(script)
    measured = 100 * (hand["fsdp"] - hand["fsdp_noreshard"]) / hand["fsdp"]
    rec = next(r for r in report["recommendations"] if r["rule_id"] == "GD-FSDP-RESHARD")
    bare = report["representativeness"]["bare_step_time_ns"]
    predicted = 100 * rec["saving_ns_per_step"] / bare
    assert measured > 5 and abs(predicted - measured) < 0.25 * measured, (predicted, measured)
    assert "host-bound" in rec["estimate"] and any("GiB more memory" in e for e in rec["evidence"])


@pytest.mark.parametrize("name, script", [("gpt_accum_shm", "ddp_train"), ("vit_accum_shm", "ddp_vit")])
def test_no_sync_is_silent_where_it_saves_nothing(nccl_run, name, script):
    """4 micro-batches per step, each all-reducing: no_sync() made by hand saved nothing (within
    2 %) on these host-bound steps, and GD-DDP-NO-SYNC's saving is under the silent share."""
    _, report = nccl_run(name)
    hand = _hand(script)
    assert abs(hand["accum4"] - hand["accum4_nosync"]) < 0.02 * hand["accum4"]
    rec = next(r for r in report["recommendations"] + report["suppressed"] if r["rule_id"] == "GD-DDP-NO-SYNC")
    assert rec["saving_ns_per_step"] < SILENT_SHARE * report["steps"]["step_time_ns"]["median"]
    assert "host-bound" in rec["estimate"]


def test_fsdp_settings_recorded_on_the_device():
    """ddp_vit.py shards its 12 blocks and the model: 13 units with the default reshard."""
    for rank in json.loads((NCCL / "vit_fsdp_shm" / "script_status.json").read_text())["ranks"]:
        assert rank["fsdp"]["units"] == 13 and rank["fsdp"]["reshard_after_forward"] == [True]
        assert rank["ddp"] is None and rank["world_size"] == 2


def test_trials_under_the_launcher_on_two_gpus():
    """`gpudiag profile --nproc-per-node 2 ddp_vit.py` with its default trials (NCCL over NVLink):
    both trials ran in both ranks and were measured; a trial's step k is its slowest rank's (an
    oracle written here); both changes made the job slower, as the same changes made by hand did."""
    from gpudiag.trials import results

    folder = NCCL / "vit_ddp_trials"
    with lzma.open(folder / "report.json.xz", "rt") as f:
        trials = {t["change"]: t for t in json.load(f)["trials"]}
    assert set(trials) == {"compile", "fused-optimizer"}
    hand = {row[0]: float(row[3]) for row in csv.reader(open(folder / "hand.tsv"), delimiter="\t")}
    for change, flag in (("compile", "compile"), ("fused-optimizer", "fused")):
        record = json.loads((folder / f"trial_{change}.json").read_text())
        assert [r["rank"] for r in record["ranks"]] == [0, 1]
        assert all(r["trial"]["applied"] for r in record["ranks"])
        view = results.job_view(record)
        for k, ns in view.step_wall_ns.items():
            assert ns == max(float(r["step_wall_ns"][k]) for r in record["ranks"])
        assert trials[change]["status"] == "measured" and trials[change]["saving_ns"] < 0
        assert hand[flag] > hand["base"]


def test_ranks_whose_collectives_barely_wait_are_balanced():
    """The waits path of the straggler table: ranks whose collectives wait for each other less
    than LOCKSTEP of the step are balanced (no straggler, no cause); more, and the rank that waits
    least is named."""
    from gpudiag.analysis.ranks.processes import LOCKSTEP, _straggler

    step = 30e6
    rows = [{"global_pid": p, "pid": p, "device_id": p, "rank": p, "step_time_ns_median": step,
             "slower_than_fastest_percent": 0.0} for p in (0, 1)]

    def report(wait):
        return {"communication": {"wait_ns_per_step": wait, "exposed_ns_per_step": wait},
                "per_step_metrics": [{"busy_ns": 10e6}], "idle": {"step_start_idle_ns_per_step": 0.0}}

    near = _straggler(rows, step, {0: report(1e6), 1: report(1e6 + 0.9 * LOCKSTEP * step)})
    assert near["balanced"] and near["collective_waits"] and "why" not in near
    far = _straggler(rows, step, {0: report(1e6), 1: report(1e6 + 2 * LOCKSTEP * step)})
    assert not far.get("balanced") and far["rank"] == 0 and far["waited_for_ns"] == pytest.approx(2 * LOCKSTEP * step)
