"""Steady state and outlier steps.

Real training runs have steps unlike the others: evaluation, checkpointing, a data-loader stall, a
recompilation, Inductor/Triton autotuning. Averaged in, one such step in a hundred can make a rule
claim more saving per step than a typical step lasts (issue 16: a replicated BERT capture whose
copies each repeat a 1 s first step gave a 168 ms/step saving on a 23 ms step). So:

- **Rule.** A measured step (not warm-up, not the detail step) is an *outlier* when its GPU window
  is longer than :data:`OUTLIER_FACTOR` (1.5) × the median window of the measured steps. The
  factor is issue 16's ("steps far from the median, say > 1.5×"); the median, not the mean, is the
  base so that the outliers themselves cannot move it (it holds while fewer than half the steps
  are slow). Only slow steps are outliers: a short step has no time for a rule to over-count.
  Outliers are rare: when more than :data:`MAX_OUTLIER_SHARE` of the measured steps, and at least
  :data:`MIN_RECURRENT`, are slow,
  the slow steps are the workload's own rhythm, not exceptions, and none is an outlier (H100,
  2026-11-26: a ResNet-18 fed by 2 DataLoader workers alternated 15 ms steps with 75 ms ones that
  waited for the next batch; dropping the slow half hid the input stall, the largest cost of all:
  8 workers instead of 2 took the step from 41 to 15 ms, docs/notes/measurements.md).
- **Steady state** = the measured steps that are not outliers. Every per-step number of the report
  (breakdown, verdicts, savings, top kernels, modules) is a mean over the steady state: a trimmed
  mean whose trimming rule is the one above.
- **Outlier finding.** Each outlier is compared with the *typical step* (per quantity, the median
  over the steady state): GPU idle with an empty launch queue (host-bound idle) before the step's
  first kernel (an input stall) or between kernels, other GPU idle, host synchronizations,
  copy/memset time, kernels a typical step does not run (or runs fewer times: evaluation,
  recompilation, autotuning benchmarks) and the usual kernels running longer.

Functions take and return pandas frames; :func:`outlier_report` assembles report.json's
``outlier_steps``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpudiag.analysis.attribution.families import kernel_label
from gpudiag.analysis.steps.launches import SYNC_APIS, in_measured_steps  # SYNC_APIS: the host syncs GD-HOST-SYNC counts

OUTLIER_FACTOR = 1.5  # issue 16: "steps far from the median (say > 1.5×)"
# Largest share of the measured steps that may be outliers (gpudiag's choice: an event every fourth
# step or more often is part of the steady state; see the module docstring).
MAX_OUTLIER_SHARE = 0.25
# ...and at least this many slow steps: in a short window two slow steps are not yet a rhythm (a
# generate() loop's 2 long requests of 7, H100 decoder capture; period() asks 3 too)
MIN_RECURRENT = 3
STEADY_STATE_RULE = (f"steady state = measured steps (not warm-up, not the detail step) whose GPU window is at most "
                     f"{OUTLIER_FACTOR}× the median of the measured steps, unless more than "
                     f"{100 * MAX_OUTLIER_SHARE:.0f} % of them (and {MIN_RECURRENT} or more) are slower (then all); per-step numbers are means over it")
MIN_CAUSE_SHARE = 0.05  # causes under 5 % of a step's excess time are left out (gpudiag's choice: noise)
MAX_LISTED = 50  # outlier steps listed in report.json (the slowest); the count covers them all
TOP_KERNELS = 5  # extra kernel names named per outlier step


def flag_outliers(st: pd.DataFrame, factor: float = OUTLIER_FACTOR) -> pd.DataFrame:
    """``st`` (the step table of :func:`gpudiag.analysis.steps.timeline.step_table`: step,
    step_time_ns, measured, ...) with a bool ``outlier`` column; outliers get ``measured`` False,
    so the steady-state statistics leave them out. Rule and source: module docstring."""
    st = st.copy()
    times = st.loc[st["measured"], "step_time_ns"].astype(float)
    median = float(times.median()) if len(times) else 0.0
    # A zero median (most windows empty: timestamps moved in a damaged export) is no base: a factor
    # of nothing would flag every step that lasts at all, and no step would be left to compare with.
    threshold = factor * median if median > 0 else np.inf
    st["outlier"] = st["measured"] & (st["step_time_ns"].astype(float) > threshold)
    slow = int(st["outlier"].sum())
    if slow >= MIN_RECURRENT and slow > MAX_OUTLIER_SHARE * len(times):  # recurrent: the steady state's own
        st["outlier"] = False
    st["measured"] = st["measured"] & ~st["outlier"]
    return st


def idle_by_step(idle: pd.DataFrame, st: pd.DataFrame, activities: pd.DataFrame) -> pd.DataFrame:
    """Whole-GPU idle intervals (:func:`gpudiag.analysis.steps.timeline.idle_intervals`) summed per step
    window they lie in: step, input_idle_ns (host-bound idle before the step's first kernel: the
    GPU waited for the step to start, e.g. for input data), host_bound_idle_ns (the other
    host-bound idle), other_idle_ns (ns). ``activities``: GPU work with ``step`` and ``kind``."""
    win = st[["step", "window_start_ns", "gpu_end_ns"]].sort_values("window_start_ns")
    cols = ["step", "input_idle_ns", "host_bound_idle_ns", "other_idle_ns"]
    if idle.empty or win.empty:
        return pd.DataFrame(columns=cols)
    pos = np.searchsorted(win["window_start_ns"].to_numpy(), idle["start_ns"].to_numpy(), side="right") - 1
    inside = (pos >= 0) & (idle["end_ns"].to_numpy() <= win["gpu_end_ns"].to_numpy()[np.maximum(pos, 0)])
    i = idle[inside].assign(step=win["step"].to_numpy()[pos[inside]])
    first_kernel = activities[activities["kind"] == "kernel"].groupby("step")["start_ns"].min()
    host = i["host_bound"].astype(bool)
    before = host & (i["end_ns"].to_numpy() <= i["step"].map(first_kernel).to_numpy(dtype=float))
    ns = i["duration_ns"].astype(float)
    return (i.assign(input_idle_ns=ns.where(before, 0.0), host_bound_idle_ns=ns.where(host & ~before, 0.0),
                     other_idle_ns=ns.where(~host, 0.0))
            .groupby("step")[cols[1:]].sum().reset_index())


def copies_by_step(activities: pd.DataFrame) -> pd.DataFrame:
    """Copy and memset GPU time per step (by launch call): step, copy_ns, copies."""
    c = activities[(activities["kind"] != "kernel") & (activities["step"] >= 0)]
    return (c.assign(copy_ns=c["end_ns"] - c["start_ns"]).groupby("step")
            .agg(copy_ns=("copy_ns", "sum"), copies=("copy_ns", "size")).reset_index())


def syncs_by_step(api: pd.DataFrame) -> pd.DataFrame:
    """Host synchronizations per step: step, syncs (count), sync_ns (host time blocked). ``api``:
    runtime API calls with a ``step`` column."""
    s = api[api["name"].fillna("").str.match(SYNC_APIS)] if not api.empty else api
    if s.empty:
        return pd.DataFrame(columns=["step", "syncs", "sync_ns"])
    return (s.assign(sync_ns=s["end_ns"] - s["start_ns"]).groupby("step")
            .agg(syncs=("sync_ns", "size"), sync_ns=("sync_ns", "sum")).reset_index())


def step_profile(st: pd.DataFrame, *parts: pd.DataFrame) -> pd.DataFrame:
    """One row per step of ``st`` (step, step_time_ns, busy_ns, kernels, kernel_ns, outlier,
    measured) joined with the per-step ``parts`` (frames with a ``step`` column); missing values 0."""
    out = st[["step", "step_time_ns", "busy_ns", "kernels", "kernel_ns", "outlier", "measured"]].set_index("step")
    for part in parts:
        out = out.join(part.set_index("step"), how="left")
    return out.fillna(0).reset_index()


def kernel_counts(kernels: pd.DataFrame, steps: list[int]) -> pd.DataFrame:
    """Launches and GPU time per (step, kernel name) for ``steps``: step, name, short_name,
    launches, ns. ``kernels``: kernel instances with step, name, short_name, duration_ns."""
    k = kernels[kernels["step"].isin(steps)]
    return (k.groupby(["step", "name"], sort=False)
            .agg(short_name=("short_name", "first"), launches=("duration_ns", "size"), ns=("duration_ns", "sum"))
            .reset_index())


def typical_kernels(counts: pd.DataFrame, steady: list[int]) -> pd.DataFrame:
    """Per kernel name, over the steady steps: the median launches and GPU time (0 in a step that
    does not run it) and in_steps, how many steady steps run it. Index name; columns
    typical_launches, typical_ns, in_steps."""
    c = counts[counts["step"].isin(steady)]
    if c.empty or not steady:
        return pd.DataFrame(columns=["typical_launches", "typical_ns", "in_steps"], dtype=float)
    wide = c.pivot_table(index="name", columns="step", values=["launches", "ns"], fill_value=0, aggfunc="sum")
    missing = len(steady) - wide["launches"].shape[1]  # steady steps that ran no kernel at all

    def median(block: pd.DataFrame) -> pd.Series:
        values = block.to_numpy(dtype=float)
        return pd.Series(np.median(np.hstack([values, np.zeros((len(values), missing))]), axis=1), index=block.index)

    return pd.DataFrame({"typical_launches": median(wide["launches"]), "typical_ns": median(wide["ns"]),
                         "in_steps": (wide["launches"] > 0).sum(axis=1).astype(float)})


def extra_kernels(counts: pd.DataFrame, typical: pd.DataFrame, step: int) -> pd.DataFrame:
    """Kernels that ``step`` launched more often than a typical step: name, short_name, label,
    launches, typical_launches, extra_ns (GPU time beyond the typical, ns), new (bool: no steady
    step runs it); largest extra time first."""
    mine = counts[counts["step"] == step].set_index("name").join(typical, how="left").fillna(
        {"typical_launches": 0.0, "typical_ns": 0.0, "in_steps": 0.0})
    more = mine[mine["launches"] > mine["typical_launches"]]
    out = more.assign(extra_ns=(more["ns"] - more["typical_ns"]).clip(lower=0), new=more["in_steps"] == 0)
    out = out.reset_index().sort_values("extra_ns", ascending=False)
    out["label"] = [kernel_label(n, s) for n, s in zip(out["name"], out["short_name"])]
    return out[["name", "short_name", "label", "launches", "typical_launches", "extra_ns", "new"]]


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms"


def _cause(cause: str, ns: float, text: str, **more) -> dict:
    return {"cause": cause, "excess_ns": float(ns), "text": text, **more}


def time_causes(row: pd.Series, typical: pd.Series) -> list[dict]:
    """Idle and copy time of one step beyond the typical step's, as :func:`causes` entries."""
    def versus(col: str) -> str:
        return f"{_ms(row[col])}, typical {_ms(typical[col])}"

    return [_cause("input_stall", row["input_idle_ns"] - typical["input_idle_ns"],
                   f"GPU idle before the step's first kernel (waiting for input or host work) {versus('input_idle_ns')}"),
            _cause("host_bound_idle", row["host_bound_idle_ns"] - typical["host_bound_idle_ns"],
                   f"GPU idle between kernels with an empty launch queue {versus('host_bound_idle_ns')}"),
            _cause("other_idle", row["other_idle_ns"] - typical["other_idle_ns"],
                   f"GPU idle with work queued {versus('other_idle_ns')}"),
            _cause("memcpy", row["copy_ns"] - typical["copy_ns"],
                   f"copies and memsets ({row['copies']:.0f}, typical {typical['copies']:.0f}) {versus('copy_ns')}")]


