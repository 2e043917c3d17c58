"""The step window: which steps a run traces and times, and where it stops the script.

``gpudiag profile --steps N`` measures N steps after the warm-up. In the profiled run the capture
range opens at the warm-up's last step (``cudaProfilerStart``, read by nsys
``--capture-range=cudaProfilerApi``) and closes after the window's last step (``cudaProfilerStop``),
so model construction, compile warm-up and data loading before it are not traced. After the window
the launcher ends the script by raising :class:`WindowComplete`, a ``SystemExit(0)`` that runs the
script's ``finally`` blocks and context managers as a normal exit does; with ``--run-to-end`` the
script keeps running, untraced, and its later steps are neither timed nor recorded.

It also keeps the value each step called ``backward()`` on (the loss), without waiting for the
GPU: the tensor is kept and read once, after the script ends. The trials compare it between the
baseline and a changed run (:mod:`gpudiag.trials.results`).
"""

from __future__ import annotations

import sys
import time


def release_process_group() -> None:
    """Destroy torch.distributed's default process group, if the script made one and left it: for a
    script gpudiag ended at its window's end, called after the script's own ``finally`` blocks and
    before the interpreter exits. Without it a gloo rank often aborts at exit ("terminate called
    without an active exception", SIGABRT: 4 of 10 two-rank CPU jobs that never destroy their group,
    0 of 10 that do; torch 2.13, this CPU machine, 2026-11-29), torchrun then reports the job failed,
    and a trial run of it read as failed. Nothing after the window is measured. Raises nothing."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the script has ended; its teardown is not ours to break
        pass


class WindowComplete(SystemExit):
    """Raised at the end of the window's last step: ends the script with exit code 0."""

    def __init__(self, steps: int) -> None:
        super().__init__(0)
        self.steps = steps


