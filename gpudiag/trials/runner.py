"""Running the trials: the unchanged script (baseline, A) and each change (B, C, …) run bare,
interleaved, A B A C A D … A, every run with the same launcher, config (:func:`trial_config`),
window and output handling, within the ``--try-budget``; one progress line per run.

Why interleaved: the unchanged script's speed moves between processes (a host-bound server's
baseline runs took 10.9 and 11.9 ms per request and a third 6.57 ms, issue 34), so a trial
compared with one baseline run measures the drift as much as the change. Each trial has a baseline
run just before and just after it (unless decided early, or past the budget); all baseline runs
are pooled for the comparison and their spread decides whether a saving is told apart from that drift
(:mod:`gpudiag.trials.stats`). A single trial runs twice, A B A B A, so that every session has at
least three baseline runs (two when the last is left out for a change decided "no win").

The settling run (:data:`SETTLE_RUN`): the first process started after an nsys capture can run
slow (H100, 2026-11-25, a host-bound generate loop: 250 ms before the capture, 384 ms in the first
run after it, 260 ms in the next; benchmarks/probes/after_nsys_slowdown.sh), so the unchanged
script runs once first. It counts as the first baseline when its steps are at most
:data:`SETTLE_TOLERANCE` slower than the bare run's before the capture (:func:`settle_counts`); else
it is left out and a baseline follows it. The
bare run of ``gpudiag profile`` itself has another config (its own warm-up and window) and is a
note only.

Ending sooner (issue, part 5). A run is almost all start-up: in the 42 recorded runs of
tests/fixtures/trials with timestamps, launcher start to the first measured step took 7.4-97 s and
the window 0.01-5.3 s (ConvNeXt and ViT at 53-56 ms a step: 0.6 s of 11-14 s). At such steps a
shorter window saves under a second a run, so the cut is in the runs made (:func:`skip_reason`):

- the settling run counts as the first baseline when it is not slow (one run fewer);
- a change decided early (:func:`gpudiag.trials.stats.early_decision`) from three baselines is not
  run again (a lone change is thus always run twice), and the last baseline is left out once every
  change tried is decided and none remains to run;
- no baseline follows a change that failed or did not apply when nothing was measured since the
  baseline before it (no two baselines back to back, a failed run not separating them);
- no run starts that cannot finish in the budget left (:func:`shortest_run_s`).

Budget: a run starts only while more than :data:`MIN_LEFT_S` and the shortest run yet is left,
and is stopped when the budget runs out. A trial whose following baseline was not run is compared
with the baseline runs before it, and its record says why (``baseline_after`` False).
:func:`budget_account` says what the budget bought.
"""

from __future__ import annotations

import dataclasses
import shlex
import statistics
import time
from pathlib import Path

from gpudiag.analysis.steps.representative import STEP_KEYS
from gpudiag.capture.config import CaptureConfig
from gpudiag.capture.run import CaptureError, run_bare
from gpudiag.script_status import ScriptStatus
from gpudiag.trials import budget, changes, results, stats

TRIAL_WINDOW_STEPS = 10  # measured steps per trial: "warm-up plus a few measured steps"
# Warm-up steps for compiled changes: step 0 runs eager (the root is compiled at its first call),
# step 1 compiles, and CUDA graph trees record on a later call before they replay
# (torch.compile's cudagraph_trees: warm-up run, record, then replay).
COMPILE_WARMUP_STEPS = 4
DEFAULT_BUDGET_S = budget.DEFAULT_BUDGET_S
SETTLE_RUN = True  # a first run of the unchanged script, counted only when not slow (module docstring)
# How much slower than the bare run before the capture (same steps, same timing) the settling run may
# be and still count as a baseline. tests/fixtures/trials, the first run after the capture against
# that bare run: ConvNeXt, GNN, ViT, Mixer 0.0, 0.0, -0.1, -1.3 %; a decoder and a seq2seq loop
# -4.6, -5.2 %; slower: T5 +9.5 %, an encoder +10 %, an LSTM +33 %, the generate loop +42.5 % (+6.1
# % in a later run), a host-bound server +66 %. 5 % parts the two groups.
SETTLE_TOLERANCE = 0.05
SETTLE_MIN_STEPS = 3  # steps both runs timed, at the least, for the comparison
MIN_LEFT_S = 5.0  # no run starts with less of the budget left: start-up alone takes seconds
# A run takes at least this share of the fastest finished run of the unchanged script: a change
# adds to start-up (compile) or leaves it; in tests/fixtures/trials the quickest, half-weights on an
# encoder, reached its window in 0.90 x its baseline's time (16.8 against 18.6 s).
SHORTEST_RUN_SHARE = 0.75
SINGLE_TRIAL_RUNS = 2  # a lone trial runs twice: A B A B A, three baseline runs

