"""Apply gpudiag's reference kernels to Hugging Face transformers models, in place: the fusion
candidates a capture of their training step shows (checked against transformers 5.23).

Per model family (``docs/kernels_hf.md`` has the details and what stays as it is):

- Llama, Mistral, Qwen2: every ``*RMSNorm`` -> :func:`rms_norm`; the MLP's
  ``act_fn(gate_proj(x)) * up_proj(x)`` -> :func:`swiglu` (SiLU) or :func:`geglu` (tanh GELU);
  ``apply_rotary_pos_emb`` in the attention -> :func:`rope`; with ``fuse_lm_loss=True``, the
  causal-LM head + loss -> :func:`linear_cross_entropy` when labels are given (the output's
  ``logits`` are then None: that is the memory it saves).
- GPT-2: per block, attention output + residual + ``ln_2`` -> :func:`add_layer_norm`; the MLP's
  ``c_fc`` bias + tanh GELU -> :func:`bias_gelu`; ``c_proj`` bias + dropout + residual ->
  :func:`bias_dropout_add`.
- BERT: dropout output + residual + LayerNorm (``BertSelfOutput``, ``BertOutput``) ->
  :func:`add_layer_norm`; the intermediate bias + GELU -> :func:`bias_gelu` only for a tanh GELU
  (BERT's own "gelu" is the erf form, which the kernel does not compute).

The fused functions are gpudiag's custom ops (:mod:`gpudiag.fused.custom_ops`): a patched model
compiles with ``torch.compile`` like the original. Where a call does not fit a kernel (mixed
dtypes outside autocast, cross-attention, ``logits_to_keep``), the module runs its original code.

    from gpudiag.fused import hf
    summary = hf.apply(model)   # {"family": "llama", "kernels": {"rms_norm": 5, ...}, "skipped": {...}}
"""

from __future__ import annotations

import importlib
import types

import torch
import torch.nn.functional as F

from gpudiag.fused.custom_ops import (add_layer_norm, bias_dropout_add, bias_gelu, geglu, linear_cross_entropy,
                                        rms_norm, rope, swiglu)

LLAMA_FAMILY = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}  # modeling module -> class prefix
SILU_ACTS = ("silu", "swish")
TANH_GELU_ACTS = ("gelu_new", "gelu_pytorch_tanh")  # 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))): the kernels' GELU
IGNORE_INDEX = -100  # transformers' loss_utils ignore index


def _modeling(name: str):
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def _patch(module: torch.nn.Module, forward) -> bool:
    """Replace ``module.forward`` (the original kept as ``_gpudiag_original_forward``); False when
    the module is patched already."""
    if hasattr(module, "_gpudiag_original_forward"):
        return False
    original = module._gpudiag_original_forward = module.forward

    def dispatch(self, *args, **kwargs):
        # Under torch.compile the HF code runs (``apply(under_compile="hf")``, the default): Inductor
        # fuses these chains itself, and a custom op per call adds host dispatch and a Python Triton
        # launch (Swin-T batch 32 on the H100: compile + kernels 53.2 ms vs compile 24.3 ms, docs/proof.md).
        if torch.compiler.is_compiling() and getattr(self, "_gpudiag_under_compile", "hf") == "hf":
            return original(*args, **kwargs)
        return forward(self, *args, **kwargs)

    module.forward = types.MethodType(dispatch, module)
    return True


def _same_dtype(*tensors) -> bool:
    return len({t.dtype for t in tensors if t is not None}) == 1


# ----------------------------------------------------------------------------- Llama family

def _rms_norm_forward(self, x):
    if x.dtype != self.weight.dtype:  # HF would promote (weight · x.to(input dtype)): keep its result dtype
        return self._gpudiag_original_forward(x)
    return rms_norm(x, self.weight, self.variance_epsilon)


def _swiglu_mlp_forward(self, x):
    return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


def _geglu_mlp_forward(self, x):
    return self.down_proj(geglu(self.gate_proj(x), self.up_proj(x)))


def _make_rope(original):
    """HF's ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` through :func:`rope`. Under
    autocast, cos/sin (the residual stream's dtype, fp32) are cast to q's autocast dtype: the
    rotated q and k are cast to it by the attention's next matmul or SDPA anyway."""

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if unsqueeze_dim == 1 and q.dtype == k.dtype and cos.dtype != q.dtype \
                and torch.is_autocast_enabled(q.device.type) and q.dtype == torch.get_autocast_dtype(q.device.type):
            cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        if unsqueeze_dim != 1 or not _same_dtype(q, k, cos, sin):
            return original(q, k, cos, sin, unsqueeze_dim)
        return rope(q, k, cos, sin)

    return apply_rotary_pos_emb


