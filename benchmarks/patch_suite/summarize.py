"""The patch suite's table (issue 46): per script, its top conclusive change (the trial with status
"measured" and the largest saving), whether gpudiag made a patch of it (or why not), whether
`git apply --check` takes that patch in a fresh copy of the script's folder, the verification's
verdict, the patched saving and the trial's, each with its 95 % interval; then the share of top
conclusive changes whose patch is verified (the issue's bar: at least 80 %).

    python benchmarks/patch_suite/summarize.py OUT_DIR [OUT_DIR ...] [-o DEST] [--only NAME] [--quiet]

Reads each OUT_DIR/NAME/ that run_suite.sh wrote (rc.txt or skipped.txt, report.json,
changes/*.json, patch_check.json); a name found in several folders keeps the last folder's.
Writes DEST/summary.md and DEST/summary.json (DEST: the first OUT_DIR).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BAR = 80.0


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _pct_interval(record: dict) -> list[float] | None:
    ci, base = record.get("saving_ci_ns"), record.get("baseline_step_ns")
    if not ci or not base:
        return None
    return [100.0 * ci[0] / base, 100.0 * ci[1] / base]


def _fmt(value, interval) -> str:
    if value is None:
        return ""
    text = f"{value:.1f}"
    if interval:
        text += f" [{interval[0]:.1f}, {interval[1]:.1f}]"
    return text


def top_conclusive(report: dict) -> dict | None:
    """The measured trial (status "measured": its interval excludes zero) with the largest saving;
    None when no trial measured a saving. An ``args:`` trial (other script arguments) is left out,
    as gpudiag's patches leave it out (a command line, not an edit)."""
    wins = [t for t in report.get("trials") or [] if t.get("status") == "measured"
            and (t.get("saving_ns") or 0) > 0 and not str(t.get("change", "")).startswith("args:")]
    return max(wins, key=lambda t: float(t["saving_ns"])) if wins else None


def patch_record(folder: Path, report: dict, change: str) -> dict | None:
    """The patch record of ``change``: changes/CHANGE.json (the full record), else report.json's."""
    record = _json(folder / "changes" / f"{change}.json")
    if record is None:
        record = next((p for p in report.get("patches") or [] if p.get("change") == change), None)
    return record


def row(name: str, folder: Path) -> dict:
    out: dict = {"name": name, "folder": str(folder)}
    if (folder / "skipped.txt").exists():
        out["skipped"] = (folder / "skipped.txt").read_text().strip()
        return out
    rc = (folder / "rc.txt").read_text().split() if (folder / "rc.txt").exists() else []
    out["exit_code"] = int(rc[0]) if rc and rc[0].lstrip("-").isdigit() else None
    out["wall_s"] = int(rc[1]) if len(rc) > 1 and rc[1].isdigit() else None
    out["script"] = (folder / "script.txt").read_text().strip() if (folder / "script.txt").exists() else None
    report = _json(folder / "report.json")
    if report is None:
        out["note"] = "no report.json"
        return out
    trials = report.get("trials") or []
    out["trials"] = [{"change": t.get("change"), "status": t.get("status"), "saving_percent": t.get("saving_percent"),
                      "ci_percent": _pct_interval(t)} for t in trials]
    out["patches_in_report"] = "patches" in report
    checks = {p.get("change"): p for p in (_json(folder / "patch_check.json") or {}).get("patches") or []}
    out["patches"] = [{"change": p.get("change"), "made": p.get("made"),
                       "status": (p.get("verification") or {}).get("status"),
                       "git_apply_check": (checks.get(p.get("change")) or {}).get("git_apply_check")}
                      for p in report.get("patches") or []]
    top = top_conclusive(report)
    if top is None:
        out["note"] = (f"no trial measured a saving ({len(trials)} trials: "
                       + ", ".join(f"{t.get('change')} {t.get('status')}" + (f" {t['saving_percent']:+.1f} %" if isinstance(
                t.get("saving_percent"), (int, float)) else "") for t in trials) + ")") if trials \
            else "no trials in report.json"
        return out
    entry = {"change": top["change"], "trial_saving_percent": top.get("saving_percent"),
             "trial_ci_percent": _pct_interval(top)}
    record = patch_record(folder, report, top["change"])
    if record is None:
        entry["made"] = None
        entry["why_not"] = "no patch record (gpudiag wrote none: stopped before its patches, or an older gpudiag)"
    else:
        v = record.get("verification") or {}
        entry.update(made=bool(record.get("made")), why_not=record.get("why_not"), notes=record.get("notes"),
                     status=v.get("status") if record.get("made") else None, why=v.get("why"),
                     saving_percent=v.get("saving_percent"), saving_ci_percent=v.get("saving_ci_percent"),
                     runs=v.get("runs"))
        if v.get("trial_saving_percent") is not None:
            entry["trial_saving_percent"] = v["trial_saving_percent"]
        if v.get("trial_ci_percent"):
            entry["trial_ci_percent"] = v["trial_ci_percent"]
        check = checks.get(top["change"]) or {}
        entry["git_apply_check"] = check.get("git_apply_check")
        entry["git_apply_error"] = check.get("git_apply_error")
        entry["files_unchanged_since_run"] = check.get("files_unchanged_since_run")
        entry["files"] = [f.get("path") for f in record.get("files") or []]
    out["top"] = entry
    return out


