"""Attribution of every kernel instance to its step, phase, module and aten op.

A kernel is attributed through the API call that launched it (join on ``global_pid`` +
``correlation_id``): this is NVIDIA's *GPU projection* of NVTX ranges.

- steps and phases are time windows on the host: a kernel belongs to the window containing its
  launch call's start, on any thread of the process. Backward kernels are launched from autograd
  threads while the main thread is inside ``backward()``, so a same-thread rule would lose them.
- modules and ops are push/pop ranges: a kernel belongs to the innermost range open *on the
  launching thread* when the launch call started.

All of it is vectorized (sorts, cumulative sums, searchsorted); the only Python loop is over NVTX
nesting depth, which is small.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpudiag import nvtx_names
from gpudiag.analysis.attribution.families import per_distinct
from gpudiag.analysis.errors import AnalysisError
from gpudiag.sources import int_keys
from gpudiag.sources import names as names_encoding

# Ranges a user names like a step, used when an export has no gpudiag step ranges.
DEFAULT_USER_STEP_REGEX = r"(?i)(?:^|[^a-z])(?:step|iteration|iter)(?:[^a-z]|$)"


@dataclass
class Steps:
    """Step windows in host time. ``table``: step, start_ns, end_ns (sorted, non-overlapping).
    ``source`` says where they came from, in words the report shows."""

    table: pd.DataFrame
    source: str
    kind: str  # "gpudiag", "nvtx" or "whole"
    # Several launcher runs in one capture (see :func:`gpudiag_steps`): per row of ``table``, the
    # run (0, 1, ...) and the launcher's own step number within it; None for a single run.
    runs: pd.DataFrame | None = None


# Rows per slice of the whole-table lookups (:func:`window_index`, :func:`_isin_ids`): their
# temporaries are a few arrays of this many rows, not of every row (13.5 M API calls: 0.7 GB at the
# 5 M-kernel report's peak, docs/scale.md)
SLICE_ROWS = 1 << 20


def launch_calls(kernels: pd.DataFrame, runtime_api: pd.DataFrame) -> pd.DataFrame:
    """For each kernel row (same index), its launch call: api_start_ns, api_end_ns, api_tid,
    api_name. NaN where the export has no matching call (e.g. API tracing was off)."""
    cols = ["api_start_ns", "api_end_ns", "api_tid", "api_name"]
    if runtime_api.empty or kernels.empty:
        return pd.DataFrame({c: pd.Series(np.nan, index=kernels.index) for c in cols})
    # Only the calls of these rows' correlation ids, selected before any column is copied: the
    # join's result is the same, and the copies below stay the size of ``kernels`` (memcpy rows: a
    # few thousand) instead of every API call (the peak memory of a 5 M-kernel report, docs/scale.md).
    ids, wanted = runtime_api["correlation_id"], kernels["correlation_id"]
    # integer ids (as nsys writes them): numpy's isin picks a lookup table for ids in a small range
    # (2.7 M calls against 1 M kernels: 0.03 s, where unique + pandas' isin took 0.8 s)
    keep = (_isin_ids(ids.to_numpy(), wanted.to_numpy()) if ids.dtype == wanted.dtype == np.int64
            else ids.isin(wanted.dropna().unique()).to_numpy())
    api = runtime_api.loc[keep, ["global_pid", "correlation_id", "start_ns", "end_ns", "global_tid", "name"]]
    # a call whose thread id names no process (gpudiag.sources.nsys_sqlite._pid_of) joins nothing
    api = api.dropna(subset=["global_pid", "correlation_id"]).astype({"global_pid": "int64", "correlation_id": "int64"})
    api = api[~_repeated_calls(api)]
    left = kernels[["global_pid", "correlation_id"]].astype({"global_pid": "int64", "correlation_id": "int64"})
    merged = left.merge(api, how="left", on=["global_pid", "correlation_id"])
    merged.index = kernels.index
    return merged.rename(columns={"start_ns": "api_start_ns", "end_ns": "api_end_ns",
                                  "global_tid": "api_tid", "name": "api_name"})[cols]


def _repeated_calls(api: pd.DataFrame) -> np.ndarray:
    """Per row of ``api`` (int64 global_pid, correlation_id), whether an earlier row has the same pair:
    ``api.duplicated([...])``, compared on the correlation id alone where one process made every call
    (:func:`gpudiag.sources.int_keys.duplicated`: 5 M calls in order, 0.006 s against 0.7 s of hashing)."""
    pid = api["global_pid"].to_numpy()
    if len(pid) and pid.min() == pid.max():
        return int_keys.duplicated(api["correlation_id"].to_numpy())
    return api.duplicated(["global_pid", "correlation_id"]).to_numpy()


def _isin_ids(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """``np.isin(ids, wanted)`` for int64 ids: by a lookup table over ``wanted``'s range where that
    table takes at most 8 bytes per id (numpy's own choice stops at 6 entries per element of both:
    the copies of 2.7 M calls against ids up to 20 M were sorted, 0.12 s, not looked up, 0.04 s),
    looked up :data:`SLICE_ROWS` ids at a time (numpy's table method copies every id in
    range twice: 13.5 M API calls, 0.2 GB at the 5 M-kernel report's peak, docs/scale.md)."""
    if not (len(wanted) and len(ids)):
        return np.zeros(len(ids), dtype=bool)
    lo, hi = int(wanted.min()), int(wanted.max())
    if hi - lo > 8 * len(ids):
        return np.isin(ids, wanted)
    table = np.zeros(hi - lo + 1, dtype=bool)
    table[wanted - lo] = True
    out = np.zeros(len(ids), dtype=bool)
    for a in range(0, len(ids), SLICE_ROWS):
        part = ids[a:a + SLICE_ROWS]
        inside = (part >= lo) & (part <= hi)
        out[a:a + len(part)][inside] = table[part[inside] - lo]
    return out


def innermost_range(ranges: pd.DataFrame, query_ns: np.ndarray, query_tid: np.ndarray) -> np.ndarray:
    """Positional index into ``ranges`` (columns start_ns, end_ns, global_tid; properly nested per
    thread, as push/pop ranges are) of the innermost range containing each query time on the same
    thread; -1 where none does. A query exactly at a range's end is outside it.

    Method: sort start (+1), end (-1) and query events per thread; the running sum is the nesting
    depth; the innermost range of a query at depth d is the last range that started at depth d
    (found for every query by one binary search over the starts)."""
    n_q = len(query_ns)
    result = np.full(n_q, -1, dtype=np.int64)
    # Empty ranges contain no time; their end would sort before their own start and skew depths.
    keep = np.flatnonzero((ranges["end_ns"] > ranges["start_ns"]).to_numpy()) if not ranges.empty else np.array([], int)
    if len(keep) == 0 or n_q == 0:
        return result
    original = keep
    ranges = ranges.iloc[keep]
    q_idx = np.flatnonzero(~pd.isna(query_ns) & ~pd.isna(query_tid))
    tids, starts, ends = (ranges[c].to_numpy(np.int64) for c in ("global_tid", "start_ns", "end_ns"))
    q_tid, q_t = np.asarray(query_tid)[q_idx].astype(np.int64), np.asarray(query_ns)[q_idx].astype(np.int64)
    if len(q_idx) < len(tids):
        # fewer queries than ranges (the host-compute stretches against every NVTX range): a range that
        # holds no query is no query's innermost, and a subset of nested ranges is nested, so the sort
        # below takes only the ranges holding one (3.6 M ranges, 5 M kernels: 1.8 s and ~0.5 GB less)
        held = np.flatnonzero(_holding_a_query(tids, starts, ends, q_tid, q_t))
        original, tids, starts, ends = original[held], tids[held], starts[held], ends[held]
    n_r = len(tids)
    if n_r == 0 or len(q_idx) == 0:
        return result
    tid = np.concatenate([tids, tids, q_tid])
    t = np.concatenate([starts, ends, q_t])
    # ends sort before starts at equal times (adjacent siblings), queries after both
    order = np.concatenate([np.ones(n_r, np.int8), np.zeros(n_r, np.int8), np.full(len(q_idx), 2, np.int8)])
    ref = np.concatenate([np.arange(n_r), np.arange(n_r), q_idx])
    sort = np.lexsort((order, t, tid))  # stable: by thread, time, then end/start/query
    tid, order, ref = tid[sort], order[sort], ref[sort]
    # every range's start and end are events of its own thread, so each thread's deltas sum to 0:
    # one running sum over all threads is each thread's own nesting depth
    depth = np.cumsum(np.select([order == 1, order == 0], [1, -1], 0))
    is_start, is_query = order == 1, (order == 2) & (depth > 0)
    # the innermost range of a query at depth d: the last range of its thread that started at
    # depth d before it (one that ended since was followed by another start at d). One search in
    # the starts keyed by (thread, depth, position) instead of a pass per depth.
    thread = np.cumsum(np.r_[0, tid[1:] != tid[:-1]])
    pos = np.arange(len(tid), dtype=np.int64)
    key = (thread * (int(depth.max()) + 1) + depth) * len(tid) + pos
    start_keys = key[is_start]
    by_key = np.argsort(start_keys, kind="stable")
    start_keys_sorted, start_refs = start_keys[by_key], ref[is_start][by_key]
    q_keys = key[is_query]
    at = np.searchsorted(start_keys_sorted, q_keys, side="right") - 1
    same = (at >= 0) & (start_keys_sorted[np.maximum(at, 0)] // len(tid) == q_keys // len(tid))
    result[ref[is_query][same]] = original[start_refs[at[same]]]
    return result


def _holding_a_query(r_tid: np.ndarray, r_start: np.ndarray, r_end: np.ndarray, q_tid: np.ndarray,
                     q_t: np.ndarray) -> np.ndarray:
    """Per range (thread, start, end; int64 ns), whether a query of its thread (``q_tid``, ``q_t``)
    lies in [start, end): a query at a range's end is outside it, as in :func:`innermost_range`."""
    held = np.zeros(len(r_tid), dtype=bool)
    for thread in np.unique(q_tid):  # the queries' threads: a few launching threads
        times = np.sort(q_t[q_tid == thread])
        on = np.flatnonzero(r_tid == thread)
        held[on] = np.searchsorted(times, r_start[on], side="left") < np.searchsorted(times, r_end[on], side="left")
    return held


def window_index(starts: np.ndarray, ends: np.ndarray, ts: np.ndarray, labels: np.ndarray | None = None) -> np.ndarray:
    """Index (int64) of the window [start, end) containing each time in ``ts`` (ns, any numeric
    dtype, NaN for none; windows sorted and non-overlapping), -1 where none does or ``ts`` is NaN;
    with ``labels`` (integers, one per window), the window's label instead of its index.
    Compared as float64, as the times always were; computed :data:`SLICE_ROWS` at a time."""
    ts = np.asarray(ts)
    out = np.full(len(ts), -1, dtype=np.int64)
    if len(starts) == 0:
        return out
    starts, ends = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    for a in range(0, len(ts), SLICE_ROWS):
        t = ts[a:a + SLICE_ROWS].astype(float, copy=False)
        i = np.searchsorted(starts, t, side="right") - 1
        ok = (i >= 0) & ~np.isnan(t)
        ok[ok] &= t[ok] < ends[i[ok]]
        out[a:a + len(t)][ok] = i[ok] if labels is None else labels[i[ok]]
    return out


def closure_phases(phase: pd.Series, phases: pd.DataFrame, api_start: np.ndarray,
                   module_index: np.ndarray) -> pd.Series | pd.Categorical:
    """``phase`` with the work of a closure ``optimizer.step(closure)`` ran taken out of the
    optimizer phase: a kernel launched with the optimizer range outermost but a ``backward()``
    range inside it is backward work, and one launched inside a module's forward is forward work.
    gpudiag's launcher closes the optimizer range while a closure runs (``gpudiag:closure``); an
    export made before it did (Lightning's automatic optimization, LBFGS) counted the closure's
    forward and backward as the optimizer's (59 % of a ResNet-50 step, issue 45). ``phases``: every
    phase range (start_ns, end_ns, text); ``module_index``: the innermost module range of each
    kernel's launch (-1 for none). A backward range is matched by time on any thread: autograd
    launches the backward kernels from its own device thread while ``backward()`` waits on the
    thread that pushed the range."""
    optimizer = (phase == "optimizer").to_numpy()
    if not optimizer.any():
        return phase
    backward_ranges = phases[phases["text"] == nvtx_names.PHASE + "backward"]
    backward = np.zeros(len(optimizer), dtype=bool)
    if not backward_ranges.empty:
        rows = np.flatnonzero(optimizer)  # only the optimizer's kernels are looked up
        outer = _outermost(backward_ranges)
        backward[rows] = window_index(outer["start_ns"].to_numpy(), outer["end_ns"].to_numpy(), api_start[rows]) >= 0
    forward = optimizer & ~backward & (module_index >= 0)
    if not (backward.any() or forward.any()):
        return phase
    out = phase.astype(object).to_numpy(copy=True)
    out[backward], out[forward] = "backward", "forward"
    return pd.Categorical(out, categories=sorted(set(out)))  # sorted categories, as names.spread makes


def _outermost(ranges: pd.DataFrame) -> pd.DataFrame:
    """Drop ranges that start inside an earlier one (keeps the outermost of nested matches)."""
    r = ranges.sort_values("start_ns", kind="stable")
    prev_end = r["end_ns"].astype(float).cummax().shift(1, fill_value=-np.inf)
    return r[r["start_ns"] >= prev_end]


def gpudiag_steps(ranges: pd.DataFrame, tails: pd.DataFrame) -> Steps | None:
    """Steps from gpudiag's step ranges (``ranges``: start_ns, end_ns, text ``gpudiag:step N``) and
    tail ranges (``tails``); None without step ranges.

    The launcher closes a step that never reached its boundary and marks it with a tail range: the
    step range that started last before each tail is incomplete and is not a step. The launcher
    numbers the steps of a run 0, 1, 2, ...; a number that does not grow starts another run in the
    same capture (one capture of several runs, or a long capture made by replicating one in time,
    as benchmarks/scale.py does). A single run keeps the launcher's numbers; several runs are
    numbered 0, 1, 2, ... in time order, and :attr:`Steps.runs` keeps each step's run and number
    within it, so that each run gets its own warm-up and detail step (:func:`run_flags`)."""
    if ranges.empty:
        return None
    r = ranges.sort_values("start_ns", kind="stable", ignore_index=True)
    number = r["text"].str[len(nvtx_names.STEP):].astype(int).to_numpy()
    run = np.concatenate([[0], np.cumsum(number[1:] <= number[:-1])])  # r has a row: ranges is not empty
    keep = np.ones(len(r), dtype=bool)
    if not tails.empty:
        before = np.searchsorted(r["start_ns"].to_numpy(), tails["start_ns"].to_numpy(), side="left") - 1
        keep[before[before >= 0]] = False
    r, number, run = r[keep], number[keep], run[keep]
    if r.empty:
        return None
    several = len(np.unique(run)) > 1
    t = pd.DataFrame({"step": np.arange(len(r)) if several else number,
                      "start_ns": r["start_ns"].to_numpy(), "end_ns": r["end_ns"].to_numpy()})
    runs = pd.DataFrame({"step": t["step"], "run": run, "run_step": number}) if several else None
    source = "gpudiag step ranges (optimizer.step() or gpudiag.step())"
    if several:
        source += f" of {len(np.unique(run))} runs (each with its own warm-up and detail step)"
    return Steps(t, source, "gpudiag", runs)


def run_flags(st: pd.DataFrame, steps: Steps, warmup_steps: int, detail_step: int | None) -> pd.DataFrame:
    """``st`` (a step table with step, warmup, detail, measured) with warm-up, detail and measured
    set per run when ``steps`` holds several launcher runs (:func:`gpudiag_steps`): in each run the
    first ``warmup_steps`` steps with GPU work are warm-up, and the step with the detail step's
    number within its run is a detail step (each run recorded its op ranges on it). Unchanged for
    a single run."""
    if steps.runs is None or st.empty:
        return st
    info = steps.runs.set_index("step").reindex(st["step"].to_numpy())
    run, run_step = info["run"].to_numpy(), info["run_step"].to_numpy()
    position = pd.Series(run).groupby(run).cumcount().to_numpy()
    detail_number = run_step[st["step"].to_numpy() == detail_step] if detail_step is not None else []
    st = st.copy()
    st["warmup"] = position < warmup_steps
    st["detail"] = np.isin(run_step, detail_number)
    st["measured"] = ~st["warmup"] & ~st["detail"]
    if not st["measured"].any():  # as step_table: runs of only warm-up steps are reported rather than nothing
        st["warmup"] = False
        st["measured"] = ~st["detail"] if (~st["detail"]).any() else True
    return st


def find_steps(nvtx: pd.DataFrame, kernels: pd.DataFrame, steps_from: str | None = None,
               runtime_api: pd.DataFrame | None = None) -> Steps:
    """Step windows: gpudiag's own step ranges when present (unless ``steps_from`` is
    ``nvtx:REGEX``), else the user's ranges matching REGEX or :data:`DEFAULT_USER_STEP_REGEX`,
    else the whole capture as one window (from the first launch call or kernel, whichever is
    earlier, to one past the last kernel's end). Without kernels (the pipeline refuses such an
    export; a direct call may not) that window is [start, start + 1): it starts at the first
    launch call, or at 0 without one, and holds no kernel. Raises :class:`AnalysisError` for an
    invalid REGEX."""
    text = nvtx["text"].fillna("") if not nvtx.empty else pd.Series(dtype=str)
    regex = steps_from[5:] if steps_from and steps_from.startswith("nvtx:") else None
    if regex is None:
        mine = gpudiag_steps(nvtx[text.str.startswith(nvtx_names.STEP)], nvtx[text == nvtx_names.TAIL])
        if mine is not None:
            return mine
    try:
        pattern = re.compile(regex or DEFAULT_USER_STEP_REGEX)
    except re.error as exc:
        raise AnalysisError(f"--steps-from nvtx:{regex}: invalid regular expression ({exc})") from None
    with warnings.catch_warnings():  # a user's REGEX may hold groups: only whether it matches counts here
        warnings.filterwarnings("ignore", "This pattern is interpreted as a regular expression, and has match groups",
                                UserWarning)
        user = nvtx[~text.str.startswith(nvtx_names.PREFIX) & text.str.contains(pattern)] if not nvtx.empty else nvtx
    if not user.empty:
        user = _outermost(user)
        t = pd.DataFrame({"step": np.arange(len(user)), "start_ns": user["start_ns"].to_numpy(),
                          "end_ns": user["end_ns"].to_numpy()})
        return Steps(t, f"user NVTX ranges matching {pattern.pattern!r}", "nvtx")
    starts = [] if kernels.empty else [kernels["start_ns"].min()]
    if runtime_api is not None and not runtime_api.empty:
        starts.append(runtime_api["start_ns"].min())  # kernels are assigned by their launch call
    start = min(starts, default=0)
    end = kernels["end_ns"].max() if not kernels.empty else start  # no kernels: [start, start + 1) holds none
    t = pd.DataFrame({"step": [0], "start_ns": [start], "end_ns": [end + 1]})
    return Steps(t, "whole capture (no step ranges found; pass --steps-from nvtx:REGEX to use your own)", "whole")


def op_payloads(ops: pd.DataFrame, outs: pd.DataFrame) -> pd.Series:
    """JSON payload per op range (same order as ``ops``), dictionary-encoded: the op range's
    ``{"op":..,"in":..}`` with ``"out"`` added from the empty out range nested at its end (null if
    there is none). Each distinct (op text, out text) pair is joined once: a step repeats its
    ops, so a million op ranges hold a few thousand pairs (docs/scale.md, issue 36)."""
    op_codes, op_texts = pd.factorize(ops["text"].astype(object).to_numpy())
    out_codes = np.full(len(ops), -1, dtype=np.int64)  # -1: no out range, "null"
    out_texts = np.array([], dtype=object)
    if not outs.empty:
        owner = innermost_range(ops, outs["start_ns"].to_numpy(), outs["global_tid"].to_numpy())
        found = owner >= 0
        codes, out_texts = pd.factorize(outs["text"].astype(object).to_numpy())
        out_codes[owner[found]] = codes[found]
    pairs, distinct = pd.factorize(op_codes.astype(np.int64) * (len(out_texts) + 1) + out_codes + 1)
    joined = [_with_out(op_texts[key // (len(out_texts) + 1)], out_texts[key % (len(out_texts) + 1) - 1]
                        if key % (len(out_texts) + 1) else None) for key in distinct]
    return pd.Series(names_encoding.spread(np.array(joined, dtype=object), pairs), index=ops.index)


def _with_out(op_text: str, out_text: str | None) -> str:
    """One op range's payload with its out range's outputs (None: no out range, "null")."""
    payload = op_text[len(nvtx_names.OP):]
    out_json = "null" if out_text is None else out_text[len(nvtx_names.OUT):]
    # Payloads that already hold outputs (captures made before out ranges existed) stay as they are.
    if payload.endswith("}") and '"out":' not in payload:
        return payload[:-1] + ',"out":' + out_json + "}"
    return payload


def op_call_payloads(nvtx: pd.DataFrame) -> pd.Series:
    """JSON payload (with outputs) of every op range, indexed by op_call: the op ranges in the
    export's order, which :func:`attribute` numbers the same way. Empty without op ranges."""
    if nvtx.empty:
        return pd.Series(dtype=object)
    text = nvtx["text"].fillna("")
    ops = nvtx[text.str.startswith(nvtx_names.OP)].reset_index(drop=True)
    return op_payloads(ops, nvtx[text.str.startswith(nvtx_names.OUT)]) if not ops.empty else pd.Series(dtype=object)


def attribute(kernels: pd.DataFrame, runtime_api: pd.DataFrame, nvtx: pd.DataFrame, steps: Steps,
              payloads: pd.Series | None = None) -> pd.DataFrame:
    """Attribution table, one row per kernel (same order as ``kernels``), with columns:
    kernel_id, api_start_ns, api_end_ns, api_tid, api_name, step (-1 outside every step),
    module (qualified path, '' if none), module_class, phase (forward/backward/optimizer/other:
    the phase range open at the launch; outside every phase range, forward when a module range
    is open, else other), op (aten op name, '' if none), op_args (JSON text of shapes/dtypes, ''
    if none), op_call (index of the op call that launched it, -1 if none).

    Kernels with no launch call in the export (API tracing off) have no step, except when the
    step is the whole capture: then their own start time places them. ``payloads``: the
    :func:`op_call_payloads` of ``nvtx`` when the caller already has them."""
    out = launch_calls(kernels, runtime_api)
    out.insert(0, "kernel_id", kernels["kernel_id"].to_numpy())
    when = out["api_start_ns"].to_numpy(dtype=float)
    if steps.kind == "whole":
        when = np.where(np.isnan(when), kernels["start_ns"].to_numpy(dtype=float), when)
    st = steps.table
    idx = window_index(st["start_ns"].to_numpy(), st["end_ns"].to_numpy(), when)
    out["step"] = np.where(idx >= 0, st["step"].to_numpy()[np.maximum(idx, 0)], -1)

    text = nvtx["text"].fillna("") if not nvtx.empty else pd.Series(dtype=str)
    phase = nvtx[text.str.startswith(nvtx_names.PHASE)] if not nvtx.empty else nvtx
    all_phases = phase
    phase = _outermost(phase) if not phase.empty else phase
    pidx = window_index(phase["start_ns"].to_numpy(), phase["end_ns"].to_numpy(), when) if not phase.empty else np.full(len(out), -1)
    phase_names = phase["text"].str[len(nvtx_names.PHASE):].to_numpy() if not phase.empty else np.array([])

    tid = out["api_tid"].to_numpy(dtype=float)
    api_start = out["api_start_ns"].to_numpy(dtype=float)
    modules = nvtx[text.str.startswith(nvtx_names.MODULE)].reset_index(drop=True) if not nvtx.empty else nvtx
    midx = innermost_range(modules, api_start, tid)
    # "path|Class" split once per distinct range text (a few thousand for a million ranges)
    mod_path = per_distinct(modules["text"], lambda t: t[len(nvtx_names.MODULE):].rsplit("|", 1)[0]) \
        if not modules.empty else np.array([], dtype=object)
    mod_cls = per_distinct(modules["text"], lambda t: t[len(nvtx_names.MODULE):].rsplit("|", 1)[-1]) \
        if not modules.empty else np.array([], dtype=object)
    out["module"] = names_encoding.spread(mod_path, midx)
    out["module_class"] = names_encoding.spread(mod_cls, midx)

    # the phase range open at the launch; outside every one, forward inside a module, else other
    phase_index = np.where(pidx >= 0, pidx, np.where(midx >= 0, len(phase_names), -1))
    out["phase"] = names_encoding.spread(np.append(np.asarray(phase_names, dtype=object), "forward"), phase_index, "other")
    out["phase"] = closure_phases(out["phase"], all_phases, api_start, midx)

    ops = nvtx[text.str.startswith(nvtx_names.OP)].reset_index(drop=True) if not nvtx.empty else nvtx
    oidx = innermost_range(ops, api_start, tid)
    if not ops.empty:
        payload = payloads if payloads is not None else op_call_payloads(nvtx)
        op_names = payload.str.extract(r'^\{"op":"([^"]*)"', expand=False).fillna("?").to_numpy(dtype=object)
        payload = payload.to_numpy(dtype=object)
        out["op"] = names_encoding.spread(op_names, oidx)
        out["op_args"] = names_encoding.spread(payload, oidx)
    else:
        out["op"] = names_encoding.spread(np.array([], dtype=object), oidx)
        out["op_args"] = names_encoding.spread(np.array([], dtype=object), oidx)
    out["op_call"] = oidx  # which op call (range) launched it; kernels of one call share its cost
    return out.reset_index(drop=True)
