"""Apply gpudiag's reference kernels to a timm Swin Transformer (``timm.models.swin_transformer``,
checked against timm 1.0.29), in place: what the fusion candidates of a Swin-T capture recommend.

Per block (``SwinTransformerBlock``):
- LayerNorm + roll(-shift) + pad + window partition -> :func:`ln_roll_partition`, written in the
  autocast dtype the qkv GEMM reads (its cast folded in);
- attention scores: q·scale, + relative position bias, + shift mask, softmax, cast ->
  :func:`scaled_masked_softmax` (the scale applied to the scores, not to q: one pass fewer);
- window reverse + roll(+shift) + DropPath + residual add -> :func:`window_reverse_roll_add`;
- the MLP branch's DropPath + residual add -> :func:`drop_path_add`.
GEMMs, GELU and the MLP's LayerNorm stay as they are. Blocks whose grid is not a multiple of the
window (timm pads them) keep timm's code.

Under ``torch.compile`` the patched blocks trace timm's code by default (``under_compile="timm"``):
Inductor fuses the same chains itself, its window kernels are faster at Swin-T's shapes (the softmax
kernel is at most 1.4x faster forward, docs/kernels_benchmark.md), and each fused op left in a compiled graph is an opaque custom op that
costs Python dispatch plus a Python Triton launch on every call (about 95 calls per Swin-T training
step). Measured on an H100, Swin-T bf16 batch 32: compile 24.28 ms per step, compile + the custom ops
53.21 ms (docs/proof.md). ``under_compile="kernels"`` keeps the custom ops in the compiled graph
(``torch.ops.gpudiag.*``, no graph break). :func:`plan` says which code each block runs and why.

    import timm
    from gpudiag.fused.timm_swin import apply
    model = apply(timm.create_model("swin_tiny_patch4_window7_224").cuda())
"""

from __future__ import annotations

import logging
import types

import torch

# The custom-op wrappers: the same autograd Functions in eager mode, torch.ops.gpudiag.* under
# torch.compile (no graph break; see gpudiag.fused.custom_ops).
from gpudiag.fused.custom_ops import drop_path_add
from gpudiag.fused.custom_ops_swin import ln_roll_partition, scaled_masked_softmax, window_reverse_roll_add


UNDER_COMPILE = ("timm", "kernels")  # what a patched block runs while torch.compile traces it
_WHY_TIMM_UNDER_COMPILE = ("torch.compile fuses these chains itself; the custom ops would add Python dispatch and a "
                           "Python Triton launch per call (2.2x slower step on Swin-T batch 32, docs/proof.md)")
_log = logging.getLogger(__name__)


def _timm_under_compile(module: torch.nn.Module) -> bool:
    """True while Dynamo traces a patched module that should run timm's code there."""
    return torch.compiler.is_compiling() and getattr(module, "_gpudiag_under_compile", "timm") == "timm"


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the next GEMM computes in: the autocast dtype when autocast is on."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def _sample_scale(x: torch.Tensor, drop_prob: float, training: bool, scale_by_keep: bool) -> torch.Tensor | None:
    """timm's DropPath factor per sample (keep ~ Bernoulli(1 - p), divided by 1 - p), or None."""
    if drop_prob == 0.0 or not training:
        return None
    keep = 1.0 - drop_prob
    scale = x.new_empty(x.shape[0], dtype=_compute_dtype(x)).bernoulli_(keep)
    return scale.div_(keep) if scale_by_keep and keep > 0 else scale


