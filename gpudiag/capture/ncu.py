"""Locating Nsight Compute and building its command line for ``gpudiag profile --ncu``.

The ncu pass re-runs the script through the same launcher and replays, on the detail step only
(NVTX filter on gpudiag's ``gpudiag:step N`` start/end range), the kernels whose demangled names
are among the top ones of the nsys pass. It collects ``--set roofline`` (FLOP counters per
precision, tensor-core ops, DRAM bytes) plus LaunchStats and Occupancy, with
``--clock-control none`` so kernels run at the clocks the nsys pass saw.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from gpudiag import nvtx_names
from gpudiag.capture.nsys import locate_tool

KNOWN_GLOBS = ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu")
INSTALL_HINT = ("install Nsight Compute (https://developer.nvidia.com/nsight-compute, part of the CUDA toolkit) "
                "or point at it with $GPUDIAG_NCU")
# ncu prints this when the driver restricts performance counters to administrators.
PERMISSION_ERROR = "ERR_NVGPUCTRPERM"
PERMISSION_HINT = ("Nsight Compute may not read the GPU's performance counters (ERR_NVGPUCTRPERM): run as root, or "
                   "allow all users (modprobe nvidia NVreg_RestrictProfilingToAdminUsers=0; see "
                   "https://developer.nvidia.com/ERR_NVGPUCTRPERM); the report uses nsys data alone")

# Beyond the roofline set: local-memory traffic (register spills) and global-load coalescing
# (sectors per request: 4 for a warp reading consecutive 4-byte words, 16 for 16-byte vectors).
EXTRA_METRICS = ("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,"
                 "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,"
                 "sm__maximum_warps_per_active_cycle_pct")

_REGEX_SPECIAL = re.compile(r"([\\^$.|?*+()\[\]{}])")


def locate_ncu() -> Path:
    """Path of the ncu executable ($GPUDIAG_NCU, PATH, known install folders). Raises ToolNotFound."""
    return locate_tool("ncu", ((os.environ.get("GPUDIAG_NCU"), "$GPUDIAG_NCU"),), KNOWN_GLOBS, INSTALL_HINT,
                       "Nsight Compute")


def name_regex(names: list[str]) -> str:
    """``regex:`` filter matching exactly these demangled kernel names (only regex metacharacters
    are escaped: ncu's regex engine need not accept escaped spaces)."""
    return "regex:^(" + "|".join(_REGEX_SPECIAL.sub(r"\\\1", n) for n in names) + ")$"


def profile_command(ncu: Path, report_base: Path, detail_step: int, kernel_names: list[str],
                    max_kernels: int, launcher_args: list[str]) -> list[str]:
    """``ncu`` command line profiling the named kernels of the detail step (at most
    ``max_kernels`` launches). ``report_base`` has no extension; ncu appends ``.ncu-rep``."""
    return [
        str(ncu), "--target-processes", "all", "--clock-control", "none",
        "--set", "roofline", "--section", "LaunchStats", "--section", "Occupancy", "--metrics", EXTRA_METRICS,
        "--nvtx", "--nvtx-include", f"{nvtx_names.STEP}{detail_step}",
        "--kernel-name-base", "demangled", "--kernel-name", name_regex(kernel_names),
        "--launch-count", str(max_kernels), "-f", "-o", str(report_base),
        sys.executable, "-m", "gpudiag.capture.launch", *launcher_args,
    ]
