"""``gpudiag gate`` and ``gpudiag baseline save`` on real captures: two runs of the same code pass,
a real regression (no autocast) and a synthetic one (one kernel family slowed in a copy of a real
export) fail, and every output format carries the verdict."""

from __future__ import annotations

import json
import shutil
import sqlite3
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from gpudiag.analysis.gate import GateConfig, GateError, Metric, compare, config_from_table, metrics_from_report
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
    annotations = [line for line in gh.output.splitlines() if line.startswith("::")]
    # one summary, then the largest few: GitHub shows 10 per step
    assert annotations[0].startswith("::error title=gpudiag gate::regression: ") and len(annotations) <= 6
    assert any(line.startswith("::error title=gpudiag gate::family:norm: ") and line.endswith(" regression")
               for line in annotations[1:])
    assert "| `family:norm` |" in summary.read_text()


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_the_piped_gate_reads_whole_at_any_width(runs, columns, monkeypatch):
    """A CI log (not a terminal): every row's name, numbers, p-value and verdict whole, at 60, 80
    and 200 columns, checked against the JSON result of the same comparison."""
    base, cur = runs["swin_t_train_bf16"], runs["slowed"]
    monkeypatch.setenv("COLUMNS", str(columns))
    text = invoke("gate", base, cur).output
    assert "…" not in text
    metrics = json.loads(invoke("gate", base, cur, "--format", "json").output)["metrics"]
    for m in metrics:
        if m["verdict"] == "regression":
            line = next(line for line in text.splitlines() if line.startswith(m["name"] + ": "))
            assert line.endswith(" regression") and f"p={m['p_value']:.3g}" in line


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
    not_reported = tmp_path / "not_reported"
    not_reported.mkdir()
    result = invoke("gate", not_reported, runs["swin_t_train_bf16"])
    assert result.exit_code == 3 and f"run 'gpudiag report {not_reported}' first" in result.output
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


def test_a_missing_path_is_a_usage_error(runs, tmp_path):
    """Exit 2, as the README reserves it for usage errors, with one line naming the file."""
    missing = tmp_path / "perf" / "baseline.json"
    for args in ((missing, runs["swin_t_train_bf16"]), (runs["swin_t_train_bf16"], missing)):
        result = invoke("gate", *args)
        assert result.exit_code == 2
        assert result.output == f"Error: {missing}: no such file or directory; pass a run directory, a report.json or a baseline file\n"
    assert invoke("baseline", "save", missing).exit_code == 2


def test_an_unreadable_file_is_a_usage_error(runs, tmp_path, monkeypatch):
    locked = tmp_path / "report.json"
    locked.write_text("{}")
    real_read = Path.read_text

    def read_text(self, *args, **kwargs):  # chmod 0 does not stop root, who may run the tests
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    result = invoke("gate", locked, runs["swin_t_train_bf16"])
    assert result.exit_code == 2 and f"{locked}: cannot be read" in result.output


def test_gate_metrics_mean_what_the_report_shows(runs):
    """gpu_busy_time and overhead_time are the per-step times behind the report's GPU busy % and
    its overhead breakdown (the gate compares medians, the report shows the mean step)."""
    report = json.loads((runs["swin_t_train_bf16"] / "report.json").read_text())
    metrics = metrics_from_report(report)
    assert "gpu_busy" not in metrics and "overhead_percent" not in metrics
    measured = [s for s in report["steps"]["per_step"] if s["measured"]]
    assert metrics["gpu_busy_time"].unit == "ns" and metrics["overhead_time"].unit == "ns"
    assert metrics["overhead_time"].samples == pytest.approx([s["overhead_ns"] for s in measured])
    busy, step = sum(metrics["gpu_busy_time"].samples), sum(metrics["step_time"].samples)
    assert 100 * busy / step == pytest.approx(report["gpu_busy_percent"])
    assert np.mean(metrics["overhead_time"].samples) == pytest.approx(report["breakdown_ns_per_step"]["overhead_ns"])


