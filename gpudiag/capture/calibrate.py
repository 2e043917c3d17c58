"""``gpudiag calibrate``: measure this GPU's ceilings, the way docs/notes and METHOD.md say to.

- copy bandwidth: a 2 GiB device-to-device ``copy_``, bytes read + written over the time;
- matmul rate per dtype: an 8192³ product of random data (bf16, fp16, TF32, fp32 SIMT, and fp8
  through ``torch._scaled_mm`` where the GPU has fp8 tensor cores), 2·N³ FLOP over the time;
- eager launch cost: the host time per call of a one-element in-place add, the pace at which eager
  PyTorch can feed the GPU (the overhead-bound threshold of the classifier).

Every device time is the median of many CUDA-event-timed repeats after warm-up. Results are cached
per GPU name and driver in ``~/.cache/gpudiag/calibration.json`` (``$GPUDIAG_CACHE`` overrides the
folder); ``gpudiag profile`` copies the entry for the present GPU into the run directory as
``calibration.json``, and the report then uses it instead of the datasheet.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

CALIBRATION_NAME = "calibration.json"


def cache_file() -> Path:
    """Where calibrations are cached (``$GPUDIAG_CACHE`` or ``~/.cache/gpudiag``)."""
    root = Path(os.environ.get("GPUDIAG_CACHE") or Path.home() / ".cache" / "gpudiag")
    return root / CALIBRATION_NAME


def driver_version() -> str | None:
    """The NVIDIA driver version (e.g. "580.159.04") from nvidia-smi, None if it cannot tell."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def cache_key(gpu_name: str, driver: str | None) -> str:
    return f"{gpu_name}|{driver or 'unknown driver'}"


def _time_ms(fn, warmup: int, repeats: int) -> float:
    """Median milliseconds of ``fn`` over ``repeats`` CUDA-event-timed calls after ``warmup``."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _copy_ms(size_bytes: int, dev) -> float:
    """Median ms of a device-to-device copy of ``size_bytes`` (its buffers are freed on return)."""
    import torch

    src = torch.empty(size_bytes // 4, dtype=torch.float32, device=dev).uniform_()
    dst = torch.empty_like(src)
    return _time_ms(lambda: dst.copy_(src), warmup=3, repeats=20)


def measure(size_bytes: int = 2 << 30, n: int = 8192, echo=print) -> dict:
    """Measure the present GPU (device 0). Returns the calibration entry: gpu, driver_version,
    measured_unix_s, copy_bytes_per_s, matmul_flop_per_s {bf16, fp16, tf32, fp32[, fp8]},
    launch_overhead_ns, method. Raises RuntimeError when there is no CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA GPU visible to PyTorch: run gpudiag calibrate on the GPU machine")
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    copy_rate = 2 * size_bytes / (_copy_ms(size_bytes, dev) * 1e-3)
    echo(f"copy: {copy_rate / 1e12:.2f} TB/s (read + write)")

    rates = {}
    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for label, dtype, tf32 in (("bf16", torch.bfloat16, False), ("fp16", torch.float16, False),
                                   ("tf32", torch.float32, True), ("fp32", torch.float32, False)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            size = n if label != "fp32" else n // 2  # SIMT fp32 is ~15x slower: a smaller product suffices
            a = torch.randn(size, size, device=dev, dtype=dtype)
            b = torch.randn(size, size, device=dev, dtype=dtype)
            ms = _time_ms(lambda: a @ b, warmup=3, repeats=10)
            rates[label] = 2 * size ** 3 / (ms * 1e-3)
            echo(f"matmul {label}: {rates[label] / 1e12:.1f} TFLOP/s")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32
    if torch.cuda.get_device_capability(dev) >= (8, 9) and hasattr(torch, "_scaled_mm"):
        a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()  # _scaled_mm wants column-major B
        one = torch.tensor(1.0, device=dev)
        try:
            ms = _time_ms(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                          warmup=3, repeats=10)
            rates["fp8"] = 2 * n ** 3 / (ms * 1e-3)
            echo(f"matmul fp8: {rates['fp8'] / 1e12:.1f} TFLOP/s")
        except RuntimeError as exc:  # a torch build without fp8 GEMMs for this GPU
            echo(f"matmul fp8: not measured ({exc})")

    x = torch.zeros(1, device=dev)
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    calls = 2000
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        x.add_(1)
    torch.cuda.synchronize()
    launch_ns = (time.perf_counter_ns() - t0) / calls
    echo(f"eager launch: {launch_ns / 1e3:.2f} µs per op")
    return {"gpu": name, "driver_version": driver_version(), "measured_unix_s": time.time(),
            "copy_bytes_per_s": copy_rate, "matmul_flop_per_s": rates, "launch_overhead_ns": launch_ns,
            "method": f"median of CUDA-event-timed repeats after warm-up; copy {size_bytes} bytes, matmul {n}^3 random"}


def save(entry: dict, path: Path | None = None) -> Path:
    """Add ``entry`` to the calibration cache (replacing the same GPU and driver)."""
    path = path or cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read_cache(path)  # a damaged cache is replaced rather than losing a fresh measurement
    data[cache_key(entry["gpu"], entry.get("driver_version"))] = entry
    path.write_text(json.dumps(data, indent=1))
    return path


def lookup(gpu_name: str, driver: str | None, path: Path | None = None) -> dict | None:
    """The cached calibration of this GPU and driver, or None."""
    data = _read_cache(path or cache_file())
    entry = data.get(cache_key(gpu_name, driver))
    if entry is None:
        # A calibration made without nvidia-smi has no driver version: use it if it is the only one of this GPU.
        same_gpu = [e for e in data.values() if isinstance(e, dict) and e.get("gpu") == gpu_name]
        entry = same_gpu[0] if len(same_gpu) == 1 and same_gpu[0].get("driver_version") is None else None
    return entry if isinstance(entry, dict) else None


def _read_cache(path: Path) -> dict:
    """The cache as a dict; {} when it is missing or damaged."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
