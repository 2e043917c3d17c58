"""Running the trials: the unchanged script (baseline, A) and each change (B, C, …) run bare,
interleaved, A B A C A D … A, every run with the same launcher, config (:func:`trial_config`),
window and output handling, within the ``--try-budget``; one progress line per run.

Why interleaved: the unchanged script's speed moves between processes (a host-bound server's
baseline runs took 10.9 and 11.9 ms per request and a third 6.57 ms, issue 34), so a trial compared with one baseline run measures the drift as much as the change. Each
trial has a baseline run just before and just after it; all baseline runs are pooled for the
comparison and their spread decides whether a saving is told apart from that drift
(:mod:`gpudiag.trials.stats`). A single trial runs twice, A B A B A, so that every session has at
least three baseline runs.

Not counted: a settling run of the unchanged script goes first (:data:`SETTLE_RUN`): the first
process started after an nsys capture runs slow (H100, 2026-11-25, a host-bound generate loop: 250
ms before the capture, 384 ms in the first run after it, 260 ms in the next;
benchmarks/probes/after_nsys_slowdown.sh). The bare run ``gpudiag profile`` makes before its
capture has another config (its own warm-up and window) and is kept as a note only.

Budget: a run starts only while more than :data:`MIN_LEFT_S` of the budget is left, and is
stopped when the budget runs out. A trial whose following baseline did not fit is compared with
the baseline runs before it, and its record says so (``baseline_after`` False).
"""

from __future__ import annotations

import dataclasses
import shlex
import statistics
import time
from pathlib import Path

from gpudiag.capture.config import CaptureConfig
from gpudiag.capture.run import run_bare
from gpudiag.trials import changes, results

TRIAL_WINDOW_STEPS = 10  # measured steps per trial: "warm-up plus a few measured steps"
# Warm-up steps for compiled changes: step 0 runs eager (the root is compiled at its first call),
# step 1 compiles, and CUDA graph trees record on a later call before they replay
# (torch.compile's cudagraph_trees: warm-up run, record, then replay).
COMPILE_WARMUP_STEPS = 4
DEFAULT_BUDGET_S = 300.0
SETTLE_RUN = True  # a first, uncounted run of the unchanged script (see the module docstring)
MIN_LEFT_S = 5.0  # no run starts with less of the budget left: start-up alone takes seconds
SINGLE_TRIAL_RUNS = 2  # a lone trial runs twice: A B A B A, three baseline runs


@dataclasses.dataclass
class Run:
    """One bare run of the session: ``kind`` "settle", "baseline" or "trial" (``index`` into the
    chosen changes); its launcher status (one process's view), exit code, seconds, and whether the
    budget stopped it."""

    kind: str
    index: int | None
    status: dict
    code: int | None
    elapsed_s: float
    timed_out: bool = False


def _bare(*args, **kwargs) -> tuple[int, dict]:
    """:func:`run_bare`, its status read as one process's (a launched job's ranks merged)."""
    code, status = run_bare(*args, **kwargs)
    return code, results.job_view(status)


def trial_config(config: CaptureConfig, change: str | None) -> CaptureConfig:
    """The bare config of a trial (``change``) or of its baseline (None): the capture's warm-up
    (at least :data:`COMPILE_WARMUP_STEPS` for every run, so all compare the same steps) and a
    window of at most :data:`TRIAL_WINDOW_STEPS`."""
    window = min(config.window_steps or TRIAL_WINDOW_STEPS, TRIAL_WINDOW_STEPS)
    bare = dataclasses.replace(config, bare=True, capture_range=False, run_to_end=False,
                               warmup_steps=max(config.warmup_steps, COMPILE_WARMUP_STEPS), window_steps=window,
                               detail_step=None)
    return changes.with_change(bare, change)


def schedule(n_trials: int, settle: bool = SETTLE_RUN) -> list[tuple[str, int | None]]:
    """The order of the runs for ``n_trials`` changes: [settle,] baseline, then each trial followed
    by a baseline; a lone trial twice (A B A B A). E.g. 2 trials: settle, A, T0, A, T1, A."""
    order: list[tuple[str, int | None]] = [("settle", None)] if settle else []
    order.append(("baseline", None))
    for index in ([0] * SINGLE_TRIAL_RUNS if n_trials == 1 else range(n_trials)):
        order += [("trial", index), ("baseline", None)]
    return order


def _ms(ns) -> str:
    return "–" if ns is None else f"{ns / 1e6:.2f} ms"


