"""The calibrate workflow (``gpudiag calibrate``): this GPU's measured peaks, cached per GPU and driver."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpudiag.capture import calibrate as calib
from gpudiag.errors import UserError


def calibrate(force: bool = False, echo: Callable[[str], None] = print) -> tuple[dict, Path | None]:
    """(the calibration entry of the present GPU and driver, the cache file it was saved to, or None
    when it came from the cache). Measures (``echo`` tells the progress) unless cached and not
    ``force``. The entry: copy_bytes_per_s, matmul_flop_per_s per dtype, launch_overhead_ns, gpu,
    driver_version. Raises UserError without PyTorch or a CUDA GPU."""
    try:
        import torch
    except ImportError:
        raise UserError("gpudiag calibrate needs PyTorch with CUDA on the GPU machine: pip install torch") from None
    if not torch.cuda.is_available():
        raise UserError("no CUDA GPU visible to PyTorch: run gpudiag calibrate on the GPU machine")
    name = torch.cuda.get_device_name(0)
    cached = None if force else calib.lookup(name, calib.driver_version())
    if cached is not None:
        return cached, None
    entry = calib.measure(echo=echo)
    return entry, calib.save(entry)
