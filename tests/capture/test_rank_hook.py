"""Issue 22 on CPU: the ranks a launched ``torchrun`` starts instrument themselves (gpudiag's
start-up hook, the launchers unpatched), stop after the step window, and are named by rank; a
2-rank DDP script with the gloo backend on CPU tensors, as CI can run it."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from gpudiag.analysis.ranks.processes import bare_by_rank, merged_view, status_of_process
from gpudiag.capture.instrument import CaptureConfig

pytest.importorskip("torch")

from conftest import ROOT

REPO_ROOT = ROOT

DDP = """
import torch, torch.distributed as dist
from torch import nn
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
for step in range(10000):  # a long job: the window ends it
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path: Path, config: CaptureConfig, launcher_first: bool = True,
             site: Path | None = None, body: str = DDP) -> tuple[subprocess.CompletedProcess, Path]:
    script = tmp_path / "train_ddp.py"
    script.write_text(body)
    status = tmp_path / "status.json"
    launcher = [sys.executable, "-m", "gpudiag.capture.launch", "--config", config.to_json(), "--status", str(status)]
    torchrun = ["--nproc-per-node", "2", "--master-port", str(_port())]
    cmd = (launcher + ["--module", "torch.distributed.run", *torchrun, str(script)] if launcher_first
           else [sys.executable, "-m", "torch.distributed.run", *torchrun, "-m", "gpudiag.capture.launch",
                 "--config", config.to_json(), "--status", str(status), str(script)])
    path = str(REPO_ROOT) + (f":{site}" if site else "")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": path, "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return proc, status


