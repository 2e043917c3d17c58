"""The fused scale + bias + window-mask softmax (Swin attention scores) against timm's eager chain,
in Triton's interpreter on the CPU (conftest sets TRITON_INTERPRET=1): forward and backward in
fp32/fp16/bf16 against a float64 reference, N = 49 windows, wide rows, optional bias and mask,
the folded output cast, fully masked rows and shape errors."""

from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gpudiag.fused.ops import softmax  # noqa: E402
from gpudiag.fused.ops.softmax import reference, scaled_masked_softmax  # noqa: E402

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}  # as tests/fused/test_fused_registry.py
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
KERNEL = softmax.KERNELS[0]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def check(inputs, dtype, fused, ref, gen):
    """Forward and backward of ``fused`` against ``ref`` on float64 copies; every float input that
    is not None gets a gradient, compared against ‖want‖ (or 1e-2·‖dy‖ where that is ~0)."""
    got_in = [None if t is None else t.clone().requires_grad_(True) for t in inputs]
    ref_in = [None if t is None else t.clone().double().requires_grad_(True) for t in inputs]
    y, want = fused(*got_in), ref(*ref_in)
    assert y.dtype == dtype and y.shape == want.shape
    assert torch.isfinite(y).all()  # every element written (the output is torch.empty)
    assert rel(y, want) < TOLERANCE[dtype]
    dy = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    y.backward(dy.to(dtype))
    want.backward(dy)
    for got, exp in zip(got_in, ref_in):
        if got is None:
            continue
        assert got.grad is not None and got.grad.dtype == got.dtype and got.grad.shape == got.shape
        scale = max(exp.grad.norm().item(), 1e-2 * dy.norm().item())
        assert (got.grad.double() - exp.grad).norm().item() / scale < 2 * TOLERANCE[dtype]


def gen_for(*key):
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", KERNEL.test_shapes)
def test_registry_entry_forward_and_backward(shape, dtype):
    """What tests/fused/test_fused_registry.py runs for every registered kernel: all of scores, bias, mask differentiable."""
    gen = gen_for(shape, dtype)
    check(KERNEL.make_inputs(shape, dtype, "cpu", gen), dtype, KERNEL.fused, KERNEL.reference, gen)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("use_bias,use_mask,scale", [(False, True, 0.3), (True, False, 1.0), (False, False, 2.0)])
@pytest.mark.parametrize("shape", [(8, 3, 49, 4), (7, 1, 49, 1)])  # the second: a short last chunk of items
def test_without_bias_or_mask(shape, use_bias, use_mask, scale, dtype):
    gen = gen_for(shape, use_bias, use_mask, dtype)
    s, bias, mask = KERNEL.make_inputs(shape, dtype, "cpu", gen)
    inputs = (s, bias if use_bias else None, mask if use_mask else None)
    check(inputs, dtype, lambda *a: scaled_masked_softmax(*a, scale=scale), lambda *a: reference(*a, scale=scale), gen)


def test_wide_rows():
    """N = 1000 (square, no mask) in fp32, and 4097 columns (one past a power of two) on a few
    query rows with bias and a 2-window mask in bf16."""
    gen = gen_for("wide")
    s, bias, _ = KERNEL.make_inputs((2, 1, 1000), torch.float32, "cpu", gen)
    check((s, bias, None), torch.float32, KERNEL.fused, KERNEL.reference, gen)
    s = torch.randn(4, 2, 3, 4097, generator=gen).bfloat16()
    bias = torch.randn(2, 3, 4097, generator=gen)
    mask = torch.where(torch.rand(2, 3, 4097, generator=gen) < 0.5, -100.0, 0.0)
    check((s, bias, mask), torch.bfloat16, KERNEL.fused, KERNEL.reference, gen)


