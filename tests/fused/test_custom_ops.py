"""gpudiag.fused.custom_ops and custom_ops_swin: every op passes torch.library.opcheck (schema,
autograd registration, fake tensors against the real kernel, AOT dispatch with dynamic shapes), the
backward ops too (with the arguments a real backward passes them), and a tiny model built from all
of them compiles with fullgraph=True and no graph break, calls the custom ops in the compiled graph,
and gives the eager loss and gradients. CPU tensors in Triton's interpreter (tests/conftest.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
nn = torch.nn

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from gpudiag.fused import custom_ops as co  # noqa: E402
from gpudiag.fused import custom_ops_swin as cs  # noqa: E402
from gpudiag.fused.ops.rope import hf_cos_sin  # noqa: E402


def _r(*shape, seed: int, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_(grad)


def _heads(batch, seq, heads, dim, seed):
    """q or k as HF makes them: a [B, S, H, D] projection viewed as [B, H, S, D] (strided)."""
    return _r(batch, seq, heads, dim, seed=seed, grad=False).transpose(1, 2).requires_grad_(True)


def _samples():
    """(op name, arguments) for every forward op: odd sizes, optional inputs present and absent."""
    cos, sin = hf_cos_sin(1, 5, 4, torch.float32, "cpu")
    targets = torch.tensor([1, 2, -100, 4, 0, 10, 3])
    region = torch.tensor([[0, 0, 1, 1, 2]])
    mask = (region[:, :, None] != region[:, None, :]).float() * -100.0  # Swin's kind of mask, [nW=1, 5, 5]
    return [
        ("rms_norm", (_r(3, 5, 8, seed=0), _r(8, seed=1), 1e-6)),
        ("glu", (_r(4, 6, seed=2), _r(4, 6, seed=3), 0)),
        ("glu", (_r(4, 6, seed=2), _r(4, 6, seed=3), 1)),
        ("bias_gelu", (_r(4, 6, seed=4), _r(6, seed=5))),
        ("add_layer_norm", (_r(3, 7, seed=6), _r(3, 7, seed=7), _r(7, seed=8), _r(7, seed=9), 1e-5)),
        ("bias_dropout_add", (_r(4, 6, seed=10), _r(4, 6, seed=11), _r(6, seed=12), None, 0.3, torch.tensor(123))),
        ("bias_dropout_add", (_r(4, 3, 2, seed=10), _r(4, 3, 2, seed=11), None, torch.rand(4), 0.0, None)),
        ("cross_entropy", (_r(7, 11, seed=13), targets, -100, 0.1)),
        ("rope", (_heads(2, 5, 3, 4, 14), _heads(2, 5, 1, 4, 15), cos, sin)),
        ("rope", (_heads(2, 5, 3, 4, 14), _heads(2, 5, 1, 4, 15), cos.clone().requires_grad_(),
                  sin.clone().requires_grad_())),
        ("linear_cross_entropy", (_r(7, 6, seed=16), _r(11, 6, seed=17), targets, _r(11, seed=18), -100, 0.0, 3,
                                  True, True, True)),
        ("linear_cross_entropy", (_r(7, 6, seed=16), _r(11, 6, seed=17), targets, None, -100, 0.1, None,
                                  True, False, False)),
        ("scaled_masked_softmax", (_r(4, 2, 5, 5, seed=19), _r(2, 5, 5, seed=20), mask, 0.5, None)),
        ("scaled_masked_softmax", (_r(4, 2, 5, 5, seed=19), None, None, 1.0, torch.float64)),
        ("ln_roll_partition", (_r(2, 14, 14, 5, seed=21), _r(5, seed=22), _r(5, seed=23), 7, 3, 1e-5, None)),
        ("window_reverse_roll_add", (_r(8, 49, 5, seed=24), _r(2, 14, 14, 5, seed=25), 7, 3, torch.rand(2))),
        ("window_reverse_roll_add", (_r(4, 49, 5, seed=24), _r(1, 14, 14, 5, seed=25), 7, 0, None)),
    ]


SAMPLES = _samples()


@pytest.mark.parametrize("name,args", SAMPLES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SAMPLES)])
def test_forward_op_passes_opcheck(name, args):
    results = torch.library.opcheck(getattr(torch.ops.gpudiag, name), args)
    assert set(results.values()) == {"SUCCESS"}, results


class _RecordGpudiagOps(TorchDispatchMode):
    """Records every torch.ops.gpudiag call (op, args) made while active."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "gpudiag":
            self.calls.append((func, args))
        return func(*args, **(kwargs or {}))


def test_backward_ops_pass_opcheck_with_the_arguments_autograd_gives_them():
    recorded = {}
    for name, args in SAMPLES:
        out = getattr(torch.ops.gpudiag, name)(*args)
        first = out[0] if isinstance(out, tuple) else out
        with _RecordGpudiagOps() as mode:
            first.sum().backward()
        for func, call_args in mode.calls:
            recorded.setdefault(func.name(), call_args)
    assert set(recorded) == {f"gpudiag::{n}_backward" for n, _ in SAMPLES if n != "linear_cross_entropy"}
    for name, call_args in recorded.items():
        plain = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in call_args)
        op = getattr(torch.ops.gpudiag, name.split("::")[1])
        results = torch.library.opcheck(op, plain, test_utils=("test_schema", "test_faketensor"))
        assert set(results.values()) == {"SUCCESS"}, (name, results)