# Why a planned run was not made (:func:`skip_reason`), as the budget account counts them.
SETTLED = "the settling run counted as the first baseline"
DECIDED = "every change tried was decided"
NOTHING_SINCE = "no change measured since the last baseline"
FAILED = "the change failed or did not apply"
BUDGET = "the budget left was shorter than a run"
NO_BASELINE = "the unchanged script measured no steps (nothing to compare with)"
RANK0 = "rank 0 of the torchrun job did not make it"  # each rank makes the runs rank 0 makes


@dataclasses.dataclass
class Run:
    """One bare run of the session: ``kind`` "settle", "baseline" or "trial" (``index`` into the
    chosen changes); its launcher status (one process's view), exit code, seconds, whether the
    budget stopped it, its status file's ``name``, its ``position`` in :func:`schedule`, and for
    the settling run whether it ``counted`` as a baseline."""

    kind: str
    index: int | None
    status: ScriptStatus
    code: int | None
    elapsed_s: float
    timed_out: bool = False
    name: str = ""
    position: int = -1
    counted: bool = False


@dataclasses.dataclass
class Skip:
    """A planned run not made: its kind, change index, position in :func:`schedule` and why; for
    :data:`DECIDED`, the change decided early and its decision ("win" or "no win")."""

    kind: str
    index: int | None
    position: int
    why: str
    change: str | None = None
    decision: str | None = None


def _bare(*args, **kwargs) -> tuple[int, ScriptStatus]:
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
    the capture's config, the chosen changes, the budget (and when it started), and the bare run
    before the capture (``bare``, a launcher status or None) the settling run is compared with."""

    script: Path | str
    script_args: list[str]
    run_dir: Path
    config: CaptureConfig
    chosen: list[dict]
    budget_s: float
    echo: object = print
    started: float = dataclasses.field(default_factory=lambda: time.monotonic())
    names: dict = dataclasses.field(default_factory=dict)
    bare: ScriptStatus | None = None

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def status_name(self, label: str) -> str:
        """``trial_<label>.json``, numbered from the second run of the same label on."""
        self.names[label] = self.names.get(label, 0) + 1
        count = self.names[label]
        return f"trial_{label}.json" if count == 1 else f"trial_{label}_{count}.json"

    def run(self, kind: str, index: int | None, position: int = -1) -> Run:
        """One bare run, stopped when the budget runs out."""
        change = None if index is None else self.chosen[index]["change"]
        is_args = change is not None and change.startswith("args:")
        args = shlex.split(change[5:]) if is_args else self.script_args
        label = kind if change is None else ("args" if is_args else change)
        left = self.left_s()
        began = time.monotonic()
        name = self.status_name(label)
        code, status = _bare(self.script, args, self.run_dir, trial_config(self.config, None if is_args else change),
                             name, timeout_s=left)
        elapsed = time.monotonic() - began
        return Run(kind, index, status, code, elapsed, timed_out=elapsed >= left, name=name, position=position)


def _usable(run: Run) -> bool:
    return not run.timed_out and bool(results.step_times(run.status)[0])


def counted(runs: list[Run]) -> list[Run]:
    """The runs of the unchanged script that count as baselines: baseline runs and a settling run
    that counted (:func:`settle_counts`), each with measured steps and not stopped by the budget."""
    return [r for r in runs if (r.kind == "baseline" or r.counted) and _usable(r)]


def settle_counts(settle: ScriptStatus | dict, bare: ScriptStatus | dict | None) -> tuple[bool, str]:
    """(whether the settling run counts as a baseline, why in words). It counts when its median
    over the steps both it and the bare run before the capture timed (CUDA events where both have
    them, else host wall-clock time; at least :data:`SETTLE_MIN_STEPS`) is at most
    :data:`SETTLE_TOLERANCE` above the bare run's: the capture did not slow it."""
    settle, bare = ScriptStatus.of(settle), ScriptStatus.of(bare) or ScriptStatus()
    first = int(settle.warmup_steps or 0)
    ids = {str(k) for k in range(first, first + int(settle.window_steps or TRIAL_WINDOW_STEPS))}
    for key in STEP_KEYS:
        mine, theirs = getattr(settle, key) or {}, getattr(bare, key) or {}
        common = [k for k in sorted(ids & set(mine) & set(theirs)) if mine[k] and theirs[k]]
        if len(common) >= SETTLE_MIN_STEPS:
            own, before = (statistics.median(float(d[k]) for k in common) for d in (mine, theirs))
            fast = own <= before * (1 + SETTLE_TOLERANCE)
            limit = f"{'at most' if fast else 'more than'} {100 * SETTLE_TOLERANCE:.0f} % slower"
            return fast, (f"{_ms(own)}/step against {_ms(before)} in the bare run before the capture over the same "
                          f"{len(common)} steps: {limit}")
    return False, "no bare run before the capture timed the same steps"


