"""Several processes in one export (``torchrun`` under one ``nsys profile``): one analysis per
process, and a merged view of the ranks side by side.

The per-process analysis is a plain function of (run database file, process):
:func:`analyse_process` copies that process's rows of the run database into memory (the analysis
writes its tables back, and ranks must not overwrite each other's; one rank's rows bound its
memory) and runs :func:`gpudiag.analysis.pipeline.analyse` on that process alone (the pipeline
passes it in: this stage never imports the pipeline), so a process pool (here) or a cluster engine
(:mod:`gpudiag.analysis.ranks.engine`: Dask) can map it over processes. The merged view
(:func:`merged_view`) reads the per-rank reports only.

A rank is identified by its process (``global_pid``; the OS pid is bits 24..47) and the GPU that
ran most of its kernel time; ``RANK``/``LOCAL_RANK`` come from the launcher's status where it
recorded them (``status["ranks"]``: [{pid, rank, local_rank}]), else they are null.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import pandas as pd
import sqlite_utils

from gpudiag import derived_text, store
from gpudiag.analysis.attribution.families import COMMUNICATION, families
from gpudiag.analysis.errors import AnalysisError
from gpudiag.analysis.ingest import Tables
from gpudiag.analysis.ranks.comm import TRANSFER_TABLE
from gpudiag.sources import names
from gpudiag.script_status import ScriptStatus


def os_pid(global_pid: int) -> int:
    """The OS process id inside an nsys ``globalPid`` (bits 24..47)."""
    return (int(global_pid) >> 24) & 0xFFFFFF


def processes(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per process that launched kernels, most kernel time first: global_pid, device_id
    (the GPU with most of its kernel time), kernel_ns."""
    by = kernels.groupby(["global_pid", "device_id"])["duration_ns"].sum().reset_index()
    main = by.sort_values("duration_ns", ascending=False).drop_duplicates("global_pid")
    total = kernels.groupby("global_pid")["duration_ns"].sum()
    out = pd.DataFrame({"global_pid": main["global_pid"].astype("int64"), "device_id": main["device_id"].astype("int64")})
    out["kernel_ns"] = out["global_pid"].map(total).astype(float)
    return out.sort_values("kernel_ns", ascending=False).reset_index(drop=True)


def one_process(t: Tables, process: int | None, warnings: list[str]) -> tuple[Tables, pd.DataFrame | None]:
    """``t`` restricted to the rows of one process: ``process``, else :func:`main_process` (with a
    warning); and, when several processes launched kernels and ``process`` is None, every process
    (:func:`processes`) for the ranks table, else None."""
    # One process per report: step numbers, stream ids and correlation ids are per process.
    kernel_ns_by_pid = t.kernels.groupby("global_pid")["duration_ns"].sum()
    procs = processes(t.kernels) if len(kernel_ns_by_pid) > 1 and process is None else None
    if process is not None and process not in kernel_ns_by_pid.index:
        raise no_kernel(process)
    if len(kernel_ns_by_pid) <= 1:
        return t, procs
    pid = process
    if process is None:
        pid, which = main_process(t.kernels, kernel_ns_by_pid)
        warnings.append(f"{len(kernel_ns_by_pid)} processes launched kernels; this report covers {which} "
                        f"(pid {os_pid(pid)}, {100 * kernel_ns_by_pid[pid] / kernel_ns_by_pid.sum():.0f} % of the "
                        "kernel time); the ranks table compares them all")
    own = {name: getattr(t, name) for name in ("runtime_api", "nvtx", "memcpy", "memset")}
    return t._replace(kernels=t.kernels[t.kernels["global_pid"] == pid].reset_index(drop=True),
                      **{name: df[df["global_pid"] == pid].reset_index(drop=True) if not df.empty else df
                         for name, df in own.items()}), procs


def no_kernel(global_pid: int) -> AnalysisError:
    """The error of asking for a process that launched no kernel."""
    return AnalysisError(f"process {os_pid(global_pid)} (globalPid {global_pid}) launched no kernel in this export")


def main_process(kernels: pd.DataFrame, kernel_ns_by_pid: pd.Series) -> tuple[int, str]:
    """(global_pid, how it was chosen) of the process a several-process report covers: where the
    collectives were split into transfer and wait (comm module doc), the rank whose collectives
    wait least, the one the others wait for (its steps are the job's critical path; the ranks that
    arrive first spin longest in NCCL and would win on kernel time); else the most kernel time."""
    split = kernels["transfer_ns"].notna()
    if split.any():
        waits = (kernels["duration_ns"] - kernels["transfer_ns"])[split].groupby(kernels["global_pid"][split]).sum()
        return int(waits.idxmin()), "the rank the others wait for in their collectives"
    return int(kernel_ns_by_pid.idxmax()), "the one with the most kernel time"