def kernel_causes(row: pd.Series, typical: pd.Series, extra: pd.DataFrame) -> list[dict]:
    """Extra kernels (:func:`extra_kernels`) and the usual kernels running longer, as
    :func:`causes` entries."""
    new, top = extra[extra["new"]], extra.head(TOP_KERNELS)
    named = ", ".join(f"{k.label} {_ms(k.extra_ns)} ({k.launches} launches, typical {k.typical_launches:.0f})"
                      for k in top.itertuples()) or "none"
    extra_ns = float(extra["extra_ns"].sum())
    longer = float(row["kernel_ns"] - typical["kernel_ns"]) - extra_ns
    return [_cause("extra_kernels", extra_ns,
                   f"{int(row['kernels'])} kernels, typical {typical['kernels']:.0f}; {len(new)} kernel names no steady "
                   f"step runs (evaluation, recompilation, autotuning?); most extra time: {named}",
                   new_names=int(len(new)),
                   kernels=[{"name": k.name, "label": k.label, "launches": int(k.launches), "new": bool(k.new),
                             "typical_launches": float(k.typical_launches), "extra_ns": float(k.extra_ns)}
                            for k in top.itertuples()]),
            _cause("slower_kernels", longer, f"the usual kernels ran {_ms(longer)} longer in total")]


