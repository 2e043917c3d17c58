"""The step-boundary core of the capture: the state of one instrumented process and the few
operations every step source goes through.

The step sources, each in its own module, decide *when* a step begins or ends; this module is
*what* happens there (one NVTX step range, the window's capture range and end, host time and a
CUDA event, the detail step's op ranges, the peak memory):

- the optimizer and ``backward()`` (:mod:`gpudiag.capture.training_steps`);
- outermost module forwards, Hugging Face ``generate()`` and ``--steps-from call:`` targets
  (:mod:`gpudiag.capture.call_steps`);
- the user's own NVTX step ranges (:mod:`gpudiag.capture.user_ranges`);
- ``gpudiag.step()`` and the module forward hooks (:mod:`gpudiag.capture.instrument`, which
  installs them all and makes the state live).

The interface: :class:`CaptureState`; :func:`current` / :func:`activate` / :func:`release` /
:func:`owns` for the process's live state; :func:`open_step`, :func:`close_step`,
:func:`step_boundary`, :func:`ensure_step_open`; :func:`record_event`,
:func:`start_op_ranges_if_detail`, :func:`stop_op_ranges`; :func:`step_wall_times` and
:func:`step_gpu_times` for the status. This module imports no other step source, so none of
them imports another (no circle among the capture modules).
"""

from __future__ import annotations

import re
import threading
import time
import weakref
from dataclasses import dataclass, field

from gpudiag import nvtx_names
from gpudiag.capture.config import CaptureConfig
from gpudiag.capture.op_ranges import make_op_mode


@dataclass
class CaptureState:
    """What the instrumentation of one process knows: the open step, the step times, the window
    (:class:`gpudiag.capture.window.Window`) and the step sources' own bookkeeping. Times in ns
    (``time.perf_counter_ns``)."""

    config: CaptureConfig
    nvtx: object
    step_index: int = -1  # index of the open step, -1 before the first
    step_range: object = None
    step_mode: str = "optimizer"
    step_regex: re.Pattern | None = None
    auto_nvtx: bool = False  # auto mode: the user's step ranges become the steps if they come first
    op_mode: object = None
    module_names: "weakref.WeakKeyDictionary" = field(default_factory=weakref.WeakKeyDictionary)
    steps_completed: int = 0
    peak_memory_bytes: dict = field(default_factory=dict)  # step -> torch.cuda.max_memory_allocated()
    autocast_dtype: str | None = None  # CUDA autocast at the first module forward: "bfloat16", "float16" or "off"
    step_start_ns: dict = field(default_factory=dict)  # step -> host perf_counter_ns at its start (nvtx mode)
    step_end_ns: dict = field(default_factory=dict)  # step -> host perf_counter_ns at its end
    step_start_event: dict = field(default_factory=dict)  # step -> CUDA event recorded at its start (nvtx mode)
    step_end_event: dict = field(default_factory=dict)  # step -> CUDA event recorded at its end
    window: object = None  # gpudiag.capture.window.Window: capture range, end of the window, losses
    call_steps: object = None  # gpudiag.capture.call_steps.CallSteps: forward / generate steps
    module_hooks: list = field(default_factory=list)  # handles of the two global forward hooks
    step_open_callbacks: list = field(default_factory=list)  # called with the step index as each step opens
    optimizer_seen: bool = False  # an optimizer was constructed (auto mode then prefers its steps)
    optimizers_built: "weakref.WeakSet" = field(default_factory=weakref.WeakSet)  # live optimizers built
    optimizers_stepped: "weakref.WeakSet" = field(default_factory=weakref.WeakSet)  # optimizers that stepped
    steps_waiting: int = 0  # optimizer steps seen while an optimizer built had not stepped yet
    last_new_optimizer: object = None  # weak ref to the optimizer that stepped first time last
    optimizer_calls: dict = field(default_factory=dict)  # step -> optimizer.step() calls in it
    backward_outside_closures: dict = field(default_factory=dict)  # step -> backward() calls outside closures
    closure_calls: dict = field(default_factory=dict)  # step -> closures optimizer.step() evaluated
    closure_backward_calls: dict = field(default_factory=dict)  # step -> backward() calls inside them
    closure_depth: int = 0  # > 0 while a closure given to optimizer.step() runs
    optimizer_depth: int = 0  # optimizer phase ranges open (a wrapper optimizer's step holds its inner one's)
    lock: threading.Lock = field(default_factory=threading.Lock)


_state: CaptureState | None = None  # this process's live state; None before install, after finish, in a fork


def current() -> CaptureState | None:
    """This process's live capture state, or None (no capture, finished, or a forked child)."""
    return _state


def activate(state: CaptureState) -> None:
    """Make ``state`` this process's live state (:func:`gpudiag.capture.instrument.install`)."""
    global _state
    _state = state


def release() -> CaptureState | None:
    """Drop the live state (at the end, or in a forked child); returns the one dropped."""
    global _state
    state, _state = _state, None
    return state


def owns(state) -> bool:
    """Whether ``state`` is this process's live capture state (False after finish, and in a
    forked child): closures holding a state check it before they act."""
    return state is not None and state is _state


def compiling() -> bool:
    """True while Dynamo traces (``torch.compiler.is_compiling``): every hook returns at once there,
    so gpudiag stays out of compiled code (no graph break, no guard on its state)."""
    import torch

    return torch.compiler.is_compiling()


