"""Benchmark every reference kernel at transformer shapes on the present GPU (device):

    python benchmarks/bench_kernels.py [--quick] [--markdown OUT.md]

Shapes: each kernel's ``bench_shapes`` (row-wise kernels: tokens 8k-64k x hidden 768-8192, GPT-2 to
LLaMA sizes; Swin kernels: the four Swin-T stages). Forward, and forward+backward.
Compares eager PyTorch, the fused Triton kernel and torch.compile of the eager chain; bandwidth as
% of the measured copy bandwidth (a 2 GiB device-to-device copy, gpudiag calibrate's method).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import pandas as pd  # noqa: E402

from gpudiag.capture.calibrate import _copy_ms  # noqa: E402
from gpudiag.fused.bench import bench  # noqa: E402

from gpudiag.fused.registry import kernels  # noqa: E402


def peak_bytes(name: str, shape, dtype) -> dict:
    """Peak CUDA memory (bytes above the inputs) of one forward+backward, eager chain vs fused kernel:
    the point of linear_cross_entropy, which never holds the [tokens, vocab] logits."""
    import torch

    kernel = kernels()[name]
    inputs = kernel.make_inputs(tuple(shape), dtype, "cuda", torch.Generator().manual_seed(1))
    inputs = [t.requires_grad_(True) if t.is_floating_point() else t for t in inputs]
    out = {}
    for label, fn in (("eager_peak_bytes", kernel.reference), ("fused_peak_bytes", kernel.fused)):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        ys = fn(*inputs)
        ys = list(ys) if isinstance(ys, tuple) else [ys]
        torch.autograd.grad(ys, [t for t in inputs if t.requires_grad], [torch.ones_like(y) for y in ys])
        del ys
        out[label] = torch.cuda.max_memory_allocated() - base
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="the first, middle and last shape only")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--kernels", default="", help="comma-separated kernel names (default: all)")
    parser.add_argument("--json", type=Path, help="also write the measurements as JSON lines")
    args = parser.parse_args()
    import torch

    copy_rate = 2 * (2 << 30) / (_copy_ms(2 << 30, torch.device("cuda")) * 1e-3)
    print(f"copy bandwidth {copy_rate / 1e12:.2f} TB/s ({torch.cuda.get_device_name()})", flush=True)
    rows = []
    registry = kernels()
    names = args.kernels.split(",") if args.kernels else list(registry)
    unknown = sorted(set(names) - set(registry))
    if unknown:
        parser.error(f"no reference kernel {', '.join(unknown)}; available: {', '.join(sorted(registry))}")
    for name in names:
        shapes = registry[name].bench_shapes
        for shape in sorted({shapes[0], shapes[len(shapes) // 2], shapes[-1]}, key=shapes.index) if args.quick else shapes:
            for backward in (False, True):
                try:
                    r = bench(name, shape, dtype=torch.bfloat16, backward=backward, copy_bytes_per_s=copy_rate)
                    if backward:
                        torch.cuda.empty_cache()
                        r.update(peak_bytes(name, shape, torch.bfloat16))
                except torch.OutOfMemoryError:
                    print(f"{name} {shape}: out of memory, skipped", flush=True)
                    continue
                finally:
                    torch.cuda.empty_cache()
                rows.append(r)
                if args.json:
                    with args.json.open("a") as f:
                        f.write(json.dumps(r) + "\n")
                print(f"{name:9s} {shape} {'fwd+bwd' if backward else 'fwd':7s} eager {r['eager_ms']:.3f} ms  fused "
                      f"{r['fused_ms']:.3f} ms  compile {r['compiled_ms'] or float('nan'):.3f} ms  "
                      f"{r['percent_of_copy_bandwidth'] or float('nan'):.0f} % of copy BW  err {r['max_rel_error']:.1e}"
                      + (f"  peak {r['eager_peak_bytes'] / 2**20:.0f} -> {r['fused_peak_bytes'] / 2**20:.0f} MiB"
                         if backward else ""),
                      flush=True)
    table = pd.DataFrame(rows)
    table["shape"] = table["shape"].map(lambda s: "x".join(map(str, s)))
    table = table[["kernel", "shape", "backward", "eager_ms", "fused_ms", "compiled_ms", "speedup_vs_eager",
                   "speedup_vs_compile", "percent_of_copy_bandwidth", "max_rel_error", "eager_peak_bytes",
                   "fused_peak_bytes"]]
    text = table.to_markdown(index=False, floatfmt=".3g")
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
