"""The channels-last change on a root module holding a 5-D tensor: ``Module.to(memory_format=
torch.channels_last)`` raises there ("required rank 4 tensor to use channels_last format": timm's
train.py training task, H200, 2026-11-28); the change converts the 4-D tensors alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from gpudiag.trials import changes  # noqa: E402


def test_channels_last_converts_4d_tensors_and_leaves_5d_ones(monkeypatch):
    monkeypatch.setattr(changes, "APPLIED", {"change": "channels-last", "applied": [], "form": None,
                                             "not_applicable": None})
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
    model.register_buffer("volume", torch.randn(1, 2, 3, 4, 5))
    with pytest.raises(RuntimeError, match="rank 4"):  # the library call this change cannot use here
        model.to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 9, 9)
    before = model(x)
    volume = model.volume.clone()
    changes._channels_last(model)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(model.volume, volume) and model.volume.is_contiguous()
    torch.testing.assert_close(model(x), before)  # the same results (the PyTorch reference)
    assert changes.APPLIED["applied"]