# ---- op ranges -------------------------------------------------------------------------------------

def start_op_ranges_if_detail(state: CaptureState) -> None:
    """Enter the op-range dispatch mode when the step just opened is the detail step."""
    if state.config.op_ranges and state.step_index == state.config.effective_detail_step:
        state.op_mode = make_op_mode(state.nvtx)
        state.op_mode.__enter__()


def stop_op_ranges(state: CaptureState) -> None:
    """Leave the op-range dispatch mode, if it is on."""
    if state.op_mode is not None:
        state.op_mode.__exit__(None, None, None)
        state.op_mode = None


# ---- boundaries ------------------------------------------------------------------------------------

def record_event(events: dict, step: int) -> None:
    """Record (never wait on) a CUDA timing event on the current stream at a step boundary, into
    ``events[step]``: the GPU time between two boundaries is the step time even when the host runs
    ahead of the GPU, which host wall-clock time between boundaries is not (measured on the H100: a
    GPT-2 decode loop replaying a CUDA graph per token issued steps every 0.11 ms that took 1.5 ms
    on the GPU). Nothing without CUDA."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        events[step] = event


def announce_step(state: CaptureState) -> None:
    """Run the callbacks registered for each step's opening (a trial's change, e.g. the CUDA-graph
    step mark) with the index of the step just opened."""
    for callback in state.step_open_callbacks:
        callback(state.step_index)


def open_step(state: CaptureState) -> None:
    """Open the next step: the window's capture range first, then the step's NVTX range, then the
    op ranges on the detail step. Call with ``state.lock`` held."""
    state.step_index += 1
    state.window.step_opening(state.step_index)  # the capture range opens before the step's range
    announce_step(state)
    state.step_range = state.nvtx.start(f"{nvtx_names.STEP}{state.step_index}")
    start_op_ranges_if_detail(state)


def _record_peak_memory(state: CaptureState) -> None:
    """Peak bytes allocated by PyTorch's CUDA allocator during the step now ending; resets the peak."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state.peak_memory_bytes[state.step_index] = int(torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()


def close_step(state: CaptureState) -> None:
    """End the open step: its end time (ns) and CUDA event, the op ranges, the peak memory (not in
    the bare run) and its NVTX range. Call with ``state.lock`` held."""
    state.step_end_ns[state.step_index] = time.perf_counter_ns()
    record_event(state.step_end_event, state.step_index)
    stop_op_ranges(state)
    if not state.config.bare:  # ~100 µs a call on an H100 (a full memory_stats()): not in the bare run
        _record_peak_memory(state)
    if state.step_range is not None:
        state.nvtx.end(state.step_range)
        state.step_range = None
        state.steps_completed += 1


def step_boundary() -> None:
    """End the open step and open the next one (at ``optimizer.step()``, ``gpudiag.step()``, a
    forward or ``generate()`` call); at the window's end, end the script (the window's
    ``WindowComplete``) unless ``--run-to-end``."""
    state = _state
    if state is None or state.window.closed:
        return
    with state.lock:
        if state.step_range is None and state.step_index == -1:
            return  # a boundary before any forward: nothing measured yet
        close_step(state)
        done = state.window.step_closed(state.step_index)
        if not done:
            open_step(state)
    if done:
        state.window.close(state)  # raises WindowComplete unless --run-to-end


def ensure_step_open() -> None:
    """Open step 0 if no step is open yet, in the optimizer and call modes (the first top-level
    forward, ``backward()`` or optimizer step); forward and generate steps open at their own calls
    (:mod:`gpudiag.capture.call_steps`)."""
    state = _state
    if state is not None and state.step_mode in ("optimizer", "call") and state.step_index == -1 \
            and not state.window.closed:
        with state.lock:
            if state.step_index == -1:
                open_step(state)


# ---- step times ------------------------------------------------------------------------------------

def step_wall_times(state: CaptureState) -> dict[str, int]:
    """Host wall-clock time of each completed step in ns, by step index (as a string, for JSON).

    Steps from boundaries (optimizer.step(), gpudiag.step()): step k lasts from boundary k-1 to
    boundary k, so step 0 (opened at a first forward the bare run does not hook) has none. Steps
    from the user's NVTX ranges: each range's own push-to-pop time."""
    ends = state.step_end_ns
    if state.step_mode == "nvtx":
        return {str(k): ends[k] - state.step_start_ns[k] for k in sorted(ends) if k in state.step_start_ns}
    return {str(k): ends[k] - ends[k - 1] for k in sorted(ends) if k - 1 in ends}


def step_gpu_times(state: CaptureState) -> dict[str, int]:
    """GPU time of each completed step in ns (CUDA events at its boundaries), by step index as a
    string; like :func:`step_wall_times` for which steps have one. Synchronizes once (the script
    has ended). {} without CUDA."""
    ends, starts = state.step_end_event, state.step_start_event
    pairs = ({k: (starts[k], ends[k]) for k in ends if k in starts} if state.step_mode == "nvtx"
             else {k: (ends[k - 1], ends[k]) for k in ends if k - 1 in ends})
    if not pairs:
        return {}
    import torch

    torch.cuda.synchronize()
    return {str(k): int(round(a.elapsed_time(b) * 1e6)) for k, (a, b) in sorted(pairs.items())}
