"""Turn compiled_ncu.sh's output into fixtures (run here, no GPU): per workload NAME,
``compiled/NAME/profile.sqlite.xz`` (the export ``gpudiag profile --ncu`` made, with its compiled-graph
ranges; scrubbed), ``compiled/NAME/ncu_truth.csv.xz`` (its Nsight Compute report as
:func:`gpudiag.sources.ncu.read_ncu` reads it, collect.py) and ``compiled/NAME/script_status.json``
(the launcher's status with Inductor's call sites and their shapes; scrubbed).

    python benchmarks/roofline48/collect_compiled.py OUT -o tests/fixtures/roofline48 --names triton_gemm,vit_compiled
    python benchmarks/roofline48/collect_compiled.py OUT -o tests/fixtures/roofline48 --names bert_sdpa,gpt2_sdpa --into profiled
"""

from __future__ import annotations

import argparse
import tarfile
import tempfile
from pathlib import Path

from gpudiag.sources import scrub

import collect as plain  # benchmarks/roofline48/collect.py


def collect(out: Path, name: str, dest: Path, into: str = "compiled") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / name
        folder.mkdir()
        with tarfile.open(out / f"{name}.tar.xz") as tar:
            tar.extractall(folder, filter="data")
        plain.collect(folder, dest / into)
        status = scrub.scrub_text((folder / "script_status.json").read_text())
        (dest / into / name / "script_status.json").write_text(status)
    if (out / f"{name}.log").exists():
        (dest / into / name / "profile.log").write_text(scrub.scrub_text((out / f"{name}.log").read_text(errors="replace")))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("-o", "--dest", type=Path, required=True)
    p.add_argument("--names", default="triton_gemm,vit_compiled")
    p.add_argument("--into", default="compiled", help="the fixtures' subfolder (eager runs: profiled)")
    a = p.parse_args()
    for name in a.names.split(","):
        collect(a.out, name, a.dest, a.into)


if __name__ == "__main__":
    main()
