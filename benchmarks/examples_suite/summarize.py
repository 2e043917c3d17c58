"""Summary of a run_examples.sh output folder: one row per script, as JSON and as a markdown table.

    python benchmarks/examples_suite/summarize.py OUT_DIR [--only NAME] [--quiet]

Reads, per script folder OUT_DIR/NAME/ (run_examples.sh copies them there): command.txt, rc.txt
(gpudiag's exit code, wall seconds), skipped.txt, profile.log (gpudiag's terminal output),
script_status.json (the launcher's status: ``step_mode``, ``steps_completed``,
``stopped_after_window``, ``window_complete``, ``exit_code``, ``exception``; ``ranks`` for a job of
several processes), report.json (``steps``: ``count``/``measured``/``source``; ``representativeness``:
``bare_step_time_ns``/``profiled_step_time_ns``/``inflation_percent``, or ``unavailable``;
``warnings``) and gpudiag.log (every command gpudiag ran, each after a ``$ `` line, with its
output: the bare run's, nsys's capture of the script, the export). A torchrun-launched gpudiag
(one per rank) has rank<k>/ folders with the same files.

The script's own iterations are its per-iteration lines (a regex per script, below) in the
capture's and the bare run's segments of gpudiag.log. Workers survived: no "DataLoader worker ...
exited unexpectedly" / "killed by signal" in any log. Writes OUT_DIR/summary.json and
OUT_DIR/summary.md (with --only: OUT_DIR/NAME/summary.json only).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# the per-iteration line each script prints, and what it counts
ITERATION_LINES = {
    "imagenet_j0": (r"^Epoch: \[\d+\]\[\s*\d+/\d+\]", "batch (printed after optimizer.step(), --print-freq 1)"),
    "imagenet_j4": (r"^Epoch: \[\d+\]\[\s*\d+/\d+\]", "batch (printed after optimizer.step(), --print-freq 1)"),
    "word_lm": (r"^\| epoch\s+\d+ \|\s*\d+/\s*\d+ batches", "batch (from batch 1 on: batch 0 prints nothing)"),
    "word_lm_adamw": (r"^\| epoch\s+\d+ \|\s*\d+/\s*\d+ batches", "batch (from batch 1 on: batch 0 prints nothing)"),
    "dcgan": (r"^\[\d+/\d+\]\[\d+/\d+\] Loss_D", "batch (two optimizer steps each: D then G)"),
    "vae": (r"^Train Epoch: \d+ \[", "batch (after optimizer.step())"),
    "mnist": (r"^Train Epoch: \d+ \[", "batch (after optimizer.step())"),
    "vision_recipe": (r"^iter \d+$", "batch (after optimizer.step())"),
    "ddp_nproc": (r"^\[GPU\d+\] Epoch \d+ \|", "epoch start, per rank (the script prints no per-batch line)"),
    "ddp_torchrun": (r"^\[GPU\d+\] Epoch \d+ \|", "epoch start, per rank (the script prints no per-batch line)"),
}
WORKER_DEATH = re.compile(r"DataLoader worker \(pid[^)]*\) (exited unexpectedly|is killed by signal)|"
                          r"worker.*killed by signal|ERROR: Unexpected bus error", re.I)
TRACEBACK = re.compile(r"^Traceback \(most recent call last\)", re.M)


def _json(path: Path) -> dict | None:
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
    """gpudiag.log split by the ``$ command`` lines: {'bare', 'capture', 'export', 'trial', 'other'}
    -> the output of those commands (concatenated when several)."""
    segments: dict[str, str] = {}
    kind, lines = "other", []

    def flush():
        if lines:
            segments[kind] = segments.get(kind, "") + "\n".join(lines) + "\n"

    for line in log.splitlines():
        if line.startswith("$ "):
            flush()
            cmd, lines = line, []
            if " export " in cmd and "nsys" in cmd:
                kind = "export"
            elif "nsys" in cmd and " profile " in cmd:
                kind = "capture"
            elif "gpudiag.capture.launch" in cmd and '"trial": "' in cmd:
                kind = "trial"
            elif "gpudiag.capture.launch" in cmd and '"bare": true' in cmd:
                kind = "bare"
            else:
                kind = "other"
        else:
            lines.append(line)
    flush()
    return segments


def count_lines(pattern: str | None, text: str) -> int | None:
    return None if pattern is None else len(re.findall(pattern, text, re.M))


def _ms(ns) -> float | None:
    return None if ns is None else round(float(ns) / 1e6, 3)


def _status_fields(status: dict | None) -> dict:
    if not status:
        return {}
    out = {k: status.get(k) for k in ("exit_code", "step_mode", "steps_completed", "stopped_after_window",
                                      "window_complete", "capture_started_step")}
    if status.get("exception"):
        out["exception"] = str(status["exception"])[:300]
    ranks = [r for r in status.get("ranks") or [] if isinstance(r, dict)]
    if ranks:
        out["ranks"] = [{k: r.get(k) for k in ("rank", "local_rank", "exit_code", "step_mode", "steps_completed",
                                               "stopped_after_window")} for r in ranks]
        if not out.get("steps_completed"):  # the launcher (torchrun) ran no steps: its ranks did
            out["step_mode"] = ranks[0].get("step_mode") or out.get("step_mode")
            out["steps_completed"] = min((r.get("steps_completed") or 0) for r in ranks)
            out["stopped_after_window"] = out.get("stopped_after_window") or ranks[0].get("stopped_after_window")
    return out


def _report_fields(report: dict | None) -> dict:
    if not report:
        return {}
    steps = report.get("steps") or {}
    out = {"steps_found": steps.get("count"), "steps_measured": steps.get("measured"),
           "steps_source": steps.get("source"), "steps_kind": steps.get("kind"),
           "median_step_ms_profile": _ms((steps.get("step_time_ns") or {}).get("median"))}
    rep = report.get("representativeness")
    if rep and "unavailable" not in rep:
        out.update(bare_ms=_ms(rep.get("bare_step_time_ns")), profiled_ms=_ms(rep.get("profiled_step_time_ns")),
                   inflation_percent=round(rep["inflation_percent"], 1) if rep.get("inflation_percent") is not None else None,
                   bare_method=rep.get("method", "").split(",")[0])
    elif rep:
        out["bare_unavailable"] = rep["unavailable"]
    else:
        out["bare_unavailable"] = "no bare run in the report"
    out["warnings"] = report.get("warnings") or []
    out["top_recommendations"] = [r.get("rule_id") for r in (report.get("recommendations") or [])[:3]]
    return out


def summarize_one(folder: Path) -> dict:
    name = folder.name
    row: dict = {"script": name}
    command = _text(folder / "command.txt").strip().splitlines()
    row["command"] = command[-1] if command else None
    row["args"] = (_text(folder / "args.txt").strip()
                   or (command[-1].split(" -- ", 1)[1] if command and " -- " in command[-1] else ""))
    if (folder / "skipped.txt").exists():
        row["status"] = _text(folder / "skipped.txt").strip()
        return row
    rc = _text(folder / "rc.txt").split()
    row["gpudiag_exit"] = int(rc[0]) if rc else None
    row["wall_s"] = int(rc[1]) if len(rc) > 1 else None
    # a torchrun-launched gpudiag: rank 0's run is the one summarized, the others listed
    base = folder / "rank0" if (folder / "rank0").is_dir() and not (folder / "report.json").exists() else folder
    row["ranks_dirs"] = sorted(p.name for p in folder.glob("rank*") if p.is_dir()) or None
    row.update(_status_fields(_json(base / "script_status.json")))
    row.update(_report_fields(_json(base / "report.json")))
    pattern, what = ITERATION_LINES.get(name, (None, None))
    segments = log_segments(_text(base / "gpudiag.log"))
    row["iteration_line"] = what
    row["iterations_capture"] = count_lines(pattern, segments.get("capture", ""))
    row["iterations_bare"] = count_lines(pattern, segments.get("bare", ""))
    if row.get("ranks_dirs"):
        row["iterations_capture_per_rank"] = {
            d: count_lines(pattern, log_segments(_text(folder / d / "gpudiag.log")).get("capture", ""))
            for d in row["ranks_dirs"]}
    logs = [folder / "profile.log", *folder.glob("gpudiag.log"), *folder.glob("terminal.log"),
            *folder.glob("rank*/gpudiag.log"), *folder.glob("rank*/terminal.log")]
    deaths = [line.strip()[:200] for log in logs for line in _text(log).splitlines() if WORKER_DEATH.search(line)]
    row["workers_survived"] = not deaths
    if deaths:
        row["worker_deaths"] = deaths[:5]
    profile_log = _text(folder / "profile.log")
    row["window_messages"] = [line.strip() for line in profile_log.splitlines() if line.startswith("[window]")][:3]
    row["tracebacks"] = len(TRACEBACK.findall(profile_log)) + len(TRACEBACK.findall(segments.get("capture", "")))
    row["status"] = "ok" if row.get("gpudiag_exit") == 0 and row.get("steps_found") else "check"
    return row


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "**NO**"
    return str(value).replace("|", "\\|")


def markdown(rows: list[dict]) -> str:
    head = ("| script | args | exit | step mode | steps completed / found / measured | script's own iterations "
            "(capture / bare run) | workers survived | bare ms | profiled ms | notes |")
    lines = [head, "|:--|:--|--:|:--|:--|:--|:--|--:|--:|:--|"]
    for r in rows:
        if r.get("status", "").startswith("skipped") or "gpudiag_exit" not in r:
            lines.append(f"| {r['script']} | {_cell(r.get('args'))} | – | – | – | – | – | – | – | {_cell(r.get('status'))} |")
            continue
        notes = []
        if r.get("bare_unavailable"):
            notes.append(f"bare: {r['bare_unavailable'][:80]}")
        if r.get("inflation_percent") is not None:
            notes.append(f"inflation {r['inflation_percent']} %")
        notes += r.get("window_messages") or []
        if r.get("exception"):
            notes.append(f"exception: {r['exception'][:100]}")
        if r.get("tracebacks"):
            notes.append(f"{r['tracebacks']} traceback(s)")
        if r.get("ranks"):
            notes.append("ranks: " + ", ".join(f"{x.get('rank')}:{x.get('step_mode')}/{x.get('steps_completed')}"
                                                for x in r["ranks"]))
        if r.get("iterations_capture_per_rank"):
            notes.append(f"iterations per rank dir {r['iterations_capture_per_rank']}")
        if r.get("iteration_line"):
            notes.append(f"iteration line = {r['iteration_line']}")
        if r.get("warnings"):
            notes.append(f"{len(r['warnings'])} warning(s): {r['warnings'][0][:120]}")
        steps = f"{_cell(r.get('steps_completed'))} / {_cell(r.get('steps_found'))} / {_cell(r.get('steps_measured'))}"
        iters = f"{_cell(r.get('iterations_capture'))} / {_cell(r.get('iterations_bare'))}"
        lines.append(f"| {r['script']} | `{_cell(r.get('args'))}` | {_cell(r.get('gpudiag_exit'))} | {_cell(r.get('step_mode'))} "
                     f"| {steps} | {iters} | {_cell(r.get('workers_survived'))} | {_cell(r.get('bare_ms'))} "
                     f"| {_cell(r.get('profiled_ms'))} | {'; '.join(notes)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", help="one script folder (writes NAME/summary.json only)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.only:
        row = summarize_one(args.out_dir / args.only)
        (args.out_dir / args.only / "summary.json").write_text(json.dumps(row, indent=1))
        if not args.quiet:
            print(json.dumps(row, indent=1))
        else:
            print(f"  {row['script']}: exit {row.get('gpudiag_exit')}, mode {row.get('step_mode')}, steps "
                  f"{row.get('steps_completed')}/{row.get('steps_found')}, iterations {row.get('iterations_capture')}, "
                  f"bare {row.get('bare_ms')} ms, profiled {row.get('profiled_ms')} ms, workers ok {row.get('workers_survived')}")
        return 0
    folders = sorted((p for p in args.out_dir.iterdir() if p.is_dir() and (p / "command.txt").exists()
                      or (p / "skipped.txt").exists()), key=lambda p: list(ITERATION_LINES).index(p.name)
                     if p.name in ITERATION_LINES else len(ITERATION_LINES))
    rows = [summarize_one(p) for p in folders]
    (args.out_dir / "summary.json").write_text(json.dumps(rows, indent=1))
    table = markdown(rows)
    env = _text(args.out_dir / "env.txt")
    (args.out_dir / "summary.md").write_text("# pytorch/examples under gpudiag profile\n\n```\n" + env + "```\n\n" + table)
    if not args.quiet:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
