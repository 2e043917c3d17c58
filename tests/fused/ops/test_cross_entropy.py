"""Fused cross-entropy against torch.nn.functional.cross_entropy in float64, in Triton's interpreter
on the CPU (conftest sets TRITON_INTERPRET=1): loss and dlogits across fp32/fp16/bf16, chunked
vocabularies, ignore_index, label smoothing, leading dimensions, the module and its refusals."""

from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import torch.nn.functional as F  # noqa: E402

from gpudiag.fused.ops import cross_entropy as ce  # noqa: E402

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}  # as tests/fused/test_fused_registry.py
KERNEL = ce.KERNELS[0]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def check(logits, target, dtype, tol=None, grad_scale=1.0, **options):
    """Loss and dlogits of the fused op vs eager in float64 on the same values; returns the grad."""
    tol = tol or TOLERANCE[dtype]
    x = logits.detach().to(dtype).requires_grad_(True)  # a fresh leaf (strides kept)
    x64 = x.detach().double().requires_grad_(True)
    loss, want = ce.cross_entropy(x, target, **options), F.cross_entropy(
        x64.reshape(-1, x64.shape[-1]), target.reshape(-1), **options)
    assert loss.dtype == dtype and loss.shape == ()
    assert rel(loss, want) < tol, (loss.item(), want.item())
    (loss * grad_scale).backward()
    (want * grad_scale).backward()
    assert x.grad.dtype == dtype and x.grad.shape == x.shape
    # A gradient that is ~0 by the math (vocabulary of one) is compared against the grad scale.
    err = (x.grad.double() - x64.grad).norm().item() / max(x64.grad.norm().item(), 1e-2 * abs(grad_scale))
    assert err < 2 * tol
    return x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", KERNEL.test_shapes)
def test_loss_and_gradient_match_torch(dtype, shape):
    gen = torch.Generator().manual_seed(zlib.crc32(f"ce{dtype}{shape}".encode()))
    logits, target = KERNEL.make_inputs(shape, dtype, "cpu", gen)
    assert logits.dtype == dtype and target.dtype == torch.int64 and target.shape == (shape[0],)
    assert (target == -100).any() == (shape[0] > 2)  # the maker pads a few rows when there are enough
    check(logits, target, dtype, grad_scale=torch.randn((), generator=gen).item())
    check(logits, target, dtype, label_smoothing=0.1)


@pytest.mark.parametrize("shape", [(37, 130), (3, 1000), (2, 4097)])
def test_many_chunks_and_large_logits(monkeypatch, shape):
    """Chunks of 32 (many, the last partial) and logits spread over ±60: the online max/rescaled sum
    must give the same lse as one pass, wherever the row's maximum falls."""
    monkeypatch.setattr(ce, "_MAX_BLOCK", 32)
    gen = torch.Generator().manual_seed(3)
    logits = 20 * torch.randn(shape, generator=gen) + 50
    target = torch.randint(0, shape[1], (shape[0],), generator=gen)
    check(logits, target, torch.float32, tol=2e-5)
    check(logits, target, torch.float32, tol=2e-5, label_smoothing=0.1)


def test_ignored_rows_have_zero_gradient_and_leave_the_mean():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(9, 50, generator=gen)
    target = torch.randint(0, 50, (9,), generator=gen)
    target[[1, 4, 8]] = -100
    grad = check(logits, target, torch.float32)
    assert (grad[[1, 4, 8]] == 0).all() and (grad[[0, 2, 3]] != 0).any(dim=1).all()
    valid = target != -100
    assert torch.allclose(ce.cross_entropy(logits, target), F.cross_entropy(logits[valid], target[valid]), rtol=1e-6)
    # a custom ignore_index (padding id 0), also with label smoothing (ignored rows add no smoothing term)
    target[[1, 2, 3, 4, 8]] = 0
    check(logits, target, torch.float32, ignore_index=0)
    check(logits, target, torch.bfloat16, ignore_index=0, label_smoothing=0.1)