def old_baseline(path, new: dict) -> None:
    """``new`` (a baseline file's content) as gpudiag wrote it before the rename: gpu_busy (ns) and
    overhead_percent (of each step)."""
    old = json.loads(json.dumps(new))
    metrics = old["metrics"]
    metrics["gpu_busy"] = metrics.pop("gpu_busy_time")
    overhead, steps = metrics.pop("overhead_time"), metrics["step_time"]["samples"]
    metrics["overhead_percent"] = {"unit": "percent", "direction": "lower",
                                   "samples": [100 * o / t for o, t in zip(overhead["samples"], steps)]}
    path.write_text(json.dumps(old))


def test_a_baseline_with_the_old_metric_names_still_compares(runs, tmp_path):
    baseline = tmp_path / "baseline.json"
    assert invoke("baseline", "save", runs["swin_t_train_bf16"], "-o", baseline).exit_code == 0
    old = tmp_path / "old.json"
    old_baseline(old, json.loads(baseline.read_text()))
    now = {m["name"]: m for m in json.loads(invoke("gate", baseline, runs["swin_t_train_bf16_repeat"], "--format", "json").output)["metrics"]}
    result = invoke("gate", old, runs["swin_t_train_bf16_repeat"], "--format", "json")
    assert result.exit_code == 0, result.output
    before = {m["name"]: m for m in json.loads(result.output)["metrics"]}
    assert set(before) == set(now)
    for name in ("gpu_busy_time", "overhead_time"):
        assert before[name]["verdict"] == now[name]["verdict"] != "new"
        assert before[name]["baseline_median"] == pytest.approx(now[name]["baseline_median"])
    broken = json.loads(old.read_text())
    del broken["metrics"]["step_time"]
    old.write_text(json.dumps(broken))
    refused = invoke("gate", old, runs["swin_t_train_bf16_repeat"])
    assert refused.exit_code == 3
    assert refused.output == (f"Error: {old}: its overhead_percent cannot be converted to overhead_time (no step times); "
                              "re-create it with 'gpudiag baseline save RUN'\n")


def test_old_metric_names_in_the_configuration(tmp_path):
    table = {"threshold": {"gpu_busy": 0.5, "overhead_percent": 0.3}, "ignore": ["overhead_percent"]}
    config = config_from_table(table, "pyproject.toml")
    assert config.threshold("gpu_busy_time") == 0.5 and config.threshold("overhead_time") == 0.3
    assert config.ignored("overhead_time")
    with pytest.raises(GateError, match="noise_floor.overhead_percent: the gate now compares overhead_time"):
        config_from_table({"noise_floor": {"overhead_percent": 2}}, "pyproject.toml")


def test_peak_memory_is_gated(runs, tmp_path):
    """Recorded by gpudiag profile's launcher, peak memory is gated like the other metrics (5 %,
    2 MiB floor): 10 % more in every step is a regression."""
    report = json.loads((runs["swin_t_train_bf16_repeat"] / "report.json").read_text())
    for step in report["per_step_metrics"]:
        step["peak_memory_bytes"] *= 1.10
    grown = tmp_path / "grown.json"
    grown.write_text(json.dumps(report))
    result = invoke("gate", runs["swin_t_train_bf16"], grown, "--format", "json")
    assert result.exit_code == 1
    verdicts = {m["name"]: m["verdict"] for m in json.loads(result.output)["metrics"]}
    assert verdicts["peak_memory"] == "regression" and verdicts["step_time"] == "ok"


_STEADY = [100e6] * 4 + [101e6] * 3  # a baseline with a little spread
_NOISY_A = [80e6, 140e6, 80e6, 140e6, 80e6, 140e6, 80e6]  # median 80 ms, wide
_NOISY_B = [140e6, 80e6, 140e6, 140e6, 80e6, 140e6, 140e6]  # median 140 ms: large, not significant


