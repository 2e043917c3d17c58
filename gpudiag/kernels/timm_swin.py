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
window (timm pads them) keep timm's code. The fused functions are gpudiag's custom ops, so the
patched model compiles with ``torch.compile`` without a graph break.

    import timm
    from gpudiag.kernels.timm_swin import apply
    model = apply(timm.create_model("swin_tiny_patch4_window7_224").cuda())
"""

from __future__ import annotations

import types

import torch

# The custom-op wrappers: the same autograd Functions in eager mode, torch.ops.gpudiag.* under
# torch.compile (no graph break; see gpudiag.kernels.custom_ops).
from gpudiag.kernels.custom_ops import drop_path_add
from gpudiag.kernels.custom_ops_swin import ln_roll_partition, scaled_masked_softmax, window_reverse_roll_add


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
    if H % ws or W % ws or self.window_size[0] != self.window_size[1] or self.shift_size[0] != self.shift_size[1] \
            or getattr(self, "dynamic_mask", False):
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


def apply(model: torch.nn.Module) -> torch.nn.Module:
    """Patch every SwinTransformerBlock (and its WindowAttention) of ``model`` in place; returns
    the model (applying it twice changes nothing more). Raises ValueError when the model has no
    Swin block (nothing would change)."""
    from timm.models.swin_transformer import SwinTransformerBlock

    blocks = [m for m in model.modules() if isinstance(m, SwinTransformerBlock)]
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no timm SwinTransformerBlock: nothing to patch")
    for block in blocks:
        if hasattr(block, "_gpudiag_original_forward"):
            continue  # already patched: keep timm's forward as the fallback
        block._gpudiag_original_forward = block.forward
        block.forward = types.MethodType(_block, block)
        block.attn.forward = types.MethodType(_attention, block.attn)
    return model
