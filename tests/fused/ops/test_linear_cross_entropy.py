"""Fused linear + cross-entropy against F.cross_entropy(F.linear(x, W, b), y) in float64, in Triton's
interpreter on the CPU (conftest sets TRITON_INTERPRET=1): loss and the gradients of x, W and b
across fp32/fp16/bf16, chunk sizes, ignore_index, leading dimensions, autocast; and the memory
claim itself: no tensor of [tokens, vocab] is ever allocated, the largest is one chunk of logits."""

from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import torch.nn.functional as F  # noqa: E402
from hypothesis import given, strategies as st  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

from gpudiag.fused.ops import linear_cross_entropy as lce  # noqa: E402

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}  # as tests/fused/test_fused_registry.py
KERNEL = lce.KERNELS[0]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def check(x, weight, target, bias, dtype, grad_scale=1.0, **options):
    """Loss and gradients of the fused op vs eager in float64 on the same (rounded) values."""
    tol = TOLERANCE[dtype]
    ins = [None if t is None else t.detach().to(dtype).requires_grad_(True) for t in (x, weight, bias)]
    refs = [None if t is None else t.detach().double().requires_grad_(True) for t in ins]
    ignore = options.get("ignore_index", -100)
    loss = lce.linear_cross_entropy(ins[0], ins[1], target, ins[2], **options)
    want = F.cross_entropy(F.linear(refs[0], refs[1], refs[2]).flatten(0, -2), target.flatten(), ignore_index=ignore,
                           label_smoothing=options.get("label_smoothing", 0.0))
    assert loss.dtype == dtype and loss.shape == ()
    assert abs(loss.item() - want.item()) <= tol * abs(want.item()) + 1e-6
    (loss * grad_scale).backward()
    (want * grad_scale).backward()
    for i, (got, ref) in enumerate(zip(ins, refs)):
        if got is None:
            continue
        assert got.grad.dtype == dtype and got.grad.shape == got.shape
        assert rel(got.grad, ref.grad) < 2 * tol, f"input {i}"
    return ins


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("chunk_size", [1, 5, None, 1000])
def test_matches_torch_across_chunk_sizes(dtype, chunk_size):
    """Chunks of one token, a partial last chunk (37 = 7·5 + 2), the default, one chunk for all."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"lce{dtype}{chunk_size}".encode()))
    x, weight, target, bias = KERNEL.make_inputs((37, 24, 130), dtype, "cpu", gen)
    assert (target == -100).sum() == 4
    check(x, weight, target, bias, dtype, grad_scale=torch.randn((), generator=gen).item(), chunk_size=chunk_size)
    check(x, weight, target, None, dtype, chunk_size=chunk_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_leading_dimensions_ignore_index_and_label_smoothing(dtype):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, 5, 16, generator=gen)  # [B, T, H] hidden states, as a causal LM's head gets them
    weight = torch.randn(77, 16, generator=gen) / 4
    target = torch.randint(1, 77, (3, 5), generator=gen)
    target[0, :2] = 0
    check(x, weight, target, None, dtype, ignore_index=0, chunk_size=4)  # a padding id as ignore_index
    check(x, weight, target, torch.randn(77, generator=gen), dtype, label_smoothing=0.1, chunk_size=3)
    transposed = torch.randn(16, 5, 3, generator=gen).permute(2, 1, 0)  # a non-contiguous x
    check(transposed, weight, target, None, dtype, chunk_size=6)


def test_ignored_rows_and_all_ignored():
    gen = torch.Generator().manual_seed(5)
    x, weight = torch.randn(9, 8, generator=gen), torch.randn(50, 8, generator=gen)
    target = torch.randint(0, 50, (9,), generator=gen)
    target[[1, 4, 8]] = -100
    x_in = check(x, weight, target, None, torch.float32, chunk_size=2)[0]
    assert (x_in.grad[[1, 4, 8]] == 0).all() and (x_in.grad[[0, 2, 3]] != 0).any(dim=1).all()
    x_all = x.clone().requires_grad_(True)
    loss = lce.linear_cross_entropy(x_all, weight, torch.full((9,), -100), chunk_size=4)
    assert torch.isnan(loss) and torch.isnan(F.cross_entropy(x @ weight.T, torch.full((9,), -100)))  # 0/0, as eager
    loss.backward()
    assert (x_all.grad == 0).all()


class _Allocations(TorchDispatchMode):
    """Bytes of every tensor any aten op returns (allocations, views and the interpreter's copies)."""

    def __init__(self):
        super().__init__()
        self.sizes: list[tuple[str, tuple, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.sizes += [(str(func), tuple(t.shape), t.numel() * t.element_size())
                       for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out


def test_no_tensor_of_tokens_by_vocab_is_ever_made():
    """Forward and backward under a dispatch mode that sees every aten op's result: the largest is
    one chunk of logits (chunk × V), never [tokens, V]. Eager, under the same mode, makes several
    [tokens, V] tensors (logits, log_softmax, their gradients): the oracle that the mode sees them."""
    tokens, hidden, vocab, chunk = 64, 8, 96, 16
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(tokens, hidden, generator=gen, requires_grad=True)
    weight = torch.randn(vocab, hidden, generator=gen, requires_grad=True)
    bias = torch.randn(vocab, generator=gen, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,), generator=gen)
    with _Allocations() as fused:
        lce.linear_cross_entropy(x, weight, target, bias, chunk_size=chunk).backward()
    with _Allocations() as eager:
        F.cross_entropy(F.linear(x, weight, bias), target).backward()
    full = tokens * vocab * 4
    assert sum(s == (tokens, vocab) for _, s, _ in eager.sizes) >= 3 and max(b for *_, b in eager.sizes) >= full
    assert not any(s == (tokens, vocab) for _, s, _ in fused.sizes)
    assert max(b for *_, b in fused.sizes) == chunk * vocab * 4 < full  # one chunk of fp32 logits
    assert any(op.startswith("aten.addmm") and s == (vocab, hidden) for op, s, _ in fused.sizes)  # grad_W per chunk


@given(tokens=st.integers(1, 1 << 17), hidden=st.integers(1, 16384), vocab=st.integers(1, 1 << 18))
def test_default_chunk_keeps_the_logits_chunk_near_the_size_of_x(tokens, hidden, vocab):
    """Liger's default: chunk × V is at most about twice tokens × H (plus one row), a power of two."""
    chunk = lce.default_chunk_size(tokens, hidden, vocab)
    assert chunk >= 1 and chunk & (chunk - 1) == 0
    assert chunk * vocab <= 2 * (tokens * hidden + vocab)
    assert chunk < 2 * tokens


def test_default_chunk_at_the_llama_benchmark_shape():
    assert lce.default_chunk_size(8192, 1024, 32000) == 256  # 256 x 32000 logits vs 8192 x 1024 x
    assert KERNEL.bench_shapes[0] == (8192, 1024, 32000)


def test_without_gradients_and_a_second_backward():
    gen = torch.Generator().manual_seed(11)
    x, weight = torch.randn(12, 8, generator=gen), torch.randn(40, 8, generator=gen)
    target = torch.randint(0, 40, (12,), generator=gen)
    want = F.cross_entropy(x @ weight.T, target)
    with torch.no_grad():
        loss = lce.linear_cross_entropy(x.requires_grad_(True), weight, target, chunk_size=5)
    assert not loss.requires_grad and rel(loss, want) < 1e-6
    loss = lce.linear_cross_entropy(x, weight, target, chunk_size=5)
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    assert torch.allclose(x.grad, 2 * first)  # the saved gradients were not scaled in place


def test_autocast_casts_like_eager_and_returns_fp32():
    """fp32 x, weight and bias under bf16 autocast: eager's linear runs in bf16 and its cross_entropy
    in fp32; so does the fused op, with fp32 gradients for the fp32 leaves."""
    gen = torch.Generator().manual_seed(13)
    leaves = [torch.randn(10, 16, generator=gen), torch.randn(64, 16, generator=gen) / 4,
              torch.randn(64, generator=gen)]
    target = torch.randint(0, 64, (10,), generator=gen)
    ins = [t.clone().requires_grad_(True) for t in leaves]
    refs = [t.clone().requires_grad_(True) for t in leaves]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = lce.linear_cross_entropy(ins[0], ins[1], target, ins[2], chunk_size=3)
        want = F.cross_entropy(F.linear(*refs[:2], refs[2]), target)
    assert loss.dtype == want.dtype == torch.float32 and rel(loss, want) < 1e-3
    loss.backward()
    want.backward()
    for got, ref in zip(ins, refs):
        assert got.grad.dtype == torch.float32 and rel(got.grad, ref.grad) < 2e-2


def test_refusals_name_the_fix():
    x, weight, target = torch.randn(4, 8), torch.randn(10, 8), torch.randint(0, 10, (4,))
    with pytest.raises(ValueError, match=r"reduction='sum'.*F?\.?cross_entropy"):
        lce.linear_cross_entropy(x, weight, target, reduction="sum")
    with pytest.raises(ValueError, match=r"\[\.\.\., H\], \[V, H\]"):
        lce.linear_cross_entropy(x, weight.T, target)
    with pytest.raises(ValueError, match="bias"):
        lce.linear_cross_entropy(x, weight, target, torch.zeros(9))
    with pytest.raises(ValueError, match=r"class indices of shape \(4,\)"):
        lce.linear_cross_entropy(x, weight, target[:3])
    with pytest.raises(ValueError, match="one dtype.*autocast"):
        lce.linear_cross_entropy(x.bfloat16(), weight, target)
    with pytest.raises(ValueError, match="chunk_size must be a positive"):
        lce.linear_cross_entropy(x, weight, target, chunk_size=0)
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\]"):
        lce.linear_cross_entropy(x, weight, target, label_smoothing=2.0)
    with pytest.raises(ValueError, match="--shape TOKENS,HIDDEN,VOCAB"):
        KERNEL.from_activation([8, 1024, 1024])
