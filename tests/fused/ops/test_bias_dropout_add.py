"""Fused bias + dropout + residual add (and DropPath) against eager PyTorch, in Triton's interpreter
on the CPU (conftest sets TRITON_INTERPRET=1): p = 0 exactness, the in-kernel Philox mask (same
seed -> same mask in forward and backward, kept fraction, seeds differ), timm's DropPath formula,
mixed dtypes and errors."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gpudiag.fused.ops import bias_dropout_add as bda  # noqa: E402

TOLERANCE = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(7, 49), (3, 1000), (2, 4097), (1, 1), (100, 130)]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def make(shape, dtype, seed=0, bias=True):
    gen = torch.Generator().manual_seed(seed)
    x, r = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    b = torch.randn(shape[-1], generator=gen).to(dtype) if bias else None
    return x, r, b


def grads(fn, tensors, dy):
    """(output, gradients of every tensor) for fn(*tensors) with upstream gradient dy."""
    leaves = [t.clone().requires_grad_(True) if t is not None else None for t in tensors]
    y = fn(*leaves)
    y.backward(dy.to(y.dtype))
    return y, [t.grad if t is not None else None for t in leaves]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_p0_matches_eager(dtype, shape):
    x, r, b = make(shape, dtype, seed=shape[0] * 10007 + shape[1])
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y, (dx, dr, db) = grads(lambda x, r, b: bda.bias_dropout_add(x, r, b, p=0.0), (x, r, b), dy)
    ref, (rdx, rdr, rdb) = grads(bda.reference, (x.double(), r.double(), b.double()), dy)
    assert y.dtype == dtype and y.shape == x.shape
    assert rel(y, ref) < TOLERANCE[dtype]
    if dtype == torch.float32:
        # fp32: the kernel rounds x + b then adds r in fp32, exactly as eager does
        assert torch.equal(y, bda.reference(x, r, b))
    # p = 0: dx = dr = dy (rounded to the input dtype), db = Σ_rows dy
    assert dx.dtype == dr.dtype == db.dtype == dtype
    assert torch.equal(dx, dy.to(dtype)) and torch.equal(dr, dy.to(dtype))
    assert rel(db, rdb) < TOLERANCE[dtype]


def test_exact_reference_forward_backward_and_determinism():
    x, r, b = make((37, 130), torch.float32, seed=3)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    p, seed = 0.3, 987
    keep = bda.dropout_keep_mask(seed, x.shape, p, "cpu")
    assert keep.dtype == torch.bool and keep.shape == x.shape
    y, (dx, dr, db) = grads(lambda x, r, b: bda.bias_dropout_add(x, r, b, p=p, seed=seed), (x, r, b), dy)
    exact = lambda x, r, b: r + keep * (x + b) / (1 - p)  # noqa: E731
    ref, (rdx, rdr, rdb) = grads(exact, (x.double(), r.double(), b.double()), dy)
    assert rel(y, ref) < 1e-6
    assert rel(dx, rdx) < 1e-6 and rel(db, rdb) < 1e-6 and torch.equal(dr, dy.float())
    # the backward regenerated the forward's mask: dx is 0 exactly at dropped elements, where y == r
    assert torch.equal(dx == 0, ~keep) and torch.equal(y == r, ~keep)
    assert torch.equal(bda.bias_dropout_add(x, r, b, p=p, seed=seed), y.detach())  # same seed, same output
    # the mask depends on (seed, p, index) only, not on the dtype
    yh = bda.bias_dropout_add(x.half(), r.half(), b.half(), p=p, seed=seed)
    assert torch.equal(yh == r.half(), ~keep)


def test_seed_read_from_memory_draws_the_same_mask():
    """A seed given as a 0-d tensor (what draw_seed gives under CUDA graph capture: the kernel reads
    it when it runs, so each replay can draw anew) gives the mask of the same seed given as an int,
    forward and backward."""
    x, r, b = make((19, 70), torch.float32, seed=8)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    from_int, grads_int = grads(lambda x, r, b: bda.bias_dropout_add(x, r, b, p=0.4, seed=555), (x, r, b), dy)
    seed_t = torch.tensor(555, dtype=torch.int64)
    from_mem, grads_mem = grads(lambda x, r, b: bda.bias_dropout_add(x, r, b, p=0.4, seed=seed_t), (x, r, b), dy)
    assert torch.equal(from_mem, from_int) and all(torch.equal(a, c) for a, c in zip(grads_mem, grads_int))
    assert torch.equal(bda.bias_dropout_add_backward(dy.float(), torch.float32, 0.4, seed_t),
                       bda.bias_dropout_add_backward(dy.float(), torch.float32, 0.4, 555))
    # not capturing a CUDA graph (and on the CPU): the seed is an int from torch's CPU generator
    assert isinstance(bda.draw_seed(x), int)


def test_kept_fraction_seeds_and_block_size(monkeypatch):
    p, n = 0.1, 1 << 18
    keep = bda.dropout_keep_mask(42, (n,), p, "cpu")
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(keep.float().mean().item() - (1 - p)) < 5 * sigma
    other = bda.dropout_keep_mask(43, (n,), p, "cpu")
    assert (keep != other).float().mean().item() > 0.1  # independent masks differ at ~2p(1-p) = 18%
    # rows of a 2-D tensor are not copies of each other (the counter is the flat element index)
    rows = bda.dropout_keep_mask(42, (64, 1024), p, "cpu")
    assert not (rows == rows[0]).all(dim=1)[1:].any()
    assert torch.equal(rows.flatten(), keep[: 64 * 1024])
    # the mask does not depend on the block size (element e uses Philox counter e // 4, output e % 4)
    monkeypatch.setattr(bda, "BLOCK", 256)
    assert torch.equal(bda.dropout_keep_mask(42, (64, 1024), p, "cpu"), rows)
    x, r, b = make((3, 1000), torch.float32)
    y256 = bda.bias_dropout_add(x, r, b, p=p, seed=42)
    monkeypatch.undo()
    assert torch.equal(bda.bias_dropout_add(x, r, b, p=p, seed=42), y256)
    # seed None draws from torch's generator: torch.manual_seed makes runs reproducible
    x, r, _ = make((16, 64), torch.float32)
    torch.manual_seed(0)
    a = bda.bias_dropout_add(x, r, p=0.5)
    torch.manual_seed(0)
    assert torch.equal(a, bda.bias_dropout_add(x, r, p=0.5))
    assert not torch.equal(a, bda.bias_dropout_add(x, r, p=0.5))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # numpy's inf * 0 in the interpreter
def test_p_one_non_finite_and_eval_mode():
    x, r, b = make((5, 33), torch.float32)
    y, (dx, dr, db) = grads(lambda x, r, b: bda.bias_dropout_add(x, r, b, p=1.0, seed=1), (x, r, b), torch.ones(5, 33))
    assert torch.equal(y, r) and torch.equal(dx, torch.zeros_like(x)) and torch.equal(db, torch.zeros_like(b))
    # a dropped inf gives NaN, as eager's multiply-by-mask does: overflow is not hidden by the mask
    x[0, :] = float("inf")
    for p in (1.0, 0.5):
        y = bda.bias_dropout_add(x, r, b, p=p, seed=1)
        eager = r + torch.nn.functional.dropout(x + b, p)
        assert y[0].isnan().any() and eager[0].isnan().any() and torch.isfinite(y[1:]).all()
    assert torch.equal(bda.bias_dropout_add(x, r, b, p=0.5, training=False), bda.reference(x, r, b))


def test_drop_path_matches_timm():
    """drop_path_add == residual + timm's drop_path(x), the bernoulli draws included (same generator)."""

    def timm_drop_path(x, drop_prob, scale_by_keep=True):  # timm.layers.drop.drop_path, training=True
        keep_prob = 1 - drop_prob
        random_tensor = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep_prob)
        if keep_prob > 0.0 and scale_by_keep:
            random_tensor.div_(keep_prob)
        return x * random_tensor

    for dtype, tol in ((torch.float32, 0.0), (torch.bfloat16, 8e-3)):
        x, r, _ = make((32, 7, 7, 12), dtype, seed=5)
        r = r.float()  # Swin under autocast: bf16 branch + fp32 residual -> fp32
        dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(6))
        torch.manual_seed(11)
        y, (dx, dr) = grads(lambda x, r: bda.drop_path_add(x, r, 0.25), (x, r), dy)
        torch.manual_seed(11)
        ref, (rdx, rdr) = grads(lambda x, r: r + timm_drop_path(x, 0.25), (x, r), dy)
        assert y.dtype == torch.float32 and dx.dtype == dtype and dr.dtype == torch.float32
        assert rel(y, ref) <= tol and rel(dx, rdx) <= tol and torch.equal(dr, rdr)
        dropped = (y == r).flatten(1).all(1)
        assert 0 < dropped.sum() < 32 and torch.equal((dx == 0).flatten(1).all(1), dropped)  # whole samples
    x, r, _ = make((4, 8), torch.float32)
    assert torch.equal(bda.drop_path_add(x, r, 0.5, training=False), r + x)