def causes(row: pd.Series, typical: pd.Series, extra: pd.DataFrame) -> list[dict]:
    """What made one outlier step slow, each an excess over the typical step (``typical``: the
    median of each :func:`step_profile` column over the steady state), largest first: cause,
    excess_ns, text (and for ``extra_kernels``: new_names, how many kernel names no steady step
    runs, and kernels, the top :data:`TOP_KERNELS` by extra time). They can overlap (a host sync
    shows up as host-bound idle too); causes under :data:`MIN_CAUSE_SHARE` of the step's excess are
    left out, except a host sync (listed whenever the step has more than a typical step) and
    kernels no steady step runs (listed whenever there are any)."""
    floor = MIN_CAUSE_SHARE * max(float(row["step_time_ns"] - typical["step_time_ns"]), 0.0)
    # kernels no steady step runs (evaluation, recompilation, autotuning) are named however short
    kept = [c for c in time_causes(row, typical) + kernel_causes(row, typical, extra)
            if c["excess_ns"] > floor or c.get("new_names")]
    if row["syncs"] > typical["syncs"]:
        kept.append(_cause("host_sync", row["sync_ns"] - typical["sync_ns"],
                           f"{row['syncs']:.0f} host synchronizations blocking the host {_ms(row['sync_ns'])}, "
                           f"typical {typical['syncs']:.0f} ({_ms(typical['sync_ns'])})"))
    return sorted(kept, key=lambda c: -c["excess_ns"])


