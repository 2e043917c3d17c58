"""After one script's `gpudiag profile`: its patches brought into the suite's output folder and
checked where they are meant to go.

    python benchmarks/patch_suite/collect.py RUN_DIR SCRIPT DEST

Copies RUN_DIR/changes/*.json and *.patch to DEST/changes/ and writes DEST/patch_check.json: per
patch record, whether `git apply --check PATCH` takes it in a fresh copy of the script's folder
(its top-level .py files, the only files a patch may touch: docs/patches.md), git's message when it
does not, and whether the files still have the bytes the patch was made from (sha256_before). The
check itself is verify_recorded.py's. Exit code 0 whatever it finds.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verify_recorded import git_apply_check  # noqa: E402 - the same check, one definition


def apply_error(patch_file: Path, folder: Path) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        for f in folder.glob("*.py"):
            shutil.copy2(f, tmp)
        done = subprocess.run(["git", "apply", "--check", str(patch_file)], cwd=tmp, capture_output=True, text=True)
        return (done.stderr or done.stdout).strip()[-500:]


def check(run_dir: Path, script: Path, dest: Path) -> dict:
    changes, out_changes = run_dir / "changes", dest / "changes"
    folder = script.resolve().parent
    out = {"script": str(script), "script_dir": str(folder), "run_dir": str(run_dir), "patches": []}
    if not changes.is_dir():
        out["note"] = "no changes/ folder in the run directory (no measured win, or gpudiag stopped before the patches)"
        return out
    out_changes.mkdir(parents=True, exist_ok=True)
    for record_file in sorted(changes.glob("*.json")):
        try:
            record = json.loads(record_file.read_text())
        except ValueError as e:
            out["patches"].append({"file": record_file.name, "error": f"unreadable: {e}"})
            continue
        shutil.copy2(record_file, out_changes / record_file.name)
        entry = {"change": record.get("change"), "made": record.get("made"), "why_not": record.get("why_not"),
                 "status": (record.get("verification") or {}).get("status")}
        patch_file = changes / f"{record.get('change')}.patch"
        if patch_file.is_file():
            shutil.copy2(patch_file, out_changes / patch_file.name)
            entry["patch"] = patch_file.name
            entry["patch_lines"] = len(patch_file.read_text().splitlines())
            patch_dir = Path(record.get("script_dir") or folder)
            entry["git_apply_check"] = git_apply_check(patch_file, patch_dir)
            if not entry["git_apply_check"]:
                entry["git_apply_error"] = apply_error(patch_file, patch_dir)
            same = []
            for f in record.get("files") or []:
                path = patch_dir / f["path"]
                now = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
                same.append(now == f.get("sha256_before"))
            entry["files_unchanged_since_run"] = all(same) if same else None
        out["patches"].append(entry)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    run_dir, script, dest = (Path(a) for a in argv)
    dest.mkdir(parents=True, exist_ok=True)
    result = check(run_dir, script, dest)
    (dest / "patch_check.json").write_text(json.dumps(result, indent=1))
    for p in result["patches"]:
        print(f"  patch {p.get('change')}: made={p.get('made')} git_apply_check={p.get('git_apply_check')} "
              f"verification={p.get('status')}" + (f" why_not={p.get('why_not')}" if not p.get("made") else ""))
    if not result["patches"]:
        print(f"  patches: none ({result.get('note', 'no records')})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
