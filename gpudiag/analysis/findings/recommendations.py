"""report.json's findings: fusion candidates (the op data flow of the detail step, else the kernel
sequence), the recommendations of every rule over the measured steps, the host's floor under the
step, and which recommendations count the same time.
"""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd

from gpudiag.analysis.attribution.ranges import Steps, launch_calls
from gpudiag.analysis.fusion.dataflow import fusion_candidates, mark_host_bound, saving_by_kernel
from gpudiag.analysis.fusion.kernel_sequence import kernel_sequence_candidates
from gpudiag.analysis.ingest import Tables
from gpudiag.analysis.findings.tables import num
from gpudiag.analysis.rules import host_floor
from gpudiag.analysis.rules.base import RuleContext
from gpudiag.analysis.rules.distributed import distributed_context
from gpudiag.analysis.rules.overlaps import mark_overlaps
from gpudiag.analysis.rules.registry import recommend_split
from gpudiag.analysis.steps import serving
from gpudiag.analysis.steps.frames import measured_api
from gpudiag.analysis.steps.launches import in_measured_steps, kept_rows
from gpudiag.analysis.steps.representative import compare_bare
from gpudiag.script_status import ScriptStatus


class RuleInputs(NamedTuple):
    """What :func:`rule_context` reads besides the fusion candidates and the measured steps, and the
    measured steps' host-compute stretches (:mod:`gpudiag.analysis.steps.host_work`)."""
    status: ScriptStatus | None
    dev: pd.Series
    compiled: dict
    host_stretches: pd.DataFrame | None = None


class FindingsInput(NamedTuple):
    """What :func:`findings` reads: ``k`` every kernel with its attribution and class, ``km`` those
    of the measured steps, ``detail_step`` (None without one), ``idle`` GPU-idle intervals with
    ``step`` (the rules read the measured steps'; passing only those, as the pipeline does, spares a
    copy), ``tables`` the export's frames, ``steps`` the step ranges, ``measured`` the measured
    steps' rows, ``step_ns`` their median step time (ns), ``peaks`` the device's
    (:class:`gpudiag.analysis.roofline.peaks.DevicePeaks`), ``ncu`` the Nsight Compute rows (may be
    empty), ``payloads`` the detail step's op payloads, ``rules`` the :class:`RuleInputs`."""

    k: pd.DataFrame
    km: pd.DataFrame
    detail_step: int | None
    idle: pd.DataFrame
    tables: Tables
    steps: Steps
    measured: pd.DataFrame
    step_ns: float
    peaks: object
    ncu: pd.DataFrame
    payloads: pd.Series
    rules: RuleInputs

    @property
    def measured_ids(self) -> set:
        return set(self.measured["step"])


def findings(inp: FindingsInput) -> tuple[dict, pd.DataFrame]:
    """(report.json's recommendations, suppressed, fusion candidates (the op data flow of the detail
    step, else the kernel sequence), fusion saving per kernel, fusion note, host time per step (ns)
    and fusion source; the measured steps' API calls, with ``step``, for the launch counts)."""
    k, km, t, steps, measured = inp.k, inp.km, inp.tables, inp.steps, inp.measured
    n, measured_ids = len(measured), inp.measured_ids
    detail = k[(k["step"] == inp.detail_step) & (k["op"] != "")] if inp.detail_step is not None else k.iloc[0:0]
    all_candidates = fusion_candidates(detail, inp.peaks, top=None,
                                       op_payloads=inp.payloads.tolist() if len(inp.payloads) else None)
    fusion_source = "op_dataflow"
    if not all_candidates and not (k["op_call"] >= 0).any():  # no op ranges: the kernel sequence alone (lower confidence)
        all_candidates, fusion_source = kernel_sequence_candidates(km, inp.peaks, n, top=None), "kernel_sequence"
    # made after the kernel sequence search: the two largest frames of this stage are never alive at once
    api_m = measured_api(t.runtime_api, steps, measured_ids)
    rules = inp.rules
    recommendations, suppressed = run_rules(
        inp, detail, api_m,
        rule_context(rules.status, rules.dev, rules.compiled, all_candidates, measured_ids)
        | {"phase_host_ns": host_floor.phase_ranges_ns(t.nvtx, steps.table, measured_ids),
           "outside_modules": host_floor.outside_modules(t.nvtx, steps.table, measured_ids),
           "host_stretches": rules.host_stretches if rules.host_stretches is not None else pd.DataFrame()}
    ) if n else ([], [])
    host_ns = host_floor.host_ns_per_step(api_m) if n else None  # the step cannot get shorter than this
    host_floor.bound_by_host(recommendations, float(measured["step_time_ns"].median()) if n else 0.0, host_ns)
    candidates = all_candidates[:10]
    fusion_note = mark_host_bound(candidates, recommendations)
    return {"recommendations": mark_overlaps(recommendations), "suppressed": suppressed,
            "fusion_candidates": candidates, "fusion_saving_by_kernel": saving_by_kernel(all_candidates),
            "fusion_note": fusion_note, "host_ns_per_step": host_ns, "fusion_source": fusion_source}, api_m


def rule_context(status: ScriptStatus | dict | None, dev: pd.Series, compiled: dict, candidates: list[dict], measured_ids) -> dict:
    """The rules' context beyond the kernels: the launcher's per-step peak memory, cudnn.benchmark and
    autocast dtype, the GPU's memory, the compiled-graph summary, all fusion candidates and the
    bare run's inflation (profiled - bare median step time, ns; None without a bare run)."""
    status = ScriptStatus.of(status) or ScriptStatus()
    bare = compare_bare({"script": status.to_json(), "steps": {"per_step": [{"step": s, "measured": True} for s in measured_ids]}})
    return {"peak_memory_bytes": {int(s): int(v) for s, v in (status.peak_memory_bytes_per_step or {}).items() if v},
            "device_memory_bytes": num(dev.get("total_memory_bytes")),
            "cudnn_benchmark": status.cudnn_benchmark, "autocast_dtype": status.autocast_dtype,
            "compiled": {**compiled, "dynamo": status.compile} if compiled["graphs"] else None,
            "candidates": candidates, "bare_inflation_ns": (bare or {}).get("inflation_ns"),
            "inference": serving.serving_context(status), "distributed": distributed_context(status, measured_ids)}


def run_rules(inp: FindingsInput, detail: pd.DataFrame, api: pd.DataFrame, context: dict) -> tuple[list[dict], list[dict]]:
    """Build the rules' context (measured steps only; ``detail``: the detail step's kernels with an
    op; ``api``: the measured steps' API calls; ``context``: :func:`rule_context`) and run them
    (:mod:`gpudiag.analysis.rules.registry`): (shown, suppressed under 0.5 % of the step)."""
    memcpy, measured_ids = inp.tables.memcpy, inp.measured_ids
    copies = (in_measured_steps(memcpy, launch_calls(memcpy, inp.tables.runtime_api)["api_start_ns"].to_numpy(dtype=float),
                                inp.steps.table, measured_ids)
              if not memcpy.empty else memcpy.assign(step=pd.Series(dtype=int)))
    idle = kept_rows(inp.idle, inp.idle["step"].isin(measured_ids).to_numpy())
    ctx = RuleContext(km=inp.km, detail=detail, api=api, memcpy=copies, idle=idle, n_steps=len(inp.measured),
                      step_ns=inp.step_ns, peaks=inp.peaks, ncu=inp.ncu, measured_steps=sorted(measured_ids), **context)
    return recommend_split(ctx)