def period(steps: list[int]) -> int | None:
    """The spacing of outlier steps when they recur at a fixed interval (3 or more, equal gaps):
    "every N-th step"; None otherwise."""
    if len(steps) < 3:
        return None
    gaps = np.diff(sorted(steps))
    return int(gaps[0]) if (gaps == gaps[0]).all() and gaps[0] > 1 else None


def outlier_summary(st: pd.DataFrame) -> dict:
    """The rule and totals of report.json's ``outlier_steps``: rule, factor, median_step_time_ns and
    threshold_ns (of the measured steps, outliers included, ns), count, time_ns and
    share_of_measured_time_percent (the outliers' windows), period_steps (:func:`period`).
    ``st``: after :func:`flag_outliers`."""
    candidates = st[st["measured"] | st["outlier"]]
    median = float(candidates["step_time_ns"].median()) if len(candidates) else None
    slow = float(st.loc[st["outlier"], "step_time_ns"].sum())
    total = float(candidates["step_time_ns"].sum())
    return {"rule": STEADY_STATE_RULE, "factor": OUTLIER_FACTOR, "max_share": MAX_OUTLIER_SHARE,
            "min_recurrent": MIN_RECURRENT,
            "median_step_time_ns": median,
            "threshold_ns": OUTLIER_FACTOR * median if median else None,  # no threshold on a zero median (flag_outliers)
            "count": int(st["outlier"].sum()), "time_ns": slow,
            "share_of_measured_time_percent": 100.0 * slow / total if total else None,
            "period_steps": period(st.loc[st["outlier"], "step"].tolist())}


def profile_steps(st: pd.DataFrame, activities: pd.DataFrame, idle: pd.DataFrame, runtime_api: pd.DataFrame,
                  steps_table: pd.DataFrame) -> pd.DataFrame:
    """:func:`step_profile` of the measured and outlier steps, every column present."""
    candidates = st[st["measured"] | st["outlier"]]
    ids = set(candidates["step"])
    api = (in_measured_steps(runtime_api, runtime_api["start_ns"].to_numpy(dtype=float), steps_table, ids)
           if not runtime_api.empty else runtime_api)
    prof = step_profile(candidates, idle_by_step(idle, candidates, activities), copies_by_step(activities),
                        syncs_by_step(api))
    for col in ("input_idle_ns", "host_bound_idle_ns", "other_idle_ns", "copy_ns", "copies", "syncs", "sync_ns"):
        if col not in prof:
            prof[col] = 0.0
    return prof


def outlier_report(st: pd.DataFrame, activities: pd.DataFrame, idle: pd.DataFrame, runtime_api: pd.DataFrame,
                   steps_table: pd.DataFrame, kernels: pd.DataFrame) -> dict:
    """report.json's ``outlier_steps``: :func:`outlier_summary`, typical (the steady state's median
    step profile, null without outliers) and steps: per outlier (slowest first, at most
    :data:`MAX_LISTED`) step, step_time_ns, times_median, excess_ns (over the typical step) and
    causes (:func:`causes`).

    ``st``: after :func:`flag_outliers`; ``activities``: GPU work with ``step``; ``idle``: whole-GPU
    idle intervals; ``runtime_api``: API calls; ``steps_table``: the step ranges (step, start_ns,
    end_ns); ``kernels``: kernel instances with step, name, short_name, duration_ns."""
    out = {**outlier_summary(st), "typical": None, "steps": []}
    if not out["count"]:
        return out
    prof = profile_steps(st, activities, idle, runtime_api, steps_table)
    steady = prof[prof["measured"]]
    typical = steady.drop(columns=["step", "outlier", "measured"]).median()
    counts = kernel_counts(kernels, prof["step"].tolist())
    kinds = typical_kernels(counts, steady["step"].tolist())
    out["typical"] = {k: float(v) for k, v in typical.items()}
    for _, row in prof[prof["outlier"]].sort_values("step_time_ns", ascending=False).head(MAX_LISTED).iterrows():
        out["steps"].append({"step": int(row["step"]), "step_time_ns": float(row["step_time_ns"]),
                             "times_median": float(row["step_time_ns"]) / out["median_step_time_ns"],
                             "excess_ns": float(row["step_time_ns"] - typical["step_time_ns"]),
                             "causes": causes(row, typical, extra_kernels(counts, kinds, int(row["step"])))})
    return out