def _rope_forward(attn_cls, modeling):
    """``attn_cls.forward`` with ``apply_rotary_pos_emb`` bound to the fused one: the same code with
    a copy of the modeling module's globals, so that only the instances given it change (other
    models of the class, and the module, keep HF's). Returns (forward, None) or (None, why not)."""
    fn = attn_cls.forward
    if getattr(fn, "__wrapped__", None) is not None or fn.__globals__ is not vars(modeling):
        return None, f"{attn_cls.__name__}.forward is wrapped or not from {modeling.__name__}"
    if "apply_rotary_pos_emb" not in fn.__code__.co_names:
        return None, f"{attn_cls.__name__}.forward does not call apply_rotary_pos_emb"
    scope = dict(fn.__globals__, apply_rotary_pos_emb=_make_rope(modeling.apply_rotary_pos_emb))
    rebound = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    rebound.__kwdefaults__ = fn.__kwdefaults__
    return rebound, None


def _causal_lm_forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                       inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    """``*ForCausalLM.forward`` with the head and loss fused when labels are given (logits None)."""
    if labels is None or not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
        return self._gpudiag_original_forward(input_ids=input_ids, attention_mask=attention_mask,
                                              position_ids=position_ids, past_key_values=past_key_values,
                                              inputs_embeds=inputs_embeds, labels=labels, use_cache=use_cache,
                                              logits_to_keep=logits_to_keep, **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
    # transformers' ForCausalLMLoss: predict token t+1 at t (labels padded with the ignore index)
    shifted = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].to(outputs.last_hidden_state.device)
    loss = linear_cross_entropy(outputs.last_hidden_state, self.lm_head.weight, shifted, self.lm_head.bias,
                                IGNORE_INDEX)
    if kwargs.get("num_items_in_batch") is not None:  # the Trainer's sum / items across gradient accumulation
        loss = loss * (shifted != IGNORE_INDEX).sum() / kwargs["num_items_in_batch"]
    return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=outputs.past_key_values,
                                  hidden_states=outputs.hidden_states, attentions=outputs.attentions)


def _patch_llama_family(model, name: str, fuse_head: bool, counts: dict, skipped: dict) -> None:
    modeling, prefix = _modeling(name), LLAMA_FAMILY[name]
    norm_cls, mlp_cls = getattr(modeling, f"{prefix}RMSNorm"), getattr(modeling, f"{prefix}MLP")
    attn_cls, lm_cls = getattr(modeling, f"{prefix}Attention"), getattr(modeling, f"{prefix}ForCausalLM")
    mlp_forward = {**dict.fromkeys(SILU_ACTS, (_swiglu_mlp_forward, "swiglu")),
                   **dict.fromkeys(TANH_GELU_ACTS, (_geglu_mlp_forward, "geglu"))}
    attn_forward, why_not = _rope_forward(attn_cls, modeling)
    if why_not:
        skipped["rope"] = why_not
    from transformers.utils import can_return_tuple

    head_forward = can_return_tuple(_causal_lm_forward)  # return_dict=False as HF's forward takes it
    for module in model.modules():
        if isinstance(module, norm_cls) and _patch(module, _rms_norm_forward):
            counts["rms_norm"] = counts.get("rms_norm", 0) + 1
        elif isinstance(module, mlp_cls):
            act = module.config.hidden_act
            if act not in mlp_forward:
                skipped["swiglu"] = f"hidden_act {act!r}: the gated kernels compute SiLU or tanh-GELU"
            elif _patch(module, mlp_forward[act][0]):
                counts[mlp_forward[act][1]] = counts.get(mlp_forward[act][1], 0) + 1
        elif isinstance(module, attn_cls) and attn_forward is not None and _patch(module, attn_forward):
            counts["rope"] = counts.get("rope", 0) + 1
        elif isinstance(module, lm_cls) and fuse_head and _patch(module, head_forward):
            counts["linear_cross_entropy"] = counts.get("linear_cross_entropy", 0) + 1


# ----------------------------------------------------------------------------- GPT-2

def _linear_no_bias(x, weight_in_out):
    return torch.matmul(x, weight_in_out)  # Conv1D stores [in, out]; the bias goes to the fused kernel


def _gpt2_block_forward(self, hidden_states, past_key_values=None, attention_mask=None, encoder_hidden_states=None,
                        encoder_attention_mask=None, use_cache=False, **kwargs):
    """GPT2Block.forward (self-attention blocks) with ln_2, the MLP's GELU and its residual fused."""
    if encoder_hidden_states is not None:
        return self._gpudiag_original_forward(hidden_states, past_key_values, attention_mask, encoder_hidden_states,
                                              encoder_attention_mask, use_cache, **kwargs)
    residual = hidden_states
    attn_output, _ = self.attn(self.ln_1(hidden_states), past_key_values=past_key_values,
                               attention_mask=attention_mask, use_cache=use_cache, **kwargs)
    dtype = torch.promote_types(attn_output.dtype, residual.dtype)  # eager's add promotes: the same sum
    ln, mlp = self.ln_2, self.mlp
    x, residual = add_layer_norm(attn_output.to(dtype), residual.to(dtype), ln.weight.to(dtype), ln.bias.to(dtype),
                                 ln.eps)
    h = _linear_no_bias(x, mlp.c_fc.weight)
    h = bias_gelu(h, mlp.c_fc.bias.to(h.dtype))  # autocast's addmm adds the bias in the GEMM's dtype too
    out = _linear_no_bias(h, mlp.c_proj.weight)
    return bias_dropout_add(out, residual, mlp.c_proj.bias.to(out.dtype), mlp.dropout.p, self.training)