def test_sample_scale_with_bias_and_dropout():
    x, r, b = make((6, 5, 40), torch.float32, seed=8)
    s = torch.tensor([0.0, 2.0, 1.0, 0.0, 4.0, 1.25])
    keep = bda.dropout_keep_mask(3, x.shape, 0.2, "cpu")
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    fused = lambda x, r, b: bda.bias_dropout_add(x, r, b, p=0.2, sample_scale=s, seed=3)  # noqa: E731
    exact = lambda x, r, b: r + keep * (x + b) / 0.8 * s.double()[:, None, None]  # noqa: E731
    y, gots = grads(fused, (x, r, b), dy)
    ref, wants = grads(exact, (x.double(), r.double(), b.double()), dy)
    assert rel(y, ref) < 1e-6 and all(rel(g, w) < 1e-6 for g, w in zip(gots, wants))


def test_mixed_dtypes_bf16_branch_fp32_residual():
    """Swin under autocast: float32[32,3136,96] + bfloat16[32,3136,96] -> float32 (smaller here)."""
    x, _, b = make((4, 49, 96), torch.bfloat16, seed=12)
    r = torch.randn(4, 49, 96, generator=torch.Generator().manual_seed(13))
    # dy representable in bf16: Triton's interpreter truncates fp32 -> bf16 (the GPU rounds to nearest)
    dy = torch.randn(r.shape, generator=torch.Generator().manual_seed(14)).bfloat16().float()
    y, (dx, dr) = grads(lambda x, r: bda.bias_dropout_add(x, r), (x, r), dy)
    ref, (rdx, rdr) = grads(lambda x, r: r + x, (x, r), dy)
    assert y.dtype == torch.float32 and torch.equal(y, ref)  # bf16 -> fp32 is exact: same sum as eager
    assert dx.dtype == torch.bfloat16 and torch.equal(dx, rdx) and torch.equal(dr, rdr)
    # an fp32 bias promotes a bf16 x + bf16 residual to fp32, as eager r + (x + b) does
    yb = bda.bias_dropout_add(x, x, b.float())
    assert yb.dtype == torch.float32 and rel(yb, x.double() + (x.double() + b.double())) < 1e-6


