"""gpudiag.fused.timm_swin against real timm (1.0.29): a tiny SwinTransformer built on the CPU
(no pretrained weights, no network), patched vs unpatched copies with the same weights, in
Triton's interpreter (fp32). Loss, the input gradient and every parameter gradient are compared,
in train mode (DropPath active) and eval mode (DropPath the identity).

DropPath: the patched blocks draw timm's per-sample factor with torch (``bernoulli_`` on B values,
in the same order as timm's two DropPath calls per block), not with the kernels' Philox stream,
which only element-wise dropout uses and this patch does not touch. So with one seed both runs
draw the same factors and train mode is compared directly; the test also checks that the
reference run did drop whole samples (a DropPath that never fires would prove nothing).

torchvision: timm imports it at import time (``timm.layers`` for FrozenBatchNorm2d, ``timm.data``
for image transforms and datasets) but Swin's forward and backward never call it. PyPI's
torchvision for Linux x86-64 is a CUDA build that does not import next to the CPU torch build
(``operator torchvision::nms does not exist``), so where no working torchvision is installed the
``torchvision`` package is a placeholder for this module's tests only: every name imports, and
calling or instantiating any of them raises (a Swin path that used torchvision would fail here,
not pass). timm, pillow and timm's Swin code are the real packages. CI installs them with
``pip install --no-deps timm==1.0.29`` (timm's declared torchvision dependency left out) and
``pip install pillow==13.0.0``. Outside CI the module skips when timm is not installed; in CI
(``CI`` set) a missing timm is an error, so the check cannot silently drop out."""

from __future__ import annotations

import copy
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
nn = torch.nn

TIMM_VERSION = "1.0.29"  # the version pinned for CI (and gpudiag.fused.timm_swin's H200 check)


class _PlaceholderMeta(type):
    """A torchvision name: importable, its attributes are placeholders too (timm.data builds
    tables of InterpolationMode members at import time); calling it raises."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"{cls.__qualname__} was called, but torchvision is a test placeholder here")


def _placeholder(qualname: str) -> type:
    return _PlaceholderMeta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname})


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{self.__name__}.{name}")


class _TorchvisionPlaceholder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``torchvision`` and every ``torchvision.*`` submodule to a placeholder module."""

    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _PlaceholderModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []  # a package: submodules resolve through this finder as well


def _torchvision_imports() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
        return True
    except Exception:  # e.g. PyPI's CUDA build next to the CPU torch: RuntimeError at import
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        return False


@pytest.fixture(scope="module")
def swin():
    """timm.models.swin_transformer (real), imported with a torchvision placeholder where no
    working torchvision is installed; the placeholder and the timm modules imported through it
    are removed again after this module's tests."""
    if importlib.util.find_spec("timm") is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must install timm for this test: pip install --no-deps timm=={TIMM_VERSION} pillow")
        pytest.skip(f"timm not installed (pip install --no-deps timm=={TIMM_VERSION} pillow)")
    before = set(sys.modules)
    finder = None
    if not _torchvision_imports():
        finder = _TorchvisionPlaceholder()
        sys.meta_path.insert(0, finder)
    try:
        import timm.models.swin_transformer as swin_transformer

        yield swin_transformer
    finally:
        if finder is not None:
            sys.meta_path.remove(finder)
            for name in set(sys.modules) - before:
                if name.split(".")[0] in ("timm", "torchvision"):
                    del sys.modules[name]


