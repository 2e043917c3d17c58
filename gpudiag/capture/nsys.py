"""Locating Nsight Systems and building its command lines.

Search order for the ``nsys`` executable (first hit wins): ``--nsys PATH``, ``$GPUDIAG_NSYS``,
``PATH``, then the known install folders in :data:`KNOWN_GLOBS` (the Nsight Compute bundle ships
an ``nsys`` too, which is the only one on some images).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import sys
from pathlib import Path

KNOWN_GLOBS = (
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
    "/usr/local/cuda/bin/nsys",
    "/usr/local/cuda-*/bin/nsys",
    "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
)

INSTALL_HINT = ("install Nsight Systems (https://developer.nvidia.com/nsight-systems, or the "
                "'nsight-systems-cli' apt package) or point at it with --nsys PATH or $GPUDIAG_NSYS")


class ToolNotFound(RuntimeError):
    """An external tool (nsys) could not be located; the message says how to fix it."""


def _version_key(path: str) -> list:
    """Sort key comparing the numbers in a path numerically (2024.10 after 2024.6)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]


def locate_tool(tool: str, explicit: tuple[tuple[str | None, str], ...], known_globs: tuple[str, ...],
                hint: str, description: str) -> Path:
    """First hit of: the ``explicit`` (value, origin) pairs (which must be executable files), PATH,
    then ``known_globs`` (newest version first). Raises :class:`ToolNotFound` naming ``hint``."""
    for candidate, origin in explicit:
        if candidate:
            path = Path(candidate)
            if path.is_file() and os.access(path, os.X_OK):
                return path.absolute()  # "./nsys" would become "nsys", which Popen looks up on PATH
            raise ToolNotFound(f"{origin} {candidate}: not an executable file; {hint}")
    found = shutil.which(tool)
    if found:
        return Path(found)
    for pattern in known_globs:
        hits = sorted(glob.glob(pattern), key=_version_key)
        if hits:
            return Path(hits[-1])  # newest version sorts last
    raise ToolNotFound(f"{tool} ({description}) not found; {hint}")


def locate_nsys(explicit: str | None = None) -> Path:
    """Path of the nsys executable. Raises :class:`ToolNotFound` with an install hint."""
    return locate_tool("nsys", ((explicit, "--nsys"), (os.environ.get("GPUDIAG_NSYS"), "$GPUDIAG_NSYS")),
                       KNOWN_GLOBS, INSTALL_HINT, "Nsight Systems")


def profile_command(nsys: Path, report_base: Path, launcher_args: list[str], capture_range: bool = False) -> list[str]:
    """``nsys profile`` command line tracing CUDA (graphs per node) and NVTX.

    OS runtime calls (``osrt``), CPU sampling and context switches are not traced: gpudiag reads
    none of them. Sampling and context switches dominate export size; ``osrt`` doubled the
    profiler's inflation of a UNet training step on an H100 (1.0 % against 0.56 %, two interleaved
    runs each) and traced every DataLoader worker's system calls (docs/scale.md, "gpudiag profile
    end to end"). ``report_base`` has no extension; nsys appends ``.nsys-rep``. With ``capture_range``
    nsys records only between the launcher's ``cudaProfilerStart`` and ``cudaProfilerStop``
    (``--capture-range=cudaProfilerApi``; ``--capture-range-end=stop`` lets the application run
    on after the stop instead of being killed, as the default ``stop-shutdown`` would)."""
    window = ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"] if capture_range else []
    return [
        str(nsys), "profile",
        "--trace=cuda,nvtx",
        "--cuda-graph-trace=node",
        "--sample=none", "--cpuctxsw=none",
        "--force-overwrite=true",
        *window,
        "--output", str(report_base),
        sys.executable, "-m", "gpudiag.capture.launch", *launcher_args,
    ]


def export_command(nsys: Path, report: Path, sqlite_path: Path) -> list[str]:
    """``nsys export`` command writing the SQLite export of ``report`` to ``sqlite_path``."""
    return [str(nsys), "export", "--type", "sqlite", "--force-overwrite", "true",
            "--output", str(sqlite_path), str(report)]
