"""Reference fused kernels against their PyTorch chains, in Triton's interpreter on the CPU
(conftest sets TRITON_INTERPRET=1): forward and backward, fp32/fp16/bf16, odd widths."""

from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gpudiag.kernels.registry import kernels  # noqa: E402

# Relative error bounds by dtype (METHOD.md: fp32 far under 1e-3, bf16 operands 1e-3..1e-2).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
SHAPES = [(7, 49), (3, 1000), (2, 4097), (1, 1)]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def outputs(value):
    return list(value) if isinstance(value, tuple) else [value]


@pytest.mark.parametrize("name", ["bias_gelu", "rms_norm", "swiglu", "geglu", "add_layer_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_matches_reference_forward_and_backward(name, dtype, shape):
    kernel = kernels()[name]
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}{dtype}{shape}".encode()))  # fresh inputs per case, reproducible
    inputs = kernel.make_inputs(*shape, dtype, "cpu", gen)
    fused_in = [t.clone().requires_grad_(True) for t in inputs]
    ref_in = [t.clone().double().requires_grad_(True) for t in inputs]  # reference in float64
    ys = outputs(kernel.fused(*fused_in))
    refs = outputs(kernel.reference(*ref_in))
    for y, ref in zip(ys, refs):
        assert y.dtype == dtype and y.shape == ref.shape
        assert torch.isfinite(y).all()  # every element written (torch.empty outputs are not zeroed)
        assert rel(y, ref) < TOLERANCE[dtype]
    dys = [torch.randn(ref.shape, generator=gen, dtype=torch.float64) for ref in refs]
    dy = dys[0]
    torch.autograd.backward(ys, [d.to(dtype) for d in dys])
    torch.autograd.backward(refs, dys)
    if shape[1] == 1 and name in ("rms_norm", "add_layer_norm"):
        return  # normalizing one element: the input gradient is ~0 and only rounding noise is left
    for got, want in zip(fused_in, ref_in):
        # A gradient that is ~0 by the math is compared against ‖dy‖ rather than itself.
        scale = max(want.grad.norm().item(), 1e-2 * dy.norm().item())
        assert (got.grad.double() - want.grad).norm().item() / scale < 2 * TOLERANCE[dtype]


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
    from gpudiag.analysis.fusion import REFERENCE_PATTERNS

    assert {name for name, _ in REFERENCE_PATTERNS} == set(kernels())


def test_kernels_cli_without_a_gpu():
    from click.testing import CliRunner

    from gpudiag.cli.main import cli

    listed = CliRunner().invoke(cli, ["kernels", "list"])
    assert listed.exit_code == 0 and "rms_norm" in listed.output and "bias_gelu" in listed.output
    unknown = CliRunner().invoke(cli, ["kernels", "bench", "nope"])
    assert unknown.exit_code == 2 and "no reference kernel 'nope'" in unknown.output
    no_gpu = CliRunner().invoke(cli, ["kernels", "bench", "rms_norm"])
    assert no_gpu.exit_code == 2 and "needs a CUDA GPU" in no_gpu.output