def _tiny_swin(swin_transformer, drop_path_rate: float):
    """A 56x56 image, patch 4 (a 14x14 grid: 4 windows of 7x7), window 7, two stages of two blocks:
    stage 1 has an unshifted and a shifted block (shift 3, the -100 region mask), stage 2 (7x7
    after patch merging: one window) two unshifted blocks. DropPath rates 0, r/3, 2r/3, r."""
    torch.manual_seed(0)
    model = swin_transformer.SwinTransformer(img_size=56, patch_size=4, in_chans=3, num_classes=5, embed_dim=16,
                                             depths=(2, 2), num_heads=(2, 4), window_size=7,
                                             drop_path_rate=drop_path_rate)
    # Weights of a trained model's size, not timm's init (std 0.02, zero biases, unit norms): with
    # those the attention branches barely move the loss, and a wrong shift or window order would
    # hide under the tolerance. Bias tables of std 1 make the relative-position term matter.
    norm_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.LayerNorm)}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name:
                p.normal_(0.0, 1.0)
            elif p.dim() > 1:
                p.normal_(0.0, p[0].numel() ** -0.5)  # 1/√fan_in
            else:  # biases; LayerNorm weights around 1
                p.normal_(1.0 if id(p) in norm_weights else 0.0, 0.1)
    return model


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("train", [True, False], ids=["train-droppath", "eval"])
def test_patched_timm_swin_matches_eager_loss_and_gradients(swin, monkeypatch, train):
    from timm.layers import drop as timm_drop

    from gpudiag.fused import timm_swin

    model = _tiny_swin(swin, drop_path_rate=0.6).train(train)
    blocks = [m for m in model.modules() if isinstance(m, swin.SwinTransformerBlock)]
    assert [b.shift_size for b in blocks] == [(0, 0), (3, 3), (0, 0), (0, 0)]
    assert blocks[1].attn_mask is not None and blocks[0].attn_mask is None
    fused = timm_swin.apply(copy.deepcopy(model))

    # Count the fused calls (the patch must not fall back to timm's forward: that would match
    # trivially) and, in the reference, the samples whose residual branch DropPath zeroed.
    calls = {"ln_roll_partition": 0, "scaled_masked_softmax": 0, "window_reverse_roll_add": 0, "drop_path_add": 0}
    for name in calls:
        original = getattr(timm_swin, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(timm_swin, name, counted)
    dropped = []
    timm_drop_path = timm_drop.drop_path

    def recorded_drop_path(x, *args, **kwargs):
        out = timm_drop_path(x, *args, **kwargs)
        dropped.append(int((out.flatten(1).abs().amax(1) == 0).sum()))
        return out

    monkeypatch.setattr(timm_drop, "drop_path", recorded_drop_path)

    gen = torch.Generator().manual_seed(1)
    images = torch.randn(4, 3, 56, 56, generator=gen)
    labels = torch.randint(0, 5, (4,), generator=gen)
    losses, grads = [], []
    for m in (model, fused):
        x = images.clone().requires_grad_(True)
        torch.manual_seed(2)  # the same DropPath draws in both runs
        loss = torch.nn.functional.cross_entropy(m(x), labels)
        loss.backward()
        losses.append(loss.detach())
        grads.append([x.grad] + [p.grad for p in m.parameters()])

    assert calls == {"ln_roll_partition": 4, "scaled_masked_softmax": 4, "window_reverse_roll_add": 4,
                     "drop_path_add": 4}  # every block patched, forward once
    if train:
        assert len(dropped) == 6 and sum(dropped) > 0  # 3 blocks with DropPath x 2 branches; some zeroed
    else:
        assert sum(dropped) == 0  # eval: DropPath is the identity
    assert _rel(losses[1], losses[0]) < 1e-5
    names = ["input"] + [n for n, _ in model.named_parameters()]
    assert len(grads[0]) == len(grads[1]) == len(names)
    for name, want, got in zip(names, grads[0], grads[1]):
        assert want is not None and got is not None, name
        assert _rel(got, want) < 1e-5, name  # measured ≤ 1e-6 (fp32, summation order)


def test_apply_refuses_a_model_without_swin_blocks(swin):
    from gpudiag.fused import timm_swin

    with pytest.raises(ValueError, match="has no timm SwinTransformerBlock"):
        timm_swin.apply(nn.Linear(4, 4))


def _dynamo_graph_ops(model, images) -> list[str]:
    """The call_function targets of the graph(s) Dynamo captures from ``model(images)``, in order,
    with graph breaks counted as entries ("graph_break: <reason>")."""
    ops = []

    def backend(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward  # run the captured graph as it is: only the capture is compared

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.compile(model, backend=backend)(images)
    return ops + [f"graph_break: {r}" for r in torch._dynamo.utils.counters["graph_break"]]


def test_patched_timm_swin_under_compile_traces_timms_code_by_default(swin):
    """Default ``under_compile="timm"``: while torch.compile traces, the patched blocks run timm's
    code, so Dynamo captures exactly the unpatched model's graph (compile + kernels cannot be
    slower than compile alone: on an H100 the custom ops made the Swin-T batch-32 step 2.2x
    slower, docs/proof.md), and plan() says so for every block; eager calls still use the kernels."""
    from gpudiag.fused import timm_swin

    images = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(1))
    reference = _tiny_swin(swin, drop_path_rate=0.0).eval()
    patched = timm_swin.apply(copy.deepcopy(reference))
    want, got = _dynamo_graph_ops(reference, images), _dynamo_graph_ops(patched, images)
    assert len(want) > 50 and not [t for t in want if t.startswith("graph_break")]
    assert got == want  # same ops, same order: no gpudiag op, no graph break

    names = [n for n, m in patched.named_modules() if isinstance(m, swin.SwinTransformerBlock)]
    steps = timm_swin.plan(patched)
    assert sorted(steps) == sorted(names)
    assert all(s["eager"] == "fused kernels" and s["compiled"].startswith("timm: torch.compile fuses")
               for s in steps.values()), steps
    assert all(s["compiled"] == "gpudiag custom ops"
               for s in timm_swin.plan(timm_swin.apply(patched, under_compile="kernels")).values())
    with pytest.raises(ValueError, match="under_compile='triton': use one of timm, kernels"):
        timm_swin.apply(patched, under_compile="triton")


def test_patched_timm_swin_compiles_without_graph_break_and_matches_eager(swin):
    """With ``under_compile="kernels"`` the patch calls gpudiag's custom ops (torch.ops.gpudiag.*)
    under torch.compile: no graph break (the autograd Functions it called before crashed Dynamo's
    fake-tensor trace in Triton's interpreter), the ops in the graph, and the eager patched model's
    loss and gradients."""
    from gpudiag.fused import timm_swin

    model = timm_swin.apply(_tiny_swin(swin, drop_path_rate=0.6).train(), under_compile="kernels")
    gen = torch.Generator().manual_seed(1)
    images, labels = torch.randn(4, 3, 56, 56, generator=gen), torch.randint(0, 5, (4,), generator=gen)

    def run(fn):
        model.zero_grad()
        torch.manual_seed(2)  # the same DropPath draws in both runs
        loss = torch.nn.functional.cross_entropy(fn(images), labels)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    want = run(model)
    targets = set()

    def backend(gm, example_inputs):
        targets.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    got = run(torch.compile(model, backend=backend))
    assert not torch._dynamo.utils.counters["graph_break"]
    assert {t.split(".")[1] for t in targets if t.startswith("gpudiag.")} == {
        "ln_roll_partition", "scaled_masked_softmax", "window_reverse_roll_add", "bias_dropout_add"}
    assert _rel(got[0], want[0]) < 1e-5
    for name, g, w in zip([n for n, _ in model.named_parameters()], got[1], want[1]):
        assert _rel(g, w) < 1e-5, name
