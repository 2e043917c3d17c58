"""gpudiag.kernels.timm_swin against timm's Swin block, in Triton's interpreter (fp32).

timm is not a test dependency (it pulls torchvision): a stand-in module with
timm 1.0.29's SwinTransformerBlock / WindowAttention code paths (its non-SDPA attention, the shift
mask, DropPath; Apache-2.0, github.com/huggingface/pytorch-image-models) is registered under
``timm.models.swin_transformer``. On the H200 the real timm Swin-T was checked the same way
(docs/swin_end_to_end.md)."""

from __future__ import annotations

import copy
import sys
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
nn = torch.nn


class DropPath(nn.Module):
    def __init__(self, drop_prob=0.0, scale_by_keep=True):
        super().__init__()
        self.drop_prob, self.scale_by_keep = drop_prob, scale_by_keep

    def forward(self, x):
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1 - self.drop_prob
        r = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * (r.div_(keep) if self.scale_by_keep else r)


class WindowAttention(nn.Module):
    def __init__(self, dim, num_heads, window=7):
        super().__init__()
        self.num_heads, self.scale, n = num_heads, (dim // num_heads) ** -0.5, window * window
        self.relative_position_bias_table = nn.Parameter(0.5 * torch.randn((2 * window - 1) ** 2, num_heads))
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("relative_position_index", rel[..., 0] * (2 * window - 1) + rel[..., 1])
        self.window_area = n
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.attn_drop, self.proj_drop, self.softmax = nn.Dropout(0.0), nn.Dropout(0.0), nn.Softmax(-1)

    def _get_rel_pos_bias(self):
        n = self.window_area
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(n, n, -1)
        return bias.permute(2, 0, 1).contiguous().unsqueeze(0)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B_, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1) + self._get_rel_pos_bias()
        if mask is not None:
            nw = mask.shape[0]
            attn = (attn.view(-1, nw, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)).view(-1, self.num_heads, N, N)
        x = self.attn_drop(self.softmax(attn)) @ v
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(B_, N, -1)))


def window_partition(x, ws):
    B, H, W, C = x.shape
    return x.view(B, H // ws, ws, W // ws, ws, C).permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws, ws, C)


def window_reverse(windows, ws, H, W):
    C = windows.shape[-1]
    x = windows.view(-1, H // ws, W // ws, ws, ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, H, W, C)


class SwinTransformerBlock(nn.Module):
    def __init__(self, dim, resolution, num_heads, shift, drop_path, window=7):
        super().__init__()
        self.window_size, self.shift_size, self.window_area = (window, window), (shift, shift), window * window
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, num_heads, window)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop_path1, self.drop_path2 = DropPath(drop_path), DropPath(drop_path)
        mask = None
        if shift:  # timm's calculate_attn_mask: regions of the shifted grid, -100 across regions
            img = torch.zeros(1, resolution, resolution, 1)
            cnt = 0
            for h in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
                for w in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
                    img[:, h, w, :] = cnt
                    cnt += 1
            mw = window_partition(img, window).view(-1, self.window_area)
            mask = mw.unsqueeze(1) - mw.unsqueeze(2)
            mask = mask.masked_fill(mask != 0, -100.0)
        self.register_buffer("attn_mask", mask, persistent=False)

    def _attn(self, x):
        B, H, W, C = x.shape
        s = self.shift_size
        shifted = torch.roll(x, shifts=(-s[0], -s[1]), dims=(1, 2)) if any(s) else x
        windows = window_partition(shifted, self.window_size[0]).view(-1, self.window_area, C)
        out = self.attn(windows, mask=self.attn_mask).view(-1, self.window_size[0], self.window_size[1], C)
        shifted = window_reverse(out, self.window_size[0], H, W)
        return torch.roll(shifted, shifts=s, dims=(1, 2)) if any(s) else shifted

    def forward(self, x):
        B, H, W, C = x.shape
        x = x + self.drop_path1(self._attn(self.norm1(x)))
        x = x.reshape(B, -1, C)
        x = x + self.drop_path2(self.mlp(self.norm2(x)))
        return x.reshape(B, H, W, C)


@pytest.fixture()
def swin_module(monkeypatch):
    """The stand-in registered as timm.models.swin_transformer for the test (also where timm is
    installed: the patch must find blocks by that module's class)."""
    module = types.ModuleType("timm.models.swin_transformer")
    module.SwinTransformerBlock = SwinTransformerBlock
    for name in ("timm", "timm.models"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "timm.models.swin_transformer", module)
    return module


def test_patched_blocks_match_timm_forward_and_backward(swin_module):
    """A shifted and an unshifted block, with DropPath drawing the same per-sample values (same
    seed, same draw order): output and every parameter and input gradient equal eager's."""
    from gpudiag.kernels import timm_swin

    torch.manual_seed(0)
    model = nn.Sequential(SwinTransformerBlock(8, 14, 2, shift=0, drop_path=0.3),
                          SwinTransformerBlock(8, 14, 2, shift=3, drop_path=0.3)).train()
    fused = timm_swin.apply(copy.deepcopy(model))
    x = torch.randn(4, 14, 14, 8)
    x_ref, x_fused = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    torch.manual_seed(1)
    ref = model(x_ref)
    torch.manual_seed(1)
    out = fused(x_fused)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-5
    dy = torch.randn_like(ref)
    ref.backward(dy)
    out.backward(dy)
    assert ((x_fused.grad - x_ref.grad).norm() / x_ref.grad.norm()).item() < 1e-5
    for (name, p_ref), (_, p_fused) in zip(model.named_parameters(), fused.named_parameters()):
        assert ((p_fused.grad - p_ref.grad).norm() / p_ref.grad.norm()).item() < 1e-4, name


def test_apply_refuses_a_model_without_swin_blocks(swin_module):
    from gpudiag.kernels import timm_swin

    with pytest.raises(ValueError, match="has no timm SwinTransformerBlock"):
        timm_swin.apply(nn.Linear(4, 4))
