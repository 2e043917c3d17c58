"""The gate's functions on committed real reports (report.json made on H100/H200 devices, no
analysis run here: fast enough for the mutation runs, scripts/mutation.sh). Oracles: the
report's own per-step fields read here, NumPy's percentile and SciPy's Mann-Whitney U called here."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import numpy as np
import pytest

from gpudiag.analysis.gate import (DEFAULT_NOISE_FLOORS, GateConfig, GateError, Metric, compare, config_from_table,
                                   differences, environment_of, metrics_from_report, overall)

from conftest import FIXTURES

TRIALS = FIXTURES / "trials"


def _report(name: str) -> dict:
    with lzma.open(TRIALS / name / "report.json.xz", "rt") as f:
        return json.load(f)


@pytest.mark.parametrize("name", ["t5_h100", "decoder_h100", "generate_h100"])
def test_metrics_are_the_reports_per_step_fields(name):
    report = _report(name)
    steps = report["per_step_metrics"]
    m = metrics_from_report(report)
    assert m["step_time"].samples == [s["step_time_ns"] for s in steps] and m["step_time"].unit == "ns"
    assert m["gpu_busy_time"].samples == [s["busy_ns"] for s in steps]
    assert m["overhead_time"].samples == pytest.approx([(s["overhead_percent"] or 0) / 100 * s["step_time_ns"]
                                                         for s in steps])
    assert m["kernel_launches"].samples == [s["kernel_launches"] for s in steps] and m["kernel_launches"].unit == "count"
    assert m["bare_step_time"].samples == report["representativeness"]["bare_samples_ns"]
    peaks = [s.get("peak_memory_bytes") for s in steps]
    assert ("peak_memory" in m) == all(p is not None for p in peaks)
    if "peak_memory" in m:
        assert m["peak_memory"].samples == peaks and m["peak_memory"].unit == "bytes"
    families = {n for s in steps for n in s.get("families_ns", {})}
    modules = {n for s in steps for n in s.get("modules_ns", {})}
    assert {k for k in m if k.startswith("family:")} == {"family:" + n for n in families}
    assert {k for k in m if k.startswith("module:")} == {"module:" + n for n in modules}
    for n in families:
        assert m["family:" + n].samples == [s.get("families_ns", {}).get(n, 0.0) for s in steps]
    assert all(x.direction == "lower" for k, x in m.items() if k != "tokens_per_s")
    assert all(m[k].name == k for k in m)


def test_inference_metrics_of_a_generate_report():
    report = _report("decoder_h100")
    m = metrics_from_report(report)
    latency = m["latency_p90"]
    assert latency.samples == report["inference"]["latency_samples_ns"] and latency.statistic == "p90"
    tokens = m["tokens_per_s"]
    assert tokens.samples == report["inference"]["generation"]["tokens_per_s_samples"]
    assert tokens.direction == "higher" and tokens.unit == "per_s" and tokens.statistic == "median"
    assert "tokens_per_s" not in metrics_from_report(_report("serve_h100"))  # no generate(): latency only
    assert "latency_p90" not in metrics_from_report(_report("t5_h100"))      # training: neither


def test_a_report_without_steps_is_refused():
    with pytest.raises(GateError) as err:
        metrics_from_report({"per_step_metrics": []})
    assert err.value.exit_code == 3


def _scaled(metrics: dict[str, Metric], name: str, factor: float) -> dict[str, Metric]:
    m = metrics[name]
    return {**metrics, name: Metric(name, m.unit, [v * factor for v in m.samples], m.direction, m.statistic)}


def test_compare_two_real_runs():
    """The T5 run against itself: every metric ok, p = 1; its step time 20 % longer: a regression
    (p from SciPy here); 20 % shorter: an improvement; a metric on one side only: new / gone."""
    from scipy.stats import mannwhitneyu

    base = metrics_from_report(_report("t5_h100"))
    same = compare(base, base, GateConfig())
    assert {c.verdict for c in same} == {"ok"} and all(c.p_value == 1.0 and c.change == 0 for c in same)
    assert same[0].name == "bare_step_time" and not any(":" in c.name for c in same[:5])  # plain metrics first
    slower = {c.name: c for c in compare(base, _scaled(base, "step_time", 1.2), GateConfig())}
    step = slower["step_time"]
    p = mannwhitneyu(base["step_time"].samples, [v * 1.2 for v in base["step_time"].samples],
                     alternative="two-sided").pvalue
    assert step.verdict == "regression" and step.p_value == pytest.approx(p) and step.change == pytest.approx(0.2)
    assert step.baseline_median == pytest.approx(np.median(base["step_time"].samples))
    assert step.threshold == 0.05 and step.noise_floor == DEFAULT_NOISE_FLOORS["ns"]
    assert overall(list(slower.values())) == ("regression", 1)
    faster = {c.name: c for c in compare(base, _scaled(base, "step_time", 0.8), GateConfig())}
    assert faster["step_time"].verdict == "improvement" and overall(list(faster.values())) == ("pass", 0)
    fewer = {k: v for k, v in base.items() if k != "kernel_launches"}
    new = {c.name: c for c in compare(fewer, base, GateConfig())}["kernel_launches"]
    gone = {c.name: c for c in compare(base, fewer, GateConfig())}["kernel_launches"]
    assert (new.verdict, new.baseline_median, gone.verdict, gone.current_median) == ("new", None, "gone", None)
    ignored = compare(base, _scaled(base, "step_time", 1.2), GateConfig(ignore=["step_*"]))
    assert "step_time" not in {c.name for c in ignored}


def test_higher_is_better_and_percentile_statistics():
    """tokens_per_s falling is the regression; latency_p90 compares NumPy's 90th percentile."""
    report = _report("decoder_h100")
    base = metrics_from_report(report)
    fewer_tokens = {c.name: c for c in compare(base, _scaled(base, "tokens_per_s", 0.7), GateConfig())}
    assert fewer_tokens["tokens_per_s"].verdict == "regression"
    more_tokens = {c.name: c for c in compare(base, _scaled(base, "tokens_per_s", 1.3), GateConfig())}
    assert more_tokens["tokens_per_s"].verdict == "improvement"
    latency = {c.name: c for c in compare(base, base, GateConfig())}["latency_p90"]
    assert latency.baseline_median == pytest.approx(np.percentile(report["inference"]["latency_samples_ns"], 90))


