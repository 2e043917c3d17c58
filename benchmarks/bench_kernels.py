"""Benchmark every reference kernel at transformer shapes on the present GPU (device):

    python benchmarks/bench_kernels.py [--quick] [--markdown OUT.md]

Shapes: tokens 8k-64k x hidden 768-8192 (GPT-2 / LLaMA sizes). Forward, and forward+backward.
Compares eager PyTorch, the fused Triton kernel and torch.compile of the eager chain; bandwidth as
% of the measured copy bandwidth (a 2 GiB device-to-device copy, gpudiag calibrate's method).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import pandas as pd  # noqa: E402

from gpudiag.capture.calibrate import _copy_ms  # noqa: E402
from gpudiag.kernels.bench import bench  # noqa: E402

SHAPES = [(8192, 768), (8192, 3072), (32768, 1024), (16384, 4096), (65536, 768), (8192, 8192)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="three shapes only")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--kernels", default="bias_gelu,rms_norm", help="comma-separated kernel names")
    args = parser.parse_args()
    import torch

    copy_rate = 2 * (2 << 30) / (_copy_ms(2 << 30, torch.device("cuda")) * 1e-3)
    print(f"copy bandwidth {copy_rate / 1e12:.2f} TB/s ({torch.cuda.get_device_name()})", flush=True)
    rows = []
    for name in args.kernels.split(","):
        for shape in [SHAPES[0], SHAPES[2], SHAPES[3]] if args.quick else SHAPES:
            for backward in (False, True):
                r = bench(name, *shape, dtype=torch.bfloat16, backward=backward, copy_bytes_per_s=copy_rate)
                rows.append(r)
                print(f"{name:9s} {shape} {'fwd+bwd' if backward else 'fwd':7s} eager {r['eager_ms']:.3f} ms  fused "
                      f"{r['fused_ms']:.3f} ms  compile {r['compiled_ms'] or float('nan'):.3f} ms  "
                      f"{r['percent_of_copy_bandwidth'] or float('nan'):.0f} % of copy BW  err {r['max_rel_error']:.1e}", flush=True)
    table = pd.DataFrame(rows)[["kernel", "rows", "cols", "backward", "eager_ms", "fused_ms", "compiled_ms",
                                "speedup_vs_eager", "speedup_vs_compile", "percent_of_copy_bandwidth", "max_rel_error"]]
    text = table.to_markdown(index=False, floatfmt=".3g")
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
