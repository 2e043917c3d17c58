"""A fake ``nsys`` for tests of ``gpudiag profile``'s terminal output and Ctrl-C handling.

It prints what the real one prints around a capture and an export (status lines and progress bars
redrawn with carriage returns, in the formats of real gpudiag.log files recorded on the H100 with
nsys 2025.3), runs the profiled command, and on SIGINT does what nsys does: waits for the
application (which got the signal too, being in its process group) and still writes its report.
The export is a real committed nsys export, copied: a CPU machine has no CUDA trace to export.

Environment: ``FAKE_NSYS_STUCK=FILE`` makes ``profile`` ignore SIGINT and hang after the
application ended (touching FILE first), to test that a second Ctrl-C aborts;
``FAKE_NSYS_PIDFILE=FILE`` makes it write its pid there.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE = REPO_ROOT / "tests" / "fixtures" / "tiny_gemm_gelu.sqlite.xz"
EXPORT_REDRAWS = 101  # "Processing N events" redraws, 0 % to 100 %, as the real export prints
REPORT_REDRAWS = 14   # "[1/1] [..] profile.nsys-rep" redraws, as in a real capture
WARNING = "WARNING: fake nsys warning the user should see"

SOURCE = r'''
import lzma, os, shutil, signal, subprocess, sys, time

FIXTURE = {fixture!r}
received = []


def bars(label_before, label_after, count, width):
    # nsys redraws one line with carriage returns; a pipe gets them all
    for i in range(count):
        pct = round(100 * i / (count - 1))
        done = "=" * (pct * width // 100)
        sys.stdout.write(f"\r{{label_before}}[{{done}}{{pct}}%{{' ' * (width - len(done))}}]{{label_after}}")
        sys.stdout.flush()
    sys.stdout.write("\n")


args = sys.argv[1:]
if args[:1] == ["profile"]:
    at = args.index("--output")
    base, command = args[at + 1], args[at + 2:]
    stuck = os.environ.get("FAKE_NSYS_STUCK")
    signal.signal(signal.SIGINT, lambda s, f: received.append(s))  # the child gets the default back
    if os.environ.get("FAKE_NSYS_PIDFILE"):
        with open(os.environ["FAKE_NSYS_PIDFILE"], "w") as f:
            f.write(str(os.getpid()))
    print("Collecting data...", flush=True)
    print({warning!r}, flush=True)
    child = subprocess.Popen(command)
    code = child.wait()
    if stuck:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        open(stuck, "w").close()
        time.sleep(600)
    print("Generating '/tmp/nsys-report-fa4e.qdstrm'\n", flush=True)
    bars("[1/1] ", " profile.nsys-rep", {report_redraws}, 24)
    with open(base + ".nsys-rep", "w") as f:
        f.write("fake nsys report; stopped by SIGINT: %s\n" % bool(received))
    print("Generated:\n\t" + base + ".nsys-rep", flush=True)
    sys.exit(code)
if args[:1] == ["export"]:
    out, report = args[6], args[7]
    open(report).close()
    print("", flush=True)
    bars("Processing 1000 events: ", "", {export_redraws}, 50)
    with lzma.open(FIXTURE) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    sys.exit(0)
sys.exit(97)
'''


def make_fake_nsys(folder: Path) -> Path:
    """Write the fake ``nsys`` into ``folder`` (executable) and return its path."""
    shebang = f"#!{sys.executable}" if len(sys.executable) < 120 and " " not in sys.executable else "#!/usr/bin/env python3"
    path = folder / "nsys"
    path.write_text(shebang + "\n" + SOURCE.format(fixture=str(FIXTURE), warning=WARNING, export_redraws=EXPORT_REDRAWS,
                                                   report_redraws=REPORT_REDRAWS))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def child_env(**extra: str) -> dict:
    """Environment for ``python -m gpudiag`` children: this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env