def test_every_rank_of_a_launched_job_is_instrumented_and_named(tmp_path):
    config = CaptureConfig(warmup_steps=2, window_steps=3, bare=True)
    proc, status_path = _torchrun(tmp_path, config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = json.loads(status_path.read_text())
    ranks = status["ranks"]
    assert [(r["rank"], r["local_rank"], r["world_size"]) for r in ranks] == [(0, 0, 2), (1, 1, 2)]
    assert len({r["pid"] for r in ranks}) == 2
    for r in ranks:
        # each rank stopped itself after 2 warm-up + 3 steps: the 10,000-step job ended, torchrun saw exit 0
        assert r["step_mode"] == "optimizer" and r["steps_completed"] == 5 and r["exception"] is None
        assert {"2", "3", "4"} <= set(r["step_wall_ns"])
    # a rank's report reads that rank's own status, and the bare run of the same rank (not pid)
    job = {**status, "bare_run": {"ranks": list(reversed(ranks))}}
    for r in ranks:
        own = status_of_process(job, pd.Series([r["pid"] << 24] * 3))
        assert own.rank == r["rank"] and own.bare_run.rank == r["rank"]
        assert own.job_status.exit_code == 0 and own.step_wall_ns == r["step_wall_ns"]
    # several processes, or one that is no rank (the launcher's own): the job's status, as it is
    assert status_of_process(job, pd.Series([ranks[0]["pid"] << 24, ranks[1]["pid"] << 24])).to_json() == job
    assert status_of_process(job, pd.Series([12345 << 24])).to_json() == job
    # each rank's bare median, as the ranks table shows it, from its own steps after the warm-up
    bare = bare_by_rank({"bare_run": status})
    for r in ranks:
        expected = statistics.median(float(v) for k, v in r["step_wall_ns"].items() if int(k) >= 2)
        assert bare[r["rank"]] == pytest.approx(expected)


def test_the_ranks_table_names_processes_by_rank(tmp_path):
    """merged_view matches the capture's processes (nsys global pid: OS pid in bits 24..47) to the
    ranks the workers recorded."""
    proc, status_path = _torchrun(tmp_path, CaptureConfig(warmup_steps=1, window_steps=2, bare=True))
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = json.loads(status_path.read_text())
    pids = {r["rank"]: r["pid"] for r in status["ranks"]}
    procs = pd.DataFrame({"global_pid": [pids[1] << 24, pids[0] << 24], "device_id": [0, 0]})
    reports = {pids[0] << 24: {"steps": {"measured": 3, "step_time_ns": {"median": 2e6, "mean": 2e6}}},
               pids[1] << 24: {"steps": {"measured": 3, "step_time_ns": {"median": 3e6, "mean": 3e6}}}}
    view = merged_view(procs, reports, status)
    assert [(r["rank"], r["pid"]) for r in view["ranks"]] == [(0, pids[0]), (1, pids[1])]
    assert view["straggler"]["rank"] == 1 and "rank 1" in view["straggler"]["text"]


def test_a_rank_that_runs_gpudiag_itself_instruments_only_itself(tmp_path):
    """``torchrun … -m gpudiag.capture.launch …``: each rank is its own launcher; no child hook (no
    ranks folder), and each rank is instrumented in-process (its own status: the last one written)."""
    proc, status_path = _torchrun(tmp_path, CaptureConfig(warmup_steps=1, window_steps=2, bare=True),
                                  launcher_first=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = json.loads(status_path.read_text())
    assert status.get("ranks") is None and status["steps_completed"] == 3
    assert not (tmp_path / "status.ranks").exists()


def test_torchrun_running_gpudiag_profile_gives_one_run_per_rank(tmp_path):
    """The second launch form: ``torchrun --nproc-per-node 2 -m gpudiag profile …``. Each rank
    writes OUT/rank<k>/ (they used to collide on OUT: "already exists"), only local rank 0 prints,
    rank 1's terminal output is kept in its terminal.log. The script is a DDP job: each of gpudiag's
    runs (bare, profiled, trial baselines, the trial) rendezvous again; on torchrun's agent store the
    second ``init_process_group`` used to wait for ever. nsys is the fake one (plumbing only)."""
    from test_run import FAKE_NSYS, SWIN_EXPORT, _executable

    fake = _executable(tmp_path / "nsys", f"#!{sys.executable}\n" + FAKE_NSYS.format(fixture=str(SWIN_EXPORT)))
    script = tmp_path / "train.py"
    script.write_text(DDP)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(_port()), "-m", "gpudiag", "profile", str(script), "-o", str(tmp_path / "out"),
                           "--nsys", str(fake), "--try", "fused-optimizer", "--steps", "3"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # every rank made the runs rank 0 made, in its order: a rank that decided on its own timings
    # to make one more run waited for ever for its rendezvous (CI, 2026-11-28)
    logs = [[(r["name"], r["kind"]) for r in json.loads((tmp_path / "out" / f"rank{k}" / "report.json").read_text())
             ["trials_budget"]["run_log"]] for k in (0, 1)]
    assert logs[0] == logs[1] and len(logs[0]) >= 3, logs
    for k in (0, 1):
        run = tmp_path / "out" / f"rank{k}"
        assert (run / "report.json").is_file()
        for name in ("bare_status.json", "script_status.json", "trial_baseline.json", "trial_fused-optimizer.json"):
            status = json.loads((run / name).read_text())
            assert status["exit_code"] == 0 and status["steps_completed"] >= 5, (k, name)
        trial = json.loads((run / "report.json").read_text())["trials"][0]
        assert trial["change"] == "fused-optimizer" and trial["status"] in ("measured", "inconclusive"), trial
    assert proc.stdout.count("report: ") == 1 and "rank0" in proc.stdout
    assert "report: " in (tmp_path / "out" / "rank1" / "terminal.log").read_text()
    assert not (tmp_path / "out" / "rank0" / "terminal.log").exists()


# A user's own sitecustomize, after gpudiag's on the path: it must still run in every rank. It
# counts the NVTX ranges each process pushes (CPU torch has no NVTX) and writes them at exit.
COUNTING_SITE = """
import atexit, collections, json, os
import torch.cuda.nvtx as nvtx
pushed = collections.Counter()
def _push(msg, *a):
    pushed[str(msg).split(" ")[0]] += 1
    return 0
nvtx.range_push = _push
nvtx.range_pop = lambda *a: 0
nvtx.range_start = lambda msg, *a: (_push(msg), 1)[1]
nvtx.range_end = lambda *a: None
atexit.register(lambda: os.environ.get("RANK") and open(os.path.join(COUNT_DIR, "pushes" + os.environ["RANK"] + ".json"),
                                                        "w").write(json.dumps(pushed)))
"""


def test_ranks_get_module_and_op_ranges_and_the_users_sitecustomize_still_runs(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"COUNT_DIR = {str(tmp_path)!r}\n" + COUNTING_SITE)
    proc, status_path = _torchrun(tmp_path, CaptureConfig(warmup_steps=1, window_steps=2), site=site)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads(status_path.read_text())["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["detail_step"] == 1 for r in ranks)
    for k in (0, 1):
        pushes = json.loads((tmp_path / f"pushes{k}.json").read_text())
        assert pushes.get("gpudiag:module", 0) >= 3 * 4  # the model and its 3 layers, in every step
        assert pushes.get("gpudiag:op", 0) > 0  # the detail step's aten ops


def test_accelerate_launch_of_one_process_instruments_its_child(tmp_path):
    """``accelerate launch`` of one process starts the script as a plain child (no RANK): as a
    known launcher module its every Python child is instrumented, named by pid."""
    pytest.importorskip("accelerate")
    script = tmp_path / "train.py"
    script.write_text("import torch\nm = torch.nn.Linear(4, 2)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "for i in range(10000):\n    loss = m(torch.randn(3, 4)).sum()\n    opt.zero_grad()\n"
                      "    loss.backward()\n    opt.step()\n")
    status = tmp_path / "status.json"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "gpudiag.capture.launch", "--config",
                           CaptureConfig(warmup_steps=2, window_steps=3, bare=True).to_json(), "--status", str(status),
                           "--module", "accelerate.commands.launch", "--num_processes", "1", "--cpu", str(script)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads(status.read_text())["ranks"]
    assert len(ranks) == 1 and ranks[0]["rank"] is None and ranks[0]["steps_completed"] == 5


def test_gloo_collectives_are_said_to_be_host_time(analysed):
    """A rank of a gloo job (its own status: world_size 2) on a real capture with no NCCL kernel:
    the report says its collectives are host time. The same capture as a single process: nothing."""
    from gpudiag.analysis.ranks.processes import host_collectives_warning
    from gpudiag.analysis.pipeline import analyse

    db, single = analysed("input_pipeline_good")
    assert single["communication"] is None
    assert host_collectives_warning({"world_size": 1}, None) is None
    assert host_collectives_warning({"world_size": 2}, {"kernel_ns_per_step": 1.0}) is None
    rank = analyse(db, status={"step_mode": "optimizer", "rank": 1, "world_size": 2, "local_rank": 1})
    assert any("collectives ran on the host (gloo" in w for w in rank["warnings"])
    assert not any("collectives ran on the host" in w for w in single["warnings"])


ACCUMULATING = DDP.replace('''    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()''', '''    opt.zero_grad()
    for micro in range(2):  # gradient accumulation over 2 micro-batches
        with model.no_sync() if NO_SYNC and micro == 0 else contextlib.nullcontext():
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
    opt.step()''')


def _accumulating_rank(tmp_path: Path, no_sync: bool) -> dict:
    body = f"import contextlib\nNO_SYNC = {no_sync}\n" + ACCUMULATING
    proc, status_path = _torchrun(tmp_path, CaptureConfig(warmup_steps=1, window_steps=2, bare=True), body=body)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(status_path.read_text())["ranks"][0]


def test_ddp_gradient_accumulation_without_no_sync_is_advised(tmp_path, analysed, export_path):
    """A gloo DDP job accumulating over 2 micro-batches: each rank records DDP's settings and 2
    backward() calls per step. On a real capture with (constructed) NCCL all-reduces, GD-DDP-NO-SYNC
    predicts half the exposed collective time (the step is GPU-bound); with no collective kernel (gloo) it fires unestimated; with
    no_sync() it does not fire."""
    from multi_gpu_exports import with_collectives

    from gpudiag.analysis.ingest import ingest
    from gpudiag.analysis.pipeline import analyse

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    rank = _accumulating_rank(tmp_path / "a", no_sync=False)
    assert rank["ddp"] == {"bucket_cap_mb": 25, "gradient_bytes": 4 * (16 * 32 + 32 + 32 * 4 + 4),
                           "find_unused_parameters": False, "static_graph": False, "no_sync_calls": 0}
    assert set(rank["backward_calls"].values()) == {2}
    status = {k: rank[k] for k in ("ddp", "backward_calls", "world_size", "rank")} | {"step_mode": "optimizer"}
    nccl = with_collectives(export_path("mlp_chain_b4096"), tmp_path / "nccl.sqlite")
    report = analyse(ingest(nccl, tmp_path / "nccl.run.sqlite"), status=status)
    rec = next(r for r in report["recommendations"] + report["suppressed"] if r["rule_id"] == "GD-DDP-NO-SYNC")
    # one process: no transfer/wait split, so the exposed communication counts; on a GPU-bound step
    assert "GPU-bound" in rec["estimate"]
    assert rec["saving_ns_per_step"] == pytest.approx(report["communication"]["exposed_ns_per_step"] / 2)
    db, _ = analysed("input_pipeline_good")
    gloo = analyse(db, status=status)
    rec = next(r for r in gloo["recommendations"] if r["rule_id"] == "GD-DDP-NO-SYNC")
    assert rec["saving_estimated"] is False and "gloo" in rec["estimate"]
    synced = _accumulating_rank(tmp_path / "b", no_sync=True)
    assert synced["ddp"]["no_sync_calls"] >= 1
    quiet = analyse(db, status={**status, "ddp": synced["ddp"]})
    assert not any(r["rule_id"] == "GD-DDP-NO-SYNC" for r in quiet["recommendations"] + quiet["suppressed"])


def test_trials_of_a_launched_job_apply_the_change_in_every_rank(tmp_path, monkeypatch):
    """Trials run under the same launcher: the change acts in the ranks (where the model and the
    optimizer are), not in torchrun's own process, and the job's step is its slowest rank's."""
    from gpudiag.trials import results
    from gpudiag.trials.runner import run_trials

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    script = tmp_path / "train_ddp.py"
    script.write_text(DDP)
    args = ["--nproc-per-node", "2", "--master-port", str(_port()), str(script)]
    config = CaptureConfig(warmup_steps=1, window_steps=3)
    lines = []
    records = run_trials("torch.distributed.run", args, tmp_path, config,
                         [{"change": "fused-optimizer", "predicted_saving_ns": 1e5, "rule_id": "GD-UNFUSED-OPTIMIZER"}],
                         {}, budget_s=150, echo=lines.append)
    (record,) = records
    # a lone change runs twice between three baselines; on 2 busy CPU cores the verdict may go either way
    assert record["status"] in ("measured", "inconclusive"), (record, lines)
    # on CPU tensors the fused form is foreach=True: applied in each rank, by rank's own SGD
    assert any("SGD" in a and "foreach=True" in a for a in record["applied"]), record["applied"]
    trial = json.loads((tmp_path / "trial_fused-optimizer.json").read_text())
    assert [r["rank"] for r in trial["ranks"]] == [0, 1]
    assert all(r["trial"]["applied"] for r in trial["ranks"])
    # the job's step k: the slowest rank's step k (an oracle written here, not job_view's code)
    view = results.job_view(trial)
    for k, ns in view.step_wall_ns.items():
        assert ns == max(float(r["step_wall_ns"][k]) for r in trial["ranks"])
    assert record["steps"] == 6 and record["trial_step_ns"] > 0 and record["baseline_step_ns"] > 0


def test_nproc_per_node_runs_the_script_under_torchrun(tmp_path):
    """``gpudiag profile --nproc-per-node 2 train.py``: the same job as ``-m torch.distributed.run
    --nproc-per-node 2 train.py``; both ranks report to the one capture's status, the bare run's too.
    nsys is the fake one (it runs the command; the export is a fixture's)."""
    from test_run import FAKE_NSYS, SWIN_EXPORT, _executable

    fake = _executable(tmp_path / "nsys", f"#!{sys.executable}\n" + FAKE_NSYS.format(fixture=str(SWIN_EXPORT)))
    script = tmp_path / "train_ddp.py"
    script.write_text(DDP)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--nproc-per-node", "2", str(script),
                           "-o", str(tmp_path / "out"), "--nsys", str(fake), "--try", "none", "--steps", "3",
                           "--no-analysis"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    status = json.loads((tmp_path / "out" / "script_status.json").read_text())
    assert [r["rank"] for r in status["ranks"]] == [0, 1]
    assert all(r["steps_completed"] == 5 for r in status["ranks"])  # 2 warm-up + 3
    assert [r["rank"] for r in status["bare_run"]["ranks"]] == [0, 1]


def test_nproc_per_node_refuses_a_launcher_as_the_target(tmp_path):
    from click.testing import CliRunner

    from gpudiag.cli.main import cli

    result = CliRunner().invoke(cli, ["profile", "--nproc-per-node", "2", "-m", "torch.distributed.run", "--", "x.py"])
    assert result.exit_code != 0 and "give the script" in result.output and "Traceback" not in result.output


FSDP = """
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
fully_shard(model[0], reshard_after_forward=False)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
for step in range(10000):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_fsdp2_settings_are_recorded_in_each_rank(tmp_path):
    """FSDP2 on CPU with gloo: each rank records its sharded units, the reshard_after_forward values
    passed (torch's default as None) and the root's unsharded parameter bytes (fp32, counted here)."""
    proc, status_path = _torchrun(tmp_path, CaptureConfig(warmup_steps=1, window_steps=2, bare=True), body=FSDP)
    if proc.returncode != 0 and "fully_shard" in proc.stderr and "not supported" in proc.stderr:
        pytest.skip("this torch's FSDP2 does not run on CPU tensors")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in json.loads(status_path.read_text())["ranks"]:
        assert rank["ddp"] is None
        assert rank["fsdp"] == {"api": "fully_shard", "units": 2, "reshard_after_forward": [False, None],
                                "cpu_offload": False, "parameter_bytes": 4 * (16 * 32 + 32 + 32 * 4 + 4)}
        assert rank["steps_completed"] == 3


def test_recording_fsdp_never_fails_the_users_call():
    """fully_shard takes a list of modules; a lazy module's parameters have no size yet: both are
    recorded or left out, never raised into the script."""
    from torch import nn

    from gpudiag.capture import ddp_watch

    saved = dict(ddp_watch._seen)
    try:
        ddp_watch._seen["fsdp"] = None
        ddp_watch._record_fsdp("fully_shard", [nn.Linear(2, 2), nn.Linear(2, 2)], None, False)
        ddp_watch._record_fsdp("fully_shard", nn.LazyLinear(3), True, False)
        assert ddp_watch.summary()["fsdp"] == {"api": "fully_shard", "units": 1, "reshard_after_forward": [None],
                                               "cpu_offload": False, "parameter_bytes": 2 * (2 * 2 + 2) * 4}
    finally:
        ddp_watch._seen.clear()
        ddp_watch._seen.update(saved)


def test_each_rank_takes_rank0s_decision_from_the_agent_store():
    """as_rank0_decides on a real TCPStore standing for torchrun's agent store: rank 0 publishes
    its own answer, rank 1 gets rank 0's whatever it decided itself, each decision once (a name
    asked again is a new decision); outside torchrun a rank keeps its own answer."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from gpudiag.capture import rank_hook

    port = _port()
    agent = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10))
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    rank_hook._runs_made.clear()
    assert rank_hook.as_rank0_decides("run3", "every change tried was decided", {**env, "RANK": "0"}) \
        == "every change tried was decided"
    assert rank_hook.as_rank0_decides("run3", "run", {**env, "RANK": "0"}) == "run"  # the next decision of that name
    rank_hook._runs_made.clear()  # rank 1's own process counts from its start
    assert rank_hook.as_rank0_decides("run3", "run", {**env, "RANK": "1"}) == "every change tried was decided"
    assert rank_hook.as_rank0_decides("run3", "skip", {**env, "RANK": "1"}) == "run"
    with pytest.raises(TimeoutError, match="rank 1: no decision from rank 0 on run4"):
        rank_hook.as_rank0_decides("run4", "run", {**env, "RANK": "1"}, timeout_s=1)
    assert rank_hook.as_rank0_decides("run3", "mine", {"RANK": "1", "WORLD_SIZE": "2"}) == "mine"
    # a JSON value: the trials rank 0 chose, whatever this rank chose from its own report
    import numpy as np

    chosen0 = [{"change": "compile", "predicted_saving_ns": np.int64(5)}, {"change": "tf32"}]
    assert rank_hook.as_rank0_has("trials-chosen", chosen0, {**env, "RANK": "0"}) is chosen0
    rank_hook._runs_made.clear()  # as rank 1's own process counts
    assert rank_hook.as_rank0_has("trials-chosen", [{"change": "tf32"}], {**env, "RANK": "1"}) == [
        {"change": "compile", "predicted_saving_ns": 5}, {"change": "tf32"}]
    del agent


# rank 0 aborts when the interpreter exits (after every atexit hook, gpudiag's status writer
# included), as a gloo rank can in torch.distributed's teardown ("terminate called without an active
# exception"); with ABORT_AT_STEP set, it aborts in that step instead, inside the window
ABORTING = """
import os
class _Abort:
    def __del__(self):
        os.abort()
if os.environ["RANK"] == "0":
    _abort_at_exit = _Abort()
""" + DDP.replace("    opt.step()\n", "    opt.step()\n    if os.environ['RANK'] == '0' and step == ABORT_AT_STEP:\n        os.abort()\n")


def test_a_rank_that_aborts_at_exit_after_its_window_does_not_fail_the_job(tmp_path):
    """torchrun reports the job failed (ChildFailedError), but every rank wrote its status with its
    window complete: the launcher keeps exit code 0 and says what happened, so a trial of such a job
    is not read as a failed run."""
    config = CaptureConfig(warmup_steps=1, window_steps=2, bare=True)
    proc, status_path = _torchrun(tmp_path, config, body="ABORT_AT_STEP = -1\n" + ABORTING)
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = json.loads(status_path.read_text())
    assert status["exit_code"] == 0 and status["exception"] is None
    assert "ChildFailedError" in status["rank_exit_after_window"]
    assert "failed at exit after gpudiag ended its script" in proc.stderr
    assert [r["window_complete"] for r in status["ranks"]] == [True, True]


def test_a_rank_that_aborts_inside_its_window_still_fails_the_job(tmp_path):
    config = CaptureConfig(warmup_steps=1, window_steps=2, bare=True)
    proc, status_path = _torchrun(tmp_path, config, body="ABORT_AT_STEP = 1\n" + ABORTING)
    assert proc.returncode != 0
    status = json.loads(status_path.read_text())
    assert status["exit_code"] == 1 and "ChildFailedError" in status["exception"]
    assert "rank_exit_after_window" not in status
