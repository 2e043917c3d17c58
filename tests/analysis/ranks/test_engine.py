"""Many ranks on Dask (issue 25, part 3): ``gpudiag report`` takes a job's rank exports (files, a
folder, a glob, or one export of several processes) and analyses the ranks on ``dask.distributed``,
a local cluster by default or ``--scheduler``'s.

The job is real: tests/fixtures/nccl/gpt_ddp_shm, two ranks of a DDP GPT captured under one
``nsys profile`` (one export of two processes). ``split_ranks`` (tests/multi_gpu_exports.py)
makes the same job's two single-rank exports, as ``nsys profile`` run per rank writes them. The
oracle is the existing path: the same export analysed in the local process pool, without Dask.
"""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from distributed import Client, LocalCluster
from multi_gpu_exports import split_ranks

from gpudiag.analysis.ingest import FILE_SHIFT, ingest_many
from gpudiag.analysis.ranks.comm import TRANSFER_TABLE
from gpudiag.analysis.ranks.processes import DERIVED_TABLES, os_pid, process_copy
from gpudiag.cli.main import cli
from gpudiag.store import DERIVED_TABLES as STORE_DERIVED
from gpudiag.app.options import AnalysisOptions
from gpudiag.app.inputs import AnalysisInputs
from gpudiag.app.report import ingest_and_analyse

from conftest import FIXTURES

JOB = FIXTURES / "nccl" / "gpt_ddp_shm" / "profile.sqlite.xz"


@pytest.fixture(scope="module")
def cluster():
    """A dask.distributed cluster of two worker processes, started by the test: its address."""
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0",
                      silence_logs=logging.ERROR) as local:
        yield local.scheduler_address


@pytest.fixture(scope="module")
def pool_report(tmp_path_factory):
    """The job's report made without Dask: the existing process-pool path."""
    folder = tmp_path_factory.mktemp("pool")
    return ingest_and_analyse(AnalysisInputs(JOB), folder / "run.sqlite", AnalysisOptions(steps_from=None, warmup_steps=None))


@pytest.fixture(scope="module")
def rank_exports(tmp_path_factory) -> list[Path]:
    """The job's two single-rank exports, in a folder of their own."""
    return split_ranks(JOB, tmp_path_factory.mktemp("rank_exports"))


def _report(tmp_path: Path, *args: str) -> tuple[object, dict | None]:
    """(CliRunner result, report.json or None) of ``gpudiag report ARGS -o tmp_path/out``."""
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["report", *args, "-o", str(out), "--json"])
    path = out / "report.json"
    return result, json.loads(path.read_text()) if path.exists() else None


def _without_global_pid(ranks: dict) -> dict:
    """The ranks table less the nsys process ids, which the ingest of several exports tags per file."""
    rows = [{k: v for k, v in r.items() if k != "global_pid"} for r in ranks["ranks"]]
    straggler = {k: v for k, v in (ranks["straggler"] or {}).items() if k != "global_pid"}
    return {**ranks, "ranks": rows, "straggler": straggler}


def test_scheduler_report_equals_the_process_pool_report(cluster, pool_report, tmp_path):
    """`gpudiag report --scheduler ADDRESS` on the 2-rank export: the ranks were analysed on the
    cluster (its scheduler ran the tasks), and the ranks table is the pool's: same ranks, same
    per-rank step times, same straggler."""
    result, report = _report(tmp_path, str(JOB), "--scheduler", cluster)
    assert result.exit_code == 0, result.output
    assert report["ranks"] == pool_report["ranks"]
    assert [r["step_time_ns_median"] for r in report["ranks"]["ranks"]] == \
        [r["step_time_ns_median"] for r in pool_report["ranks"]["ranks"]]
    assert report["ranks"]["straggler"]["pid"] == pool_report["ranks"]["straggler"]["pid"]
    with Client(cluster) as client:
        prefixes = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
    assert "analyse_one" in prefixes