def decisions(session: Session, runs: list[Run], done: dict) -> dict[int, str | None]:
    """change index -> :func:`gpudiag.trials.stats.early_decision` against the baselines counted
    so far, for every change with a usable run that did not fail."""
    base = [r.status for r in counted(runs)]
    out = {}
    for index in sorted({r.index for r in runs if r.kind == "trial" and r.index not in done and _usable(r)}):
        per_sample = session.chosen[index]["change"].startswith("args:")
        mine = [r.status for r in runs if r.kind == "trial" and r.index == index and _usable(r)]
        # as the record compares them (results.step_runs): no decision across timing methods
        trial, method = results.step_runs(mine, per_sample)
        baselines, base_method = results.step_runs(base, per_sample)
        same = method is not None and method == base_method
        out[index] = stats.early_decision(baselines, trial) if trial and baselines and same else None
    return out


def shortest_run_s(runs: list[Run]) -> float:
    """The least a run can take, in s: :data:`SHORTEST_RUN_SHARE` of the fastest finished run of
    the unchanged script so far (0 before one finished)."""
    times = [r.elapsed_s for r in runs if r.kind != "trial" and _usable(r)]
    return SHORTEST_RUN_SHARE * min(times) if times else 0.0


def _baseline_not_needed(runs: list[Run], done: dict) -> str | None:
    """Why the next baseline would measure nothing new: no usable change ran since the last counted
    run of the unchanged script (:data:`SETTLED` when that is the settling run, else
    :data:`NOTHING_SINCE`); None when it is needed, or none counts yet."""
    ids = {id(r) for r in counted(runs)}
    last = max((i for i, r in enumerate(runs) if id(r) in ids), default=None)
    if last is None or any(r.kind == "trial" and r.index not in done and _usable(r) for r in runs[last + 1:]):
        return None
    return SETTLED if runs[last].kind == "settle" else NOTHING_SINCE


def skip_reason(session: Session, runs: list[Run], done: dict, kind: str, index: int | None,
                rest: list[tuple[str, int | None]]) -> tuple[str, dict] | None:
    """(why, the decisions so far) when the planned run (``kind``, ``index``) is not made, given the
    runs made and the planned runs after it (``rest``); None to make it. A trial: its change failed
    or did not apply (``done``), or is decided from at least
    :data:`~gpudiag.trials.stats.MIN_BASELINES_FOR_REPEAT` baselines. A baseline: no trial
    remains to run and every change tried is decided, or nothing was measured since the last
    (:func:`_baseline_not_needed`).
    Any run: the budget left is under :data:`MIN_LEFT_S` or :func:`shortest_run_s`."""
    if kind == "trial" and index in done:
        return FAILED, {}
    decided = decisions(session, runs, done) if kind != "settle" else {}
    if kind == "trial" and decided.get(index) and len(counted(runs)) >= stats.MIN_BASELINES_FOR_REPEAT:
        return DECIDED, decided
    if kind == "baseline":
        remain = any(k == "trial" and i not in done and not decided.get(i) for k, i in rest)
        if decided and all(decided.values()) and not remain:
            return DECIDED, decided
        why = _baseline_not_needed(runs, done)
        if why:
            return why, decided
    if session.left_s() <= max(MIN_LEFT_S, shortest_run_s(runs)):
        return BUDGET, decided
    return None


