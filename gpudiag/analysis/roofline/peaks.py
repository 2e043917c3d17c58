"""Device peaks: datasheet values per math path and memory bandwidth.

Units: FLOP/s and bytes/s; dense (no structured sparsity) tensor-core rates. Sources are NVIDIA's
product datasheets (named per row). Measured peaks (``gpudiag calibrate``, a later issue) win over
this table; until then the report says it used the datasheet. If a GPU is not in the table, the
bandwidth nsys recorded (``TARGET_INFO_GPU.memoryBandwidth``, bytes/s) is used and compute peaks
are unknown, so only the bandwidth roof and heuristics classify.
"""

from __future__ import annotations

import dataclasses

import re
from dataclasses import dataclass, field

import pandas as pd

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
    """Peaks of one GPU: ``bandwidth`` bytes/s, ``flops`` FLOP/s per math path, where they came from;
    ``l2_bytes``, the L2 cache size in bytes, from the export (NaN when it names none)."""

    name: str
    sm_count: int
    bandwidth: float
    flops: dict = field(default_factory=dict)
    source: str = ""
    launch_overhead_ns: float = LAUNCH_OVERHEAD_NS
    l2_bytes: float = float("nan")  # L2 cache size (nsys TARGET_INFO_GPU.l2CacheSize); NaN when unknown

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


# SMs of the whole GPU (NVIDIA datasheets / CUDA deviceQuery), for scaling a MIG slice's compute
# peaks by the SMs nsys recorded for it.
FULL_SMS = ((r"H100.*PCIe", 114), (r"H100|H200|GH200", 132), (r"A100", 108), (r"A30", 56))
# GPU memory (GB) where nsys's device name does not say it (datasheets).
FULL_MEMORY_GB = ((r"H200 NVL", 141), (r"GH200", 96), (r"H200", 141))
MIG = re.compile(r"MIG\s+(\d+)g\.(\d+)gb", re.IGNORECASE)


def mig_slice(name: str, sm_count: int, peaks: "DevicePeaks") -> "DevicePeaks":
    """``peaks`` of a whole GPU scaled to the MIG slice named in ``name`` (e.g. "NVIDIA H100 80GB
    HBM3 MIG 1g.10gb"): compute by the slice's SMs over the whole GPU's (``sm_count`` as nsys
    recorded it), else by its compute slices over 7; memory bandwidth by its memory over the
    GPU's (the number before "GB" in the name, else the largest 7g profile's). NVIDIA Multi-Instance
    GPU User Guide: a slice gets its share of SMs and of memory controllers. Unchanged otherwise."""
    match = MIG.search(name or "")
    if not match:
        return peaks
    g, slice_gb = int(match.group(1)), int(match.group(2))
    full_sms = next((n for pattern, n in FULL_SMS if re.search(pattern, name, re.IGNORECASE)), None)
    compute = sm_count / full_sms if sm_count and full_sms and sm_count <= full_sms else g / 7
    found = re.search(r"(\d+)\s*GB(?!\w)", name[:match.start()], re.IGNORECASE)
    total = int(found.group(1)) if found else next(
        (gb for pattern, gb in FULL_MEMORY_GB if re.search(pattern, name, re.IGNORECASE)), None)
    memory = min(slice_gb / total, 1.0) if total else None
    how = (f"MIG slice {match.group(1)}g.{match.group(2)}gb: compute peaks x {compute:.3f} "
           f"({f'{sm_count} of {full_sms} SMs' if sm_count and full_sms and sm_count <= full_sms else f'{g} of 7 slices'}), "
           + (f"bandwidth x {memory:.3f} ({slice_gb} of {total} GB)" if memory else "bandwidth unscaled (GPU memory unknown)"))
    return DevicePeaks(name=peaks.name, sm_count=peaks.sm_count,
                       bandwidth=peaks.bandwidth * (memory or 1.0),
                       flops={k: v * compute for k, v in peaks.flops.items()},
                       source=f"{peaks.source}; {how} (NVIDIA MIG User Guide)", launch_overhead_ns=peaks.launch_overhead_ns)


def lookup(name: str, sm_count: int = 0, nsys_bandwidth: float | None = None) -> DevicePeaks:
    """Peaks for the GPU called ``name`` (as nsys records it, e.g. "NVIDIA H200"); a MIG slice's
    are scaled to it (:func:`mig_slice`)."""
    for pattern, bw, flops, source in DATASHEET:
        if re.search(pattern, name or "", re.IGNORECASE):
            whole = DevicePeaks(name=name, sm_count=sm_count, bandwidth=bw, flops=dict(flops), source=f"datasheet: {source}")
            return mig_slice(name, sm_count, whole)
    return DevicePeaks(name=name or "unknown GPU", sm_count=sm_count, bandwidth=float(nsys_bandwidth or 0.0),
                       source="nsys TARGET_INFO_GPU.memoryBandwidth (GPU not in the datasheet table; compute peaks unknown)")


def main_device(kernels: pd.DataFrame, devices: pd.DataFrame, warnings: list[str]) -> pd.Series:
    """The ``devices`` row of the GPU that ran the most kernel time (an empty Series when none is known)."""
    # The GPU that ran most of the kernels sets the peaks (TARGET_INFO_GPU lists every GPU present).
    by_device = kernels.groupby("device_id")["duration_ns"].sum()
    if by_device.empty:  # no kernel names its device (a damaged export): the first GPU listed
        warnings.append("no kernel records its device; peaks are those of the first GPU the export lists")
    main_device = by_device.idxmax() if not by_device.empty else (devices["device_id"].iloc[0] if not devices.empty else None)
    if kernels["device_id"].nunique() > 1:
        warnings.append(f"kernels ran on {kernels['device_id'].nunique()} GPUs; peaks are those of device {main_device}")
    dev_rows = devices[devices["device_id"] == main_device] if not devices.empty else devices
    return dev_rows.iloc[0] if not dev_rows.empty else (devices.iloc[0] if not devices.empty else pd.Series(dtype=object))


def device_peaks(dev: pd.Series, calibration: dict | None, warnings: list[str]) -> DevicePeaks:
    """The datasheet peaks of the main GPU ``dev``, measured ones where ``calibration`` is of that GPU."""
    found = lookup(str(dev.get("name", "")), int(dev.get("sm_count", 0) or 0),
                   dev.get("memory_bandwidth_bytes_per_s"))
    if "MIG slice" in found.source:
        warnings.append(f"ran on a MIG slice ({found.name}): {found.source.split('; ', 1)[-1]}")
    if calibration and calibration.get("gpu") == found.name:
        found = with_calibration(found, calibration)
    elif calibration:
        warnings.append(f"calibration of {calibration.get('gpu')} ignored: the capture ran on {found.name}")
    l2 = dev.get("l2_cache_bytes")  # nsys TARGET_INFO_GPU.l2CacheSize
    return dataclasses.replace(found, l2_bytes=float(l2)) if pd.notna(l2) and float(l2) > 0 else found
