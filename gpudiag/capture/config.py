"""The options of one capture (:class:`CaptureConfig`), written by the parent (``gpudiag profile``,
the trials' runner) and read in the profiled process by the launcher and the ranks' start-up hook."""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class CaptureConfig:
    """Options of one capture, passed from ``gpudiag profile`` to the launcher as JSON.

    steps_from: ``"auto"`` (``gpudiag.step()`` calls if the script makes them, else
        ``optimizer.step()``), ``"optimizer"``, ``"call"`` or ``"nvtx:REGEX"``.
    detail_step: index of the step recorded with per-op ranges; None means ``warmup_steps``.
    module_ranges / op_ranges: switch the module and op ranges off (to measure their overhead).
    bare: the representativeness run: no NVTX, no module or backward hooks, no peak-memory reads;
        only the step boundaries, where (as in every run) host wall-clock time and a CUDA event are
        recorded (no synchronization added; see :func:`gpudiag.capture.steps_core.step_gpu_times`).
    trial / change_modules: a change applied in the process before the script runs (bare runs
        only), looked up in :mod:`gpudiag.capture.trial_changes`, which the modules named in
        ``change_modules`` fill when the profiled process imports them (the trials' own,
        ``gpudiag.trials.changes``, set by the trials' runner).
    """

    steps_from: str = "auto"
    warmup_steps: int = 2
    detail_step: int | None = None
    module_ranges: bool = True
    op_ranges: bool = True
    bare: bool = False
    window_steps: int | None = None  # measured steps after warm-up; None: the whole script
    run_to_end: bool = False  # after the window: keep the script running, untraced and untimed
    capture_range: bool = False  # nsys --capture-range=cudaProfilerApi: cudaProfilerStart/Stop at the window
    trial: str | None = None  # the name of a change registered in gpudiag.capture.trial_changes
    change_modules: list[str] = field(default_factory=list)  # modules that register changes, imported by name

    @property
    def last_window_step(self) -> int | None:
        """Index of the window's last step, None without a window."""
        return None if self.window_steps is None else self.warmup_steps + self.window_steps - 1

    @property
    def capture_start_step(self) -> int:
        """The step at which the capture range opens: the warm-up's last step (its end is where
        the first measured step's GPU window starts), or step 0 without warm-up."""
        return max(self.warmup_steps - 1, 0)

    @property
    def effective_detail_step(self) -> int:
        """The index of the step recorded with per-op ranges (``detail_step``, else the first
        measured step)."""
        return self.warmup_steps if self.detail_step is None else self.detail_step

    def to_json(self) -> str:
        """The config as a JSON object (the launcher's ``--config``)."""
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> "CaptureConfig":
        """The config :meth:`to_json` wrote (missing keys take their defaults)."""
        return cls(**json.loads(text))