def test_noise_floor_and_alpha_decide():
    """A 20 % move under the noise floor is ok; with alpha tiny the same move is only a warning."""
    base = metrics_from_report(_report("t5_h100"))
    slower = _scaled(base, "step_time", 1.2)
    floor = GateConfig(noise_floors=[("step_time", 1e12)])
    assert {c.name: c for c in compare(base, slower, floor)}["step_time"].verdict == "ok"
    strict = GateConfig(alpha=1e-9)
    assert {c.name: c for c in compare(base, slower, strict)}["step_time"].verdict == "warning"
    loose = GateConfig(thresholds=[("step_time", 0.5)])
    assert {c.name: c for c in compare(base, slower, loose)}["step_time"].verdict == "ok"


def test_configuration_table():
    cfg = config_from_table({"alpha": 0.01, "threshold": {"module:*": 0.2, "gpu_busy": 0.07},
                             "noise_floor": {"family:*": 5e4}, "ignore": ["overhead_percent", "family:nccl*"]}, "pyproject.toml")
    assert cfg.alpha == 0.01
    assert cfg.threshold("module:encoder") == 0.2 and cfg.threshold("gpu_busy_time") == 0.07
    assert cfg.threshold("step_time") == 0.05 and cfg.threshold("family:gemm") == 0.10 and cfg.threshold("x") == 0.10
    assert cfg.noise_floor("family:gemm", "ns") == 5e4 and cfg.noise_floor("step_time", "ns") == 20_000.0
    assert cfg.noise_floor("kernel_launches", "count") == 2.0 and cfg.noise_floor("z", "per_s") == 0.0
    assert cfg.ignored("overhead_time") and cfg.ignored("family:nccl_allreduce") and not cfg.ignored("step_time")
    for bad in ({"alpha": 1.5}, {"alpha": 0}, {"threshold": {"step_time": -1}}, {"alpha": "x"},
                {"threshold": 3}, {"colour": 1}, {"noise_floor": {"overhead_percent": 1}}):
        with pytest.raises(GateError) as err:
            config_from_table(bad, "pyproject.toml")
        assert err.value.exit_code == 2 and "pyproject.toml" in str(err.value)


