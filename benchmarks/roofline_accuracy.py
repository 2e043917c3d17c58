"""Roofline accuracy: the class gpudiag estimates without Nsight Compute against the class from
ncu's measured FLOPs and DRAM bytes, for the kernels ncu profiled (and their same-configuration
instances), over the measured steps of each run.

    python benchmarks/roofline_accuracy.py RUN_DIR [RUN_DIR ...] [--markdown OUT.md]

Each RUN_DIR comes from `gpudiag profile --ncu` (profile.sqlite, profile.ncu-rep,
script_status.json; the first two may be .xz), or is one of issue 48's fixtures
(tests/fixtures/roofline48/NAME: profile.sqlite.xz from a plain `nsys profile`, ncu_truth.csv.xz). The runs behind docs/roofline_accuracy.md are in
benchmarks/data/roofline/. Prints one row per run: agreement weighted by kernel time and by count, and
the error of estimated vs measured FLOPs and bytes (median of |estimate/measured - 1| over kernel
instances with both, and the time-weighted mean).
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from gpudiag import store  # noqa: E402
from gpudiag.analysis.ingest import ingest  # noqa: E402
from gpudiag.analysis.pipeline import analyse  # noqa: E402


def classes(run_dir: Path, with_ncu: bool, tmp: Path) -> pd.DataFrame:
    status_file = run_dir / "script_status.json"
    status = json.loads(status_file.read_text()) if status_file.exists() else None
    truth = run_dir / "ncu_truth.csv"  # issue 48's fixtures: ncu's numbers as read_ncu reads them
    db = ingest(run_dir / "profile.sqlite", tmp / f"{run_dir.name}-{with_ncu}.sqlite",
                ncu_path=run_dir / "profile.ncu-rep" if with_ncu and not truth.exists() else None)
    if with_ncu and truth.exists():
        store.write_table(db, "ncu_kernels", pd.read_csv(truth))
    analyse(db, status=status, warmup_steps=(status or {}).get("warmup_steps", 2))
    k = store.read_table(db, "kernels")[["kernel_id", "name", "duration_ns"]]
    c = store.read_table(db, "kernel_class")[["kernel_id", "kernel_class", "evidence", "flop", "bytes", "family",
                                               "basis"]]
    steps = store.read_table(db, "steps")
    a = store.read_table(db, "kernel_attribution")[["kernel_id", "step"]]
    measured = set(steps.loc[steps["measured"].astype(bool), "step"])
    merged = k.merge(c, on="kernel_id").merge(a, on="kernel_id")
    return merged[merged["step"].isin(measured)]


def _relative_error(estimate: pd.Series, measured: pd.Series, weight: pd.Series) -> tuple[float, float]:
    ok = estimate.notna() & measured.notna() & (measured > 0)
    err = (estimate[ok] / measured[ok] - 1).abs()
    if err.empty:
        return float("nan"), float("nan")
    return float(err.median()), float(np.average(err, weights=weight[ok]))


def _unpacked(run_dir: Path, tmp: Path) -> Path:
    """``run_dir`` itself, or a copy in ``tmp`` with its .xz files decompressed."""
    if not any(run_dir.glob("*.xz")):
        return run_dir
    target = tmp / run_dir.name
    target.mkdir()
    for f in run_dir.iterdir():
        if f.suffix == ".xz":
            with lzma.open(f) as src, open(target / f.name.removesuffix(".xz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
        elif f.is_file():  # a fixture's shapes/ run is compared on its own
            shutil.copy(f, target / f.name)
    return target


def compared(run_dir: Path) -> tuple[pd.DataFrame, float]:
    """Per kernel instance ncu measured (its configuration and ordinal): gpudiag's estimate
    (``*_est``: class, evidence, flop, bytes, family, basis) beside ncu's (``*_ncu``), and the run's
    total kernel time (ns) over the measured steps."""
    with tempfile.TemporaryDirectory() as tmp:
        source = _unpacked(run_dir, Path(tmp))
        est = classes(source, False, Path(tmp))
        meas = classes(source, True, Path(tmp))
    both = est.merge(meas, on="kernel_id", suffixes=("_est", "_ncu"))
    return both[both["evidence_ncu"] == "ncu"], float(est["duration_ns"].sum())


def accuracy(run_dir: Path) -> dict:
    both, total = compared(run_dir)
    # Overhead-bound kernels are classed by duration before any FLOP or byte is looked at: they would
    # agree by construction, so the agreement is over the roofline classes only.
    overhead = both["kernel_class_est"].eq("overhead") & both["kernel_class_ncu"].eq("overhead")
    per_class = both.loc[~overhead, "kernel_class_ncu"].value_counts().to_dict()
    both = both[~overhead]
    agree = both["kernel_class_est"] == both["kernel_class_ncu"]
    w = both["duration_ns_est"]
    flop_med, flop_tw = _relative_error(both["flop_est"], both["flop_ncu"], w)
    bytes_med, bytes_tw = _relative_error(both["bytes_est"], both["bytes_ncu"], w)
    gemm = both["family_est"].isin(["gemm", "conv", "attention"])
    gemm_flop_med, _ = _relative_error(both.loc[gemm, "flop_est"], both.loc[gemm, "flop_ncu"], w[gemm])
    by_basis = {b: (float(w[agree & (both["basis_est"] == b)].sum()), float(w[both["basis_est"] == b].sum()))
                for b in both["basis_est"].unique() if b}
    by_family = {f: (float(w[agree & (both["family_est"] == f)].sum()), float(w[both["family_est"] == f].sum()))
                 for f in both["family_est"].unique()}
    return {"run": run_dir.name, "kernels_compared": int(len(both)), "by_basis": by_basis, "by_family": by_family,
            "measured_classes": ", ".join(f"{k} {v}" for k, v in sorted(per_class.items())),
            "share_of_kernel_time_percent": 100.0 * float(w.sum()) / total if total else float("nan"),
            "agreement_time_weighted_percent": 100.0 * float(w[agree].sum() / w.sum()) if len(both) else float("nan"),
            "agreement_by_count_percent": 100.0 * float(agree.mean()) if len(both) else float("nan"),
            "flop_error_median_percent": 100 * flop_med, "flop_error_time_weighted_percent": 100 * flop_tw,
            "bytes_error_median_percent": 100 * bytes_med, "bytes_error_time_weighted_percent": 100 * bytes_tw,
            "contraction_flop_error_median_percent": 100 * gemm_flop_med,
            "disagreements": both.loc[~agree].groupby(["name_est", "kernel_class_est", "kernel_class_ncu"])["duration_ns_est"]
                                 .sum().sort_values(ascending=False).head(5).reset_index()
                                 .assign(name_est=lambda d: d["name_est"].str[:70]).values.tolist()}


def _print_totals(rows: list[dict], key: str, label: str) -> None:
    """Agreement per basis or family, summed over the runs: 'basis large tile: agreed 60.7 % of 25.76 ms'."""
    totals: dict[str, list[float]] = {}
    for r in rows:
        for b, (agreed, time) in r[key].items():
            totals.setdefault(b, [0.0, 0.0])
            totals[b][0] += agreed
            totals[b][1] += time
    for b, (agreed, time) in sorted(totals.items()):
        print(f"{label} {b}: agreed {100 * agreed / time:.1f} % of {time / 1e6:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--by-basis", action="store_true", help="agreement per heuristic basis over all runs")
    args = parser.parse_args()
    rows = [accuracy(r) for r in args.runs]
    table = pd.DataFrame([{k: v for k, v in r.items() if k not in ("disagreements", "by_basis", "by_family")} for r in rows])
    text = table.to_markdown(index=False, floatfmt=".1f")
    print(text)
    for r in rows:
        for d in r["disagreements"]:
            print(f"  {r['run']}: {d[0]} estimated {d[1]}, measured {d[2]} ({d[3] / 1e6:.2f} ms)")
    if args.by_basis:  # tiles.BASIS_CONFIDENCE: agreement per heuristic basis, over all runs given
        _print_totals(rows, "by_basis", "basis")
        _print_totals(rows, "by_family", "family")
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