def test_rank_exports_as_files_on_the_scheduler(cluster, pool_report, rank_exports, tmp_path):
    """The same job as two exports (one per rank): the same ranks table, the process ids aside;
    the main report is the same rank's."""
    result, report = _report(tmp_path, *map(str, rank_exports), "--scheduler", cluster)
    assert result.exit_code == 0, result.output
    assert _without_global_pid(report["ranks"]) == _without_global_pid(pool_report["ranks"])
    assert report["steps"] == pool_report["steps"]
    assert report["communication"] == pool_report["communication"]
    # the pairing stored by the job's analysis: a rank's copy holds its own kernels only
    run_db = tmp_path / "out" / "run.sqlite"
    pid = report["ranks"]["ranks"][1]["global_pid"]
    copy = process_copy(str(run_db), pid)
    assert copy.execute("SELECT COUNT(DISTINCT global_pid) FROM kernels").fetchone()[0] == 1
    assert copy.execute(f"SELECT COUNT(*) FROM {TRANSFER_TABLE}").fetchone()[0] > 0
    # the tables the job's analysis derived (schema 4: two of them codes, texts and a view) are not copied
    with sqlite3.connect(run_db) as run:
        stored = {r[0] for r in run.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    assert {f"{t}{s}" for t in STORE_DERIVED for s in ("", "_coded", "_text")} <= stored
    copied = {r[0] for r in copy.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    assert {f"{t}{s}" for t in STORE_DERIVED for s in ("", "_coded", "_text")} <= set(DERIVED_TABLES)
    assert not copied & set(DERIVED_TABLES)


def test_a_folder_and_a_glob_give_the_same_ranks(cluster, rank_exports, pool_report, tmp_path):
    """A folder of the exports (analysed on the default local Dask cluster) and a glob of them (on
    the scheduler) give the ranks table of the one export."""
    folder = rank_exports[0].parent
    result, by_folder = _report(tmp_path / "folder", str(folder))
    assert result.exit_code == 0, result.output
    result, by_glob = _report(tmp_path / "glob", str(folder / "rank*.sqlite"), "--scheduler", cluster)
    assert result.exit_code == 0, result.output
    assert by_folder["ranks"] == by_glob["ranks"]
    assert _without_global_pid(by_glob["ranks"]) == _without_global_pid(pool_report["ranks"])


def test_a_bad_scheduler_address_is_one_line(rank_exports, tmp_path):
    """No scheduler at the address: one line naming it, exit 2, no traceback, nothing written."""
    address = "tcp://127.0.0.1:9"
    result, report = _report(tmp_path, str(rank_exports[0]), str(rank_exports[1]), "--scheduler", address)
    assert result.exit_code == 2 and report is None
    assert address in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_without_dask_the_pool_analyses_and_scheduler_says_how_to_install(monkeypatch, rank_exports, pool_report,
                                                                           tmp_path):
    """Dask not installed: the ranks are analysed in the process pool all the same; --scheduler is
    one line with the install command and a non-zero exit."""
    for name in [m for m in sys.modules if m == "distributed" or m.startswith("distributed.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    result, report = _report(tmp_path / "pool", *map(str, rank_exports))
    assert result.exit_code == 0, result.output
    assert _without_global_pid(report["ranks"]) == _without_global_pid(pool_report["ranks"])
    result, report = _report(tmp_path / "scheduler", *map(str, rank_exports), "--scheduler", "tcp://127.0.0.1:9")
    assert result.exit_code == 2 and report is None and "Traceback" not in result.output
    assert 'pip install "gpudiag[ranks]"' in result.output and len(result.output.strip().splitlines()) == 1


def test_exports_that_reuse_a_pid_stay_distinct_ranks(rank_exports, tmp_path):
    """Two exports of processes with the same OS pid (one rank's export twice): two processes, each
    file's index in bits FILE_SHIFT.. of its process ids, the OS pid kept."""
    twin = shutil.copyfile(rank_exports[0], tmp_path / "twin.sqlite")
    db = ingest_many([rank_exports[0], Path(twin)], tmp_path / "run.sqlite")
    pids = [r[0] for r in db.conn.execute("SELECT DISTINCT global_pid FROM kernels ORDER BY global_pid")]
    assert len(pids) == 2 and pids[1] - pids[0] == 1 << FILE_SHIFT and os_pid(pids[0]) == os_pid(pids[1])
    tids = db.conn.execute("SELECT COUNT(DISTINCT global_tid >> 52) FROM runtime_api").fetchone()[0]
    assert tids == 2
    db.conn.close()


def test_a_ranks_copy_holds_its_rows_and_the_collectives(rank_exports, tmp_path):
    """The in-memory copy a worker analyses, of a run database without the stored pairing: one
    process's rows, plus the other ranks' collective kernels only (what the transfer/wait split pairs)."""
    db = ingest_many(rank_exports, tmp_path / "run.sqlite")
    db.conn.close()
    run = sqlite3.connect(tmp_path / "run.sqlite")
    pids = [r[0] for r in run.execute("SELECT DISTINCT global_pid FROM kernels ORDER BY global_pid")]
    copy = process_copy(str(tmp_path / "run.sqlite"), pids[0])
    own = run.execute("SELECT COUNT(*) FROM kernels WHERE global_pid = ?", (pids[0],)).fetchone()[0]
    others = copy.execute("SELECT name FROM kernels WHERE global_pid != ?", (pids[0],)).fetchall()
    assert copy.execute("SELECT COUNT(*) FROM kernels WHERE global_pid = ?", (pids[0],)).fetchone()[0] == own
    assert others and all(name.startswith("ncclDevKernel") for (name,) in others)
    assert copy.execute("SELECT COUNT(DISTINCT global_pid) FROM runtime_api").fetchone()[0] == 1
