"""Where the wall time of ``gpudiag profile`` goes: the profile part against the trials, and within
each trial run its start-up against its steps. Reads run directories only; runs nothing.

    python benchmarks/trial_wall.py RUN_DIR [RUN_DIR ...] [--target-s 180] [--json FILE]

Per run directory:

- ``stage_times.json`` (gpudiag profile writes it): each stage's seconds; the profile part is every
  stage but "trials", the trials part is "trials".
- the command's own wall, when the device run measured it: a file ``RUN_DIR.wall_s`` or
  ``RUN_DIR/wall_s`` holding seconds (e.g. ``/usr/bin/time -f %e -o RUN_DIR.wall_s gpudiag
  profile ... -o RUN_DIR``); it adds the command's start-up and the report's rewrite to the stages.
- ``report.json``'s ``trials_budget`` (gpudiag.trials.runner.budget_account): budget, seconds
  used, runs by kind, planned runs not made and why, changes decided early, the run log. Runs made
  before the account existed are found as ``trial_*.json`` files, without process seconds.
- each run's status (``trial_*.json``): ``started_unix_s`` (the launcher's first line),
  ``startup_ns`` (from the launcher's instrumentation to step 0: the script's imports and model),
  ``warmup_ns`` (the warm-up steps), ``window_start_unix_s`` and ``ended_unix_s`` (the measured
  window and the status written). Per run: imports = launcher start to step 0 less ``startup_ns``
  (gpudiag's and torch's imports before the script's first line), start-up, warm-up, window, and
  outside = the process's seconds (the run log's ``elapsed_s``) less started-to-ended (the
  interpreter's start and the process's exit: CUDA context teardown).

``--target-s``: the wall the whole command should stay under; printed: the seconds left for
trials after the profile part and how many runs of this session's mean length fit in them.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

PARTS = ("imports", "start-up", "warm-up", "window", "outside")


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _command_wall(run_dir: Path) -> float | None:
    for path in (run_dir.with_name(run_dir.name + ".wall_s"), run_dir / "wall_s"):
        try:
            return float(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return None


def _median_step_ms(status: dict) -> float | None:
    """The run's median measured step (ms): CUDA events, else host wall clock, steps from its
    warm-up within its window (as gpudiag.analysis.steps.representative.step_times)."""
    first = int(status.get("warmup_steps") or 0)
    last = None if status.get("window_steps") is None else first + int(status["window_steps"]) - 1
    for key in ("step_gpu_ns", "step_wall_ns"):
        times = [float(v) for k, v in (status.get(key) or {}).items()
                 if int(k) >= first and (last is None or int(k) <= last) and v and float(v) > 0]
        if times:
            return statistics.median(times) / 1e6
    return None


def run_split(status: dict, elapsed_s: float | None) -> dict:
    """One run's seconds by part (:data:`PARTS`; None where the status lacks the timestamps) and its
    median step in ms."""
    started, window, ended = (status.get(k) for k in ("started_unix_s", "window_start_unix_s", "ended_unix_s"))
    startup = (status.get("startup_ns") or 0) / 1e9 or None
    warmup = (status.get("warmup_ns") or 0) / 1e9 or None
    to_window = window - started if started and window else None
    imports = to_window - startup - (warmup or 0.0) if to_window is not None and startup is not None else None
    lived = ended - started if started and ended else None
    return {"imports": imports, "start-up": startup if startup is not None else to_window, "warm-up": warmup,
            "window": ended - window if window and ended else None,
            "outside": elapsed_s - lived if elapsed_s is not None and lived is not None else None,
            "process_s": elapsed_s, "step_ms": _median_step_ms(status)}


def _runs(run_dir: Path, account: dict) -> list[dict]:
    """The run log of the account, each with its status file's split; without an account, every
    trial_*.json in the run directory (no process seconds)."""
    log = account.get("run_log") or [{"name": p.name, "kind": _kind(p.name), "change": None, "elapsed_s": None}
                                     for p in sorted(run_dir.glob("trial_*.json"))]
    return [entry | run_split(_read(run_dir / entry["name"]), entry.get("elapsed_s")) for entry in log]


def _kind(name: str) -> str:
    return "settle" if name.startswith("trial_settle") else "baseline" if name.startswith("trial_baseline") else "trial"


def session(run_dir: Path, target_s: float) -> dict:
    """Everything the tables show for one run directory, as plain data (the --json output)."""
    stages = _read(run_dir / "stage_times.json").get("stages_s") or {}
    account = _read(run_dir / "report.json").get("trials_budget") or {}
    profile_s = sum(v for k, v in stages.items() if k != "trials")
    runs = _runs(run_dir, account)
    elapsed = [r["process_s"] for r in runs if r["process_s"] is not None]
    mean_run = statistics.fmean(elapsed) if elapsed else None
    left = target_s - profile_s
    return {"run_dir": str(run_dir), "command_wall_s": _command_wall(run_dir), "profile_s": profile_s,
            "trials_s": stages.get("trials"), "stages_s": stages, "account": {k: v for k, v in account.items()
                                                                             if k != "run_log"},
            "runs": runs, "parts_s": {p: sum(r[p] or 0.0 for r in runs) for p in PARTS},
            "mean_run_s": mean_run, "target_s": target_s, "left_for_trials_s": left,
            "runs_that_fit": int(left // mean_run) if mean_run else None}


def _s(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def show(data: dict) -> None:
    print(f"== {data['run_dir']}")
    print(f"command {_s(data['command_wall_s'])} s; profile part {_s(data['profile_s'])} s "
          f"({', '.join(f'{k} {v:.1f}' for k, v in data['stages_s'].items() if k != 'trials')}); "
          f"trials {_s(data['trials_s'])} s")
    account = data["account"]
    if account:
        print(f"budget {account.get('budget_s')} s, used {account.get('used_s')} s; runs {account.get('runs')}; "
              f"seconds {account.get('run_s')}; not run {account.get('not_run')}; decided early "
              f"{account.get('decided_early')}; left out for the budget {account.get('left_out_for_budget')}")
    print(f"{'run':<34}{'kind':<10}{'process':>9}" + "".join(f"{p:>10}" for p in PARTS) + f"{'step ms':>10}")
    for r in data["runs"]:
        print(f"{r['name']:<34}{r['kind']:<10}{_s(r['process_s']):>9}" + "".join(f"{_s(r[p]):>10}" for p in PARTS)
              + f"{_s(r['step_ms']):>10}")
    parts = data["parts_s"]
    total = sum(parts.values()) or 1.0
    print("all runs: " + ", ".join(f"{p} {v:.1f} s ({100 * v / total:.0f} %)" for p, v in parts.items()))
    print(f"target {data['target_s']:.0f} s: {data['left_for_trials_s']:.1f} s left for trials after the profile "
          f"part; runs of {_s(data['mean_run_s'])} s that fit: {data['runs_that_fit']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--target-s", type=float, default=180.0, help="the whole command's wall to stay under")
    parser.add_argument("--json", type=Path, help="also write the data to this file")
    args = parser.parse_args()
    data = [session(d, args.target_s) for d in args.run_dirs]
    for one in data:
        show(one)
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