def test_all_rows_ignored_gives_nan_like_torch():
    x = torch.randn(4, 10, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    target = torch.full((4,), -100)
    loss, want = ce.cross_entropy(x, target), F.cross_entropy(x_ref, target)
    assert torch.isnan(want) and torch.isnan(loss)  # mean over no rows: 0/0
    loss.backward()
    want.backward()
    assert torch.equal(x.grad, x_ref.grad) and (x.grad == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_leading_dimensions_and_strided_logits(dtype):
    gen = torch.Generator().manual_seed(11)
    target = torch.randint(0, 77, (2, 3), generator=gen)
    target[1, 2] = -100
    check(torch.randn(2, 3, 77, generator=gen), target, dtype, label_smoothing=0.1)  # [B, T, V] logits
    wide = torch.randn(6, 100, generator=gen).to(dtype)
    view = wide[:, :77]  # rows 100 apart: read in place through the row stride
    check(view, target.reshape(-1), dtype)
    check(torch.randn(77, generator=gen), torch.tensor(5), dtype)  # unbatched, as torch allows


def test_module_is_a_drop_in_for_cross_entropy_loss():
    gen = torch.Generator().manual_seed(13)
    logits = torch.randn(16, 300, generator=gen, requires_grad=True)
    target = torch.randint(0, 300, (16,), generator=gen)
    target[:3] = 7
    fused = ce.FusedCrossEntropyLoss(ignore_index=7, label_smoothing=0.1)
    eager = torch.nn.CrossEntropyLoss(ignore_index=7, label_smoothing=0.1)
    assert fused.state_dict() == {} == eager.state_dict()
    loss, want = fused(logits, target), eager(logits, target)
    assert rel(loss, want) < 1e-5
    assert rel(*torch.autograd.grad(loss, logits), *torch.autograd.grad(want, logits)) < 1e-5
    assert rel(ce.FusedCrossEntropyLoss()(logits, target), torch.nn.CrossEntropyLoss()(logits, target)) < 1e-5


def test_autocast_gives_an_fp32_loss_like_eager():
    """Under autocast eager cross_entropy runs in fp32 (a copy of the logits); the kernel reads the
    bf16 logits and returns the same fp32 loss, with a bf16 gradient."""
    gen = torch.Generator().manual_seed(17)
    logits = torch.randn(8, 64, generator=gen).bfloat16().requires_grad_(True)
    target = torch.randint(0, 64, (8,), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, want = ce.cross_entropy(logits, target), F.cross_entropy(logits, target)
    assert loss.dtype == want.dtype == torch.float32 and rel(loss, want) < 1e-5
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16


def test_refusals_name_the_fix():
    x, t = torch.randn(4, 10), torch.randint(0, 10, (4,))
    for reduction in ("sum", "none"):
        with pytest.raises(ValueError, match=rf"reduction='{reduction}'.*torch.nn.functional.cross_entropy"):
            ce.FusedCrossEntropyLoss(reduction=reduction)
        with pytest.raises(ValueError, match=rf"reduction='{reduction}'"):
            ce.cross_entropy(x, t, reduction=reduction)
    with pytest.raises(ValueError, match=r"class weights.*weight=\.\.\."):
        ce.FusedCrossEntropyLoss(weight=torch.ones(10))
    with pytest.raises(ValueError, match="class weights"):
        ce.cross_entropy(x, t, torch.ones(10))  # F.cross_entropy's third positional argument is weight
    with pytest.raises(ValueError, match="deprecated"):
        ce.FusedCrossEntropyLoss(size_average=False)
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\]"):
        ce.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="class indices of shape"):
        ce.cross_entropy(x, torch.softmax(x, -1))  # probability targets
    with pytest.raises(ValueError, match="class indices of shape"):
        ce.cross_entropy(torch.randn(2, 10, 3), torch.randint(0, 10, (2, 3)))  # torch's class-dim-1 layout


def test_registry_entry_and_reproducible_inputs():
    assert KERNEL.name == "cross_entropy" and KERNEL.fused is ce.cross_entropy and KERNEL.reference is ce.reference
    assert KERNEL.shape_doc == "TOKENS,VOCAB" and (8192, 50257) in KERNEL.bench_shapes
    a = KERNEL.make_inputs((37, 130), torch.bfloat16, "cpu", torch.Generator().manual_seed(1))
    b = KERNEL.make_inputs((37, 130), torch.bfloat16, "cpu", torch.Generator().manual_seed(1))
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert ((a[1] == -100) | ((a[1] >= 0) & (a[1] < 130))).all()
    assert KERNEL.reference(*a).dtype == torch.bfloat16  # the eager chain in the given dtype
