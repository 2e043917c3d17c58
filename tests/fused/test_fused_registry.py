"""Reference fused kernels against their PyTorch chains, in Triton's interpreter on the CPU
(conftest sets TRITON_INTERPRET=1): forward and backward, fp32/fp16/bf16, odd widths."""

from __future__ import annotations

import os
import zlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gpudiag.fused.registry import kernels  # noqa: E402

# Relative error bounds by dtype (METHOD.md: fp32 far under 1e-3, bf16 operands 1e-3..1e-2).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
# On a GPU machine, GPUDIAG_TEST_DEVICE=cuda TRITON_INTERPRET=0 runs the same cases compiled.
DEVICE = os.environ.get("GPUDIAG_TEST_DEVICE", "cpu")
CASES = [(name, shape) for name, kernel in kernels().items() for shape in kernel.test_shapes]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def outputs(value):
    return list(value) if isinstance(value, tuple) else [value]


@pytest.mark.parametrize("name,shape", CASES, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_matches_reference_forward_and_backward(name, dtype, shape):
    kernel = kernels()[name]
    reference = kernel.exact_reference or kernel.reference
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}{dtype}{shape}".encode()))  # fresh inputs per case, reproducible
    inputs = kernel.make_inputs(shape, dtype, DEVICE, gen)
    # float inputs take gradients (the reference runs in float64); integer ones (labels) pass as they are
    fused_in = [t.clone().requires_grad_(True) if t.is_floating_point() else t for t in inputs]
    ref_in = [t.clone().double().requires_grad_(True) if t.is_floating_point() else t for t in inputs]
    ys = outputs(kernel.fused(*fused_in))
    refs = outputs(reference(*ref_in))
    for y, ref in zip(ys, refs):
        assert y.dtype == dtype and y.shape == ref.shape
        assert torch.isfinite(y).all()  # every element written (torch.empty outputs are not zeroed)
        assert rel(y, ref) < TOLERANCE[dtype]
    dys = [torch.randn(ref.shape, generator=gen, dtype=torch.float64).to(DEVICE) for ref in refs]
    dy = dys[0]
    torch.autograd.backward(ys, [d.to(y.dtype) for d, y in zip(dys, ys)])
    torch.autograd.backward(refs, dys)
    # RMSNorm of one element: y = w·x/√(x² + eps), so dx = dy·w·eps/(x² + eps)^1.5 ≈ 0, which the kernel
    # gets as r·g·(1 − x²r²): a cancellation that leaves fp32 rounding noise of ~1e-7·|dy|. That
    # gradient is judged against ‖dy‖ (a kernel that dropped the projection would be off by ~‖dy‖).
    # The weight gradient, and add_layer_norm's (whose x and residual gradients are the exact
    # residual-path gradient: the normalised part is 0), are checked as every other case.
    vanishing = {0} if (name == "rms_norm" and shape[-1] == 1) else set()
    checked = 0
    for i, (got, want) in enumerate(zip(fused_in, ref_in)):
        if not want.is_floating_point():
            continue  # integer inputs (labels) have no gradient
        assert want.grad is not None and got.grad is not None, f"input {i} got no gradient"
        assert got.grad.dtype == got.dtype and got.grad.shape == got.shape
        # A gradient that is ~0 by the math is compared against ‖dy‖ rather than itself.
        floor = 1.0 if i in vanishing else 1e-2
        scale = max(want.grad.norm().item(), floor * dy.norm().item())
        assert (got.grad.double() - want.grad).norm().item() / scale < 2 * TOLERANCE[dtype], f"input {i}"
        checked += 1
    assert checked >= 1  # every case compares at least one gradient


def test_leading_dimensions_and_errors():
    kernel = kernels()["rms_norm"]
    x = torch.randn(2, 3, 49)
    w = torch.ones(49)
    assert rel(kernel.fused(x, w), kernel.reference(x.double(), w.double())) < 1e-5
    with pytest.raises(ValueError, match="does not match the last dimension"):
        kernel.fused(x, torch.ones(48))
    with pytest.raises(ValueError, match="does not match the last dimension"):
        kernels()["bias_gelu"].fused(x, torch.ones(48))


def test_every_reference_pattern_has_a_kernel():
    from gpudiag.analysis.fusion.dataflow import REFERENCE_PATTERNS

    assert {name for name, _ in REFERENCE_PATTERNS} == set(kernels())


def test_kernels_cli_without_a_gpu(monkeypatch):
    from click.testing import CliRunner

    from gpudiag.cli.main import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    listed = CliRunner().invoke(cli, ["kernels", "list"])
    assert listed.exit_code == 0 and "rms_norm" in listed.output and "bias_gelu" in listed.output
    unknown = CliRunner().invoke(cli, ["kernels", "bench", "nope"])
    assert unknown.exit_code == 2 and "no reference kernel 'nope'" in unknown.output
    no_gpu = CliRunner().invoke(cli, ["kernels", "bench", "rms_norm"])
    assert no_gpu.exit_code == 2 and "needs a CUDA GPU" in no_gpu.output
    listed_shapes = CliRunner().invoke(cli, ["kernels", "list"]).output
    assert "ln_roll_window_partition" in listed_shapes and "BATCH,H,W,C" in listed_shapes
    wrong = CliRunner().invoke(cli, ["kernels", "bench", "ln_roll_window_partition", "--shape", "32768,1024"])
    assert wrong.exit_code == 2 and "takes BATCH,H,W,C, e.g. --shape 32,56,56,96" in wrong.output
    optional = CliRunner().invoke(cli, ["kernels", "bench", "softmax_bias_mask", "--shape", "2048,3,49"])
    assert optional.exit_code == 2 and "needs a CUDA GPU" in optional.output  # [,NW] may be left out


