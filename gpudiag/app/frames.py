"""The tables of a report as pandas DataFrames, one fixed schema per table (docs/api.md, "The frames'
schemas"): ``gpudiag.load(...).steps`` and the other :class:`gpudiag.api.Run` tables are built here
from report.json's dict.

Every frame has exactly the columns of its schema, in its order, with the same dtypes whether it has
rows or not, whichever run it comes from, so it converts to Arrow (``pyarrow.Table.from_pandas``),
Polars (``polars.from_pandas``) and Parquet (``frame.to_parquet``) and stacks with the frames of other
runs. A key report.json does not hold for a row (an older report, a field only some rules set) is a
missing value. Keys the schema does not list are left out (report.json holds them).

The dtypes:

- ``Int64``: integers (pandas' nullable integer: ``<NA>`` where missing);
- ``float64``: numbers that may have a fraction, ``NaN`` where missing;
- ``boolean``: flags (nullable);
- ``string``: text (pandas' string dtype, ``<NA>`` where missing);
- ``json``: a nested value (a list or a dict) as its JSON text in a ``string`` column, so that every
  library reads one type: filter with ``frame["overlaps"].str.contains('"GD-TORCH-COMPILE"')``,
  decode with ``frame["ops"].map(json.loads)`` or, in Polars, ``pl.col("ops").str.json_decode(pl.List(pl.String))``.
  A list of strings is a JSON list of strings (``ops``, ``modules``, ``evidence``, ``overlaps``);
  ``example_shapes`` is a JSON list of each recorded input as the profiler wrote it (a tensor's
  ``"dtype[dims]"`` string, a number, null, a list for a tensor list).

Units are in the names: ``_ns`` nanoseconds, ``_bytes`` bytes, ``_flop`` floating-point operations,
``_percent`` percent (0 to 100); ``_per_step`` means per measured step (the mean over the
steady-state steps).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

__all__ = ["Column", "SCHEMAS", "STEPS", "KERNELS", "RECOMMENDATIONS", "FUSION_CANDIDATES", "RANKS",
           "dtypes", "frame", "steps", "kernels", "recommendations", "fusion_candidates", "ranks", "schema_text",
           "describe"]

INT, FLOAT, BOOL, STR, JSON = "Int64", "float64", "boolean", "string", "json"
_PANDAS = {INT: "Int64", FLOAT: "float64", BOOL: "boolean", STR: pd.StringDtype(), JSON: pd.StringDtype()}


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # INT, FLOAT, BOOL, STR or JSON
    doc: str


def _cols(*spec: tuple[str, str, str]) -> tuple[Column, ...]:
    return tuple(Column(*s) for s in spec)


STEPS = _cols(
    ("step", INT, "its number in the capture"),
    ("step_time_ns", INT, "wall time"),
    ("busy_ns", INT, "GPU busy time"),
    ("idle_ns", INT, "GPU idle time"),
    ("kernels", INT, "kernel launches"),
    ("warmup", BOOL, "a warm-up step, left out of the statistics"),
    ("detail", BOOL, "the step recorded with per-op ranges (slower)"),
    ("measured", BOOL, "in the statistics"),
    ("outlier", BOOL, "left out of the steady-state statistics"),
    ("compute_ns", FLOAT, "time split of a measured step: compute-bound kernels (missing for other steps)"),
    ("bandwidth_ns", FLOAT, "bandwidth-bound kernels"),
    ("overhead_ns", FLOAT, "overhead-bound kernels and host-bound idle"),
    ("communication_ns", FLOAT, "communication kernels"),
    ("host_bound_idle_ns", FLOAT, "GPU idle while the host had not launched the next kernel"),
    ("launch_bound_idle_ns", FLOAT, "its part spent launching (where split)"),
    ("host_compute_idle_ns", FLOAT, "its part spent computing on the host (where split)"),
    ("other_idle_ns", FLOAT, "the rest of the idle time"),
)

KERNELS = _cols(
    ("name", STR, "demangled kernel name"),
    ("short_name", STR, "its function name"),
    ("label", STR, "the name the reports show"),
    ("family", STR, "gemm, conv, elementwise, reduce, copy, communication..."),
    ("kernel_class", STR, "compute, bandwidth, overhead, communication..."),
    ("evidence", STR, "what classified it: ncu, shapes or heuristic"),
    ("instances_per_step", FLOAT, "launches per measured step"),
    ("time_ns_per_step", FLOAT, "GPU time per measured step"),
    ("avg_ns", FLOAT, "mean time of one launch"),
    ("med_ns", FLOAT, "median time of one launch"),
    ("share_of_kernel_time_percent", FLOAT, "share of all kernel time"),
    ("intensity_flop_per_byte", FLOAT, "arithmetic intensity (median)"),
    ("ridge_flop_per_byte", FLOAT, "the roofline's ridge for its math"),
    ("efficiency", FLOAT, "fraction of its roofline bound reached, 0 to 1"),
)

RECOMMENDATIONS = _cols(
    ("rule_id", STR, "stable id, e.g. GD-OVERHEAD-BOUND"),
    ("title", STR, "one line"),
    ("saving_ns_per_step", FLOAT, "estimated saving"),
    ("saving_percent_of_step", FLOAT, "the same, of the mean step"),
    ("saving_estimated", BOOL, "false: not estimated (0 ns)"),
    ("estimate", STR, "how the saving is estimated"),
    ("evidence", JSON, "list of sentences"),
    ("how_to_fix", STR, "what to change"),
    ("overlaps", JSON, "list of rule ids whose savings count the same time"),
    ("rule", STR, "the rule's function name"),
    ("predicted", BOOL, "false for GD-MEASURED (a trial's win no rule predicted), else missing"),
    ("saving_ns_per_step_under_profiler", FLOAT, "the saving before the bare run's correction"),
    ("host_ns_per_step", FLOAT, "host time per step of a GPU-time-only saving"),
    ("step_saving_bound_ns", FLOAT, "the most that saving can shorten the step"),
    ("throughput_gain", JSON, "GD-BATCH-HEADROOM: batch factor -> samples/s factor"),
    ("change_estimates", JSON, "trial change -> its own predicted saving (ns per step)"),
    ("graph_floor", JSON, "GD-OVERHEAD-BOUND in a loop of forwards: the CUDA-graph floor's inputs"),
    ("trial_change", STR, "the change a trial tried for it (gpudiag profile --trials)"),
    ("trial_status", STR, "measured, changes results, inconclusive, failed..."),
    ("trial_reason", STR, "why inconclusive or failed"),
    ("trial_saving_ns", FLOAT, "the trial's saving per step, whatever its verdict"),
    ("trial_saving_ci_ns", JSON, "its 95 % interval, [low, high]"),
    ("trial_changes_results", BOOL, "the change altered the script's results"),
    ("measured_saving_ns", FLOAT, "the trial's saving per step where conclusive"),
    ("measured_saving_percent", FLOAT, "the same, of the step"),
    ("covers_ns_per_step", FLOAT, "the time per step the rule's evidence covers (a trial saving more is not its)"),
    ("trial_contradicts", BOOL, "predicted over 20 % of the step, its trial measured under 5 %"),
    ("framework_switch", STR, "the framework's own switch for the change (Lightning, HF TrainingArguments, Accelerate)"),
    ("trial_not_credited", STR, "a trial of its change saved more than its evidence covers: shown on its own line"),
)

FUSION_CANDIDATES = _cols(
    ("ops", JSON, "list of the chain's ops (aten ops, or kernels for a kernel-sequence chain)"),
    ("occurrences_per_step", FLOAT, "occurrences per measured step"),
    ("modules", JSON, "list of the modules it runs in"),
    ("chain_ns", FLOAT, "kernel time of one occurrence"),
    ("fused_floor_ns", FLOAT, "one fused occurrence at the bandwidth bound"),
    ("saving_ns_per_step", FLOAT, "(chain - floor) x occurrences"),
    ("external_bytes", FLOAT, "read and written by the fused kernel"),
    ("kernels_per_occurrence", INT, "kernels one occurrence launches"),
    ("compile_fusable", BOOL, "torch.compile would fuse it"),
    ("reference_kernel", STR, "a bundled gpudiag kernel that does it, if any"),
    ("compile_pattern", STR, "a known pattern torch.compile fuses, if any"),
    ("host_bound", BOOL, "the host, not the GPU, sets its pace"),
    ("example_shapes", JSON, "list of the widest op's inputs as recorded"),
    ("saved_for_backward", JSON, "list of {op, bytes}: intermediates the backward reads"),
    ("source", STR, "kernel_sequence for a chain found from kernels alone, else missing (op data flow)"),
    ("confidence", STR, "low for a kernel-sequence chain"),
    ("bytes_method", STR, "how a kernel-sequence chain's bytes were estimated"),
    ("families", JSON, "kernel family -> count, of a kernel-sequence chain"),
    ("grids", JSON, "list of each kernel's [x, y, z] grid, of a kernel-sequence chain"),
    ("verified", JSON, "the reference kernel's measurement (gpudiag profile --verify)"),
    ("advice", STR, "what the measurement advises"),
)

_BREAKDOWN = ("compute", "bandwidth", "overhead", "communication", "idle")
RANKS = _cols(
    ("global_pid", INT, "nsys's process id"),
    ("pid", INT, "the operating system's process id"),
    ("device_id", INT, "the GPU with most of its kernel time"),
    ("rank", INT, "RANK, where the launcher recorded it"),
    ("local_rank", INT, "LOCAL_RANK, likewise"),
    ("measured_steps", INT, "its measured steps"),
    ("step_time_ns_median", FLOAT, "median measured step"),
    ("step_time_ns_mean", FLOAT, "mean measured step"),
    ("gpu_busy_percent", FLOAT, "GPU busy share of its step"),
    *((f"{k}_percent", FLOAT, f"{k} share of its step") for k in _BREAKDOWN),
    ("communication_ns_per_step", FLOAT, "communication kernel time"),
    ("exposed_communication_ns_per_step", FLOAT, "the part no compute overlaps"),
    ("op_calls_recorded", INT, "op calls the capture recorded"),
    ("top_recommendation", STR, "rule id of its first recommendation"),
    ("bare_step_time_ns_median", FLOAT, "its median step without the profiler (bare run)"),
    ("slower_than_fastest_percent", FLOAT, "median step over the fastest rank's"),
    ("straggler", BOOL, "the rank the others wait for (report.json's ranks.straggler; false when balanced)"),
    ("error", STR, "why it could not be analysed"),
)

SCHEMAS: dict[str, tuple[Column, ...]] = {"steps": STEPS, "kernels": KERNELS, "recommendations": RECOMMENDATIONS,
                                          "fusion_candidates": FUSION_CANDIDATES, "ranks": RANKS}


def dtypes(name: str) -> dict[str, object]:
    """Column -> pandas dtype of the frame ``name`` (a key of :data:`SCHEMAS`)."""
    return {c.name: _PANDAS[c.kind] for c in SCHEMAS[name]}


def _json(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _array(values: list, kind: str):
    if kind == JSON:
        values = [_json(v) for v in values]
    elif kind == STR:
        values = [None if v is None else str(v) for v in values]
    elif kind == FLOAT:
        values = [float("nan") if v is None else float(v) for v in values]
    return pd.array(values, dtype=_PANDAS[kind])


def frame(rows: list[dict], schema: tuple[Column, ...]) -> pd.DataFrame:
    """``rows`` (report.json records) as a frame of ``schema``'s columns and dtypes."""
    return pd.DataFrame({c.name: _array([r.get(c.name) for r in rows], c.kind) for c in schema},
                        index=pd.RangeIndex(len(rows)))