def gather(folders: list[Path], only: str | None) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for base in folders:
        for sub in sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if only and sub.name != only:
                continue
            if (sub / "rc.txt").exists() or (sub / "skipped.txt").exists():
                rows[sub.name] = row(sub.name, sub)
    return rows


def bar(rows: dict[str, dict]) -> dict:
    tops = [r["top"] for r in rows.values() if r.get("top")]
    verified = [t for t in tops if t.get("status") == "verified"]
    made = [t for t in tops if t.get("made")]
    applies = [t for t in made if t.get("git_apply_check")]
    share = 100.0 * len(verified) / len(tops) if tops else None
    return {"scripts": len(rows), "with_top_conclusive_change": len(tops), "patch_made": len(made),
            "git_apply_check_ok": len(applies), "verified": len(verified), "verified_share_percent": share,
            "bar_percent": BAR, "meets_bar": share is not None and share >= BAR}


def markdown(rows: dict[str, dict], totals: dict) -> str:
    lines = ["| script | exit, wall s | top conclusive change | patch | git apply --check | verification "
             "| patched saving % [95 % CI] | trial saving % [95 % CI] |",
             "|:--|:--|:--|:--|:--|:--|:--|:--|"]
    notes = []
    for name, r in rows.items():
        if "skipped" in r:
            lines.append(f"| {name} | skipped | | | | | | |")
            notes.append(f"- {name}: {r['skipped']}")
            continue
        run = f"{r.get('exit_code')}, {r.get('wall_s')}"
        t = r.get("top")
        if not t:
            lines.append(f"| {name} | {run} | none | | | | | |")
            notes.append(f"- {name}: {r.get('note', '')}")
            continue
        if t.get("made"):
            patch = "made (" + ", ".join(t.get("files") or []) + ")"
        else:
            patch = f"no: {t.get('why_not') or ''}".replace("|", "\\|")
        check = {True: "ok", False: "FAILS", None: ""}[t.get("git_apply_check")]
        lines.append(f"| {name} | {run} | {t['change']} | {patch} | {check} | {t.get('status') or ''} "
                     f"| {_fmt(t.get('saving_percent'), t.get('saving_ci_percent'))} "
                     f"| {_fmt(t.get('trial_saving_percent'), t.get('trial_ci_percent'))} |")
        if t.get("why"):
            notes.append(f"- {name}: {t['change']}: {t['why']}")
        if t.get("git_apply_error"):
            notes.append(f"- {name}: git apply --check: {t['git_apply_error']}")
        if t.get("files_unchanged_since_run") is False:
            notes.append(f"- {name}: the script's files changed since the run (sha256_before differs)")
        others = [p for p in r.get("patches") or [] if p.get("change") != t["change"]]
        if others:
            notes.append(f"- {name}: other wins: " + ", ".join(
                f"{p['change']} ({'made' if p.get('made') else 'no patch'}"
                + (f", {p['status']}" if p.get("status") else "")
                + (", git apply ok" if p.get("git_apply_check") else ", git apply FAILS" if p.get("git_apply_check") is False else "")
                + ")" for p in others))
    share = totals["verified_share_percent"]
    lines += ["", f"Top conclusive changes with a verified patch: {totals['verified']} of "
              f"{totals['with_top_conclusive_change']}"
              + (f" ({share:.0f} %; the bar: {totals['bar_percent']:.0f} %: "
                 f"{'met' if totals['meets_bar'] else 'not met'})" if share is not None else " (none measured)")
              + f"; patch made {totals['patch_made']}, git apply --check ok {totals['git_apply_check_ok']}; "
              f"{totals['scripts']} scripts."]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("-o", "--out", type=Path, default=None, help="where summary.md/json go (default: the first folder)")
    parser.add_argument("--only", default=None, help="one script's row, printed (run_suite.sh after each script)")
    parser.add_argument("--quiet", action="store_true", help="print, write nothing")
    args = parser.parse_args(argv)
    rows = gather(args.folders, args.only)
    totals = bar(rows)
    text = markdown(rows, totals)
    if args.only:
        print("\n".join(line for line in text.splitlines() if line.startswith(f"| {args.only} |")
                        or line.startswith(f"- {args.only}:")))
    else:
        print(text, end="")
    if not args.quiet:
        dest = args.out or args.folders[0]
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "summary.md").write_text(text)
        (dest / "summary.json").write_text(json.dumps({"rows": rows, "totals": totals}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
