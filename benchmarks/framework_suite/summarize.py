"""The framework suite's table: one row per profiled script, with the by-hand runs beside it, as
JSON and as markdown.

    python benchmarks/framework_suite/summarize.py OUT_DIR [OUT_DIR...] [--only NAME] [--quiet] [-o DEST]

OUT_DIR is a run_suite.sh output folder (or several: the calls of one suite, e.g. part1, part2,
hand1, hand2 unpacked side by side; a later folder's row replaces an earlier one's unless that one
was skipped). Per script folder NAME/ it reads rc.txt (exit code, wall seconds, the timeout),
skipped.txt, args.txt, profile.log, script_status.json (``step_mode``, ``steps_completed``,
``stopped_after_window``, ``backward_calls`` {step: backward() calls}, ``exception``),
bare_status.json, report.json (``steps``; ``recommendations``: ``rule_id``,
``saving_ns_per_step``, ``saving_percent_of_step``, ``trial_change``, ``trial_status``,
``measured_saving_percent``; ``trials``; ``representativeness``; ``warnings``) and gpudiag.log
(each command's output after its ``$ `` line: the bare run's, nsys's capture, the trials').
Per hand folder hand_NAME/ it reads hand.json (hand.sh: each arm's run medians, each change's
saving with its 95 % interval).

The framework's own optimizer steps come from the script's output in the capture (and the bare
run): our workloads print ``fw_step N`` from the framework's counter; run_clm.py logs one
``{'loss': ...}`` per optimizer step (--logging_steps 1); timm's train.py one ``Train: E [  N/M``
line per update (--log-interval 1); the Lightning demo's progress bar shows ``N/M`` batches when
the script ends; Accelerate's cv_example.py prints nothing per step. Micro-batches per optimizer
step: gpudiag's (the median of ``backward_calls`` over the steps it kept) against the script's
accumulation setting (LBFGS: the closure evaluations it printed).

Writes DEST/summary.json and DEST/summary.md (DEST: the last OUT_DIR unless -o); with --only,
OUT_DIR/NAME/summary.json only.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
from pathlib import Path

OWN = ["lightning_resnet50", "hf_trainer_bert", "accelerate_accum", "lightning_closure_lbfgs", "loader_bound"]
EXTERNAL = ["pl_transformer", "hf_run_clm", "accel_cv_example", "timm_train"]
ORDER = OWN + EXTERNAL

# how each script shows the framework's optimizer steps in its output: (kind, regex, what it counts)
FRAMEWORK_STEPS = {
    **{name: ("last", r"^fw_step (\d+)", "fw_step N: the framework's step counter") for name in OWN},
    "hf_run_clm": ("count", r"\{'loss': ", "{'loss': ...} log lines (--logging_steps 1)"),
    "timm_train": ("count", r"Train: \d+ \[\s*\d+/\d+", "Train: E [N/M] lines (--log-interval 1)"),
    "pl_transformer": ("last", r"Epoch \d+/\d+\s+\S*\s*(\d+)/\d+", "progress bar N/M at exit (batches)"),
    "accel_cv_example": (None, None, "prints nothing per step (one line per epoch)"),
}
# the script argument that sets micro-batches per optimizer step
ACCUMULATION_FLAGS = ("--accumulate-grad-batches", "--gradient-accumulation-steps", "--grad-accum",
                      "--grad-accum-steps", "--gradient_accumulation_steps")
# a trial's change -> the hand.sh arms that make the same change by hand (first found wins)
HAND_ARMS_OF_CHANGE = {
    "bf16-autocast": ("precision-bf16-mixed", "bf16", "mixed-precision-bf16"),
    "tf32": ("tf32",), "channels-last": ("channels-last",), "compile": ("compile",), "compile-graphs": ("compile",),
    "fused-optimizer": ("fused-optimizer",), "cudnn-benchmark": ("cudnn-benchmark",),
}
# a rule with no trial -> the hand arms that follow its advice (prefixes)
HAND_ARMS_OF_RULE = {
    "GD-INPUT-STALL": ("workers",), "GD-PAGEABLE-COPY": ("workers", "pin-memory"),
    "GD-FP32-MATMUL": ("precision-bf16-mixed", "bf16", "mixed-precision-bf16", "tf32"),
    "GD-CHANNELS-LAST": ("channels-last",), "GD-UNFUSED-OPTIMIZER": ("fused-optimizer",),
    "GD-TORCH-COMPILE": ("compile",), "GD-OVERHEAD-BOUND": ("compile",), "GD-CUDNN-BENCHMARK": ("cudnn-benchmark",),
}
TRACEBACK = re.compile(r"^Traceback \(most recent call last\)", re.M)


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def log_segments(log: str) -> dict[str, str]:
    """gpudiag.log split by its ``$ command`` lines into 'bare', 'capture', 'export', 'trial',
    'other' (the output of those commands, concatenated when several)."""
    segments: dict[str, str] = {}
    kind, lines = "other", []

    def flush():
        if lines:
            segments[kind] = segments.get(kind, "") + "\n".join(lines) + "\n"

    for line in log.splitlines():
        if line.startswith("$ "):
            flush()
            lines = []
            if " export " in line and "nsys" in line:
                kind = "export"
            elif "nsys" in line and " profile " in line:
                kind = "capture"
            elif "gpudiag.capture.launch" in line and '"trial": "' in line:
                kind = "trial"
            elif "gpudiag.capture.launch" in line and '"bare": true' in line:
                kind = "bare"
            else:
                kind = "other"
        else:
            lines.append(line)
    flush()
    return segments


def framework_steps(name: str, text: str) -> int | None:
    kind, pattern, _ = FRAMEWORK_STEPS.get(name, (None, None, None))
    if not pattern or not text:
        return None
    text = text.replace("\r", "\n")
    if kind == "count":
        return len(re.findall(pattern, text, re.M))
    found = re.findall(pattern, text, re.M)
    return int(found[-1]) if found else None


def configured_micro_batches(name: str, args: list[str], capture: str) -> float | None:
    if name == "lightning_closure_lbfgs":  # closure evaluations per step, as the script printed them
        found = [int(k) for k in re.findall(r"^fw_step \d+ closures=(\d+)", capture, re.M)]
        return statistics.median(found) if found else None
    value = 1.0
    for i, a in enumerate(args):
        for flag in ACCUMULATION_FLAGS:
            if a == flag and i + 1 < len(args):
                value = float(args[i + 1])
            elif a.startswith(flag + "="):
                value = float(a.split("=", 1)[1])
    return value


def gpudiag_micro_batches(status: dict | None, report: dict | None) -> float | None:
    calls = (status or {}).get("backward_calls") or {}
    if not calls:
        return None
    measured = [s.get("step") for s in ((report or {}).get("steps") or {}).get("per_step") or [] if s.get("measured")]
    per_step = [calls[str(i)] for i in measured if str(i) in calls] or list(calls.values())
    return statistics.median(per_step)


def _ms(ns) -> float | None:
    return None if ns is None else round(float(ns) / 1e6, 2)


def first_advice(report: dict | None) -> dict:
    recs = (report or {}).get("recommendations") or []
    if not recs:
        return {}
    r = recs[0]
    out = {"rule_id": r.get("rule_id"), "title": r.get("title"),
           "predicted_saving_ms": _ms(r.get("saving_ns_per_step")),
           "predicted_saving_percent": round(r["saving_percent_of_step"], 1) if r.get("saving_percent_of_step") is not None else None,
           "trial_change": r.get("trial_change"), "trial_status": r.get("trial_status"),
           "trial_saving_percent": round(r["measured_saving_percent"], 1) if r.get("measured_saving_percent") is not None else None,
           "trial_saving_ms": _ms(r.get("measured_saving_ns"))}
    trials = [t for t in (report or {}).get("trials") or [] if t.get("rule_id") == r.get("rule_id")]
    if trials:
        out["trials_of_rule"] = [{k: t.get(k) for k in ("change", "status", "saving_percent", "error")} for t in trials]
        if out["trial_change"] is None:  # the report names no trial for the advice: the rule's first trial
            t = trials[0]
            out.update(trial_change=t.get("change"), trial_status=t.get("status"),
                       trial_saving_percent=round(t["saving_percent"], 1) if t.get("saving_percent") is not None else None)
    return out


def hand_match(advice: dict, hand: dict | None) -> dict | None:
    """The hand.sh change that makes the first advice's change by hand, with its saving; None
    without hand runs."""
    if not hand:
        return None
    changes = hand.get("changes") or {}
    names = list(changes)
    want = HAND_ARMS_OF_CHANGE.get(advice.get("trial_change") or "", ())
    arm = next((a for a in want if a in changes), None)
    if arm is None:
        prefixes = HAND_ARMS_OF_RULE.get(advice.get("rule_id") or "", ())
        arm = next((n for p in prefixes for n in names if n.startswith(p)), None)
    out = {"all": {n: _hand_cell(changes[n]) for n in names}}
    if arm is not None:
        out.update(arm=arm, **{k: changes[arm].get(k) for k in ("saving_percent", "saving_percent_ci95", "baseline_ms",
                                                                "change_ms", "baseline_runs", "change_runs", "error")})
    return out


def _hand_cell(change: dict) -> str:
    if change.get("error"):
        return change["error"]
    lo, hi = change.get("saving_percent_ci95") or (None, None)
    return (f"{change['baseline_ms']:.1f} -> {change['change_ms']:.1f} ms, {change['saving_percent']:.1f} % "
            f"[{lo:.1f}, {hi:.1f}]")


def summarize_one(folder: Path, hand: dict | None = None) -> dict:
    name = folder.name
    row: dict = {"script": name}
    command = _text(folder / "command.txt").strip().splitlines()
    row["command"] = command[-1] if command else None
    args_text = _text(folder / "args.txt").strip()
    try:
        args = shlex.split(args_text)
    except ValueError:
        args = args_text.split()
    row["args"] = args_text
    if (folder / "skipped.txt").exists():
        row["status"] = _text(folder / "skipped.txt").strip()
        return row
    rc = _text(folder / "rc.txt").split()
    row["gpudiag_exit"] = int(rc[0]) if rc else None
    row["wall_s"] = int(rc[1]) if len(rc) > 1 else None
    row["timeout_s"] = int(rc[2]) if len(rc) > 2 else None
    status = _json(folder / "script_status.json")
    bare = _json(folder / "bare_status.json")
    report = _json(folder / "report.json")
    if status:
        row.update({k: status.get(k) for k in ("step_mode", "steps_completed", "stopped_after_window", "window_complete")})
        if status.get("exception"):
            row["exception"] = str(status["exception"])[:300]
    if bare:
        row["bare_steps_completed"] = bare.get("steps_completed")
    if report:
        steps = report.get("steps") or {}
        row.update(steps_found=steps.get("count"), steps_measured=steps.get("measured"), steps_source=steps.get("source"),
                   median_step_ms=_ms((steps.get("step_time_ns") or {}).get("median")))
        rep = report.get("representativeness") or {}
        if rep and "unavailable" not in rep:
            row.update(bare_ms=_ms(rep.get("bare_step_time_ns")), profiled_ms=_ms(rep.get("profiled_step_time_ns")))
        row["warnings"] = report.get("warnings") or []
        row["recommendations"] = [r.get("rule_id") for r in report.get("recommendations") or []]
        row["trials"] = [{k: t.get(k) for k in ("change", "rule_id", "status", "saving_percent", "error")}
                         for t in report.get("trials") or []]
    segments = log_segments(_text(folder / "gpudiag.log"))
    row["framework_steps_capture"] = framework_steps(name, segments.get("capture", ""))
    row["framework_steps_bare"] = framework_steps(name, segments.get("bare", ""))
    row["framework_steps_how"] = FRAMEWORK_STEPS.get(name, (None, None, None))[2]
    row["micro_batches_gpudiag"] = gpudiag_micro_batches(status, report)
    row["micro_batches_framework"] = configured_micro_batches(name, args, segments.get("capture", ""))
    row["first_advice"] = first_advice(report)
    row["hand"] = hand_match(row["first_advice"], hand)
    profile_log = _text(folder / "profile.log")
    row["window_messages"] = [line.strip() for line in profile_log.splitlines() if line.startswith("[window]")][:3]
    row["tracebacks"] = len(TRACEBACK.findall(profile_log)) + len(TRACEBACK.findall(segments.get("capture", "")))
    timed_out = row.get("gpudiag_exit") in (124, 137)
    row["status"] = ("timeout" if timed_out else
                     "ok" if row.get("gpudiag_exit") == 0 and row.get("steps_found") else "check")
    return row


def _cell(value) -> str:
    if value is None or value == "":
        return "–"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _advice_cell(a: dict) -> str:
    if not a:
        return "–"
    pct = f" {a['predicted_saving_percent']} %" if a.get("predicted_saving_percent") is not None else ""
    ms = f" ({a['predicted_saving_ms']} ms)" if a.get("predicted_saving_ms") is not None else ""
    return f"{a.get('rule_id')}{pct}{ms}"


def _trial_cell(a: dict) -> str:
    if not a or not a.get("trial_change"):
        return "no trial" if a else "–"
    saving = f" {a['trial_saving_percent']} %" if a.get("trial_saving_percent") is not None else ""
    return f"{a['trial_change']}: {a.get('trial_status')}{saving}"


def _hand_column(h: dict | None) -> str:
    if not h:
        return "–"
    if h.get("arm"):
        if h.get("error"):
            return f"{h['arm']}: {h['error']}"
        lo, hi = h.get("saving_percent_ci95") or (None, None)
        return (f"{h['arm']}: {h['saving_percent']:.1f} % [{lo:.1f}, {hi:.1f}] "
                f"({h['baseline_ms']:.1f} -> {h['change_ms']:.1f} ms)")
    return "no matching arm; " + "; ".join(f"{k}: {v}" for k, v in (h.get("all") or {}).items())


def markdown(rows: list[dict], hands: dict[str, dict]) -> str:
    head = ("| script | exit | step mode | steps: gpudiag completed / found / measured — framework's (capture, bare run) "
            "| micro-batches per step: gpudiag / framework | first advice (predicted) | its trial | the same change by hand "
            "| notes |")
    lines = [head, "|:--|--:|:--|:--|:--|:--|:--|:--|:--|"]
    for r in rows:
        if "gpudiag_exit" not in r:
            lines.append(f"| {r['script']} | – | – | – | – | – | – | {_hand_column(None)} | {_cell(r.get('status'))} |")
            continue
        notes = []
        if r.get("status") == "timeout":
            notes.append(f"timed out at {r.get('timeout_s')} s")
        if r.get("bare_ms") is not None:
            notes.append(f"bare {r['bare_ms']} / profiled {r.get('profiled_ms')} ms")
        notes += r.get("window_messages") or []
        if r.get("exception"):
            notes.append(f"exception: {r['exception'][:100]}")
        if r.get("tracebacks"):
            notes.append(f"{r['tracebacks']} traceback(s)")
        if r.get("trials"):
            notes.append("trials: " + ", ".join(f"{t['change']} {t.get('status')}"
                                                + (f" {t['saving_percent']:.1f} %" if t.get("saving_percent") is not None else "")
                                                for t in r["trials"]))
        if r.get("warnings"):
            notes.append(f"{len(r['warnings'])} warning(s): {r['warnings'][0][:100]}")
        notes.append(f"wall {r.get('wall_s')} s")
        steps = (f"{_cell(r.get('steps_completed'))} / {_cell(r.get('steps_found'))} / {_cell(r.get('steps_measured'))} — "
                 f"{_cell(r.get('framework_steps_capture'))}, {_cell(r.get('framework_steps_bare'))}")
        micro = f"{_cell(r.get('micro_batches_gpudiag'))} / {_cell(r.get('micro_batches_framework'))}"
        lines.append(f"| {r['script']} | {_cell(r.get('gpudiag_exit'))} | {_cell(r.get('step_mode'))} | {steps} | {micro} "
                     f"| {_advice_cell(r.get('first_advice') or {})} | {_trial_cell(r.get('first_advice') or {})} "
                     f"| {_hand_column(r.get('hand'))} | {'; '.join(notes)} |")
    text = "\n".join(lines) + "\n"
    if hands:
        text += "\n## By hand (hand.sh: interleaved bare runs, median of runs' medians, 95 % bootstrap interval)\n\n"
        text += "| workload | arm | runs | median of runs' medians (min–max), ms | saving vs baseline |\n|:--|:--|--:|:--|:--|\n"
        for name, h in hands.items():
            for arm, a in (h.get("arms") or {}).items():
                change = (h.get("changes") or {}).get(arm)
                med = a.get("median_of_runs_ms")
                span = f"{med:.2f} ({a['min_ms']:.2f}–{a['max_ms']:.2f})" if med is not None else "–"
                text += (f"| {name} | {arm} | {len(a.get('run_medians_ms') or [])} | {span} "
                         f"| {_hand_cell(change) if change else '–'} |\n")
    return text


def collect(out_dirs: list[Path]) -> tuple[dict[str, Path], dict[str, dict]]:
    folders: dict[str, Path] = {}
    hands: dict[str, dict] = {}
    for d in out_dirs:
        for p in sorted(d.iterdir()) if d.is_dir() else []:
            if not p.is_dir():
                continue
            if p.name.startswith("hand_"):
                h = _json(p / "hand.json")
                if h:
                    hands[p.name[5:]] = h
            elif (p / "command.txt").exists() or (p / "skipped.txt").exists():
                if p.name in folders and (p / "skipped.txt").exists():
                    continue  # a skip never hides a run from another call
                folders[p.name] = p
    return folders, hands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dirs", type=Path, nargs="+")
    parser.add_argument("--only", help="one script folder (writes OUT_DIR/NAME/summary.json only)")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("-o", "--dest", type=Path, default=None, help="where summary.json/.md go (default: the last OUT_DIR)")
    args = parser.parse_args(argv)
    folders, hands = collect(args.out_dirs)
    if args.only:
        folder = args.out_dirs[-1] / args.only
        row = summarize_one(folder, hands.get(args.only))
        (folder / "summary.json").write_text(json.dumps(row, indent=1))
        if args.quiet:
            a = row.get("first_advice") or {}
            print(f"  {row['script']}: exit {row.get('gpudiag_exit')}, mode {row.get('step_mode')}, steps "
                  f"{row.get('steps_completed')}/{row.get('steps_found')}/{row.get('steps_measured')}, framework "
                  f"{row.get('framework_steps_capture')}, micro-batches {row.get('micro_batches_gpudiag')}/"
                  f"{row.get('micro_batches_framework')}, first advice {_advice_cell(a)}, trial {_trial_cell(a)}")
        else:
            print(json.dumps(row, indent=1))
        return 0
    names = sorted(folders, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))
    rows = [summarize_one(folders[n], hands.get(n)) for n in names]
    dest = args.dest or args.out_dirs[-1]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "summary.json").write_text(json.dumps({"rows": rows, "hand": hands}, indent=1))
    table = markdown(rows, hands)
    envs = "".join(f"{d}:\n{_text(d / 'env.txt')}\n" for d in args.out_dirs if (d / "env.txt").exists())
    (dest / "summary.md").write_text("# Framework suite under gpudiag profile\n\n```\n" + envs + "```\n\n" + table)
    if not args.quiet:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