def execute(session: Session, autocast_dtype: str | None = None) -> tuple[list[Run], list[Skip]]:
    """Walks :func:`schedule` within the budget; returns the runs made and the planned runs not
    made (:func:`skip_reason`), in order. Stops when the first baseline measured no steps (nothing
    to compare with)."""
    runs: list[Run] = []
    skips: list[Skip] = []
    done: dict[int, str] = {}
    plan = schedule(len(session.chosen))
    for position, (kind, index) in enumerate(plan):
        skipped = rank0_decides(f"run{position}", skip_reason(session, runs, done, kind, index, plan[position + 1:]))
        if skipped is not None:
            skips.append(_skip(session, runs, kind, index, position, *skipped))
            continue
        run = session.run(kind, index, position)
        runs.append(run)
        _report_run(session, runs, run, done, autocast_dtype)
        if rank0_decides(f"stop{position}", (NO_BASELINE, {}) if kind == "baseline" and not counted(runs) else None):
            # the rest of the plan is not made: the budget account lists it (issue 45's review)
            skips += [Skip(k, i, position + 1 + n, NO_BASELINE) for n, (k, i) in enumerate(plan[position + 1:])]
            break
    return runs, skips


def rank0_decides(name: str, skipped: tuple[str, dict] | None) -> tuple[str, dict] | None:
    """``skipped`` (:func:`skip_reason`'s answer: None to make the run) as rank 0 decided it when
    this gpudiag is one rank of a torchrun job (:func:`~gpudiag.capture.rank_hook.as_rank0_decides`:
    a rank making a run rank 0 does not make waits for ever); :data:`RANK0` where rank 0 left out a
    run for a reason of its own. Raises CaptureError when rank 0 stopped deciding."""
    from gpudiag.capture.rank_hook import as_rank0_decides

    mine = "run" if skipped is None else skipped[0]
    try:
        agreed = as_rank0_decides(name, mine)
    except TimeoutError as exc:
        raise CaptureError(f"{exc}: see rank 0's gpudiag.log") from None
    if agreed == "run":
        return None
    return skipped if agreed == mine else (RANK0, {})


def _skip(session: Session, runs: list[Run], kind: str, index: int | None, position: int, why: str,
          decided: dict) -> Skip:
    """The :class:`Skip` of a planned run, told in a progress line where it is news: a decided
    change (a trial's own, a baseline's the last change measured before it) or the budget."""
    skip = Skip(kind, index, position, why)
    if why == DECIDED:
        which = index if kind == "trial" else next(r.index for r in reversed(runs) if r.index in decided)
        skip.change, skip.decision = session.chosen[which]["change"], decided[which]
        told = ", ".join(f"{session.chosen[i]['change']} {d}" for i, d in decided.items())
        session.echo(f"[try] not run: the trial of {skip.change} again; it is decided ({skip.decision})"
                     if kind == "trial" else f"[try] not run: a baseline run; every change tried is decided ({told})")
    elif why == BUDGET:
        what = "a baseline run" if index is None else f"the trial of {session.chosen[index]['change']}"
        session.echo(f"[try] not run: {what} ({max(session.left_s(), 0):.0f} s of the budget left, "
                     f"a run takes {shortest_run_s(runs):.0f} s or more)")
    return skip