def test_non_contiguous_inputs_and_mixed_dtypes():
    """Views (a strided bias, a transposed activation) give the same results as contiguous copies;
    mixed dtypes are refused rather than silently rounded."""
    from gpudiag.fused.ops import add_layer_norm, bias_gelu

    gen = torch.Generator().manual_seed(7)
    x = torch.randn(64, 33, generator=gen).t()  # (33, 64), transposed
    big = torch.randn(128, generator=gen)
    b = big[::2]  # (64,), stride 2
    xs, bs = x.clone().requires_grad_(True), b.clone().requires_grad_(True)
    xc, bc = x.contiguous().double().requires_grad_(True), b.contiguous().double().requires_grad_(True)
    y = bias_gelu.bias_gelu(xs, bs)
    ref = bias_gelu.reference(xc, bc)
    assert rel(y, ref) < 1e-5
    dy = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    y.backward(dy.float())
    ref.backward(dy)
    assert rel(xs.grad, xc.grad) < 1e-5 and rel(bs.grad, bc.grad) < 1e-5
    w_big = torch.randn(128, generator=gen)
    xr, rr = torch.randn(9, 64, generator=gen), torch.randn(9, 64, generator=gen)
    args = [t.clone().requires_grad_(True) for t in (xr, rr, w_big[::2], b)]
    ref_args = [t.contiguous().double().requires_grad_(True) for t in (xr, rr, w_big[::2], b)]
    outs, refs = add_layer_norm.add_layer_norm(*args), add_layer_norm.reference(*ref_args)
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    torch.autograd.backward(refs, [torch.ones_like(o) for o in refs])
    for got, want in zip(args, ref_args):
        assert rel(got.grad, want.grad) < 1e-5
    with pytest.raises(ValueError, match="one dtype"):
        add_layer_norm.add_layer_norm(xr.bfloat16(), rr, torch.ones(64), torch.zeros(64))
    with pytest.raises(ValueError, match="one dtype"):
        kernels()["rms_norm"].fused(xr.bfloat16(), torch.ones(64))


def test_swin_window_kernels_drop_path_dtypes_and_errors():
    """The window kernels with DropPath's per-sample scale, a bf16 branch added to an fp32 residual
    (autocast: the result is fp32, as eager promotes), the autocast cast folded into the partition,
    and one-line errors for grids that are not whole windows."""
    from gpudiag.fused.ops import swin_window as sw

    gen = torch.Generator().manual_seed(3)
    B, H, W, C = 3, 14, 21, 12
    windows = torch.randn(B * H * W // 49, 49, C, generator=gen).bfloat16()
    residual = torch.randn(B, H, W, C, generator=gen)
    scale = torch.tensor([0.0, 1.25, 1.25])  # sample 0 dropped
    w_in, r_in = windows.clone().requires_grad_(True), residual.clone().requires_grad_(True)
    out = sw.window_reverse_roll_add(w_in, r_in, 7, 3, scale)
    ref_w, ref_r = windows.double().requires_grad_(True), residual.double().requires_grad_(True)
    ref = sw.reference_reverse(ref_w, ref_r, 7, 3, scale.double())
    assert out.dtype == torch.float32 and rel(out, ref) < 1e-6
    assert torch.equal(out[0], residual[0])  # the dropped sample is the residual alone
    dout = torch.randn(out.shape, generator=gen)
    out.backward(dout)
    ref.backward(dout.double())
    assert w_in.grad.dtype == torch.bfloat16 and rel(w_in.grad, ref_w.grad) < 1e-2
    assert torch.equal(r_in.grad, dout)  # the residual's gradient passes through
    x = torch.randn(2, 14, 14, 8, generator=gen)
    w, b = torch.randn(8, generator=gen), torch.randn(8, generator=gen)
    y = sw.ln_roll_partition(x, w, b, 7, 3, out_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16 and y.shape == (8, 49, 8)
    assert rel(y, sw.reference(x.double(), w.double(), b.double(), 7, 3)) < 1e-2
    with pytest.raises(ValueError, match="multiples of the window 7"):
        sw.ln_roll_partition(torch.randn(1, 10, 14, 8), w, b, 7, 3)
    with pytest.raises(ValueError, match="do not match C=8"):
        sw.ln_roll_partition(x, torch.ones(9), b, 7, 3)
    with pytest.raises(ValueError, match="do not hold the tokens"):
        sw.window_reverse_roll_add(windows[:-1], residual, 7, 3)


def test_swin_bench_shapes_that_are_not_whole_windows_are_refused(monkeypatch):
    """`gpudiag kernels bench` on a Swin kernel with a grid that is not whole 7x7 windows: a
    one-line error naming the shape (the input maker refuses it before any kernel runs)."""
    from click.testing import CliRunner

    from gpudiag.cli.main import cli
    from gpudiag.fused import bench as bench_mod

    with pytest.raises(ValueError, match="multiples of the 7-token window"):
        kernels()["window_reverse_roll_add"].make_inputs((32, 10, 14, 96), torch.float32, "cpu", torch.Generator())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # bench() itself needs a GPU; its input maker runs first, on the CPU here
    monkeypatch.setattr(bench_mod.torch.cuda, "is_available", lambda: True)
    result = CliRunner().invoke(cli, ["kernels", "bench", "window_reverse_roll_add", "--shape", "32,10,14,96"])
    assert result.exit_code == 2 and "multiples of the 7-token window" in result.output