def progress_line(i: int, n: int, result: dict) -> str:
    """``[try 1/3] compile: 31.20 -> 17.00 ms/step (-45.5 %) so far; predicted -28.50 ms`` or the
    reason it has no time. The verdict comes with the table once every baseline ran."""
    head = f"[try {i}/{n}] {result['change']}: "
    if result.get("saving_ns") is None:
        return head + f"{result['status']} ({result.get('error') or ''})"
    predicted = result.get("predicted_saving_ns")
    tail = f"; predicted -{_ms(predicted)}" if predicted is not None else ""
    flag = " CHANGES RESULTS" if result["status"] == "changes results" else ""
    return (head + f"{_ms(result['baseline_step_ns'])} -> {_ms(result['trial_step_ns'])}/step "
            f"({-result['saving_percent']:+.1f} %) against the baselines so far{tail}{flag}")


@dataclasses.dataclass
class Session:
    """What every run of one trial session shares: the script, its arguments and run directory,
    the capture's config, the chosen changes, the budget (and when it started)."""

    script: Path | str
    script_args: list[str]
    run_dir: Path
    config: CaptureConfig
    chosen: list[dict]
    budget_s: float
    echo: object = print
    started: float = dataclasses.field(default_factory=lambda: time.monotonic())
    names: dict = dataclasses.field(default_factory=dict)

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def status_name(self, label: str) -> str:
        """``trial_<label>.json``, numbered from the second run of the same label on."""
        self.names[label] = self.names.get(label, 0) + 1
        count = self.names[label]
        return f"trial_{label}.json" if count == 1 else f"trial_{label}_{count}.json"

    def run(self, kind: str, index: int | None) -> Run:
        """One bare run, stopped when the budget runs out."""
        change = None if index is None else self.chosen[index]["change"]
        is_args = change is not None and change.startswith("args:")
        args = shlex.split(change[5:]) if is_args else self.script_args
        label = kind if change is None else ("args" if is_args else change)
        left = self.left_s()
        began = time.monotonic()
        code, status = _bare(self.script, args, self.run_dir, trial_config(self.config, None if is_args else change),
                             self.status_name(label), timeout_s=left)
        elapsed = time.monotonic() - began
        return Run(kind, index, status, code, elapsed, timed_out=elapsed >= left)


def _usable(run: Run) -> bool:
    return not run.timed_out and bool(results.step_times(run.status)[0])


def execute(session: Session, autocast_dtype: str | None = None) -> list[Run]:
    """Walks :func:`schedule` within the budget; returns the runs made, in order. A trial that
    failed or did not apply is not run again, and no two baselines run back to back. Stops early
    when the first baseline measured no steps (nothing to compare with)."""
    runs: list[Run] = []
    done: set[int] = set()
    for kind, index in schedule(len(session.chosen)):
        if session.left_s() <= MIN_LEFT_S:
            break
        if index in done or (kind == "baseline" and runs and runs[-1].kind == "baseline"):
            continue
        run = session.run(kind, index)
        runs.append(run)
        _report_run(session, runs, run, done, autocast_dtype)
        if kind == "baseline" and not any(_usable(r) for r in runs if r.kind == "baseline"):
            break
    return runs


def _report_run(session: Session, runs: list[Run], run: Run, done: set, autocast_dtype: str | None) -> None:
    """The progress line of ``run`` (a trial's against the baselines so far, results unchecked);
    a trial that failed or did not apply joins ``done``."""
    if run.kind != "trial":
        times = results.step_times(run.status)[0]
        what = f"{_ms(statistics.median(times))}/step" if times else f"no measured steps (exit code {run.code})"
        label = "settling run (not counted)" if run.kind == "settle" else "baseline"
        session.echo(f"[try] {label}: the unchanged script, {what}")
        return
    baselines = [r.status for r in runs if r.kind == "baseline" and _usable(r)]
    entry = session.chosen[run.index]
    record = results.trial_result(entry, baselines, run.status, run.code, run.elapsed_s, timed_out=run.timed_out,
                                  comparable=None, autocast_dtype=autocast_dtype)
    if record["status"] in ("failed", "not applicable", "over budget"):
        done.add(run.index)
    session.echo(progress_line(run.index + 1, len(session.chosen), record))