def steps(report: dict) -> pd.DataFrame:
    """One row per step of the capture, in order (:data:`STEPS`)."""
    return frame((report.get("steps") or {}).get("per_step") or [], STEPS)


def kernels(report: dict) -> pd.DataFrame:
    """The top kernels by GPU time over the measured steps, longest first (:data:`KERNELS`)."""
    return frame(report.get("top_kernels") or [], KERNELS)


def recommendations(report: dict) -> pd.DataFrame:
    """The recommendations, in the report's order (:data:`RECOMMENDATIONS`)."""
    return frame(report.get("recommendations") or [], RECOMMENDATIONS)


def fusion_candidates(report: dict) -> pd.DataFrame:
    """Chains of ops worth fusing, largest saving first (:data:`FUSION_CANDIDATES`)."""
    return frame(report.get("fusion_candidates") or [], FUSION_CANDIDATES)


def ranks(report: dict) -> pd.DataFrame:
    """One row per process of a capture of several processes, else none (:data:`RANKS`): the
    breakdown as ``<class>_percent`` columns, and ``straggler`` set on the rank the others wait for."""
    section = report.get("ranks") or {}
    named = section.get("straggler") or section.get("slowest")  # "slowest": reports written before the rename
    waited_for = named.get("global_pid") if named and not named.get("balanced") else None
    rows = [{**r, **{f"{k}_percent": v for k, v in (r.get("breakdown_percent") or {}).items()},
             "straggler": waited_for is not None and r.get("global_pid") == waited_for}
            for r in section.get("ranks") or []]
    return frame(rows, RANKS)


def schema_text(width: int = 110) -> str:
    """Each frame's columns and dtypes, as docs/api.md lists them."""
    lines = []
    for name, schema in SCHEMAS.items():
        line = f"run.{name}:"
        for i, c in enumerate(schema):
            item = f" {c.name} {c.kind}" + ("," if i < len(schema) - 1 else "")
            if len(line) + len(item) > width:
                lines.append(line)
                line = "   "
            line += item
        lines.append(line)
    return "\n".join(lines)


def describe(name: str) -> str:
    """The frame ``name``'s columns, one a line: name, dtype, meaning."""
    return "\n".join(f"{c.name:<36} {c.kind:<8} {c.doc}" for c in SCHEMAS[name])
