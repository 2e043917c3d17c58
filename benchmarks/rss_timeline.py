"""Where ``gpudiag report`` holds its memory: resident set size over time, with the stack of the moment.

    python benchmarks/rss_timeline.py EXPORT OUT_DIR [--every 0.25] [--top 3] [--timeline-every 8]

Runs the report in this process (click's CliRunner) while a thread samples the RSS
(/proc/self/statm, Linux) and the main thread's stack every ``--every`` seconds. Prints the peak
RSS (``ru_maxrss``), the ``--top`` largest samples with their stacks, and a timeline of every 8th
sample with the gpudiag stage it fell in. docs/scale.md has a 1 M-kernel run.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time
import traceback


def _sampler(main_id: int, every_s: float, samples: list) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    while True:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * page
        frame = sys._current_frames().get(main_id)
        stack = [f"{fs.name}({os.path.basename(fs.filename)}:{fs.lineno})"
                 for fs in traceback.extract_stack(frame)][-14:] if frame else []
        samples.append((time.perf_counter(), rss, stack))
        time.sleep(every_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export")
    parser.add_argument("out")
    parser.add_argument("--every", type=float, default=0.25, help="seconds between samples")
    parser.add_argument("--top", type=int, default=3, help="largest samples to print with their stacks")
    parser.add_argument("--timeline-every", type=int, default=8, help="print every N-th sample in the timeline")
    args = parser.parse_args()
    from click.testing import CliRunner

    from gpudiag.cli.main import cli

    samples: list = []
    threading.Thread(target=_sampler, args=(threading.get_ident(), args.every, samples), daemon=True).start()
    start = time.perf_counter()
    result = CliRunner().invoke(cli, ["report", args.export, "-o", args.out, "--force"])
    timeline = list(samples)
    print(f"exit {result.exit_code}, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    for _, rss, stack in sorted(timeline, key=lambda s: -s[1])[:args.top]:
        print(f"{rss / 2**30:.2f} GiB  " + " > ".join(stack))
    for i, (t, rss, stack) in enumerate(timeline):
        if i % args.timeline_every == 0:
            # the stage the sample fell in: the innermost pipeline stage, else the innermost run/report/store frame
            inner = [s for s in stack if s.startswith(("_step_frames", "findings", "_step_sections", "analyse("))]
            stage = inner[-1] if inner else next(
                (s for s in reversed(stack) if any(m in s for m in ("run.py", "report.py", "store.py"))), "")
            print(f"{t - start:7.1f} s {rss / 2**30:6.2f} GiB  {stage} | {stack[-1] if stack else ''}")


if __name__ == "__main__":
    main()