def run_trials(script: Path | str, script_args: list[str], run_dir: Path, config: CaptureConfig, chosen: list[dict],
               profiled_status: dict, budget_s: float = DEFAULT_BUDGET_S, echo=print) -> list[dict]:
    """Run the baseline and each chosen change (:func:`gpudiag.trials.plan.choose`) interleaved
    (:func:`schedule`), bare; returns one record per chosen change
    (:func:`gpudiag.trials.results.trial_result` on all baseline runs and that change's runs, plus
    ``baseline_note``, ``baseline_after``, ``compared_with`` and ``trial_runs``). Never raises for a
    failing trial; Ctrl-C raises :class:`~gpudiag.capture.toolrun.Interrupted` after the running
    run stopped."""
    session = Session(script, script_args, run_dir, config, chosen, budget_s, echo)
    first = trial_config(config, None)
    echo(f"[try] {len(chosen)} change(s), each run bare over {first.window_steps} steps after {first.warmup_steps} "
         "warm-up steps, interleaved with runs of the unchanged script (--try none skips the trials)")
    autocast = profiled_status.get("autocast_dtype")
    runs = execute(session, autocast_dtype=autocast)
    baselines = [r for r in runs if r.kind == "baseline" and _usable(r)]
    if not baselines:
        first_base = next((r for r in runs if r.kind == "baseline"), None)
        code = None if first_base is None else first_base.code
        echo(f"[try] no trials: the baseline run measured no steps (exit code {code}; see {run_dir / 'gpudiag.log'})")
        return [results.trial_result(c, {}, {}, None, 0.0) | {"status": "skipped",
                "error": "the baseline run measured no steps"} for c in chosen]
    comparable = _comparable([r.status for r in baselines], profiled_status)
    note = baseline_note(baselines, runs, profiled_status.get("bare_run"))
    echo(f"[try] {note}")
    return [_record(session, i, runs, baselines, note, comparable, autocast) for i in range(len(chosen))]


def _record(session: Session, index: int, runs: list[Run], baselines: list[Run], note: str, comparable,
            autocast: str | None) -> dict:
    """The record of the change ``index``: its runs that finished, against every usable baseline."""
    entry = session.chosen[index]
    mine = [r for r in runs if r.kind == "trial" and r.index == index]
    if not mine:
        return results.trial_result(entry, {}, {}, None, 0.0) | {
            "status": "over budget", "error": f"the --try-budget of {session.budget_s:.0f} s was spent before it"}
    finished = [r for r in mine if not r.timed_out] or mine[:1]
    position = {id(r): i for i, r in enumerate(runs)}
    after = any(position[id(b)] > position[id(finished[-1])] for b in baselines)
    record = results.trial_result(entry, [b.status for b in baselines], [r.status for r in finished],
                                  finished[-1].code, sum(r.elapsed_s for r in mine),
                                  timed_out=all(r.timed_out for r in mine), comparable=comparable,
                                  autocast_dtype=autocast)
    compared = (f"all {len(baselines)} baseline runs, the one just after it included" if after else
                f"the {len(baselines)} baseline run(s) before it; none after it (the --try-budget ran out)")
    return record | {"baseline_note": note, "baseline_after": after, "compared_with": compared,
                     "trial_runs": len(finished)}


def _comparable(baselines: list[dict], profiled: dict) -> bool | None:
    """Whether the unchanged script computes the same loss (at inference: output sample) in two
    runs, within fp32's tolerance: two baseline runs compared, else the baseline with the profiled
    run (training only: the profiled run keeps no output sample); None when nothing to compare."""
    if len(baselines) >= 2:
        diff = results.loss_difference(baselines[0], baselines[1]) or results.output_difference(baselines[0],
                                                                                                baselines[1])
        return None if diff is None else diff["relative"] <= results.TOLERANCE["fp32"]
    return results.deterministic(baselines[0], profiled)


def baseline_note(baselines: list[Run], runs: list[Run], bare: dict | None) -> str:
    """One sentence on the unchanged script's runs: the counted baselines' medians, and the runs
    not counted (the settling run, the bare run before the capture) with their medians."""
    counted = " / ".join(f"{statistics.median(results.step_times(r.status)[0]) / 1e6:.2f}" for r in baselines)
    runs_word = "run" if len(baselines) == 1 else "runs"
    text = f"{len(baselines)} baseline {runs_word} interleaved with the trials: {counted} ms"
    aside = []
    settle = next((r for r in runs if r.kind == "settle" and results.step_times(r.status)[0]), None)
    if settle is not None:
        settled = statistics.median(results.step_times(settle.status)[0])
        aside.append(f"the settling run first after the capture {_ms(settled)}")
    bare_times = results.step_times(results.job_view(bare or {}))[0] if bare else []
    if bare_times:
        aside.append(f"the bare run before the capture {_ms(statistics.median(bare_times))} (its own window)")
    return text + (f"; not counted: {', '.join(aside)}" if aside else "")