def test_non_contiguous_views_and_empty():
    gen = torch.Generator().manual_seed(15)
    x = torch.randn(64, 33, generator=gen).t()  # (33, 64), transposed
    r = torch.randn(33, 64, generator=gen)
    b = torch.randn(128, generator=gen)[::2]
    y = bda.bias_dropout_add(x, r, b, p=0.1, seed=2)
    assert torch.equal(y, bda.bias_dropout_add(x.contiguous(), r, b.contiguous(), p=0.1, seed=2))
    empty = torch.empty(0, 8)
    assert bda.bias_dropout_add(empty, empty, torch.ones(8), p=0.1, seed=1).shape == (0, 8)


def test_gradient_only_where_needed():
    x, r, b = make((9, 20), torch.float32)
    xs, rs = x.clone().requires_grad_(True), r.clone()
    bda.bias_dropout_add(xs, rs, b, p=0.5, seed=4).sum().backward()  # bias and residual need no gradient
    assert torch.equal(xs.grad, bda.dropout_keep_mask(4, x.shape, 0.5, "cpu") * 2.0)
    rs.requires_grad_(True)
    dy = torch.randn(9, 20)
    (dr,) = torch.autograd.grad(bda.bias_dropout_add(x, rs, b, p=0.5, seed=4), rs, dy)
    assert dr.data_ptr() == dy.data_ptr()  # dresidual is dy itself, no copy