def database_file(db: sqlite_utils.Database) -> str | None:
    """The file behind ``db`` (None for an in-memory database)."""
    rows = db.conn.execute("PRAGMA database_list").fetchall()
    return next((r[2] for r in rows if r[1] == "main" and r[2]), None)


def analyse_process(run_db: str, global_pid: int, options: dict, analyse: Callable[..., dict]) -> dict:
    """report.json's content for process ``global_pid`` of the run database file ``run_db``: ``analyse``
    (:func:`gpudiag.analysis.pipeline.analyse`, passed in so that this stage does not import the
    pipeline) with the keyword arguments ``options``. The file is only read: the analysis runs on
    an in-memory copy of this process's rows (:func:`process_copy`), so its memory is one rank's,
    whatever the number of ranks. Raises AnalysisError as ``analyse`` does (also for a process that
    launched no kernel)."""
    return analyse(sqlite_utils.Database(process_copy(run_db, int(global_pid))), process=int(global_pid), **options)


# Tables the analysis writes (it replaces them): not copied for a rank's analysis.
DERIVED_TABLES = ("kernel_attribution", "kernel_class", "steps",
                  *(f"{t}{suffix}" for t in store.DERIVED_TABLES for suffix in (names.CODED_SUFFIX, derived_text.TEXT_SUFFIX)))


def process_copy(run_db: str, global_pid: int) -> sqlite3.Connection:
    """An in-memory copy of the run database file ``run_db`` holding, of every table with a
    ``global_pid`` column, the rows of process ``global_pid`` only, and the other tables whole (less
    :data:`DERIVED_TABLES`). The transfer/wait split pairs one collective's kernels across ranks:
    where the file holds the pairing (:data:`gpudiag.analysis.ranks.comm.TRANSFER_TABLE`, written
    by the analysis of every rank) the copy has it; else ``kernels`` also keeps every other
    process's communication kernels (:func:`gpudiag.analysis.ranks.comm.peer_transfer_ns` reads
    nothing else). Rows keep their order. The analysis of that copy with ``process=global_pid``
    reads the same frames as on the whole file. Raises AnalysisError when that process launched no
    kernel."""
    mem = sqlite3.connect(":memory:", uri=True)  # uri: ATTACH below opens the file read-only
    # the rows are copied by SQLite itself (INSERT ... SELECT), not through Python row by row
    try:
        mem.execute("ATTACH DATABASE ? AS src", (f"file:{urllib.parse.quote(run_db)}?mode=ro",))
        if mem.execute("SELECT 1 FROM src.kernels WHERE global_pid = ? LIMIT 1", (global_pid,)).fetchone() is None:
            raise no_kernel(global_pid)
        tables = mem.execute("SELECT name, sql FROM src.sqlite_master WHERE type = 'table'").fetchall()
        comm_names = [] if TRANSFER_TABLE in {name for name, _ in tables} else _communication_names(mem)
        for name, sql in tables:
            if name in DERIVED_TABLES or name.startswith("sqlite_"):
                continue
            mem.execute(sql)  # the CREATE statement names no schema: the table is made in main
            columns = {c[1] for c in mem.execute(f'PRAGMA src.table_info("{name}")')}
            where, args = "", ()
            if "global_pid" in columns:
                where, args = " WHERE global_pid = ?", (global_pid,)
                if name == names.coded_table("kernels") and comm_names:
                    where += f" OR name IN ({','.join('?' * len(comm_names))})"
                    args += tuple(comm_names)
            mem.execute(f'INSERT INTO main."{name}" SELECT * FROM src."{name}"{where} ORDER BY rowid', args)
        for name, sql in mem.execute("SELECT name, sql FROM src.sqlite_master WHERE type = 'view'").fetchall():
            if name not in DERIVED_TABLES:  # the name views (gpudiag.store), over the tables just copied
                mem.execute(sql)
        mem.commit()
    except BaseException:
        mem.close()
        raise
    mem.execute("DETACH DATABASE src")
    return mem


