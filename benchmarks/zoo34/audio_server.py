"""A host-bound speech-command server that never ends, held out from the GD-HOST-COMPUTE profiler
correction (built after host_server.py, 2026-11-27): each request's clips get log-mel features in
NumPy on the CPU, then a small Transformer encoder classifies them on the GPU in eval/no_grad, and
the top-3 labels are read back with ``.tolist()``.

    python benchmarks/zoo34/audio_server.py                          # serves until stopped
    python benchmarks/zoo34/audio_server.py --hand gpu-features      # features made on the GPU
    python benchmarks/zoo34/audio_server.py --hand compile-graphs    # torch.compile(mode="reduce-overhead")
    gpudiag profile benchmarks/zoo34/audio_server.py                 # steps: one per model call (request)

Each request carries 16 mono float32 clips at 16 kHz of one length drawn at random per request
(2 s half of the time, 4 s a third, 8 s the rest: the noise). The CPU path frames each clip
(25 ms window, 10 ms hop, Hann), takes NumPy's real FFT, the power spectrum, an 80-band mel
filterbank and the log, normalises per clip, pads the batch to its longest clip and copies it to
the GPU. The model: a linear stem, 4 Transformer encoder layers (d_model 256, 4 heads, FFN 1024),
mean pooling, 35 classes.

Hand changes:
- ``gpu-features``: the raw clips are stacked and copied to the GPU as they are, and framing,
  FFT (``torch.stft``), mel filterbank, log and normalisation run there.
- ``compile-graphs``: ``model = torch.compile(model, mode="reduce-overhead")`` and
  ``torch.compiler.cudagraph_mark_step_begin()`` before each request.
"""

import argparse

import numpy as np
import torch
import torch.nn as nn

import steptime

RATE, N_FFT, HOP, MELS, CLASSES = 16000, 400, 160, 80, 35
LENGTHS = [(2.0, 0.5), (4.0, 0.35), (8.0, 0.15)]  # seconds, probability


def mel_filterbank(n_fft: int, mels: int, rate: int) -> np.ndarray:
    """(n_fft // 2 + 1, mels) triangular filters on the HTK mel scale."""
    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def mel_to_hz(m):
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    edges = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(rate / 2), mels + 2))
    freqs = np.linspace(0.0, rate / 2, n_fft // 2 + 1)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (freqs[None, :] - lower) / (centre - lower)
    down = (upper - freqs[None, :]) / (upper - centre)
    return np.maximum(0.0, np.minimum(up, down)).T.astype(np.float32)


def features_cpu(clip: np.ndarray, bank: np.ndarray, window: np.ndarray) -> np.ndarray:
    """One float32 clip -> (frames, MELS) normalised log-mel features, in NumPy."""
    frames = np.lib.stride_tricks.sliding_window_view(clip, N_FFT)[::HOP] * window
    power = np.abs(np.fft.rfft(frames, axis=-1)) ** 2
    logmel = np.log(power.astype(np.float32) @ bank + 1e-6)
    return (logmel - logmel.mean(axis=0)) / (logmel.std(axis=0) + 1e-5)


def features_gpu(clips: np.ndarray, bank: torch.Tensor, window: torch.Tensor, device) -> torch.Tensor:
    """(N, samples) float32 on the host -> (N, frames, MELS) on the GPU, as features_cpu does."""
    audio = torch.from_numpy(clips).to(device, non_blocking=True)
    spec = torch.stft(audio, N_FFT, HOP, window=window, center=False, return_complex=True)
    logmel = torch.log(spec.abs().pow(2).transpose(1, 2) @ bank + 1e-6)
    return (logmel - logmel.mean(dim=1, keepdim=True)) / (logmel.std(dim=1, keepdim=True, unbiased=False) + 1e-5)


class Classifier(nn.Module):
    def __init__(self, d_model: int = 256, layers: int = 4):
        super().__init__()
        self.stem = nn.Linear(MELS, d_model)
        layer = nn.TransformerEncoderLayer(d_model, 4, 4 * d_model, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.stem(x)).mean(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steptime.add_arguments(parser, hands=("gpu-features", "compile-graphs"))
    parser.add_argument("--batch", type=int, default=16, help="clips per request (default 16)")
    args = parser.parse_args()
    device = steptime.device_of(args)
    lengths = [(s / 8 if args.tiny else s, p) for s, p in LENGTHS]
    rng = np.random.default_rng(2)
    # clips waiting in the server's queue: a few per length, reused
    queue = {s: rng.standard_normal((args.batch * 2, int(s * RATE)), dtype=np.float32) * 0.1 for s, _ in lengths}
    seconds, weights = [s for s, _ in lengths], [p for _, p in lengths]
    bank_np, window_np = mel_filterbank(N_FFT, MELS, RATE), np.hanning(N_FFT + 1)[:-1].astype(np.float32)
    bank, window = torch.from_numpy(bank_np).to(device), torch.from_numpy(window_np).to(device)

    torch.manual_seed(0)
    model = Classifier().to(device).eval()
    if "compile-graphs" in args.hand:
        model = torch.compile(model, mode="reduce-overhead")
    gpu_features = "gpu-features" in args.hand
    print(f"audio_server: transformer encoder, {args.batch} clips per request, device {device}, "
          f"hand: {','.join(args.hand) or 'none'}", flush=True)
    answered = 0
    clock = steptime.StepClock(device, args.warmup, args.log_every)
    try:
        while args.steps is None or clock.steps < args.steps:
            length = seconds[rng.choice(len(seconds), p=weights)]
            clips = queue[length][rng.choice(len(queue[length]), size=args.batch, replace=False)]
            with torch.no_grad():
                if gpu_features:
                    batch = features_gpu(clips, bank, window, device)
                else:
                    batch = torch.from_numpy(np.stack([features_cpu(c, bank_np, window_np) for c in clips])).to(device)
                if "compile-graphs" in args.hand:
                    torch.compiler.cudagraph_mark_step_begin()
                top = model(batch).softmax(dim=-1).topk(3, dim=-1)
                answered += len(top.indices.tolist())
            clock.tick()
    finally:
        clock.report()


if __name__ == "__main__":
    main()
