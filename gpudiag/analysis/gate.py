"""The CI performance gate: compare two runs metric by metric, on per-step samples.

A metric *regresses* only when all three hold:

1. its median over steps moved in the bad direction by more than its relative threshold
   (default 5 % for step time, 10 % for per-family and per-module time, see :data:`DEFAULT_THRESHOLDS`);
2. the move is larger than the metric's absolute noise floor (default 20 µs per step for times,
   2 launches, 2 MiB of memory), so tiny kernels cannot trip the gate;
3. the two sets of per-step samples differ significantly: two-sided Mann–Whitney U test
   (``scipy.stats.mannwhitneyu``), p < ``alpha`` (default 0.05).

Why Mann–Whitney U: step times are not normal (warm-up tails, host jitter), the test is rank-based
and needs no distribution, and with 7 measured steps per run its smallest exact two-sided p-value
is 2/C(14,7) ≈ 0.0006, so a real shift is detectable from one short capture. A change that passes
(1) and (2) but not (3) is reported as a *warning*: large, but not distinguishable from noise.
An improvement is the same test in the good direction.

Every metric is a time, count or size per step, never a share of the step: a share rises when the
rest of the step gets faster, which is no regression. ``gpu_busy_time`` and ``overhead_time`` were
called ``gpu_busy`` and ``overhead_percent`` (a percentage of each step) before; baseline files
and configurations with the old names are still read (:data:`RENAMED`).
"""

from __future__ import annotations

import fnmatch
import math
from pathlib import Path
from dataclasses import dataclass, field

# numpy and scipy are imported where used: scipy.stats alone takes over a second to import, and
# `gpudiag --help` and the report command must not pay for the gate's statistics.

BASELINE_FORMAT = 1

# (metric-name glob, relative threshold); first match wins, user entries come before these.
DEFAULT_THRESHOLDS: tuple[tuple[str, float], ...] = (
    ("step_time", 0.05), ("bare_step_time", 0.05), ("gpu_busy_time", 0.05), ("kernel_launches", 0.05),
    ("peak_memory", 0.05), ("overhead_time", 0.10), ("latency_p90", 0.10), ("tokens_per_s", 0.05),
    ("family:*", 0.10), ("module:*", 0.10), ("*", 0.10),
)
# Absolute noise floors by unit: ns per step, launches per step, bytes (one 2 MiB allocator block:
# PyTorch's caching allocator rounds large allocations to 2 MiB segments).
DEFAULT_NOISE_FLOORS = {"ns": 20_000.0, "count": 2.0, "bytes": float(2 << 20)}
# Old metric name -> new one, for baseline files and configurations written before the rename.
RENAMED = {"gpu_busy": "gpu_busy_time", "overhead_percent": "overhead_time"}