def _communication_names(conn: sqlite3.Connection) -> list[int]:
    """The codes (``names.id``, as the ``kernels.name`` column holds them) of the kernel names of
    the run database attached to ``conn`` as ``src`` that are communication kernels (family from
    the name)."""
    rows = conn.execute(f"SELECT id, value FROM src.{names.NAMES_TABLE} WHERE id IN (SELECT DISTINCT name FROM src.{names.coded_table('kernels')})").fetchall()
    if not rows:
        return []
    ids, texts = zip(*rows)
    return [i for i, family in zip(ids, families(pd.Series(texts, dtype=object))) if family == COMMUNICATION]


def analyse_one(run_db: str, global_pid: int, options: dict, analyse: Callable[..., dict]) -> dict:
    """:func:`analyse_process`, with an analysis error kept as the rank's result ({"error": text})."""
    try:
        return analyse_process(run_db, global_pid, options, analyse)
    except AnalysisError as exc:
        return {"error": str(exc)}


def analyse_processes(run_db: str, pids: list[int], options: dict, workers: int | None,
                      analyse: Callable[..., dict]) -> dict[int, dict]:
    """global_pid -> report (or {"error": text}) for each of ``pids`` (:func:`analyse_process`); in a
    process pool of ``workers`` (None: one per process, at most the CPU count) when there is more
    than one. ``analyse`` is a module-level function, so the pool can pickle it by name."""
    if len(pids) <= 1:
        return {int(p): analyse_one(run_db, p, options, analyse) for p in pids}
    workers = workers or min(len(pids), os.cpu_count() or 1)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {int(p): pool.submit(analyse_one, run_db, int(p), options, analyse) for p in pids}
        return {p: f.result() for p, f in futures.items()}


def _rank_ids(status: ScriptStatus | None) -> dict[int, dict]:
    """OS pid -> {rank, local_rank} from the launcher's status, where it recorded them."""
    out = {}
    for entry in (status.ranks if status is not None else None) or []:
        if entry.pid is not None:
            out[int(entry.pid)] = {"rank": entry.rank, "local_rank": entry.local_rank}
    return out


def status_of_process(status: ScriptStatus | dict | None, global_pids) -> ScriptStatus | None:
    """The status that describes the one process of ``global_pids`` (a column of nsys global pids):
    for a rank of a launched job, the status that rank wrote (gpudiag.capture.rank_hook), with the
    bare run of the same rank as its ``bare_run``; else ``status`` unchanged (a single process, the
    launcher itself, or several processes). The rank's status holds the job's as ``job_status``."""
    status = ScriptStatus.of(status)
    entries = (status.ranks if status is not None else None) or []
    if not entries:  # before looking at the pids: a column of 1 M kernels, read only for a launched job
        return status
    # the distinct values in C (pd.unique), not a Python set of every row; tolist: the values as set() sees them
    pids = {os_pid(g) for g in pd.unique(pd.Series(global_pids)).tolist()} if len(global_pids) else set()
    if len(pids) != 1:
        return status
    pid = pids.pop()
    own = next((e for e in entries if e.pid == pid), None)
    if own is None:
        return status
    bare = next((e for e in ((status.bare_run.ranks if status.bare_run else None) or []) if e.rank == own.rank), None)
    return own.replaced(bare_run=bare, job_status=status.without("ranks", "bare_run"))


def bare_by_rank(status: ScriptStatus | dict | None) -> dict[int, float]:
    """rank -> median step time (ns) of that rank in the run without the profiler (the bare run's
    ``ranks``: statuses the ranks wrote, gpudiag.capture.rank_hook): CUDA events where recorded,
    else host time, over the steps after the warm-up. Ranks are matched by rank, not pid: the
    bare run's processes are others."""
    import statistics

    from gpudiag.analysis.steps.representative import step_times  # as the trials read a status's measured steps

    status = ScriptStatus.of(status) or ScriptStatus()
    out = {}
    for entry in (status.bare_run.ranks if status.bare_run else None) or []:
        times = step_times(entry)[0] if entry.rank is not None else []
        if times:
            out[int(entry.rank)] = statistics.median(times)
    return out


