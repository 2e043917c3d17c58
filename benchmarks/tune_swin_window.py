"""Sweep the tile (rows per program) and warps of the Swin window kernels' forward on the present GPU:

    python benchmarks/tune_swin_window.py

Prints, per shape and configuration, the median time (triton.testing.do_bench) and the share of the
copy bandwidth; it checked the defaults in gpudiag/fused/ops/swin_window.py (_tile, 4 warps): within
3-11 % of the best configuration on the H200 (docs/notes/measurements.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

from gpudiag.capture.calibrate import _copy_ms  # noqa: E402
from gpudiag.fused.ops import swin_window as sw  # noqa: E402


def main() -> None:
    copy_rate = 2 * (2 << 30) / (_copy_ms(2 << 30, torch.device("cuda")) * 1e-3)
    for B, H, W, C in ((128, 56, 56, 96), (32, 28, 28, 192), (32, 14, 14, 384)):
        x = torch.randn(B, H, W, C, device="cuda", dtype=torch.bfloat16)
        w, b = torch.ones(C, device="cuda", dtype=torch.bfloat16), torch.zeros(C, device="cuda", dtype=torch.bfloat16)
        n_rows, block = B * H * W, triton.next_power_of_2(C)
        y = torch.empty(n_rows // 49, 49, C, device="cuda", dtype=torch.bfloat16)
        mean = torch.empty(n_rows, device="cuda", dtype=torch.float32)
        rstd = torch.empty_like(mean)
        moved = 2 * x.numel() * x.element_size()
        for rows in (4, 8, 16, 32, 64):
            for warps in (1, 2, 4, 8):
                def ln():
                    sw._ln_partition_fwd[(triton.cdiv(n_rows, rows),)](x, w, b, y, mean, rstd, n_rows, C, H, W, 3, 1e-5,
                                                                       WS=7, ROWS=rows, BLOCK=block, num_warps=warps)

                def rev():
                    sw._reverse_add[(triton.cdiv(n_rows, rows),)](y, x, x, x, n_rows, C, H, W, 3, WS=7, HAS_RES=True,
                                                                  HAS_SCALE=False, TO_WINDOWS=False, ROWS=rows,
                                                                  BLOCK=block, num_warps=warps)
                t_ln = triton.testing.do_bench(ln, warmup=10, rep=50, return_mode="median")
                t_rev = triton.testing.do_bench(rev, warmup=10, rep=50, return_mode="median")
                print(f"{B}x{H}x{W}x{C} rows {rows:2d} warps {warps}: ln_partition {t_ln * 1e3:6.1f} us "
                      f"({100 * moved / (t_ln * 1e-3) / copy_rate:4.0f} %), reverse_add {t_rev * 1e3:6.1f} us "
                      f"({100 * 1.5 * moved / (t_rev * 1e-3) / copy_rate:4.0f} %)", flush=True)


if __name__ == "__main__":
    main()