def _patch_gpt2(model, counts: dict, skipped: dict) -> None:
    modeling = _modeling("gpt2")
    for module in model.modules():
        if not isinstance(module, modeling.GPT2Block):
            continue
        act = getattr(model.config, "activation_function", None)
        if act not in TANH_GELU_ACTS:
            skipped["gpt2_block"] = f"activation_function {act!r}: bias_gelu computes the tanh GELU"
        elif _patch(module, _gpt2_block_forward):
            for kernel in ("add_layer_norm", "bias_gelu", "bias_dropout_add"):
                counts[kernel] = counts.get(kernel, 0) + 1


# ----------------------------------------------------------------------------- BERT

def _bert_output_forward(self, hidden_states, input_tensor):
    """BertSelfOutput / BertOutput.forward with the residual add and LayerNorm fused."""
    h = self.dropout(self.dense(hidden_states))
    dtype = torch.promote_types(h.dtype, input_tensor.dtype)
    ln = self.LayerNorm
    return add_layer_norm(h.to(dtype), input_tensor.to(dtype), ln.weight.to(dtype), ln.bias.to(dtype), ln.eps)[0]


def _bert_intermediate_forward(self, hidden_states):
    h = F.linear(hidden_states, self.dense.weight)
    return bias_gelu(h, self.dense.bias.to(h.dtype))


def _patch_bert(model, counts: dict, skipped: dict) -> None:
    modeling = _modeling("bert")
    act = getattr(model.config, "hidden_act", None)
    for module in model.modules():
        if isinstance(module, (modeling.BertSelfOutput, modeling.BertOutput)) and _patch(module, _bert_output_forward):
            counts["add_layer_norm"] = counts.get("add_layer_norm", 0) + 1
        elif isinstance(module, modeling.BertIntermediate):
            if act not in TANH_GELU_ACTS:
                skipped["bias_gelu"] = f"hidden_act {act!r}: bias_gelu computes the tanh GELU, not the erf form"
            elif _patch(module, _bert_intermediate_forward):
                counts["bias_gelu"] = counts.get("bias_gelu", 0) + 1


# ----------------------------------------------------------------------------- entry point

def _family(model: torch.nn.Module) -> str | None:
    """The model family by its config's ``model_type``, or None."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return model_type if model_type in (*LLAMA_FAMILY, "gpt2", "bert") else None


def apply(model: torch.nn.Module, *, fuse_lm_loss: bool = False, under_compile: str = "hf") -> dict:
    """Patch ``model`` (a transformers Llama, Mistral, Qwen2, GPT-2 or BERT model, any head) in
    place with gpudiag's fused kernels; applying it twice changes nothing more.

    ``fuse_lm_loss=True`` (Llama family) also fuses the LM head with the loss when the
    forward gets ``labels``: its output then has ``logits=None``.

    ``under_compile``: "hf" (default) runs transformers' own code while torch.compile traces the
    model (compile fuses those chains with no per-call host cost); "kernels" keeps gpudiag's custom
    ops in the compiled graph.

    Returns ``{"family": model_type, "kernels": {kernel: modules patched}, "skipped": {kernel:
    reason}}``. Raises ValueError for any other model (nothing would change)."""
    if under_compile not in ("hf", "kernels"):
        raise ValueError(f"under_compile must be 'hf' or 'kernels', not {under_compile!r}")
    family = _family(model)
    if family is None:
        raise ValueError(f"{type(model).__name__} is not a transformers Llama, Mistral, Qwen2, GPT-2 or BERT model "
                         "(config.model_type): nothing to patch")
    counts: dict[str, int] = {}
    skipped: dict[str, str] = {}
    if family in LLAMA_FAMILY:
        _patch_llama_family(model, family, fuse_lm_loss, counts, skipped)
    elif family == "gpt2":
        _patch_gpt2(model, counts, skipped)
    else:
        _patch_bert(model, counts, skipped)
    for module in model.modules():
        if hasattr(module, "_gpudiag_original_forward"):
            module._gpudiag_under_compile = under_compile
    return {"family": family, "kernels": counts, "skipped": skipped}
