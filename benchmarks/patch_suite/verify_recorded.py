"""Device: the patch of a run's top measured win, made from its recorded report (a trial already
measured on the same kind of GPU), then verified by running the patched script bare, interleaved
with the unchanged one (gpudiag.patches.verify), without profiling the script again.

    python benchmarks/patch_suite/verify_recorded.py -o OUT_DIR [--budget S] REPORT_JSON[.xz] SCRIPT [-- ARGS]

ARGS default to the recorded run's own arguments. OUT_DIR gets changes/<change>.json and .patch,
the runs' status files, and verify_recorded.json: script, change, the trial's saving and interval,
whether a patch was made (or why not), `git apply --check` in a fresh copy of the script's folder,
and the verification. Exit code 0 whatever the verdict (2 for a usage mistake).
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def load(path: Path) -> dict:
    raw = lzma.open(path).read() if path.suffix == ".xz" else path.read_bytes()
    return json.loads(raw)


def git_apply_check(patch_file: Path, folder: Path) -> bool:
    """Whether ``git apply --check`` takes the patch in a fresh copy of ``folder`` (.py files)."""
    with tempfile.TemporaryDirectory() as tmp:
        for f in folder.glob("*.py"):
            shutil.copy2(f, tmp)
        return subprocess.run(["git", "apply", "--check", str(patch_file)], cwd=tmp, capture_output=True).returncode == 0


def main(argv: list[str]) -> int:
    from gpudiag.app.patches import wins
    from gpudiag.capture.instrument import CaptureConfig
    from gpudiag.patches import make, verify

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("script", type=Path)
    parser.add_argument("-o", "--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=150.0, help="seconds for the verification runs")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    report = load(opts.report)
    args = opts.args[1:] if opts.args[:1] == ["--"] else (opts.args or list((report.get("script") or {}).get("args") or []))
    opts.out.mkdir(parents=True, exist_ok=True)
    measured = wins(report)
    out = {"script": opts.script.name, "args": args, "top": None}
    if measured:
        trial = measured[0]
        patch = make.make_patch(opts.script, trial["change"], trial, args)
        out["top"] = {"change": trial["change"], "trial_saving_percent": trial["saving_percent"],
                      "trial_ci_percent": verify._percent_interval(trial), "made": patch.made, "why_not": patch.why_not,
                      "notes": patch.notes}
        if patch.made:
            make.write(opts.out, patch)
            out["top"]["git_apply_check"] = git_apply_check(opts.out / "changes" / f"{patch.change}.patch",
                                                            opts.script.resolve().parent)
            patch.verification = verify.verify(patch, opts.script.resolve(), args, opts.out,
                                               CaptureConfig(warmup_steps=2, window_steps=20), trial, opts.budget,
                                               autocast_dtype=(report.get("script") or {}).get("autocast_dtype"))
            make.write(opts.out, patch)
            out["top"]["verification"] = patch.verification
    (opts.out / "verify_recorded.json").write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in (out["top"] or {}).items() if k != "verification"}),
          (out["top"] or {}).get("verification", {}).get("status"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
