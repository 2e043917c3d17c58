"""Turn shapes.sh's output into fixtures (run here, no GPU): per workload NAME,
``NAME/shapes/profile.sqlite.xz`` (the export ``gpudiag profile`` made, with its op ranges and
shapes; scrubbed, :mod:`gpudiag.sources.scrub`) and ``NAME/shapes/script_status.json`` (scrubbed).
The ground truth stays ``NAME/ncu_truth.csv.xz`` (collect.py): the same workload, the same GPU.

    python benchmarks/roofline48/collect_shapes.py OUT -o tests/fixtures/roofline48
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import tempfile
from pathlib import Path

from gpudiag.sources import scrub


def collect(out: Path, name: str, dest: Path) -> None:
    target = dest / name / "shapes"
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "profile.sqlite"
        with lzma.open(out / f"{name}_shapes.sqlite.xz") as f, open(export, "wb") as g:
            shutil.copyfileobj(f, g)
        scrub.scrub(export)
        with open(export, "rb") as f, lzma.open(target / "profile.sqlite.xz", "wb", preset=9) as g:
            shutil.copyfileobj(f, g)
    status = scrub.scrub_text((out / f"{name}_status.json").read_text())
    (target / "script_status.json").write_text(status)
    print(f"{name}: -> {target}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("-o", "--dest", type=Path, required=True)
    p.add_argument("--names", default="encoder,conv,decoder,swinv2,decode,moe")
    a = p.parse_args()
    for name in a.names.split(","):
        collect(a.out, name, a.dest)


if __name__ == "__main__":
    main()
