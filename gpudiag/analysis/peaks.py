"""Device peaks: datasheet values per math path and memory bandwidth.

Units: FLOP/s and bytes/s; dense (no structured sparsity) tensor-core rates. Sources are NVIDIA's
product datasheets (named per row). Measured peaks (``gpudiag calibrate``, a later issue) win over
this table; until then the report says it used the datasheet. If a GPU is not in the table, the
bandwidth nsys recorded (``TARGET_INFO_GPU.memoryBandwidth``, bytes/s) is used and compute peaks
are unknown, so only the bandwidth roof and heuristics classify.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

T = 1e12

# name regex, bandwidth bytes/s, {math path: FLOP/s}, source
DATASHEET: tuple[tuple[str, float, dict, str], ...] = (
    (r"H200 NVL", 4.8e12, {"fp64": 30 * T, "fp32": 60 * T, "tf32": 417.5 * T, "bf16": 835.5 * T, "fp16": 835.5 * T,
                           "fp8": 1671 * T, "int8": 1671 * T}, "NVIDIA H200 Tensor Core GPU datasheet (NVL)"),
    (r"GH200", 4.0e12, {"fp64": 34 * T, "fp32": 67 * T, "tf32": 494.7 * T, "bf16": 989.4 * T, "fp16": 989.4 * T,
                        "fp8": 1978.9 * T, "int8": 1978.9 * T}, "NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3)"),
    (r"H200", 4.8e12, {"fp64": 34 * T, "fp32": 67 * T, "tf32": 494.7 * T, "bf16": 989.4 * T, "fp16": 989.4 * T,
                       "fp8": 1978.9 * T, "int8": 1978.9 * T}, "NVIDIA H200 Tensor Core GPU datasheet (SXM)"),
    (r"H100 NVL", 3.9e12, {"fp64": 30 * T, "fp32": 60 * T, "tf32": 417.5 * T, "bf16": 835.5 * T, "fp16": 835.5 * T,
                           "fp8": 1671 * T, "int8": 1671 * T}, "NVIDIA H100 Tensor Core GPU datasheet (NVL)"),
    (r"H100.*PCIe", 2.0e12, {"fp64": 26 * T, "fp32": 51 * T, "tf32": 378 * T, "bf16": 756 * T, "fp16": 756 * T,
                             "fp8": 1513 * T, "int8": 1513 * T}, "NVIDIA H100 Tensor Core GPU datasheet (PCIe)"),
    (r"H100", 3.35e12, {"fp64": 34 * T, "fp32": 67 * T, "tf32": 494.7 * T, "bf16": 989.4 * T, "fp16": 989.4 * T,
                        "fp8": 1978.9 * T, "int8": 1978.9 * T}, "NVIDIA H100 Tensor Core GPU datasheet (SXM)"),
    (r"B200", 8.0e12, {"fp64": 40 * T, "fp32": 80 * T, "tf32": 1100 * T, "bf16": 2250 * T, "fp16": 2250 * T,
                       "fp8": 4500 * T, "int8": 4500 * T}, "NVIDIA DGX B200 datasheet, per GPU, dense"),
    (r"A100.*80GB", 2.039e12, {"fp64": 9.7 * T, "fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T,
                               "int8": 624 * T}, "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)"),
    (r"A100", 1.555e12, {"fp64": 9.7 * T, "fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T,
                         "int8": 624 * T}, "NVIDIA A100 Tensor Core GPU datasheet (40GB)"),
    (r"L40S", 0.864e12, {"fp32": 91.6 * T, "tf32": 183 * T, "bf16": 362 * T, "fp16": 362 * T, "fp8": 733 * T,
                         "int8": 733 * T}, "NVIDIA L40S datasheet"),
    (r"\bL4\b", 0.3e12, {"fp32": 30.3 * T, "tf32": 60 * T, "bf16": 121 * T, "fp16": 121 * T, "fp8": 242.5 * T,
                         "int8": 242.5 * T}, "NVIDIA L4 datasheet"),
    (r"\bA10\b", 0.6e12, {"fp32": 31.2 * T, "tf32": 62.5 * T, "bf16": 125 * T, "fp16": 125 * T, "int8": 250 * T},
     "NVIDIA A10 datasheet"),
    (r"V100", 0.9e12, {"fp64": 7.8 * T, "fp32": 15.7 * T, "fp16": 125 * T}, "NVIDIA V100 datasheet (SXM2)"),
)

# Host cost of one eager PyTorch op launch, measured on a lent H200 (docs/notes/
# h200_measured_peaks.json, eager_small_op_us = 5.88). A kernel shorter than this cannot be kept
# fed by eager launches; docs/notes/measurements.md.
LAUNCH_OVERHEAD_NS = 5_900


@dataclass
class DevicePeaks:
    """Peaks of one GPU: ``bandwidth`` bytes/s, ``flops`` FLOP/s per math path, where they came from."""

    name: str
    sm_count: int
    bandwidth: float
    flops: dict = field(default_factory=dict)
    source: str = ""
    launch_overhead_ns: float = LAUNCH_OVERHEAD_NS

    def ridge(self, math_path: str) -> float:
        """Ridge point (FLOP/byte) of ``math_path``; NaN when its peak is unknown."""
        peak = self.flops.get(math_path)
        return peak / self.bandwidth if peak and self.bandwidth else float("nan")


def with_calibration(peaks: DevicePeaks, calibration: dict) -> DevicePeaks:
    """``peaks`` with the measured values of a ``gpudiag calibrate`` entry: copy bandwidth, the
    matmul rate of every measured math path and the eager launch cost. Paths it did not measure
    (fp64, int8) keep their datasheet value."""
    import datetime

    flops = {**peaks.flops, **{k: float(v) for k, v in (calibration.get("matmul_flop_per_s") or {}).items()}}
    when = datetime.date.fromtimestamp(calibration.get("measured_unix_s", 0)).isoformat()
    measured = ", ".join(f"{k} {v / 1e12:.0f} TFLOP/s" for k, v in (calibration.get("matmul_flop_per_s") or {}).items())
    return DevicePeaks(name=peaks.name, sm_count=peaks.sm_count,
                       bandwidth=float(calibration.get("copy_bytes_per_s") or peaks.bandwidth), flops=flops,
                       source=(f"measured by gpudiag calibrate on {when}: copy {calibration.get('copy_bytes_per_s', 0) / 1e12:.2f} TB/s, "
                               f"{measured}; other paths {peaks.source}"),
                       launch_overhead_ns=float(calibration.get("launch_overhead_ns") or peaks.launch_overhead_ns))


def lookup(name: str, sm_count: int = 0, nsys_bandwidth: float | None = None) -> DevicePeaks:
    """Peaks for the GPU called ``name`` (as nsys records it, e.g. "NVIDIA H200")."""
    for pattern, bw, flops, source in DATASHEET:
        if re.search(pattern, name or "", re.IGNORECASE):
            return DevicePeaks(name=name, sm_count=sm_count, bandwidth=bw, flops=dict(flops), source=f"datasheet: {source}")
    return DevicePeaks(name=name or "unknown GPU", sm_count=sm_count, bandwidth=float(nsys_bandwidth or 0.0),
                       source="nsys TARGET_INFO_GPU.memoryBandwidth (GPU not in the datasheet table; compute peaks unknown)")
