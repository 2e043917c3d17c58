"""``gpudiag gate`` and ``gpudiag baseline save`` on real captures: two runs of the same code pass,
a real regression (no autocast) and a synthetic one (one kernel family slowed in a copy of a real
export) fail, and every output format carries the verdict."""

from __future__ import annotations

import json
import shutil
import sqlite3
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from gpudiag.analysis.gate import GateConfig, Metric, compare
from gpudiag.cli.main import cli

from conftest import FIXTURES


def invoke(*args, **kwargs):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False, **kwargs)


def slow_family(export, out, name_fragment: str, factor: float) -> None:
    """Copy of ``export`` where kernels whose name contains ``name_fragment`` take ``factor`` times
    longer and all later GPU work on the (single) stream is pushed back by the added time."""
    shutil.copy(export, out)
    with sqlite3.connect(out) as conn:
        k = pd.read_sql_query("SELECT k.rowid AS rid, k.start, k.end, s.value AS name FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                              "JOIN StringIds s ON s.id = k.demangledName ORDER BY k.start", conn)
        added = np.where(k["name"].str.contains(name_fragment), (factor - 1) * (k["end"] - k["start"]), 0).astype(np.int64)
        before = np.cumsum(added) - added
        conn.executemany("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = ?, end = ? WHERE rowid = ?",
                         zip((k["start"] + before).tolist(), (k["end"] + before + added).tolist(), k["rid"].tolist()))
        total = np.cumsum(added)
        for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            rows = pd.read_sql_query(f"SELECT rowid AS rid, start, end FROM {table}", conn)
            i = np.searchsorted(k["start"].to_numpy(), rows["start"].to_numpy(), side="right") - 1
            shift = np.where(i >= 0, total[np.maximum(i, 0)], 0)
            conn.executemany(f"UPDATE {table} SET start = ?, end = ? WHERE rowid = ?",
                             zip((rows["start"] + shift).tolist(), (rows["end"] + shift).tolist(), rows["rid"].tolist()))


def run_dir(root, name, export, status_of):
    """A run directory as `gpudiag profile` leaves it (export + launcher status), then reported."""
    folder = root / name
    folder.mkdir()
    shutil.copy(export, folder / "profile.sqlite")
    shutil.copy(FIXTURES / "status" / f"{status_of}.json", folder / "script_status.json")
    assert invoke("report", folder).exit_code == 0
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory, export_path):
    """Run directories of the real captures, plus the synthetic regression."""
    root = tmp_path_factory.mktemp("gate")
    made = {name: run_dir(root, name, export_path(name), name)
            for name in ("swin_t_train_bf16", "swin_t_train_bf16_repeat", "swin_t_train_fp32")}
    slowed = root / "slowed.sqlite"
    slow_family(export_path("swin_t_train_bf16_repeat"), slowed, "layer_norm", 2.0)
    made["slowed"] = run_dir(root, "slowed", slowed, "swin_t_train_bf16_repeat")
    return made


