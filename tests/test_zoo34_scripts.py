"""The held-out audio server of issue 34 (benchmarks/zoo34/audio_server.py) on the CPU: its hand
change makes the same features on the GPU's path (torch.stft) as the CPU path (NumPy) it replaces,
so the measured saving is of the same work; and its tiny run prints the step times hand.sh reads."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT

ZOO34 = ROOT / "benchmarks" / "zoo34"


@pytest.fixture(scope="module")
def audio_server():
    sys.path.insert(0, str(ZOO34))
    try:
        import audio_server as module
        yield module
    finally:
        sys.path.remove(str(ZOO34))


@pytest.mark.parametrize("seconds", [0.25, 1.0, 2.0])
def test_features_on_the_gpu_path_equal_the_numpy_path(audio_server, seconds):
    rng = np.random.default_rng(7)
    clips = rng.standard_normal((3, int(seconds * audio_server.RATE)), dtype=np.float32) * 0.1
    bank = audio_server.mel_filterbank(audio_server.N_FFT, audio_server.MELS, audio_server.RATE)
    window = np.hanning(audio_server.N_FFT + 1)[:-1].astype(np.float32)
    reference = np.stack([audio_server.features_cpu(c, bank, window) for c in clips])
    got = audio_server.features_gpu(clips, torch.from_numpy(bank), torch.from_numpy(window), "cpu").numpy()
    assert got.shape == reference.shape == (3, 1 + (clips.shape[1] - audio_server.N_FFT) // audio_server.HOP,
                                            audio_server.MELS)
    np.testing.assert_allclose(got, reference, rtol=1e-3, atol=1e-3)


def test_the_tiny_server_prints_its_step_times():
    out = subprocess.run([sys.executable, str(ZOO34 / "audio_server.py"), "--tiny", "--device", "cpu", "--steps", "3",
                          "--warmup", "1", "--batch", "2", "--hand", "gpu-features"],
                         capture_output=True, text=True, timeout=300, cwd=ZOO34)
    assert out.returncode == 0, out.stderr[-2000:]
    times = next(line for line in out.stdout.splitlines() if line.startswith("STEP_TIMES_MS"))
    assert len(times.split("[")[1].split(",")) == 2