def _row(global_pid: int, device_id: int, report: dict, ids: dict) -> dict:
    steps = (report.get("steps") or {}).get("step_time_ns") or {}
    comm = report.get("communication") or {}
    recs = report.get("recommendations") or []
    return {"global_pid": int(global_pid), "pid": os_pid(global_pid), "device_id": int(device_id),
            "rank": ids.get("rank"), "local_rank": ids.get("local_rank"),
            "measured_steps": (report.get("steps") or {}).get("measured"),
            "step_time_ns_median": steps.get("median"), "step_time_ns_mean": steps.get("mean"),
            "gpu_busy_percent": report.get("gpu_busy_percent"),
            "breakdown_percent": report.get("breakdown_percent"),
            "communication_ns_per_step": comm.get("kernel_ns_per_step"),
            "exposed_communication_ns_per_step": comm.get("exposed_ns_per_step"),
            "op_calls_recorded": (report.get("instrumentation") or {}).get("op_calls_recorded"),
            "top_recommendation": recs[0]["rule_id"] if recs else None,
            "error": report.get("error")}


def _rule_saving(report: dict, rule_id: str) -> float:
    recs = (report.get("recommendations") or []) + (report.get("suppressed") or [])
    return float(next((r.get("saving_ns_per_step") or 0.0 for r in recs if r.get("rule_id") == rule_id), 0.0))


def _kernel_ns(report: dict) -> float:
    """GPU work per step: busy time (median over measured steps; the breakdown's "overhead" holds
    host-bound idle too, so it is not used here) less the exposed communication, which on the
    ranks that arrive first is mostly waiting for the last (:mod:`gpudiag.analysis.ranks.comm`)."""
    import statistics

    busy = [m["busy_ns"] for m in report.get("per_step_metrics") or [] if m.get("busy_ns") is not None]
    exposed = (report.get("communication") or {}).get("exposed_ns_per_step") or 0.0
    return max(float(statistics.median(busy)) - float(exposed), 0.0) if busy else 0.0


def _waits_ns(report: dict) -> float:
    """Time per step its collectives wait for other ranks (transfer split, comm module doc); the
    exposed communication where the export could not split it."""
    c = report.get("communication") or {}
    return float(c.get("wait_ns_per_step") if c.get("wait_ns_per_step") is not None else c.get("exposed_ns_per_step") or 0.0)


# Ranks whose median steps differ by less than this run in lockstep (a collective every step ends
# them together), so the step time cannot name the straggler (gpudiag's choice: the bare runs of
# one job's ranks differ by ~1 %, docs/ranks_proof.md).
LOCKSTEP = 0.05


def _own_work_ns(report: dict) -> float:
    """Time per step a rank spends on its own before the collective: its input stall (idle before
    its steps' first kernel) and its GPU work. What it waits for, the others, is not in it."""
    return _stall_ns(report) + _kernel_ns(report)


def _stall_ns(report: dict) -> float:
    """Host-bound GPU idle before the steps' first kernel, ns per step (GD-INPUT-STALL's measure)."""
    stall = (report.get("idle") or {}).get("step_start_idle_ns_per_step")
    if stall is None:  # a report written before step_start_idle existed
        stall = _rule_saving(report, "GD-INPUT-STALL")
    return float(stall or 0.0)


def straggler_cause(slow: dict, fast: dict) -> dict:
    """Why the straggler ``slow`` takes longer than ``fast``, from their reports (ns per measured step):
    the largest of the input stall (idle before the steps' first kernel: what GD-INPUT-STALL measures), more
    GPU work (busy time less exposed communication, with the kernels per step), more host time (the
    rest of its host-bound idle) and late arrival at the collective (the fastest rank's wait in
    its collectives over the straggler's: it waits there for the straggler). Returns {"cause",
    "excess_ns", "components": {cause: ns}, "text"}; components under 0 count as 0, and with none
    above 0 the cause is None."""
    stall = _stall_ns(slow) - _stall_ns(fast)
    host = ((slow.get("idle") or {}).get("host_bound_idle_ns_per_step") or 0.0) - \
        ((fast.get("idle") or {}).get("host_bound_idle_ns_per_step") or 0.0) - max(stall, 0.0)
    waits = _waits_ns(fast) - _waits_ns(slow)
    components = {"input stall": stall, "more GPU work": _kernel_ns(slow) - _kernel_ns(fast),
                  "more host time": host, "late arrival at the collective": waits}
    components = {k: max(float(v), 0.0) for k, v in components.items()}
    cause = max(components, key=components.get)
    if components[cause] <= 0:
        return {"cause": None, "excess_ns": 0.0, "components": components,
                "text": "no cause found in its report (stall, GPU work, host time and collective waits are no larger)"}
    kernels = lambda r: ((r.get("launches_per_step") or {}).get("kernels") or 0.0)  # noqa: E731
    detail = {"input stall": "idle before its steps' first kernel (data loading: see its GD-INPUT-STALL)",
              "more GPU work": f"{kernels(slow):.0f} kernels per step against {kernels(fast):.0f}",
              "more host time": "the GPU waits for its host between kernels",
              "late arrival at the collective": "the other ranks wait for it in the collective"}[cause]
    return {"cause": cause, "excess_ns": components[cause], "components": components,
            "text": f"{cause}: {components[cause] / 1e6:.2f} ms per step more than the fastest rank ({detail})"}


