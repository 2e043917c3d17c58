"""The gate workflow (``gpudiag gate``, ``gpudiag baseline save``, :meth:`gpudiag.api.Run.compare`,
the MCP server's compare_runs): read two runs, compare them beyond noise, and save baselines."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from gpudiag.analysis import gate as gate_mod
from gpudiag.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

EXIT_PASS, EXIT_REGRESSION, EXIT_USAGE, EXIT_NOT_COMPARABLE = 0, 1, 2, 3
# The gate's thresholds, for the faces (the library, the MCP server): they import the application
# layer only (pyproject.toml's import contracts)
GateConfig = gate_mod.GateConfig


def read_run(path: Path) -> tuple[dict, str]:
    """Parsed JSON of a run directory's report.json, a report.json or a baseline file, and its label.
    Raises UserError: exit 2 (usage) when ``path`` does not exist or cannot be read, exit 3
    (invalid run) when it holds no report or no JSON."""
    if not path.exists():
        raise UserError(f"{path}: no such file or directory; pass a run directory, a report.json or a baseline file",
                        exit_code=EXIT_USAGE)
    file = path / "report.json" if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"{file}: not found; run 'gpudiag report {path}' first", exit_code=EXIT_NOT_COMPARABLE)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{file}: cannot be read ({exc.strerror}); check its permissions", exit_code=EXIT_USAGE) from None
    except UnicodeDecodeError:
        text = ""  # binary content: reported as not JSON below
    try:
        return json.loads(text), str(path)
    except ValueError:
        raise UserError(f"{file}: not valid JSON; pass a gpudiag report.json or baseline file", exit_code=EXIT_NOT_COMPARABLE) from None


def load_config(config_file: Path | None) -> gate_mod.GateConfig:
    """``--config FILE`` (its [tool.gpudiag.gate] table, or the whole file if it has none), else
    ./pyproject.toml's [tool.gpudiag.gate] if present, else the defaults."""
    path = config_file or (Path("pyproject.toml") if Path("pyproject.toml").is_file() else None)
    if path is None:
        return gate_mod.GateConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{path}: cannot read the gate configuration ({exc}); fix the TOML or pass --config FILE") from None
    table = data.get("tool", {}).get("gpudiag", {}).get("gate")
    if table is None:
        table = {} if config_file is None else data
    try:
        return gate_mod.config_from_table(table, str(path))
    except gate_mod.GateError as exc:
        raise UserError(str(exc), exit_code=exc.exit_code) from None


@dataclass(frozen=True)
class GatedRun:
    """One side of a comparison: its gated ``metrics``, its ``environment`` (GPU, driver, torch),
    its ``workload`` (:func:`gpudiag.analysis.gate.workload_of`) and its ``label`` (the path given)."""

    metrics: dict
    environment: dict
    workload: dict
    label: str


def gated(run: tuple[dict, str]) -> GatedRun:
    """The :class:`GatedRun` of a (parsed report.json or baseline file, label) pair
    (:func:`read_run`'s answer). Raises UserError, exit 3, when it is neither or has no samples."""
    try:
        metrics, env = gate_mod.metrics_from(*run)
    except gate_mod.GateError as exc:
        raise UserError(str(exc), exit_code=exc.exit_code) from None
    return GatedRun(metrics, env, gate_mod.workload_from(run[0]), run[1])


def gate_result(baseline: GatedRun, current: GatedRun, config: gate_mod.GateConfig,
                allow_different_hardware: bool = False, force: bool = False) -> dict:
    """The gate's verdict on two runs, each as :func:`gated` gives it: the ``--format json`` dict
    (verdict, exit_code, baseline and current labels, metrics, ...). The one comparison of
    ``gpudiag gate`` and :meth:`gpudiag.api.Run.compare`. Raises UserError, exit 3, when the runs'
    GPU, driver or torch differ (unless ``allow_different_hardware``), when they are not one workload
    (:func:`gpudiag.analysis.gate.workload_difference`; unless ``force``, and then the result's
    ``forced`` says why it was needed) or no metric is in both."""
    from gpudiag.renderers import gate_formats  # imports rich: here, so that --help starts fast

    base_label, cur_label = baseline.label, current.label
    diffs = gate_mod.differences(baseline.environment, current.environment)
    if diffs and not allow_different_hardware:
        raise UserError("not comparable: " + "; ".join(diffs) + " (pass --allow-different-hardware to compare anyway)",
                        exit_code=EXIT_NOT_COMPARABLE)
    different = gate_mod.workload_difference(baseline.workload, current.workload)
    if different and not force:
        raise UserError(f"not one workload: {base_label} and {cur_label}: {different} "
                        "(pass --force to compare anyway)", exit_code=EXIT_NOT_COMPARABLE)
    comparisons = gate_mod.compare(baseline.metrics, current.metrics, config)
    if not any(c.verdict not in ("new", "gone") for c in comparisons):
        raise UserError(f"nothing comparable between {base_label} and {cur_label}: no metric in both",
                        exit_code=EXIT_NOT_COMPARABLE)
    verdict, code = gate_mod.overall(comparisons)
    result = gate_formats.result_dict(comparisons, verdict, code, base_label, cur_label, diffs, config.alpha)
    if different:
        result["forced"] = f"compared with --force though not one workload: {different}"
    return result


def save_baseline(run: Path, output: Path, force: bool) -> tuple[dict, str]:
    """Write RUN's baseline file (a run directory, a report.json) to ``output``: (its content, the
    run's label). Raises UserError for a run that cannot be read or has no samples (exit 3), or an
    ``output`` that exists without ``force``."""
    data, label = read_run(run)
    try:
        content = gate_mod.baseline_from_report(data)
    except gate_mod.GateError as exc:
        raise UserError(f"{label}: {exc}", exit_code=exc.exit_code) from None
    if output.exists() and not force:
        raise UserError(f"{output} already exists: pass --force to overwrite it, or -o FILE to write elsewhere")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(content, indent=1), encoding="utf-8")
    return content, label


def gate(baseline: Path, current: Path, config_file: Path | None = None,
         allow_different_hardware: bool = False, force: bool = False) -> dict:
    """``gpudiag gate``'s verdict of ``current`` against ``baseline`` (each a run directory, a
    report.json or a baseline file), with ``config_file``'s thresholds (else ./pyproject.toml's, else
    the defaults): :func:`gate_result`'s dict. Raises UserError as :func:`read_run`,
    :func:`load_config` and :func:`gate_result`; the first bad run is named."""
    config = load_config(config_file)
    base = gated(read_run(baseline))  # read and checked in this order: the first bad one is named
    return gate_result(base, gated(read_run(current)), config, allow_different_hardware, force)