def _attention(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """WindowAttention.forward with the score chain fused (same math as timm's non-SDPA path)."""
    if _timm_under_compile(self):
        return self._gpudiag_original_forward(x, mask)
    B_, N, C = x.shape
    qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    attn = scaled_masked_softmax(q @ k.transpose(-2, -1), self._get_rel_pos_bias().squeeze(0), mask,
                                 scale=self.scale, out_dtype=v.dtype)
    attn = self.attn_drop(attn)
    x = (attn @ v).transpose(1, 2).reshape(B_, N, -1)
    return self.proj_drop(self.proj(x))


def _block(self, x: torch.Tensor) -> torch.Tensor:
    """SwinTransformerBlock.forward on (B, H, W, C) with the window shuffles fused."""
    B, H, W, C = x.shape
    ws, shift = self.window_size[0], self.shift_size[0]
    if _timm_under_compile(self) or H % ws or W % ws or self.window_size[0] != self.window_size[1] \
            or self.shift_size[0] != self.shift_size[1] or getattr(self, "dynamic_mask", False):
        return self._gpudiag_original_forward(x)
    windows = ln_roll_partition(x, self.norm1.weight, self.norm1.bias, ws, shift, self.norm1.eps, _compute_dtype(x))
    attn = self.attn(windows, mask=self.attn_mask)
    p1 = getattr(self.drop_path1, "drop_prob", 0.0)
    x = window_reverse_roll_add(attn, x, ws, shift,
                                _sample_scale(x, p1, self.training, getattr(self.drop_path1, "scale_by_keep", True)))
    x = x.reshape(B, -1, C)
    x = drop_path_add(self.mlp(self.norm2(x)), x, getattr(self.drop_path2, "drop_prob", 0.0), self.training,
                      getattr(self.drop_path2, "scale_by_keep", True))
    return x.reshape(B, H, W, C)


def apply(model: torch.nn.Module, under_compile: str = "timm") -> torch.nn.Module:
    """Patch every SwinTransformerBlock (and its WindowAttention) of ``model`` in place; returns
    the model (applying it twice patches nothing more; the second call's ``under_compile`` wins).
    ``under_compile``: "timm" (default) runs timm's code while torch.compile traces the model,
    "kernels" runs gpudiag's custom ops there. :func:`plan` lists what each block runs.
    Raises ValueError when the model has no Swin block (nothing would change) or for another
    ``under_compile``."""
    from timm.models.swin_transformer import SwinTransformerBlock

    if under_compile not in UNDER_COMPILE:
        raise ValueError(f"under_compile={under_compile!r}: use one of {', '.join(UNDER_COMPILE)}")
    blocks = [m for m in model.modules() if isinstance(m, SwinTransformerBlock)]
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no timm SwinTransformerBlock: nothing to patch")
    for block in blocks:
        block._gpudiag_under_compile = block.attn._gpudiag_under_compile = under_compile
        if hasattr(block, "_gpudiag_original_forward"):
            continue  # already patched: keep timm's forward as the fallback
        block._gpudiag_original_forward = block.forward
        block.forward = types.MethodType(_block, block)
        block.attn._gpudiag_original_forward = block.attn.forward
        block.attn.forward = types.MethodType(_attention, block.attn)
    if under_compile == "timm":
        _log.info("gpudiag.fused.timm_swin: under torch.compile the %d patched blocks run timm's code (%s)",
                  len(blocks), _WHY_TIMM_UNDER_COMPILE)
    return model


def plan(model: torch.nn.Module) -> dict[str, dict[str, str]]:
    """What each patched Swin block of ``model`` runs, by module name: {"eager": ..., "compiled": ...},
    each "fused kernels" / "gpudiag custom ops" or "timm: <why>". The eager choice follows the
    block's recorded input resolution (timm pads a grid that is not a multiple of the window);
    unpatched blocks are left out."""
    out = {}
    for name, m in model.named_modules():
        if not hasattr(m, "_gpudiag_original_forward") or not hasattr(m, "attn"):
            continue
        res, ws = tuple(getattr(m, "input_resolution", (0, 0))), m.window_size[0]
        whole = all(r % ws == 0 for r in res) and not getattr(m, "dynamic_mask", False)
        eager = "fused kernels" if whole else f"timm: grid {res} is not a multiple of the {ws}-token window"
        compiled = ("gpudiag custom ops" if m._gpudiag_under_compile == "kernels" and whole
                    else eager if not whole else f"timm: {_WHY_TIMM_UNDER_COMPILE}")
        out[name] = {"eager": eager, "compiled": compiled}
    return out