def merged_view(procs: pd.DataFrame, reports: dict[int, dict], status: ScriptStatus | dict | None = None) -> dict:
    """report.json's ``ranks``: one row per process (``procs``: :func:`processes`; ``reports``:
    global_pid -> its report) with step time (ns, median and mean of its measured steps), GPU busy
    (%), breakdown (%), communication and exposed communication (ns per step); each row's
    ``slower_than_fastest_percent``; ``straggler``: the rank the others wait for (:func:`_straggler`:
    at their collectives, which can make it the rank with the shortest median step), its excess
    over the fastest (ns and %), why, and a sentence; None with fewer than two timed ranks."""
    status = ScriptStatus.of(status)
    ids = _rank_ids(status)
    rows = [_row(p.global_pid, p.device_id, reports.get(int(p.global_pid), {"error": "not analysed"}),
                 ids.get(os_pid(p.global_pid), {})) for p in procs.itertuples(index=False)]
    rows.sort(key=lambda r: (r["rank"] if r["rank"] is not None else 1 << 30, r["device_id"], r["pid"]))
    bare = bare_by_rank(status)
    for r in rows:
        r["bare_step_time_ns_median"] = bare.get(r["rank"]) if r["rank"] is not None else None
    timed = [r for r in rows if r["step_time_ns_median"]]
    fastest = min((r["step_time_ns_median"] for r in timed), default=None)
    for r in rows:
        r["slower_than_fastest_percent"] = (100.0 * (r["step_time_ns_median"] - fastest) / fastest
                                            if fastest and r["step_time_ns_median"] else None)
    straggler = _straggler(timed, fastest, reports) if len(timed) > 1 else None
    return {"count": len(rows), "ranks": rows, "straggler": straggler,
            "identified_by": "process (global_pid) and the GPU with most of its kernel time; RANK/LOCAL_RANK "
                             "where the launcher recorded them"}


def _who(row: dict) -> str:
    return f"rank {row['rank']}" if row["rank"] is not None else f"pid {row['pid']}"


def _straggler(timed: list[dict], fastest: float, reports: dict[int, dict]) -> dict:
    """``straggler`` of :func:`merged_view`: the rank the others wait for, and why.

    - Ranks whose collectives were split into transfer and wait (NCCL kernels of every rank in the
      export, :mod:`gpudiag.analysis.ranks.comm`): the straggler is the rank whose collectives wait
      least, the last to arrive; ``waited_for_ns`` is how much longer per step the rank that
      waits most waits; ``collective_waits`` is set.
    - Else ranks in lockstep (median steps within :data:`LOCKSTEP`) all take as long as the
      slowest: the straggler is the one with the most time of its own per step
      (:func:`_own_work_ns`); ``lockstep`` is set.
    - Else the rank with the longest median step.

    ``balanced`` (and no cause) when the wait, or the own time, differs by less than
    :data:`LOCKSTEP` of the fastest step between ranks."""
    ok = all(reports.get(r["global_pid"]) and not reports[r["global_pid"]].get("error") for r in timed)
    waits = {r["global_pid"]: ((reports[r["global_pid"]].get("communication") or {}).get("wait_ns_per_step"))
             for r in timed} if ok else {}
    if waits and all(w is not None for w in waits.values()):
        return _waited_for(timed, fastest, reports, waits)
    s = max(timed, key=lambda r: r["step_time_ns_median"])
    quick = min(timed, key=lambda r: r["step_time_ns_median"])
    lockstep = ok and (s["step_time_ns_median"] - fastest) <= LOCKSTEP * fastest
    if lockstep:
        own = {r["global_pid"]: _own_work_ns(reports[r["global_pid"]]) for r in timed}
        s = max(timed, key=lambda r: own[r["global_pid"]])
        quick = min(timed, key=lambda r: own[r["global_pid"]])
    out = _straggler_head(s, fastest, lockstep)
    if lockstep:
        gap = own[s["global_pid"]] - own[quick["global_pid"]]
        out["own_work_over_fastest_ns"] = gap
        head = f"the ranks run in lockstep (median steps within {100 * LOCKSTEP:.0f} %)"
        if gap < LOCKSTEP * fastest:  # nobody waits long for anybody: no straggler to name
            out["balanced"] = True
            out["text"] = (f"{head} and are balanced: no rank spends more than {gap / 1e6:.2f} ms per step more on its "
                           "own (input and GPU work) than another")
            return out
        out["text"] = (f"{head}: the others wait for {_who(s)} on GPU {s['device_id']}, which spends "
                       f"{gap / 1e6:.2f} ms per step more on its own (input and GPU work) than {_who(quick)}")
    slow_report, fast_report = reports.get(s["global_pid"]) or {}, reports.get(quick["global_pid"]) or {}
    if not slow_report.get("error") and not fast_report.get("error"):
        out["why"] = straggler_cause(slow_report, fast_report)
        out["text"] += "; why: " + out["why"]["text"]
    return out