class TinyModel(nn.Module):
    """Every fused function once: an attention-ish block (RMSNorm, RoPE with GQA, masked softmax,
    add + LayerNorm), gated and GELU MLPs, dropout + residual, both losses, and a Swin-style
    window branch (LayerNorm + roll + partition, reverse + roll + add, DropPath)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.rms_w = nn.Parameter(1 + 0.1 * torch.randn(8))
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(8, 8)
        self.rel_bias = nn.Parameter(torch.randn(2, 5, 5))
        self.register_buffer("mask", torch.triu(torch.full((1, 5, 5), -100.0), 1))
        self.ln_w, self.ln_b = nn.Parameter(1 + 0.1 * torch.randn(8)), nn.Parameter(0.1 * torch.randn(8))
        self.gate, self.up, self.down = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 8, bias=False)
        self.fc, self.fc_b = nn.Linear(8, 16, bias=False), nn.Parameter(0.1 * torch.randn(16))
        self.down_b = nn.Parameter(0.1 * torch.randn(8))
        self.head = nn.Linear(8, 11)
        self.win_ln_w, self.win_ln_b = nn.Parameter(1 + 0.1 * torch.randn(4)), nn.Parameter(0.1 * torch.randn(4))
        self.win = nn.Linear(4, 4)

    def forward(self, x, target, grid):
        b, s, _ = x.shape
        h = co.rms_norm(x, self.rms_w)
        cos, sin = hf_cos_sin(1, s, 4, x.dtype, x.device)
        q, k = co.rope(self.q(h).view(b, s, 2, 4).transpose(1, 2), self.k(h).view(b, s, 1, 4).transpose(1, 2), cos, sin)
        attn = cs.scaled_masked_softmax(q @ k.transpose(-1, -2), self.rel_bias, self.mask, scale=0.5)
        o = (attn @ self.v(h).view(b, s, 2, 4).transpose(1, 2)).transpose(1, 2).reshape(b, s, 8)
        y, res = co.add_layer_norm(o, x, self.ln_w, self.ln_b)
        m = co.swiglu(self.gate(y), self.up(y)) + co.geglu(self.gate(y), self.up(y))
        m = m + co.bias_gelu(self.fc(y), self.fc_b)
        out = co.bias_dropout_add(self.down(m), res, self.down_b, p=0.3, training=True)
        loss = co.linear_cross_entropy(out, self.head.weight, target, self.head.bias)
        loss = loss + co.cross_entropy(self.head(out), target, label_smoothing=0.1)
        windows = self.win(cs.ln_roll_partition(grid, self.win_ln_w, self.win_ln_b, 7, 3))
        g = cs.window_reverse_roll_add(windows, grid, 7, 3)
        g = co.drop_path_add(g, grid, 0.5, training=True)
        return loss + g.square().mean()


def _loss_and_grads(model, fn, inputs):
    model.zero_grad()
    torch.manual_seed(5)  # the same dropout seed and DropPath draws in every run
    loss = fn(*inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _inputs():
    gen = torch.Generator().manual_seed(3)
    target = torch.randint(0, 11, (2, 5), generator=gen)
    target[0, 1] = -100
    return torch.randn(2, 5, 8, generator=gen), target, torch.randn(2, 14, 14, 4, generator=gen)


def _assert_same(got, want, rtol=1e-5, atol=1e-6):
    torch.testing.assert_close(got[0], want[0], rtol=rtol, atol=atol)
    assert got[1].keys() == want[1].keys()
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], rtol=rtol, atol=atol, msg=name)


def test_eager_through_the_custom_ops_matches_the_autograd_functions(monkeypatch):
    model, inputs = TinyModel(), _inputs()
    want = _loss_and_grads(model, model, inputs)
    monkeypatch.setattr(co, "EAGER_USES_OPS", True)
    seen = set()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.name()) if func.namespace == "gpudiag" else None
            return func(*args, **(kwargs or {}))

    with Count():
        got = _loss_and_grads(model, model, inputs)
    assert len(seen) == 2 * 11 - 1  # 11 forward ops, 10 backward ops (linear + cross-entropy has none)
    _assert_same(got, want)


def test_tiny_model_compiles_fullgraph_with_the_ops_and_matches_eager():
    model, inputs = TinyModel(), _inputs()
    want = _loss_and_grads(model, model, inputs)
    graph_targets = set()

    def backend(gm, example_inputs):
        graph_targets.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    got = _loss_and_grads(model, compiled, inputs)
    assert not torch._dynamo.utils.counters["graph_break"]
    fused = {t.split(".")[1] for t in graph_targets if t.startswith("gpudiag.")}
    assert fused == {"rms_norm", "rope", "scaled_masked_softmax", "add_layer_norm", "glu", "bias_gelu",
                     "bias_dropout_add", "linear_cross_entropy", "cross_entropy", "ln_roll_partition",
                     "window_reverse_roll_add"}
    _assert_same(got, want)