def test_environments():
    report = _report("t5_h100")
    env = environment_of(report)
    assert env == {"gpu": report["device"]["name"], "driver_version": report["environment"]["driver_version"],
                   "torch_version": report["environment"]["torch_version"]}
    other = {**env, "gpu": "NVIDIA H200"}
    assert differences(env, other) == [f"gpu: {env['gpu']} -> NVIDIA H200"]
    assert differences(env, {**env, "gpu": None}) == [] and differences(env, env) == []


def test_units_decide_the_noise_floor():
    """Every time metric is in ns (its noise floor is the 20 µs one), launches are counts."""
    m = metrics_from_report(_report("decoder_h100"))
    for name, metric in m.items():
        expected = {"kernel_launches": "count", "peak_memory": "bytes", "tokens_per_s": "per_s"}.get(name, "ns")
        assert metric.unit == expected, name


def test_missing_per_step_values_count_as_zero():
    """A family absent from a step took no time in it; a step without an overhead share has none."""
    steps = [{"step_time_ns": 100.0, "busy_ns": 50.0, "overhead_percent": None, "kernel_launches": 3,
              "families_ns": {"gemm": 10.0}, "modules_ns": {}},
             {"step_time_ns": 200.0, "busy_ns": 60.0, "overhead_percent": 10.0, "kernel_launches": 4,
              "families_ns": {}, "modules_ns": {"encoder": 7.0}}]
    m = metrics_from_report({"per_step_metrics": steps})
    assert m["overhead_time"].samples == [0.0, 20.0]
    assert m["family:gemm"].samples == [10.0, 0.0] and m["module:encoder"].samples == [0.0, 7.0]
    assert "bare_step_time" not in m and "peak_memory" not in m and "latency_p90" not in m


def test_p_value_of_degenerate_samples():
    """One sample on a side, or the same constant on both: no test (p = 1); two different
    constants: SciPy's two-sided p-value."""
    from scipy.stats import mannwhitneyu

    from gpudiag.analysis.gate import _p_value

    assert _p_value([1.0], [1.0, 2.0, 3.0]) == 1.0 and _p_value([1.0, 2.0, 3.0], [1.0]) == 1.0
    assert _p_value([5.0] * 4, [5.0] * 4) == 1.0
    expected = mannwhitneyu([5.0] * 4, [6.0] * 4, alternative="two-sided").pvalue
    assert _p_value([5.0] * 4, [6.0] * 4) == pytest.approx(expected) and expected < 1.0
    assert _p_value([5.0, 5.0], [5.0, 6.0]) == pytest.approx(
        mannwhitneyu([5.0, 5.0], [5.0, 6.0], alternative="two-sided").pvalue)
    assert _p_value([1.0, 2.0], [1.0, 2.0]) == pytest.approx(1.0)


def test_new_and_gone_metrics_keep_their_settings_and_others_are_still_compared():
    base = metrics_from_report(_report("t5_h100"))
    fewer = {k: v for k, v in base.items() if k != "kernel_launches"}
    new = {c.name: c for c in compare(fewer, base, GateConfig())}["kernel_launches"]
    assert (new.unit, new.threshold, new.noise_floor) == ("count", 0.05, 2.0)
    assert new.current_median == pytest.approx(np.median(base["kernel_launches"].samples))
    gone = {c.name: c for c in compare(base, fewer, GateConfig())}["kernel_launches"]
    assert gone.baseline_median == pytest.approx(np.median(base["kernel_launches"].samples))
    # ignoring one metric leaves every other one compared
    rest = {c.name for c in compare(base, base, GateConfig(ignore=["bare_step_time"]))}
    assert rest == set(base) - {"bare_step_time"}