def _straggler_head(s: dict, fastest: float, lockstep: bool) -> dict:
    excess = s["step_time_ns_median"] - fastest
    return {"global_pid": s["global_pid"], "pid": s["pid"], "device_id": s["device_id"], "rank": s["rank"],
            "step_time_ns_median": s["step_time_ns_median"], "excess_over_fastest_ns": excess,
            "excess_over_fastest_percent": s["slower_than_fastest_percent"], "lockstep": lockstep,
            "text": (f"slowest: {_who(s)} on GPU {s['device_id']}, median step {s['step_time_ns_median'] / 1e6:.2f} ms, "
                     f"{excess / 1e6:.2f} ms ({s['slower_than_fastest_percent']:.1f} %) over the fastest rank")}


def _waited_for(timed: list[dict], fastest: float, reports: dict[int, dict], waits: dict) -> dict:
    """:func:`_straggler` from the collectives' waits: the last rank to arrive waits least."""
    s = min(timed, key=lambda r: waits[r["global_pid"]])
    waiter = max(timed, key=lambda r: waits[r["global_pid"]])
    gap = waits[waiter["global_pid"]] - waits[s["global_pid"]]
    out = {**_straggler_head(s, fastest, True), "collective_waits": True, "waited_for_ns": gap}
    if gap < LOCKSTEP * fastest:
        out["balanced"] = True
        out["text"] = (f"the ranks' waits in their collectives differ by {gap / 1e6:.2f} ms per step (under "
                       f"{100 * LOCKSTEP:.0f} % of the step): balanced, no straggler")
        return out
    out["text"] = (f"the others wait for {_who(s)} on GPU {s['device_id']}: in their collectives {_who(waiter)} waits "
                   f"{gap / 1e6:.2f} ms per step more for it (NCCL kernels spin until the last rank arrives)")
    why = straggler_cause(reports[s["global_pid"]], reports[waiter["global_pid"]])
    # arriving late is what was found; the cause is what the late rank does before the collective
    own = {k: v for k, v in why["components"].items() if k != "late arrival at the collective"}
    cause = max(own, key=own.get)
    out["why"] = ({**why, "cause": cause, "excess_ns": own[cause], "text": why["text"] if why["cause"] == cause else
                   f"{cause}: {own[cause] / 1e6:.2f} ms per step more than {_who(waiter)}"} if own[cause] > 0 else
                  {**why, "cause": None, "excess_ns": 0.0,
                   "text": "not in its report: its input stall, GPU work and host-bound GPU idle are no larger; "
                           "its host is slower between launches (compare its bare step)"})
    out["text"] += "; why: " + out["why"]["text"]
    return out


def host_collectives_warning(status: ScriptStatus | dict | None, communication: dict | None) -> str | None:
    """A warning for a job of several ranks (the launcher's ``ranks``, or a rank's own
    ``world_size``) whose capture holds no collective kernel: its collectives ran on the host (gloo,
    or CPU tensors), so their time is host time in the step, and the exposed-communication numbers
    (NCCL kernels only) do not cover them. None otherwise."""
    status = ScriptStatus.of(status) or ScriptStatus()
    sizes = [e.world_size for e in status.ranks or []]
    sizes.append(status.world_size)
    if communication or not any(isinstance(n, int) and n > 1 for n in sizes):
        return None
    return ("a job of several ranks with no collective kernel in the capture: its collectives ran on the host "
            "(gloo, or CPU tensors), so they are host time in each step, not communication; the exposed-communication "
            "numbers cover NCCL kernels only")