def _report_run(session: Session, runs: list[Run], run: Run, done: dict, autocast_dtype: str | None) -> None:
    """The progress line of ``run`` (a trial's against the baselines so far; its results checked
    only where two plain runs so far computed the same loss: an unseeded script's would be flagged
    "changes results" here and cleared in the table); a trial that failed or did not apply joins
    ``done``; a settling run is counted or not."""
    if run.kind != "trial":
        times = results.step_times(run.status)[0]
        what = f"{_ms(statistics.median(times))}/step" if times else f"no measured steps (exit code {run.code})"
        if run.kind == "baseline":
            session.echo(f"[try] baseline: the unchanged script, {what}")
            return
        run.counted, why = settle_counts(run.status, session.bare) if _usable(run) else (False, what)
        label = "counted as the first baseline" if run.counted else "not counted"
        session.echo(f"[try] settling run ({label}): the unchanged script, {why if times else what}")
        return
    baselines = [r.status for r in counted(runs)]
    entry = session.chosen[run.index]
    plain = baselines + ([session.bare] if session.bare else [])
    comparable = runs_agree(plain, {}) if len(plain) >= 2 else None
    record = results.trial_result(entry, baselines, run.status, run.code, run.elapsed_s, timed_out=run.timed_out,
                                  comparable=False if comparable is None else comparable, autocast_dtype=autocast_dtype)
    if record["status"] in ("failed", "not applicable", "over budget"):
        done[run.index] = record["status"]
    session.echo(progress_line(run.index + 1, len(session.chosen), record))


def run_trials(script: Path | str, script_args: list[str], run_dir: Path, config: CaptureConfig, chosen: list[dict],
               profiled_status: dict, budget_s: float = DEFAULT_BUDGET_S, echo=print) -> list[dict]:
    """The records of :func:`run_session`, without its budget account."""
    return run_session(script, script_args, run_dir, config, chosen, profiled_status, budget_s, echo)[0]


def run_session(script: Path | str, script_args: list[str], run_dir: Path, config: CaptureConfig, chosen: list[dict],
                profiled_status: dict, budget_s: float = DEFAULT_BUDGET_S, echo=print) -> tuple[list[dict], dict]:
    """Run the baseline and each chosen change (:func:`gpudiag.trials.plan.choose`) interleaved
    (:func:`schedule`, less the runs :func:`skip_reason` leaves out), bare; returns one record per
    chosen change (:func:`gpudiag.trials.results.trial_result` on all counted baseline runs and that
    change's runs, plus ``baseline_note``, ``baseline_after``, ``compared_with``, ``trial_runs``
    and ``decided_early``) and the :func:`budget_account`. Never raises for a failing trial;
    Ctrl-C raises :class:`~gpudiag.capture.toolrun.Interrupted` after the running run stopped."""
    typed = ScriptStatus.of(profiled_status)
    bare = typed.bare_run
    session = Session(script, script_args, run_dir, config, chosen, budget_s, echo,
                      bare=results.job_view(bare) if bare else None)
    first = trial_config(config, None)
    echo(f"[try] {len(chosen)} change(s), each run bare over {first.window_steps} steps after {first.warmup_steps} "
         "warm-up steps, interleaved with runs of the unchanged script (--try none skips the trials)")
    autocast = typed.autocast_dtype
    runs, skips = execute(session, autocast_dtype=autocast)
    account = budget_account(session, runs, skips)
    baselines = counted(runs)
    if not baselines:
        first_base = next((r for r in runs if r.kind == "baseline"), None)
        code = None if first_base is None else first_base.code
        echo(f"[try] no trials: the baseline run measured no steps (exit code {code}; see {run_dir / 'gpudiag.log'})")
        return [results.trial_result(c, {}, {}, None, 0.0) | {"status": "skipped",
                "error": "the baseline run measured no steps"} for c in chosen], account
    comparable = runs_agree([r.status for r in baselines], profiled_status)
    note = baseline_note(baselines, runs, bare)
    echo(f"[try] {note}")
    _echo_account(echo, account)
    records = [_record(session, i, runs, skips, baselines, note, comparable, autocast) for i in range(len(chosen))]
    return records, account


def _echo_account(echo, account: dict) -> None:
    from gpudiag.renderers.units import budget_text

    echo(f"[try] {budget_text(account)}")