def test_configuration_defaults_and_bounds():
    assert config_from_table({}, "pyproject.toml") == GateConfig()
    assert config_from_table({"threshold": {"step_time": 0}}, "p").threshold("step_time") == 0.0  # 0 is allowed
    for bad in ({"alpha": 1}, {"noise_floor": {"step_time": -0.5}}):
        with pytest.raises(GateError):
            config_from_table(bad, "p")
    with pytest.raises(GateError) as err:
        config_from_table({"noise_floor": {"overhead_percent": 1}}, "p")
    assert "noise_floor.overhead_time in ns" in str(err.value)
    with pytest.raises(GateError) as err:
        config_from_table({"ignore": 3}, "p")
    assert "list of globs" in str(err.value)
    with pytest.raises(GateError) as err:
        metrics_from_report({})
    assert "re-run 'gpudiag report'" in str(err.value)


def test_baseline_round_trip_on_a_real_report():
    """baseline_from_report then metrics_from: every metric as loading the report itself gives it."""
    from gpudiag.analysis.gate import BASELINE_FORMAT, baseline_from_report, metrics_from

    report = _report("decoder_h100")
    baseline = json.loads(json.dumps(baseline_from_report(report)))
    assert baseline["gpudiag_baseline"] == BASELINE_FORMAT and baseline["source"] == report["source"]
    assert baseline["gpudiag_version"] == report["gpudiag_version"]
    assert baseline["environment"] == environment_of(report)
    got, env = metrics_from(baseline, "b.json")
    want, want_env = metrics_from(report, "report.json")
    assert env == want_env and set(got) == set(want)
    for name, m in want.items():
        assert (got[name].name, got[name].unit, got[name].samples, got[name].direction, got[name].statistic) == \
            (m.name, m.unit, m.samples, m.direction, m.statistic)


def test_old_baselines_are_read_under_todays_names():
    """gpu_busy is gpu_busy_time; overhead_percent (of each step) becomes overhead_time in ns from
    the same steps' times; without step times it cannot be converted (exit 3)."""
    from gpudiag.analysis.gate import metrics_from

    old = {"gpudiag_baseline": 1, "metrics": {
        "step_time": {"unit": "ns", "samples": [100.0, 200.0]},
        "overhead_percent": {"unit": "percent", "samples": [10.0, 50.0]},
        "gpu_busy": {"unit": "ns", "samples": [1.0, 2.0]}}}
    metrics, env = metrics_from(old, "old.json")
    assert env == {} and set(metrics) == {"step_time", "overhead_time", "gpu_busy_time"}
    assert metrics["overhead_time"].samples == [10.0, 100.0] and metrics["overhead_time"].unit == "ns"
    assert metrics["overhead_time"].name == "overhead_time" and metrics["gpu_busy_time"].samples == [1.0, 2.0]
    no_steps = {"gpudiag_baseline": 1, "metrics": {"overhead_percent": {"unit": "percent", "samples": [10.0]}}}
    with pytest.raises(GateError) as err:
        metrics_from(no_steps, "old.json")
    assert err.value.exit_code == 3 and "old.json" in str(err.value) and "overhead_time" in str(err.value)


