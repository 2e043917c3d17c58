"""Turn capture.sh's output folders into the issue 48 fixtures (run here, no GPU).

    python benchmarks/roofline48/collect.py CAPTURE_DIR [CAPTURE_DIR ...] -o tests/fixtures/roofline48

Per workload folder ``NAME`` (``profile.sqlite[.xz]``, ``profile.ncu-rep[.xz]``, the logs), writes
``NAME/profile.sqlite.xz``: the nsys export, scrubbed (:mod:`gpudiag.sources.scrub`), and
``NAME/ncu_truth.csv.xz``: Nsight Compute's per-kernel numbers as :func:`gpudiag.sources.ncu.read_ncu`
reads them (name, grid, block, duration, DRAM bytes, FLOPs per precision and tensor path), one row per
profiled launch in ncu's order. The ``.ncu-rep`` files themselves (2-7 MB each, 25 MB in all, holding
the capture machine's command lines) are not committed; ``ncu.log``/``nsys.log`` are, scrubbed.
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import tempfile
from pathlib import Path

from gpudiag.sources import scrub
from gpudiag.sources.ncu import read_ncu


def _plain(src: Path, tmp: Path) -> Path:
    """``src`` or, for ``src.xz``, a decompressed copy in ``tmp``."""
    xz = src.with_name(src.name + ".xz")
    if src.exists():
        return src
    out = tmp / f"plain-{src.name}"  # not the name collect() copies the export to
    with lzma.open(xz) as f, open(out, "wb") as g:
        shutil.copyfileobj(f, g)
    return out


def collect(folder: Path, dest: Path) -> None:
    target = dest / folder.name
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "profile.sqlite"
        shutil.copy(_plain(folder / "profile.sqlite", Path(tmp)), export)
        scrub.scrub(export)
        with open(export, "rb") as f, lzma.open(target / "profile.sqlite.xz", "wb", preset=9) as g:
            shutil.copyfileobj(f, g)
        truth = read_ncu(_plain(folder / "profile.ncu-rep", Path(tmp)))
    with lzma.open(target / "ncu_truth.csv.xz", "wt", preset=9) as g:
        truth.to_csv(g, index=False)
    for log in ("nsys.log", "ncu.log"):
        if (folder / log).exists():
            (target / log).write_text(scrub.scrub_text((folder / log).read_text(errors="replace")))
    print(f"{folder.name}: {len(truth)} ncu rows -> {target}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("-o", "--out", type=Path, required=True)
    a = p.parse_args()
    for folder in a.folders:
        collect(folder, a.out)


if __name__ == "__main__":
    main()