def test_shape_errors():
    x = torch.randn(2, 3, 49)
    with pytest.raises(ValueError, match=r"x \(2, 3, 49\) and residual \(2, 3, 48\) must have one shape"):
        bda.bias_dropout_add(x, torch.randn(2, 3, 48))
    with pytest.raises(ValueError, match=r"x \(2, 3, 49\) and residual \(3, 49\)"):
        bda.bias_dropout_add(x, torch.randn(3, 49))  # no broadcasting
    with pytest.raises(ValueError, match=r"bias of shape \(48,\) does not match the last dimension of x \(2, 3, 49\)"):
        bda.bias_dropout_add(x, x, torch.ones(48))
    with pytest.raises(ValueError, match=r"sample_scale of shape \(3,\) must be \(B,\) for x of shape \(2, 3, 49\)"):
        bda.bias_dropout_add(x, x, sample_scale=torch.ones(3))
    with pytest.raises(ValueError, match="outside"):
        bda.bias_dropout_add(x, x, p=1.5)


def test_registry_entries():
    """The two KERNELS entries as the generic test uses them: fused vs exact_reference in float64,
    outputs and gradients."""
    by_name = {k.name: k for k in bda.KERNELS}
    assert set(by_name) == {"bias_residual_add", "bias_dropout_add"}
    assert by_name["bias_residual_add"].exact_reference is None
    for name, dtype, shape in (("bias_residual_add", torch.bfloat16, (37, 49)), ("bias_dropout_add", torch.float32, (3, 1000)),
                               ("bias_dropout_add", torch.bfloat16, (2, 4097))):
        kernel = by_name[name]
        inputs = kernel.make_inputs(shape, dtype, "cpu", torch.Generator().manual_seed(16))
        assert [t.shape for t in inputs] == [shape, shape, shape[1:]] and all(t.dtype == dtype for t in inputs)
        check = kernel.exact_reference or kernel.reference
        dy = torch.randn(shape, generator=torch.Generator().manual_seed(17), dtype=torch.float64)
        y, gots = grads(kernel.fused, inputs, dy)
        ref, wants = grads(check, [t.double() for t in inputs], dy)
        assert y.dtype == dtype and rel(y, ref) < TOLERANCE[dtype]
        assert all(g.dtype == dtype and rel(g, w) < 2 * TOLERANCE[dtype] for g, w in zip(gots, wants))
    # the eager dropout reference keeps about 1 - p and scales by 1/(1 - p)
    x, r, b = by_name["bias_dropout_add"].make_inputs((64, 512), torch.float32, "cpu", torch.Generator().manual_seed(18))
    kept = (by_name["bias_dropout_add"].reference(x, r, b) != r).float().mean().item()
    assert abs(kept - 0.9) < 0.01
