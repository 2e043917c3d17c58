"""gpudiag.fused.hf against real transformers models: tiny configs (2 layers, hidden 64) built on
the CPU (no weights downloaded), patched vs unpatched copies with the same weights, in Triton's
interpreter. Loss and every parameter gradient are compared, the fused functions' calls are
counted (a patch that fell back to the original code would match trivially), and the patched
Llama is compiled (aot_eager) with no more graph breaks than the original.

Weights are drawn at a trained model's scale (1/√fan_in, norms around 1), not transformers' init
(std 0.02): with those the attention and MLP branches barely move the loss and a wrong rotation
or gate would hide under the tolerance. Dropout stays on where its random numbers are torch's in
both models (BERT: the patch keeps torch's dropout) and is off where the kernel draws its own mask
(GPT-2's MLP residual; its probability is checked separately)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
transformers = pytest.importorskip("transformers")

from gpudiag.fused import hf  # noqa: E402

FUSED = ("rms_norm", "swiglu", "geglu", "rope", "linear_cross_entropy", "add_layer_norm", "bias_gelu",
         "bias_dropout_add")
TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64)


def _llama_like(name, **overrides):
    config_cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
                  "qwen2": transformers.Qwen2Config}[name]
    model_cls = {"llama": transformers.LlamaForCausalLM, "mistral": transformers.MistralForCausalLM,
                 "qwen2": transformers.Qwen2ForCausalLM}[name]
    return model_cls(config_cls(**{**TINY, "num_key_value_heads": 2, **overrides}))


def _gpt2(**overrides):
    config = transformers.GPT2Config(**{"vocab_size": 97, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64,
                                        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, **overrides})
    return transformers.GPT2LMHeadModel(config)


def _bert(**overrides):
    config = transformers.BertConfig(**{**TINY, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                                        **overrides})
    return transformers.BertForMaskedLM(config)


# family -> (model builder, the kernels apply() must report, with their module counts)
MODELS = {
    "llama": (lambda: _llama_like("llama"), {"rms_norm": 5, "swiglu": 2, "rope": 2}),
    "mistral-geglu": (lambda: _llama_like("mistral", hidden_act="gelu_pytorch_tanh"),
                      {"rms_norm": 5, "geglu": 2, "rope": 2}),
    "qwen2": (lambda: _llama_like("qwen2"), {"rms_norm": 5, "swiglu": 2, "rope": 2}),
    "gpt2": (_gpt2, {"add_layer_norm": 2, "bias_gelu": 2, "bias_dropout_add": 2}),
    "bert-gelu-tanh": (lambda: _bert(hidden_act="gelu_new"), {"add_layer_norm": 4, "bias_gelu": 2}),
}


def _trained_scale(model):
    """Reinitialize in place at a trained model's scale (see the module docstring); returns it."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, p.shape[-1] ** -0.5 if "embed" not in name and "wte" not in name else 1.0)
            else:  # biases, norm weights around 1
                p.normal_(1.0 if "norm" in name.lower() or "ln_" in name else 0.0, 0.1)
    return model


def _count_calls(monkeypatch):
    calls = dict.fromkeys(FUSED, 0)
    for name in FUSED:
        original = getattr(hf, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(hf, name, counted)
    return calls


def _batch(model):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (2, 8), generator=gen)
    labels = ids.clone()
    labels[0, :3] = -100  # padding: the ignore index must be honoured
    return {"input_ids": ids, "labels": labels}