def budget_account(session: Session, runs: list[Run], skips: list[Skip]) -> dict:
    """What the budget bought, plain data: ``budget_s`` and ``used_s`` (s, from the session's start
    to now), ``runs`` and ``run_s`` (runs made and their seconds, by kind: settle, baseline,
    trial), ``settle_counted``, ``stopped_by_budget`` (runs the budget cut short), ``not_run``
    (planned runs not made, by reason: :func:`skip_reason`'s), ``decided_early`` ([{change,
    decision}]: changes whose planned runs were left out as decided), ``left_out_for_budget``
    (changes never run for the budget) and ``run_log`` (each run: status file ``name``, kind,
    change, elapsed_s, exit code, timed_out, counted)."""
    kinds = ("settle", "baseline", "trial")
    ran = {r.index for r in runs if r.kind == "trial"}
    early = {s.change: s.decision for s in skips if s.why == DECIDED}
    budget = [s.index for s in skips if s.why == BUDGET and s.kind == "trial" and s.index not in ran]
    return {"budget_s": session.budget_s, "used_s": round(time.monotonic() - session.started, 1),
            "runs": {k: sum(r.kind == k for r in runs) for k in kinds},
            "run_s": {k: round(sum(r.elapsed_s for r in runs if r.kind == k), 1) for k in kinds},
            "settle_counted": any(r.counted for r in runs), "stopped_by_budget": sum(r.timed_out for r in runs),
            "not_run": {why: sum(s.why == why for s in skips) for why in dict.fromkeys(s.why for s in skips)},
            "decided_early": [{"change": c, "decision": d} for c, d in early.items()],
            "left_out_for_budget": list(dict.fromkeys(session.chosen[i]["change"] for i in budget)),
            "run_log": [{"name": r.name, "kind": r.kind, "change": None if r.index is None else
                         session.chosen[r.index]["change"], "elapsed_s": round(r.elapsed_s, 2), "code": r.code,
                         "timed_out": r.timed_out, "counted": r.kind == "baseline" or r.counted} for r in runs]}


def _record(session: Session, index: int, runs: list[Run], skips: list[Skip], baselines: list[Run], note: str,
            comparable, autocast: str | None) -> dict:
    """The record of the change ``index``: its runs that finished, against every counted baseline."""
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
    early = next((s.decision for s in skips if s.why == DECIDED and s.change == entry["change"]), None)
    return record | {"baseline_note": note, "baseline_after": after, "trial_runs": len(finished),
                     "compared_with": _compared_with(len(baselines), after, early), "decided_early": early}


def _compared_with(count: int, after: bool, early: str | None) -> str:
    """Which baseline runs a change was compared with, in words."""
    if after:
        return f"all {count} baseline runs, the one just after it included"
    why = (f"its result was decided ({early}) with every other change tried" if early else "the --try-budget ran out")
    return f"the {count} baseline run(s) before it; none after it ({why})"


def runs_agree(baselines: list[ScriptStatus | dict], profiled: ScriptStatus | dict) -> bool | None:
    """Whether the unchanged script computes the same loss (at inference: output sample) in two
    runs, within fp32's tolerance: two baseline runs compared, else the baseline with the profiled
    run (training only: the profiled run keeps no output sample); None when nothing to compare."""
    if len(baselines) >= 2:
        diff = results.loss_difference(baselines[0], baselines[1]) or results.output_difference(baselines[0],
                                                                                                baselines[1])
        return None if diff is None else diff["relative"] <= results.TOLERANCE["fp32"]
    return results.deterministic(baselines[0], profiled)


def baseline_note(baselines: list[Run], runs: list[Run], bare: ScriptStatus | None) -> str:
    """One sentence on the unchanged script's runs: the counted baselines' medians (the settling
    run among them when it counted), and the runs not counted (the settling run, the bare run
    before the capture) with their medians."""
    counted_ms = " / ".join(f"{statistics.median(results.step_times(r.status)[0]) / 1e6:.2f}" for r in baselines)
    runs_word = "run" if len(baselines) == 1 else "runs"
    text = f"{len(baselines)} baseline {runs_word} interleaved with the trials: {counted_ms} ms"
    if any(r.counted for r in baselines):
        text += " (the first: the settling run after the capture, as fast as the bare run before it)"
    aside = []
    settle = next((r for r in runs if r.kind == "settle" and not r.counted and results.step_times(r.status)[0]), None)
    if settle is not None:
        settled = statistics.median(results.step_times(settle.status)[0])
        aside.append(f"the settling run first after the capture {_ms(settled)}")
    bare_times = results.step_times(results.job_view(bare or {}))[0] if bare else []
    if bare_times:
        aside.append(f"the bare run before the capture {_ms(statistics.median(bare_times))} (its own window)")
    return text + (f"; not counted: {', '.join(aside)}" if aside else "")