class Window:
    """Per-process window bookkeeping, driven by the instrumentation's step boundaries.

    ``config``: the run's :class:`~gpudiag.capture.config.CaptureConfig` (``warmup_steps``,
    ``window_steps``, ``run_to_end``, ``capture_range``)."""

    MAX_LOSSES = 1000  # a --steps 0 run of a long script keeps at most this many loss tensors

    def __init__(self, config) -> None:
        self.config = config
        self.closed = False  # the window's last step has ended
        self.capture_started_step: int | None = None
        self.capture_stopped = False
        self.window_start_unix_s: float | None = None  # when the first measured step opened
        self.created_ns = time.perf_counter_ns()  # the launcher's start, before the script's first line
        self.startup_ns: int | None = None  # from the launcher's start to step 0's opening
        self.warmup_ns: int | None = None  # from step 0's opening to the first measured step's
        self.losses: dict[int, object] = {}  # step -> the detached scalar backward() was called on
        self.backward_calls: dict[int, int] = {}  # step -> backward() calls (gradient accumulation: > 1)
        self.outputs: dict[int, object] = {}  # step -> a sample of an inference step's first output
        self.root_parameters: dict | None = None  # forward/generate steps: the stepping module's weights
        self.first_input_shape: list[int] | None = None  # of the tensor samples_per_step was read from
        self.samples_per_step: int | None = None  # gpudiag.step(samples=N), else the first input's batch
        self._batch_hook = None

    # -- capture range --------------------------------------------------------------------------
    def step_opening(self, step: int) -> None:
        """Called as step ``step`` is about to open (before its NVTX range)."""
        now = time.perf_counter_ns()
        if step == 0:
            self.startup_ns = now - self.created_ns
        if step == self.config.warmup_steps:
            self.window_start_unix_s = time.time()
            if self.startup_ns is not None:
                self.warmup_ns = now - self.created_ns - self.startup_ns
        if self.config.capture_range and self.capture_started_step is None and step >= self.config.capture_start_step:
            if _profiler("start"):
                self.capture_started_step = step

    def stop_capture(self) -> None:
        """``cudaProfilerStop`` after the GPU has finished (the last kernels land in the capture)."""
        if self.capture_started_step is not None and not self.capture_stopped:
            self.capture_stopped = _profiler("stop")

    # -- end of the window ----------------------------------------------------------------------
    def step_closed(self, step: int) -> bool:
        """True when ``step`` was the window's last: the caller opens no further step."""
        last = self.config.last_window_step
        self.closed = last is not None and step >= last
        return self.closed

    def close(self, state) -> None:
        """After the window's last step: stop the capture, stop recording, and end the script
        (raises :class:`WindowComplete`) unless ``run_to_end``."""
        self.stop_capture()
        from gpudiag.capture.op_ranges import NullNvtx

        state.nvtx = NullNvtx()  # --run-to-end: the rest of the script adds no ranges
        if not self.config.run_to_end:
            raise WindowComplete(state.steps_completed)

    # -- losses ---------------------------------------------------------------------------------
    def record_loss(self, step: int, tensors) -> None:
        """Keep the scalar ``backward()`` was called on in ``step`` (the first such call of the
        step); a non-scalar (a gradient given) is not kept."""
        if not self.closed and step >= 0:
            self.backward_calls[step] = self.backward_calls.get(step, 0) + 1
        if self.closed or step in self.losses or len(self.losses) >= self.MAX_LOSSES:
            return
        tensor = tensors[0] if isinstance(tensors, (tuple, list)) and tensors else tensors
        if getattr(tensor, "numel", None) is not None and tensor.numel() == 1:
            # A copy: a CUDA graph's output is overwritten by the next replay (reduce-overhead
            # compile: every kept loss read back as the last step's on the H100). One scalar copy
            # kernel per step, the same in the baseline and every trial.
            self.losses[step] = tensor.detach().clone()

    def loss_values(self) -> dict[str, float]:
        """The kept losses as floats (one device-to-host copy each, after the script ended)."""
        values = {}
        for step, tensor in sorted(self.losses.items()):
            try:
                values[str(step)] = float(tensor.float().item())
            except RuntimeError:  # a CUDA error at the end of a crashed script: keep the others
                continue
        return values

    # -- outputs (inference) ----------------------------------------------------------------------
    OUTPUT_STEPS = (1, 2, 3)  # the steps whose output is kept: the first after step 0 (see trials.results)
    OUTPUT_SAMPLE = 1024  # elements kept per output: evenly strided over the flattened tensor

    def record_output(self, step: int, output) -> None:
        """Keep a strided sample (fp32 copy) of the first floating-point tensor of an outermost
        forward's ``output`` (a tensor, tuple, or dict such as a Hugging Face ModelOutput) in the
        steps of :data:`OUTPUT_STEPS`, first call of the step only. Inference has no loss: the
        trials compare these instead. Two small copy kernels per kept step, in bare runs only."""
        if self.closed or step not in self.OUTPUT_STEPS or step in self.outputs:
            return
        tensor = _first_float_tensor(output)
        if tensor is not None:
            flat = tensor.detach().reshape(-1)
            stride = max(1, flat.numel() // self.OUTPUT_SAMPLE)
            self.outputs[step] = flat[::stride][: self.OUTPUT_SAMPLE].float().clone()

    def output_values(self) -> dict[str, list[float]]:
        values = {}
        for step, tensor in sorted(self.outputs.items()):
            try:
                values[str(step)] = [float(v) for v in tensor.cpu().tolist()]
            except RuntimeError:
                continue
        return values

    # -- samples per step --------------------------------------------------------------------------
    def watch_batch(self, nn_module, torch) -> None:
        """Take the samples per step from dimension 0 of the first tensor passed positionally to a
        module (a model called with keyword arguments passes its input to a submodule, e.g. the
        embedding, positionally): a global forward pre-hook that removes itself once it found one
        (or after 1000 calls). A sequence-first input (``nn.LSTM`` without ``batch_first``) is
        misread; ``gpudiag.step(samples=N)`` overrides it."""
        from gpudiag.capture import model_modules

        calls = [0]

        def hook(module, args):
            if torch.compiler.is_compiling():  # first: Dynamo must trace nothing of gpudiag's state
                return
            if model_modules.is_data_transform(module):  # a transform's input is one sample, not a batch
                return
            calls[0] += 1
            first = next((a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 1), None)
            if first is not None and first.device.type != "cuda" and not model_modules.is_model(module):
                first = None  # a CPU tensor passed to a module without the model's state: the data pipeline's
            if first is not None and self.samples_per_step is None:
                self.samples_per_step = int(first.shape[0])
                self.first_input_shape = [int(d) for d in first.shape]
            if (first is not None or calls[0] >= 1000) and self._batch_hook is not None:
                self._batch_hook.remove()
                self._batch_hook = None

        self._batch_hook = nn_module.register_module_forward_pre_hook(hook)

    def unwatch_batch(self) -> None:
        """Remove the samples-per-step hook (in a forked child: not gpudiag's process)."""
        if self._batch_hook is not None:
            self._batch_hook.remove()
            self._batch_hook = None

    def summary(self) -> dict:
        """The status entries of the window (merged into the launcher's status)."""
        return {"window_steps": self.config.window_steps, "window_complete": self.closed,
                "run_to_end": self.config.run_to_end, "capture_range": self.config.capture_range,
                "capture_started_step": self.capture_started_step, "window_start_unix_s": self.window_start_unix_s,
                "samples_per_step": self.samples_per_step, "startup_ns": self.startup_ns,
                "warmup_ns": self.warmup_ns, "losses": self.loss_values(), "outputs": self.output_values(),
                "root_parameters": self.root_parameters, "first_input_shape": self.first_input_shape,
                "backward_calls": {str(k): v for k, v in sorted(self.backward_calls.items())[:self.MAX_LOSSES]}}


def _first_float_tensor(value, depth: int = 0):
    """The first floating-point tensor in ``value`` (a tensor, tuple/list or dict), or None."""
    import torch

    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() and value.numel() else None
    if depth > 3:
        return None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    for item in items:
        found = _first_float_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def _profiler(action: str) -> bool:
    """``cudaProfilerStart`` / ``cudaProfilerStop`` (after a synchronize, for stop) where CUDA is
    in use; False where it is not (a CPU run: there is nothing to capture)."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return False
    if action == "stop":
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    else:
        torch.cuda.profiler.start()
    return True
