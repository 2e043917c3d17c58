"""A step is one iteration of the script's training loop (issue 34, pytorch/examples), through the
real launcher on CPU: a GAN stepping two optimizers per batch (dcgan) gets one step per batch, and a
loop with no torch.optim optimizer (word_language_model's hand-written SGD update) gets one step per
call of its model, and is still read as training."""

from __future__ import annotations

import pytest

from gpudiag.capture.instrument import CaptureConfig

pytest.importorskip("torch")

from test_window import launch  # noqa: E402 - after the skip: it needs torch

GAN = """
import torch
from torch import nn

torch.manual_seed(0)
netG, netD = nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 1), nn.Sigmoid())
optD = torch.optim.Adam(netD.parameters(), lr=1e-3)
optG = torch.optim.Adam(netG.parameters(), lr=1e-3)
bce = nn.BCELoss()
for i in range(1000):
    real = torch.randn(16, 8)
    netD.zero_grad()
    errD = bce(netD(real), torch.ones(16, 1)) + bce(netD(netG(torch.randn(16, 4)).detach()), torch.zeros(16, 1))
    errD.backward()
    optD.step()
    for critic in range(CRITIC_STEPS):  # a WGAN-style critic stepped more often than the generator
        optD.step()
    netG.zero_grad()
    errG = bce(netD(netG(torch.randn(16, 4))), torch.ones(16, 1))
    errG.backward()
    print("iteration", i + 1, flush=True)
    optG.step()
"""


@pytest.mark.parametrize("critic_steps", [0, 4])
def test_a_gan_gets_one_step_per_batch(tmp_path, critic_steps):
    config = CaptureConfig(warmup_steps=2, window_steps=4, bare=True)
    proc, status = launch(tmp_path, f"CRITIC_STEPS = {critic_steps}\n" + GAN, config)
    assert proc.returncode == 0, proc.stderr
    assert status["step_mode"] == "optimizer" and status["stopped_after_window"] == 6
    # one step per batch, ending at the generator's step (the last optimizer built to step): the
    # window's 6 steps end in batch 6's, the discriminator's steps never end one
    assert proc.stdout.count("iteration ") == 6
    assert {"1", "2", "3", "4", "5"} <= set(status["step_wall_ns"])


MANUAL_SGD = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.LSTM(8, 16)
head = nn.Linear(16, 4)
criterion = nn.CrossEntropyLoss()
lr = 0.1
for i in range(1000):
    model.zero_grad()
    head.zero_grad()
    out, _ = model(torch.randn(5, 3, 8))
    loss = criterion(head(out).view(-1, 4), torch.randint(0, 4, (15,)))
    loss.backward()
    for p in list(model.parameters()) + list(head.parameters()):
        p.data.add_(p.grad, alpha=-lr)
    print("iteration", i + 1, flush=True)
"""


@pytest.mark.parametrize("bare", [True, False], ids=["bare", "profiled"])
def test_training_without_an_optimizer_steps_at_the_model_calls(tmp_path, bare):
    from gpudiag.analysis.steps.serving import is_inference

    config = CaptureConfig(warmup_steps=2, window_steps=4, bare=bare)
    proc, status = launch(tmp_path, MANUAL_SGD, config)
    assert proc.returncode == 0, proc.stderr
    assert status["step_mode"] == "forward" and status["stopped_after_window"] == 6
    # a step runs from one call of the model to the next: 6 steps end at the 7th call, after 6 iterations
    assert proc.stdout.count("iteration ") == 6
    assert status["losses"] and not is_inference(status)  # backward() ran: training, not requests