def test_out_dtype_folds_the_cast():
    """bf16 scores with fp32 bias and mask (timm under autocast): out_dtype=fp32 gives the fp32
    softmax itself (no bf16 rounding), the default gives bf16 = the eager chain's final cast; the
    gradient of the scores comes back in the scores' dtype."""
    gen = gen_for("out_dtype")
    s, bias, mask = KERNEL.make_inputs((4, 3, 49, 2), torch.bfloat16, "cpu", gen)
    exact = reference(s.double(), bias.double(), mask.double(), scale=0.5)
    s = s.requires_grad_(True)
    y32 = scaled_masked_softmax(s, bias, mask, scale=0.5, out_dtype=torch.float32)
    assert y32.dtype == torch.float32 and rel(y32, exact) < 1e-6
    y16 = scaled_masked_softmax(s, bias, mask, scale=0.5)
    assert y16.dtype == torch.bfloat16
    assert (y16.float() - reference(s.detach(), bias, mask, scale=0.5).float()).abs().max() <= 2 ** -8
    y32.sum().backward()
    assert s.grad.dtype == torch.bfloat16 and s.grad.abs().max() < 1e-2  # rows sum to 1: d(sum)/ds ~ 0
    y = scaled_masked_softmax(torch.randn(2, 1, 5, 5, generator=gen), out_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16


def test_gpu_tiling_and_strided_inputs(monkeypatch):
    """The GPU's small tiles (4 rows of 64: H·N = 147 rows padded to 148, one item per program) in
    the interpreter, on a transposed view of the scores and a strided bias."""
    monkeypatch.setattr(softmax, "INTERPRETER_TILE", 256)
    monkeypatch.setitem(softmax.CONFIG["fwd"], "per_sm", 10**6)
    gen = gen_for("gpu tiling")
    assert softmax._plan((4, 3, 49, 49), 2, torch.device("cpu"), "fwd")[:4] == (4, 64, 1, 37)
    s, bias, mask = KERNEL.make_inputs((4, 3, 49, 2), torch.float32, "cpu", gen)
    check((s, bias, mask), torch.float32, KERNEL.fused, KERNEL.reference, gen)
    s_t = s.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, column-major storage
    bias_strided = torch.stack([bias, bias], -1)[..., 0]
    assert not s_t.is_contiguous() and not bias_strided.is_contiguous()
    assert rel(KERNEL.fused(s_t, bias_strided, mask), KERNEL.reference(s.double(), bias.double(), mask.double())) < 1e-5


def test_mask_as_a_buffer_gets_no_gradient():
    """Swin's attn_mask is a buffer: only scores and the bias table are differentiated."""
    gen = gen_for("buffer")
    s, bias, mask = KERNEL.make_inputs((4, 2, 49, 2), torch.float32, "cpu", gen)
    s, bias = s.requires_grad_(True), bias.requires_grad_(True)
    KERNEL.fused(s, bias, mask).sum().backward()
    assert mask.grad is None and s.grad is not None and bias.grad is not None
    b_only = bias.detach().clone().requires_grad_(True)  # the scores constant: the bias gradient alone
    s2, b2 = s.detach().double(), bias.detach().double().requires_grad_(True)
    dy = torch.randn(4, 2, 49, 49, generator=gen)
    KERNEL.fused(s.detach(), b_only, mask).backward(dy)
    KERNEL.reference(s2, b2, mask.double()).backward(dy.double())
    assert rel(b_only.grad, b2.grad) < 1e-5


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's numpy on -inf - -inf
def test_fully_masked_rows_follow_torch():
    """A row masked with -100 everywhere (Swin's value) is still a softmax of the scores; a row of
    -inf is NaN, as torch.softmax gives."""
    gen = gen_for("masked")
    s = torch.randn(2, 1, 4, 4, generator=gen)
    mask = torch.zeros(1, 4, 4)
    mask[0, 1] = -100.0
    mask[0, 2] = float("-inf")
    y, want = scaled_masked_softmax(s, mask=mask), reference(s, mask=mask)
    torch.testing.assert_close(y, want, equal_nan=True)
    assert torch.isnan(y[:, :, 2]).all() and torch.isfinite(y[:, :, [0, 1, 3]]).all()


def test_shape_errors_name_the_shapes():
    s = torch.randn(6, 3, 49, 49)
    with pytest.raises(ValueError, match=r"bias of shape \(2, 49, 49\) does not match scores \(6, 3, 49, 49\)"):
        scaled_masked_softmax(s, torch.zeros(2, 49, 49))
    with pytest.raises(ValueError, match=r"mask of shape \(4, 49, 49\) .*B_ = 6 a multiple of nW"):
        scaled_masked_softmax(s, mask=torch.zeros(4, 49, 49))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 49, 48\)"):
        scaled_masked_softmax(s, mask=torch.zeros(3, 49, 48))
    with pytest.raises(ValueError, match=r"got shape \(18, 49, 49\)"):
        scaled_masked_softmax(s.view(18, 49, 49))
    with pytest.raises(ValueError, match="floating dtype"):
        scaled_masked_softmax(s, out_dtype=torch.int32)


def test_registry_shapes_and_inputs():
    assert KERNEL.name == "softmax_bias_mask"
    assert KERNEL.from_activation([2048, 3, 49, 49]) == (2048, 3, 49, 1)
    with pytest.raises(ValueError, match="attention scores"):
        KERNEL.from_activation([2048, 49, 96])
    s, bias, mask = KERNEL.make_inputs((8, 3, 49, 4), torch.bfloat16, "cpu", torch.Generator().manual_seed(0))
    assert s.shape == (8, 3, 49, 49) and s.dtype == torch.bfloat16
    assert bias.shape == (3, 49, 49) and bias.dtype == mask.dtype == torch.float32  # as timm under autocast
    assert mask.shape == (4, 49, 49) and set(mask.unique().tolist()) <= {0.0, -100.0}
    assert (mask.diagonal(dim1=1, dim2=2) == 0).all() and (mask == -100).any()  # a token always sees itself
    assert all(b % nw == 0 for b, _, _, nw in KERNEL.bench_shapes)
