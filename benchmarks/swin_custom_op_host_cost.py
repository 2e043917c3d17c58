"""Host (CPU) time per call of Swin's fused ops inside a compiled graph, without a GPU: the custom op
(``torch.ops.gpudiag.*``, what Inductor's generated code calls for an opaque custom op) against the
launcher alone (what an inlined launch costs at most), with the Triton launch itself stubbed out so
only Python and dispatcher work is timed.

    python benchmarks/swin_custom_op_host_cost.py

Tiny shapes (a 14x14 grid, C=8), under torch.no_grad as a compiled graph runs them; µs per call,
median of 5 rounds of 300 calls after 30 warm-up calls. Prints one line per op (the 8 a patched
Swin block calls per training step, forward and backward), then their sum per block and per
Swin-T step (12 blocks). The numbers are this machine's,
not a GPU host's; the stub means the launch cost of the real kernel is not included.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors; the launch is stubbed anyway
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from gpudiag.fused import custom_ops as co  # noqa: E402  (importing registers the ops)
from gpudiag.fused import custom_ops_swin as cs  # noqa: E402
from host_launch_cost import per_call_us  # noqa: E402  (benchmarks/, beside this script)

SWIN_T_BLOCKS = 12


def _stub_launches() -> None:
    """Make ``kernel[grid](...)`` a no-op: what is left is the host work around the launch."""
    InterpretedFunction.__getitem__ = lambda self, grid: (lambda *args, **kwargs: None)


def _cases():
    """(name, through the custom op, launcher body alone) for each forward and backward op."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x, w, b = r(2, 14, 14, 8), r(8), r(8)
    win, s = r(8, 49, 8), r(8, 2, 49, 49)
    bias, mask = r(2, 49, 49), r(4, 49, 49)
    mean, rstd = r(2 * 14 * 14), r(2 * 14 * 14).abs()
    scale = torch.rand(2, generator=g)  # DropPath's per-sample factor
    ops = torch.ops.gpudiag
    return [
        ("ln_roll_partition", lambda: ops.ln_roll_partition(x, w, b, 7, 3, 1e-5, None),
         lambda: cs._lrp_op._init_fn(x, w, b, 7, 3, 1e-5, None)),
        ("scaled_masked_softmax", lambda: ops.scaled_masked_softmax(s, bias, mask, 0.5, None),
         lambda: cs._sms_op._init_fn(s, bias, mask, 0.5, None)),
        ("window_reverse_roll_add", lambda: ops.window_reverse_roll_add(win, x, 7, 3, None),
         lambda: cs._wrra_op._init_fn(win, x, 7, 3, None)),
        ("ln_roll_partition_backward", lambda: ops.ln_roll_partition_backward(x, w, mean, rstd, win, 7, 3),
         lambda: cs._lrp_bwd_op._init_fn(x, w, mean, rstd, win, 7, 3)),
        ("scaled_masked_softmax_backward",
         lambda: ops.scaled_masked_softmax_backward(s, s, bias, mask, 0.5, torch.float32, True, False),
         lambda: cs._sms_bwd_op._init_fn(s, s, bias, mask, 0.5, torch.float32, True, False)),
        ("window_reverse_roll_add_backward",
         lambda: ops.window_reverse_roll_add_backward(x, list(win.shape), torch.float32, 7, 3, None),
         lambda: cs._wrra_bwd_op._init_fn(x, list(win.shape), torch.float32, 7, 3, None)),
        ("bias_dropout_add (DropPath + residual)", lambda: ops.bias_dropout_add(x, x, None, scale, 0.0, None),
         lambda: co._bda_op._init_fn(x, x, None, scale, 0.0, None)),
        ("bias_dropout_add_backward", lambda: ops.bias_dropout_add_backward(x, torch.float32, scale, 0.0, None),
         lambda: co._bda_bwd_op._init_fn(x, torch.float32, scale, 0.0, None)),
    ]


def main() -> None:
    _stub_launches()
    total_op = total_body = 0.0
    print(f"{'op':40} {'custom op µs':>13} {'body µs':>9} {'dispatch µs':>12}")
    with torch.no_grad():
        for name, via_op, body in _cases():
            t_op, t_body = per_call_us(via_op, 300, 30), per_call_us(body, 300, 30)
            total_op, total_body = total_op + t_op, total_body + t_body
            print(f"{name:40} {t_op:13.1f} {t_body:9.1f} {t_op - t_body:12.1f}")
    print(f"per block (these 8 ops): {total_op:.0f} µs through custom ops, {total_body:.0f} µs in the bodies; "
          f"x{SWIN_T_BLOCKS} blocks = {total_op * SWIN_T_BLOCKS / 1e3:.1f} ms per Swin-T step on this host")


if __name__ == "__main__":
    main()