class GateError(ValueError):
    """Invalid gate input or configuration (exit code 2), or runs that cannot be compared (3)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Metric:
    """One gated metric: per-step ``samples`` in ``unit``; ``direction`` says which way is better."""

    name: str
    unit: str  # ns, count, bytes or per_s
    samples: list[float]
    direction: str = "lower"  # tokens_per_s is higher-is-better; every other metric lower
    statistic: str = "median"  # latency_p90 compares the 90th percentile of its samples


@dataclass
class GateConfig:
    """Gate settings: ``alpha`` (significance level), ``thresholds`` and ``noise_floors`` as
    (metric glob, value) pairs tried before the defaults, and ``ignore`` globs."""

    alpha: float = 0.05
    thresholds: list[tuple[str, float]] = field(default_factory=list)
    noise_floors: list[tuple[str, float]] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)

    def threshold(self, name: str) -> float:
        return next(v for pattern, v in (*self.thresholds, *DEFAULT_THRESHOLDS) if fnmatch.fnmatchcase(name, pattern))

    def noise_floor(self, name: str, unit: str) -> float:
        return next((v for pattern, v in self.noise_floors if fnmatch.fnmatchcase(name, pattern)),
                    DEFAULT_NOISE_FLOORS.get(unit, 0.0))

    def ignored(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.ignore)


CONFIG_KEYS = {"alpha", "threshold", "noise_floor", "ignore"}


def config_from_table(table: dict, origin: str) -> GateConfig:
    """GateConfig from a ``[tool.gpudiag.gate]`` TOML table. Raises :class:`GateError` (exit 2) for
    unknown keys or values of the wrong type, naming ``origin`` (the file)."""
    unknown = set(table) - CONFIG_KEYS
    if unknown:
        raise GateError(f"{origin}: unknown key(s) {sorted(unknown)} in [tool.gpudiag.gate]; allowed: {sorted(CONFIG_KEYS)}")
    if "overhead_percent" in (table.get("noise_floor") or {}):  # percentage points do not convert to ns
        raise GateError(f"{origin}: noise_floor.overhead_percent: the gate now compares overhead_time (ns per step); "
                        "set noise_floor.overhead_time in ns instead")
    try:
        alpha = float(table.get("alpha", 0.05))
        thresholds = [(RENAMED.get(str(k), str(k)), float(v)) for k, v in table.get("threshold", {}).items()]
        floors = [(RENAMED.get(str(k), str(k)), float(v)) for k, v in table.get("noise_floor", {}).items()]
        ignore = [RENAMED.get(str(p), str(p)) for p in table.get("ignore", [])]
    except (TypeError, ValueError, AttributeError):
        raise GateError(f"{origin}: [tool.gpudiag.gate] values must be numbers (alpha, threshold.*, "
                        "noise_floor.*) and a list of globs (ignore)") from None
    if not 0 < alpha < 1 or any(v < 0 for _, v in thresholds + floors):
        raise GateError(f"{origin}: alpha must be in (0, 1) and thresholds/noise floors must be >= 0")
    return GateConfig(alpha=alpha, thresholds=thresholds, noise_floors=floors, ignore=ignore)


def metrics_from_report(report: dict) -> dict[str, Metric]:
    """Gated metrics from a ``report.json`` dict, per measured step: step_time, gpu_busy_time (GPU
    busy ns: the report's GPU busy % is this over the step time), overhead_time (ns: the report's
    "overhead" of the step breakdown), kernel_launches, peak_memory (bytes, when the launcher
    recorded it), bare_step_time (ns: the same steps timed without the profiler, when
    ``gpudiag profile`` made its bare run), ``family:<name>`` and ``module:<path>`` (GPU time).
    Raises :class:`GateError` (exit 3) for a report without per-step samples."""
    steps = report.get("per_step_metrics")
    if not steps:
        raise GateError("the run has no per-step samples (no measured steps, or a report.json from an older "
                        "gpudiag: re-run 'gpudiag report' on it)", exit_code=3)
    metrics = {
        "step_time": Metric("step_time", "ns", [s["step_time_ns"] for s in steps]),
        "gpu_busy_time": Metric("gpu_busy_time", "ns", [s["busy_ns"] for s in steps]),
        # report.json keeps each step's overhead as a percentage of that step
        "overhead_time": Metric("overhead_time", "ns", [(s["overhead_percent"] or 0.0) * s["step_time_ns"] / 100
                                                         for s in steps]),
        "kernel_launches": Metric("kernel_launches", "count", [float(s["kernel_launches"]) for s in steps]),
    }
    bare = (report.get("representativeness") or {}).get("bare_samples_ns")
    if bare:  # the run without the profiler: the step time a CI gate should trust
        metrics["bare_step_time"] = Metric("bare_step_time", "ns", [float(v) for v in bare])
    metrics.update(inference_metrics(report.get("inference")))
    peaks = [s.get("peak_memory_bytes") for s in steps]
    if all(p is not None for p in peaks):  # captured by gpudiag's launcher
        metrics["peak_memory"] = Metric("peak_memory", "bytes", [float(p) for p in peaks])
    for key, prefix in (("families_ns", "family:"), ("modules_ns", "module:")):
        names = sorted({n for s in steps for n in s.get(key, {})})
        for n in names:
            metrics[prefix + n] = Metric(prefix + n, "ns", [s.get(key, {}).get(n, 0.0) for s in steps])
    return metrics


def inference_metrics(inference: dict | None) -> dict[str, Metric]:
    """An inference run's gated metrics (gpudiag.analysis.steps.serving): ``latency_p90`` (the 90th
    percentile of the per-request latencies, ns; the tail a service level is written against) and,
    for generate(), ``tokens_per_s`` (per step, higher is better). Empty for a training run."""
    if not inference:
        return {}
    out = {"latency_p90": Metric("latency_p90", "ns", [float(v) for v in inference["latency_samples_ns"]],
                                 statistic="p90")}
    gen = inference.get("generation")
    if gen and gen.get("tokens_per_s_samples"):
        out["tokens_per_s"] = Metric("tokens_per_s", "per_s", [float(v) for v in gen["tokens_per_s_samples"]],
                                     direction="higher")
    return out


def _statistic(metric: Metric) -> float:
    """The compared value of a metric: its median, or the percentile its ``statistic`` names."""
    import numpy as np

    if metric.statistic.startswith("p"):
        return float(np.percentile(metric.samples, float(metric.statistic[1:])))
    return float(np.median(metric.samples))


def baseline_from_report(report: dict) -> dict:
    """The baseline file's content (meant to be committed): format, source, environment, the
    workload (:func:`workload_of`) and the per-step samples of every gated metric."""
    return {"gpudiag_baseline": BASELINE_FORMAT, "source": report.get("source"),
            "gpudiag_version": report.get("gpudiag_version"), "environment": environment_of(report),
            "workload": workload_of(report),
            "metrics": {m.name: {"unit": m.unit, "direction": m.direction, "statistic": m.statistic,
                                 "samples": m.samples}
                        for m in metrics_from_report(report).values()}}


def metrics_from(data: dict, origin: str) -> tuple[dict[str, Metric], dict]:
    """(metrics, environment) from a parsed report.json or baseline file. Raises :class:`GateError`
    (exit 3) when it is neither, or has no samples."""
    if not isinstance(data, dict):  # a JSON list, string or number
        raise GateError(f"{origin}: neither a gpudiag report.json nor a baseline file", exit_code=3)
    if data.get("gpudiag_baseline") == BASELINE_FORMAT:
        try:
            metrics = {name: Metric(name, m["unit"], [float(x) for x in m["samples"]], m.get("direction", "lower"),
                                    m.get("statistic", "median"))
                       for name, m in data["metrics"].items()}
        except (KeyError, TypeError, ValueError):
            raise GateError(f"{origin}: a damaged baseline file; re-create it with 'gpudiag baseline save RUN'", exit_code=3) from None
        return _renamed(metrics, origin), data.get("environment") or {}
    if "schema_version" in data and "steps" in data:
        try:
            metrics, env = metrics_from_report(data), environment_of(data)
        except GateError as exc:
            raise GateError(f"{origin}: {exc}", exit_code=3) from None
        except (KeyError, TypeError, ValueError, AttributeError):  # an edited or damaged report.json
            metrics, env = {"step": Metric("step", "", [None])}, {}
        bad = [m.name for m in metrics.values()
               if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in m.samples)]
        if bad:
            raise GateError(f"{origin}: per_step_metrics holds {bad[0]} values that are not numbers (a damaged or "
                            "edited report.json); re-run 'gpudiag report' on the run", exit_code=3)
        return metrics, env
    raise GateError(f"{origin}: neither a gpudiag report.json nor a baseline file", exit_code=3)


def _renamed(metrics: dict[str, Metric], origin: str) -> dict[str, Metric]:
    """A baseline's metrics under today's names (:data:`RENAMED`): gpu_busy is gpu_busy_time;
    overhead_percent (of each step) becomes overhead_time with the step times of the same steps."""
    out = {RENAMED.get(name, name): Metric(RENAMED.get(name, name), m.unit, m.samples, m.direction, m.statistic)
           for name, m in metrics.items() if name != "overhead_percent"}
    old = metrics.get("overhead_percent")
    if old is not None:
        steps = metrics.get("step_time")
        if steps is None or len(steps.samples) != len(old.samples):
            raise GateError(f"{origin}: its overhead_percent cannot be converted to overhead_time (no step times); "
                            "re-create it with 'gpudiag baseline save RUN'", exit_code=3)
        out["overhead_time"] = Metric("overhead_time", "ns", [p * t / 100 for p, t in zip(old.samples, steps.samples)])
    return out


def environment_of(report: dict) -> dict:
    """The facts two runs must share to be comparable: GPU, driver, torch (where recorded)."""
    env = report.get("environment") or {}
    return {"gpu": (report.get("device") or {}).get("name"), "driver_version": env.get("driver_version"),
            "torch_version": env.get("torch_version")}


def differences(base_env: dict, cur_env: dict) -> list[str]:
    """What differs between two environments; a fact missing on either side is not compared."""
    return [f"{k}: {base_env[k]} -> {cur_env[k]}" for k in base_env
            if base_env.get(k) and cur_env.get(k) and base_env[k] != cur_env[k]]


# Two runs of one workload share most of their kernel time in kernels of the same name; unrelated
# models little. Over the repository's exports (docs/notes/measurements.md, 2026-11-28): the same
# model and precision 61-68 %, different models 0-41 % (Swin-T against Swin-V2-T the highest).
SAME_WORKLOAD_PERCENT = 50.0


def workload_of(report: dict) -> dict:
    """What the run profiled: ``script`` (the file name gpudiag's launcher ran; None for an export
    made without gpudiag) and ``kernels`` (top kernel name -> its share of kernel time, percent)."""
    status = report.get("script") or {}
    script = status.get("script") if isinstance(status, dict) else None
    return {"script": Path(str(script)).name if script else None,
            "kernels": {k["name"]: k["share_of_kernel_time_percent"] for k in report.get("top_kernels") or []
                        if k.get("name") is not None and k.get("share_of_kernel_time_percent") is not None}}


def workload_from(data: dict) -> dict:
    """The workload (:func:`workload_of`) of a parsed report.json or baseline file; empty for a
    baseline saved before baselines recorded it, or anything else."""
    if not isinstance(data, dict):
        return {}
    if data.get("gpudiag_baseline") == BASELINE_FORMAT:
        return data["workload"] if isinstance(data.get("workload"), dict) else {}
    try:
        return workload_of(data)
    except (AttributeError, KeyError, TypeError):  # an edited report.json: nothing to compare
        return {}


def workload_difference(base: dict, cur: dict) -> str | None:
    """Why two runs (each :func:`workload_of`) are not one workload, or None. Scripts decide where
    both runs name one (a precision or compile change keeps the script and renames the kernels);
    else the time both spend in kernels of the same name, under :data:`SAME_WORKLOAD_PERCENT`."""
    if base.get("script") and cur.get("script"):
        return None if base["script"] == cur["script"] else f"script {base['script']} -> {cur['script']}"
    a, b = base.get("kernels") or {}, cur.get("kernels") or {}
    if not a or not b:
        return None
    shared = sum(min(a[n], b[n]) for n in set(a) & set(b))
    if shared >= SAME_WORKLOAD_PERCENT:
        return None
    return (f"only {shared:.0f} % of kernel time is in kernels both runs have "
            f"(one workload shares {SAME_WORKLOAD_PERCENT:.0f} % or more)")


@dataclass
class Comparison:
    """The verdict on one metric. ``change`` is relative (0.05 = +5 %); ``p_value`` from the
    two-sided Mann–Whitney U test (1.0 when it cannot be computed)."""

    name: str
    unit: str
    baseline_median: float | None
    current_median: float | None
    change: float | None
    p_value: float | None
    threshold: float
    noise_floor: float
    verdict: str  # regression, improvement, warning, ok, new, gone


def _p_value(a: list[float], b: list[float]) -> float:
    import numpy as np
    from scipy.stats import mannwhitneyu

    if len(a) < 2 or len(b) < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0 and a[0] == b[0]):
        return 1.0
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


def compare(baseline: dict[str, Metric], current: dict[str, Metric], config: GateConfig) -> list[Comparison]:
    """One :class:`Comparison` per metric in either run (ignored ones left out), step time first."""
    import numpy as np

    out = []
    names = sorted(set(baseline) | set(current), key=lambda n: (":" in n, n))
    for name in names:
        if config.ignored(name):
            continue
        b, c = baseline.get(name), current.get(name)
        unit = (b or c).unit
        threshold, floor = config.threshold(name), config.noise_floor(name, unit)
        if b is None or c is None:
            out.append(Comparison(name, unit, None if b is None else _statistic(b),
                                  None if c is None else _statistic(c), None, None, threshold, floor,
                                  "new" if b is None else "gone"))
            continue
        mb, mc = _statistic(b), _statistic(c)
        delta = mc - mb
        change = delta / mb if mb else (math.inf if delta else 0.0)
        p = _p_value(b.samples, c.samples)
        worse = delta > 0 if b.direction == "lower" else delta < 0
        large = abs(change) > threshold and abs(delta) > floor
        if large and p < config.alpha:
            verdict = "regression" if worse else "improvement"
        elif large and worse:
            verdict = "warning"
        else:
            verdict = "ok"
        out.append(Comparison(name, unit, mb, mc, change, p, threshold, floor, verdict))
    return out


def overall(comparisons: list[Comparison]) -> tuple[str, int]:
    """(verdict, exit code): ("regression", 1) if any metric regressed, else ("pass", 0)."""
    if any(c.verdict == "regression" for c in comparisons):
        return "regression", 1
    return "pass", 0