def test_two_runs_of_the_same_code_pass(runs):
    result = invoke("gate", runs["swin_t_train_bf16"], runs["swin_t_train_bf16_repeat"], "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["verdict"] == "pass"
    assert not [m for m in data["metrics"] if m["verdict"] == "regression"]
    step = next(m for m in data["metrics"] if m["name"] == "step_time")
    assert abs(step["change"]) < 0.05
    memory = next(m for m in data["metrics"] if m["name"] == "peak_memory")  # recorded by the launcher
    assert memory["baseline_median"] > 2e9 and memory["verdict"] == "ok"


def test_slowed_kernel_family_fails(runs):
    """LayerNorm kernels (forward and backward, ~2.7 ms per 33 ms step) made 2x slower."""
    result = invoke("gate", runs["swin_t_train_bf16"], runs["slowed"], "--format", "json")
    assert result.exit_code == 1, result.output
    verdicts = {m["name"]: m for m in json.loads(result.output)["metrics"]}
    assert verdicts["family:norm"]["verdict"] == "regression"
    assert verdicts["family:norm"]["change"] > 0.5 and verdicts["family:norm"]["p_value"] < 0.01
    assert verdicts["step_time"]["verdict"] == "regression"
    assert verdicts["family:gemm"]["verdict"] == "ok"  # untouched families stay ok
    assert verdicts["kernel_launches"]["verdict"] == "ok"


def test_turning_off_autocast_is_a_regression(runs):
    result = invoke("gate", runs["swin_t_train_bf16"], runs["swin_t_train_fp32"])
    assert result.exit_code == 1
    assert "REGRESSION" in result.output and "step_time" in result.output


def test_formats(runs, tmp_path, monkeypatch):
    base, cur = runs["swin_t_train_bf16"], runs["slowed"]
    suite = ET.fromstring(invoke("gate", base, cur, "--format", "junit").output.split("?>", 1)[1])
    assert suite.tag == "testsuite" and int(suite.get("failures")) >= 2
    assert any(case.get("name") == "family:norm" and case.find("failure") is not None for case in suite)
    md = invoke("gate", base, cur, "--format", "markdown").output
    assert md.startswith("### gpudiag gate: regression") and "| `family:norm` |" in md
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    gh = invoke("gate", base, cur, "--format", "github")
    assert gh.exit_code == 1
    assert any(line.startswith("::error title=gpudiag gate::family:norm regression") for line in gh.output.splitlines())
    assert "| `family:norm` |" in summary.read_text()


def test_baseline_save_and_gate_against_it(runs, tmp_path):
    baseline = tmp_path / "perf" / "baseline.json"
    saved = invoke("baseline", "save", runs["swin_t_train_bf16"], "-o", baseline)
    assert saved.exit_code == 0 and baseline.exists()
    data = json.loads(baseline.read_text())
    assert data["gpudiag_baseline"] == 1 and len(data["metrics"]["step_time"]["samples"]) == 7
    assert data["environment"] == {"gpu": "NVIDIA H200", "driver_version": "580.159.04", "torch_version": "2.11.0+cu130"}
    assert invoke("gate", baseline, runs["swin_t_train_bf16_repeat"]).exit_code == 0
    assert invoke("gate", baseline, runs["slowed"]).exit_code == 1
    again = invoke("baseline", "save", runs["swin_t_train_bf16"], "-o", baseline)
    assert again.exit_code == 2 and "--force" in again.output


def test_different_hardware_is_not_comparable(runs, tmp_path):
    other = tmp_path / "other.json"
    report = json.loads((runs["swin_t_train_bf16_repeat"] / "report.json").read_text())
    report["device"]["name"] = "NVIDIA H100 80GB HBM3"
    other.write_text(json.dumps(report))
    refused = invoke("gate", runs["swin_t_train_bf16"], other)
    assert refused.exit_code == 3 and "not comparable: gpu: NVIDIA H200 -> NVIDIA H100 80GB HBM3" in refused.output
    assert invoke("gate", runs["swin_t_train_bf16"], other, "--allow-different-hardware").exit_code == 0


def test_configuration(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.gpudiag.gate]\nalpha = 0.01\nignore = ["module:*"]\n'
                                             '[tool.gpudiag.gate.threshold]\n"family:norm" = 5.0\nstep_time = 0.5\ngpu_busy = 0.5\n')
    relaxed = invoke("gate", runs["swin_t_train_bf16"], runs["slowed"], "--format", "json")
    assert relaxed.exit_code == 0, relaxed.output
    data = json.loads(relaxed.output)
    assert data["alpha"] == 0.01 and not any(m["name"].startswith("module:") for m in data["metrics"])
    bad = tmp_path / "bad.toml"
    bad.write_text("[tool.gpudiag.gate]\nthreshhold = 1\n")
    wrong = invoke("gate", runs["swin_t_train_bf16"], runs["slowed"], "--config", bad)
    assert wrong.exit_code == 2 and "unknown key(s) ['threshhold']" in wrong.output
    broken = tmp_path / "broken.toml"
    broken.write_text("[tool.gpudiag.gate\n")
    assert invoke("gate", runs["swin_t_train_bf16"], runs["slowed"], "--config", broken).exit_code == 2


def test_invalid_inputs_exit_3(runs, tmp_path):
    assert invoke("gate", tmp_path / "missing", runs["swin_t_train_bf16"]).exit_code == 3
    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": 1}')
    result = invoke("gate", junk, runs["swin_t_train_bf16"])
    assert result.exit_code == 3 and "neither a gpudiag report.json nor a baseline file" in result.output


def test_decision_rules_on_synthetic_samples():
    """Large and significant fails; large but noisy warns; large relative change under the
    absolute noise floor (a 5 µs kernel doubling) passes."""
    def m(name, samples, unit="ns"):
        return Metric(name, unit, [float(x) for x in samples])

    base = {"step_time": m("step_time", [100e6] * 4 + [101e6] * 3), "family:tiny": m("family:tiny", [5e3] * 7),
            "family:noisy": m("family:noisy", [1e6, 3e6, 1e6, 3e6, 1e6, 3e6, 1e6])}
    cur = {"step_time": m("step_time", [110e6] * 7), "family:tiny": m("family:tiny", [10e3] * 7),
           "family:noisy": m("family:noisy", [3e6, 1e6, 3e6, 3e6, 1e6, 3e6, 3e6])}
    verdicts = {c.name: c.verdict for c in compare(base, cur, GateConfig())}
    assert verdicts == {"step_time": "regression", "family:tiny": "ok", "family:noisy": "warning"}