def _loss_and_grads(model, batch, fn=None, **kwargs):
    model.zero_grad()
    torch.manual_seed(2)  # the same dropout draws in both models
    out = (model if fn is None else fn)(**batch, **kwargs)
    out.loss.backward()
    return out, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _rel(a, b, floor: float = 1e-30):
    """|a - b| / max(|b|, floor) (2-norms)."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(floor)).item()


def _grad_errors(got, want):
    """Relative error per parameter gradient; gradients that are zero in exact arithmetic (e.g. the
    key bias: softmax ignores a constant added to every score) are measured against 1e-3 of the
    largest gradient norm instead of their own rounding noise."""
    floor = 1e-3 * max(g.double().norm().item() for g in want[1].values())
    return {name: _rel(got[1][name], want[1][name], floor) for name in want[1]}


def _assert_close(got, want, tol):
    assert _rel(got[0].loss.detach(), want[0].loss.detach()) < tol
    assert got[1].keys() == want[1].keys() and len(want[1]) > 10
    errors = _grad_errors(got, want)
    assert max(errors.values()) < tol, max(errors.items(), key=lambda kv: kv[1])


@pytest.mark.parametrize("family", list(MODELS))
def test_patched_model_matches_the_original_loss_and_gradients(family, monkeypatch):
    build, expected = MODELS[family]
    model = _trained_scale(build()).train()
    patched = copy.deepcopy(model)
    summary = hf.apply(patched)
    assert summary["kernels"] == expected
    calls = _count_calls(monkeypatch)
    batch = _batch(model)
    want, got = _loss_and_grads(model, batch), _loss_and_grads(patched, batch)
    assert calls == {k: expected.get(k, 0) for k in FUSED}  # each patched module ran its kernel once
    assert len(got[1]) == len(list(model.parameters()))  # every parameter got a gradient
    _assert_close(got, want, 1e-5)  # fp32; measured ≤ 2.4e-6 (summation order)


def test_llama_head_and_loss_fused_when_labels_are_given(monkeypatch):
    model = _trained_scale(_llama_like("llama")).train()
    patched = copy.deepcopy(model)
    assert hf.apply(patched, fuse_lm_loss=True)["kernels"]["linear_cross_entropy"] == 1
    calls = _count_calls(monkeypatch)
    batch = _batch(model)
    items = torch.tensor(11)  # the Trainer's num_items_in_batch (gradient accumulation): sum / items
    for kwargs in ({}, {"num_items_in_batch": items}):
        want, got = _loss_and_grads(model, batch, **kwargs), _loss_and_grads(patched, batch, **kwargs)
        assert got[0].logits is None and want[0].logits is not None  # the logits are never materialized
        _assert_close(got, want, 1e-5)
    assert calls["linear_cross_entropy"] == 2
    logits = patched(input_ids=batch["input_ids"]).logits  # without labels: HF's own head, logits returned
    torch.testing.assert_close(logits, model(input_ids=batch["input_ids"]).logits, rtol=1e-5, atol=1e-5)
    assert calls["linear_cross_entropy"] == 2


def test_llama_under_bf16_autocast_matches_to_bf16_tolerance(monkeypatch):
    """The training setting: fp32 weights, bf16 autocast. RMSNorm sees the fp32 residual stream,
    SwiGLU bf16 projections, RoPE bf16 q/k with fp32 cos/sin (cast by the patch)."""
    model = _trained_scale(_llama_like("llama")).train()
    patched = copy.deepcopy(model)
    hf.apply(patched)
    calls = _count_calls(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = _loss_and_grads(model, _batch(model)), _loss_and_grads(patched, _batch(model))
    assert calls["rms_norm"] == 5 and calls["swiglu"] == 2 and calls["rope"] == 2
    # bf16 keeps 8 bits: a few roundings of 2^-9 each, through two layers (measured: loss 2.1e-4,
    # worst gradient 1.7e-2, on the 2-core CPU development machine)
    assert _rel(got[0].loss.detach(), want[0].loss.detach()) < 2e-3
    assert max(_grad_errors(got, want).values()) < 5e-2


def test_gpt2_dropout_probability_reaches_the_fused_residual(monkeypatch):
    model = _gpt2(resid_pdrop=0.25)
    hf.apply(model)
    seen = []
    original = hf.bias_dropout_add
    monkeypatch.setattr(hf, "bias_dropout_add", lambda *a, **k: seen.append((a[3], a[4])) or original(*a, **k))
    batch = _batch(model)
    model.train()(**batch)
    model.eval()(**batch)
    assert seen == [(0.25, True)] * 2 + [(0.25, False)] * 2


def test_unsupported_activation_and_model_are_reported():
    bert = _bert()  # BERT's own GELU is the erf form
    summary = hf.apply(bert)
    assert summary["kernels"] == {"add_layer_norm": 4} and "erf" in summary["skipped"]["bias_gelu"]
    assert hf.apply(bert)["kernels"] == {}  # applied twice: nothing more
    with pytest.raises(ValueError, match="not a transformers Llama"):
        hf.apply(torch.nn.Linear(4, 4))


COMPILED_OPS = {"llama": {"rms_norm", "glu", "rope"}, "gpt2": {"add_layer_norm", "bias_gelu", "bias_dropout_add"},
                "bert-gelu-tanh": {"add_layer_norm", "bias_gelu"}}


@pytest.mark.parametrize("family", list(COMPILED_OPS))
def test_patched_model_compiles_with_no_more_graph_breaks_than_the_original(family):
    """Llama compiles to one graph either way; GPT-2 has two breaks of its own (a transformers
    logger call in the loss), which the patch must not add to."""
    model = _trained_scale(MODELS[family][0]()).train()
    patched = copy.deepcopy(model)
    hf.apply(patched, under_compile="kernels")
    batch = _batch(model)
    breaks, targets = [], set()

    def backend(gm, example_inputs):
        targets.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    for m in (model, patched):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        compiled = _loss_and_grads(m, batch, fn=torch.compile(m, backend=backend))
        breaks.append(sum(torch._dynamo.utils.counters["graph_break"].values()))
    assert breaks[1] == breaks[0]
    assert {t.split(".")[1] for t in targets if t.startswith("gpudiag.")} == COMPILED_OPS[family]
    _assert_close(compiled, _loss_and_grads(patched, batch), 1e-5)


def test_under_compile_the_default_traces_the_hf_code():
    """By default a patched model compiles to the unpatched model's graph, op for op: Inductor fuses
    these chains itself, and custom ops would add host dispatch per call (Swin-T on the H100:
    compile + kernels 2.2x slower than compile, docs/proof.md). Eager still runs the kernels."""
    model = _trained_scale(MODELS["llama"][0]()).train()
    patched = copy.deepcopy(model)
    hf.apply(patched)
    batch = _batch(model)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    for m in (model, patched):
        torch._dynamo.reset()
        _loss_and_grads(m, batch, fn=torch.compile(m, backend=backend))
    assert len(graphs) == 2 and graphs[0] == graphs[1]
    assert not any(t.startswith("gpudiag.") for t in graphs[1])