@pytest.mark.parametrize("data, words", [
    ([1, 2], "neither a gpudiag report.json nor a baseline file"),
    ({"something": 1}, "neither a gpudiag report.json nor a baseline file"),
    ({"gpudiag_baseline": 1, "metrics": {"step_time": {"samples": [1.0]}}}, "a damaged baseline file"),
    ({"gpudiag_baseline": 1, "metrics": {"step_time": {"unit": "ns", "samples": ["x"]}}}, "a damaged baseline file"),
    ({"schema_version": 1, "steps": {}, "per_step_metrics": [{"step_time_ns": "slow", "busy_ns": 1.0,
      "overhead_percent": 0.0, "kernel_launches": 1}]}, "not numbers"),
    ({"schema_version": 1, "steps": {}, "per_step_metrics": []}, "no per-step samples"),
])
def test_what_load_refuses(data, words):
    from gpudiag.analysis.gate import metrics_from

    with pytest.raises(GateError) as err:
        metrics_from(data, "run/report.json")
    assert err.value.exit_code == 3 and words in str(err.value) and "run/report.json" in str(err.value)


def test_a_report_loads_with_its_environment():
    from gpudiag.analysis.gate import metrics_from

    report = _report("t5_h100")
    metrics, env = metrics_from(report, "report.json")
    assert env == environment_of(report) and metrics["step_time"].samples == [
        s["step_time_ns"] for s in report["per_step_metrics"]]
    nan = {**report, "per_step_metrics": [{**s, "busy_ns": float("nan")} for s in report["per_step_metrics"]]}
    with pytest.raises(GateError):
        metrics_from(nan, "report.json")


def test_compare_edges():
    """A metric from nothing (baseline median 0) changes by infinity, nothing to nothing by 0; a
    new metric does not stop the comparison of the ones after it; a varying run against a
    constant one gets SciPy's p-value."""
    from scipy.stats import mannwhitneyu

    from gpudiag.analysis.gate import _p_value

    zero = {"family:x": Metric("family:x", "ns", [0.0, 0.0, 0.0])}
    grew = {"family:x": Metric("family:x", "ns", [5e5, 6e5, 7e5])}
    (c,) = compare(zero, grew, GateConfig())
    assert c.change == float("inf") and c.verdict in ("regression", "warning")
    (same,) = compare(zero, zero, GateConfig())
    assert same.change == 0.0 and same.verdict == "ok"
    base = metrics_from_report(_report("t5_h100"))
    first = {"aaa_new": Metric("aaa_new", "ns", [1.0, 2.0])}
    names = {c.name for c in compare(base, {**base, **first}, GateConfig())}
    assert names == set(base) | {"aaa_new"}
    step = {c.name: c for c in compare(base, base, GateConfig())}["step_time"]
    assert step.unit == "ns" and step.current_median == pytest.approx(np.median(base["step_time"].samples))
    assert _p_value([5.0, 6.0], [5.0, 5.0]) == pytest.approx(
        mannwhitneyu([5.0, 6.0], [5.0, 5.0], alternative="two-sided").pvalue)


def test_baseline_defaults_and_what_is_not_a_report():
    """A baseline metric without direction or statistic is lower-is-better, compared at its median;
    a dict with "steps" alone is not a report; a report whose steps lack their fields names them."""
    from gpudiag.analysis.gate import metrics_from

    metrics, _ = metrics_from({"gpudiag_baseline": 1, "metrics": {"step_time": {"unit": "ns", "samples": [1.0, 2.0]}}}, "b")
    assert (metrics["step_time"].name, metrics["step_time"].direction, metrics["step_time"].statistic) == \
        ("step_time", "lower", "median")
    with pytest.raises(GateError) as err:
        metrics_from({"steps": {}, "per_step_metrics": [{"step_time_ns": 1.0}]}, "r.json")
    assert "neither" in str(err.value)
    with pytest.raises(GateError) as err:
        metrics_from({"schema_version": 1, "steps": {}, "per_step_metrics": [{"step_time_ns": 1.0}]}, "r.json")
    assert "holds step values that are not numbers" in str(err.value) and "re-run 'gpudiag report'" in str(err.value)
    with pytest.raises(GateError) as err:
        metrics_from({"gpudiag_baseline": 1, "metrics": {"x": {}}}, "b.json")
    assert "re-create it with 'gpudiag baseline save RUN'" in str(err.value)