@pytest.mark.parametrize("base,cur,direction,expected", [
    # large (past 5 % and the 20 µs floor) and significant: the direction decides
    (_STEADY, [110e6] * 7, "lower", "regression"),
    ([110e6] * 7, _STEADY, "lower", "improvement"),
    (_STEADY, [110e6] * 7, "higher", "improvement"),  # tokens/s up
    ([110e6] * 7, _STEADY, "higher", "regression"),  # tokens/s down
    # large but not significant: a warning when worse, nothing when better
    (_NOISY_A, _NOISY_B, "lower", "warning"),
    (_NOISY_B, _NOISY_A, "lower", "ok"),
    (_NOISY_B, _NOISY_A, "higher", "warning"),
    # significant but small: under the 5 % threshold
    (_STEADY, [103e6] * 7, "lower", "ok"),
    # significant and 100 % larger, but under the 20 µs absolute floor
    ([5e3] * 7, [10e3] * 7, "lower", "ok"),
])
def test_the_gate_decision_table(base, cur, direction, expected):
    """Each verdict from the three conditions of the module docstring (relative threshold, absolute
    noise floor, Mann-Whitney U significance) and the metric's direction, one row per case."""
    b = {"step_time": Metric("step_time", "ns", [float(x) for x in base], direction)}
    c = {"step_time": Metric("step_time", "ns", [float(x) for x in cur], direction)}
    (result,) = compare(b, c, GateConfig())
    assert result.verdict == expected, (result.change, result.p_value)


def test_a_baseline_keeps_every_metric_of_the_report(runs):
    """baseline_from_report, then metrics_from: the same metrics (unit, direction, statistic, samples) as
    loading the report itself, with the report's source and version."""
    from gpudiag.analysis.gate import baseline_from_report, metrics_from

    report = json.loads((runs["swin_t_train_bf16"] / "report.json").read_text())
    baseline = json.loads(json.dumps(baseline_from_report(report)))  # as written to the file
    assert baseline["source"] == report["source"] and baseline["gpudiag_version"] == report["gpudiag_version"]
    from_baseline, env_b = metrics_from(baseline, "baseline.json")
    from_report, env_r = metrics_from(report, "report.json")
    assert env_b == env_r and set(from_baseline) == set(from_report) and len(from_report) >= 3
    for name, m in from_report.items():
        b = from_baseline[name]
        assert (b.unit, b.direction, b.statistic, b.samples) == (m.unit, m.direction, m.statistic, m.samples), name


def test_a_baseline_file_keeps_each_metric_name_and_statistic():
    """A saved baseline with a p90 latency (serving) and an old name: loaded, latency_p90 still
    compares its 90th percentile (it used to come back as a median), gpu_busy is gpu_busy_time."""
    from gpudiag.analysis.gate import metrics_from

    baseline = {"gpudiag_baseline": 1, "environment": {"gpu": "NVIDIA H100 80GB HBM3"},
                "metrics": {"latency_p90": {"unit": "ns", "samples": [1.0, 2.0, 9.0], "direction": "lower",
                                            "statistic": "p90"},
                            "tokens_per_s": {"unit": "per_s", "samples": [5.0, 6.0], "direction": "higher"},
                            "gpu_busy": {"unit": "ns", "samples": [3.0, 4.0]}}}
    metrics, env = metrics_from(baseline, "baseline.json")
    assert env == {"gpu": "NVIDIA H100 80GB HBM3"}
    assert {n: (m.name, m.statistic, m.direction) for n, m in metrics.items()} == {
        "latency_p90": ("latency_p90", "p90", "lower"), "tokens_per_s": ("tokens_per_s", "median", "higher"),
        "gpu_busy_time": ("gpu_busy_time", "median", "lower")}
    assert metrics["latency_p90"].samples == [1.0, 2.0, 9.0] and metrics["gpu_busy_time"].unit == "ns"
