"""NVTX instrumentation injected into the user's process, without editing the user's script.

What it adds (texts defined in :mod:`gpudiag.nvtx_names`):

- one NVTX start/end range per step. A step ends at ``optimizer.step()`` (global optimizer step
  post-hook), at a ``gpudiag.step()`` call, or, with ``steps_from="nvtx:REGEX"``, steps are the
  user's own ranges and none are injected. Step 0 opens at the first top-level module forward;
  step k+1 opens where step k ends, so input-pipeline time between iterations belongs to a step.
- one push/pop range per ``nn.Module`` forward, named by its qualified path (global forward hooks);
- push/pop phase ranges around ``torch.autograd.backward`` and ``optimizer.step()``;
- on the detail step only, one range per aten op with input/output shapes and dtypes
  (a ``TorchDispatchMode``; it also sees backward ops on autograd threads).

At each step boundary it also records the host wall-clock time and a CUDA event (never waited
on), the step times the representativeness check compares with the bare run's. Inside
``torch.compile``d code every hook is a no-op (see :func:`_compiling`).

The NVTX calls go through a tiny backend object (:mod:`gpudiag.capture.op_ranges`, with the op
ranges' texts) so tests can record them on a CPU-only torch.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field

from gpudiag import nvtx_names
from gpudiag.capture import ddp_watch, dynamo_stats, model_modules
from gpudiag.capture.op_ranges import NullNvtx, _make_op_mode, default_nvtx
from gpudiag.capture.call_steps import CallSteps, generate_summary, wrap_call_target
from gpudiag.capture.user_ranges import wrap_user_nvtx
from gpudiag.capture.window import Window

# In auto mode, the user's ranges that are steps: text starting with step/iteration/iter ("step 3",
# "iteration_3"), stricter than the analysis's default (gpudiag.analysis.attribution.ranges), which also
# takes "train_step": at run time a nested "optimizer_step" must not become the step.
AUTO_USER_STEP_REGEX = r"(?i)^\s*(?:step|iteration|iter)(?:[^a-z]|$)"
# Optimizer steps before the first step boundary while an optimizer built has not stepped (one
# built and never used): gpudiag's choice, as call_steps.OPTIMIZER_PATIENCE.
OPTIMIZER_PATIENCE = 64


@dataclass
class CaptureConfig:
    """Options of one capture, passed from ``gpudiag profile`` to the launcher as JSON.

    steps_from: ``"auto"`` (``gpudiag.step()`` calls if the script makes them, else
        ``optimizer.step()``), ``"optimizer"``, ``"call"`` or ``"nvtx:REGEX"``.
    detail_step: index of the step recorded with per-op ranges; None means ``warmup_steps``.
    module_ranges / op_ranges: switch the module and op ranges off (to measure their overhead).
    bare: the representativeness run: no NVTX, no module or backward hooks, no peak-memory reads;
        only the step boundaries, where (as in every run) host wall-clock time and a CUDA event are
        recorded (no synchronization added; see :func:`step_gpu_times`).
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
    trial: str | None = None  # a change applied in the process (gpudiag.trials.changes), bare runs only

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
        return self.warmup_steps if self.detail_step is None else self.detail_step

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> "CaptureConfig":
        return cls(**json.loads(text))


@dataclass
class _State:
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
    lock: threading.Lock = field(default_factory=threading.Lock)


_state: _State | None = None


# ---- steps -------------------------------------------------------------------------------------

def _start_op_ranges_if_detail(state: _State) -> None:
    """Enter the op-range dispatch mode when the step just opened is the detail step."""
    if state.config.op_ranges and state.step_index == state.config.effective_detail_step:
        state.op_mode = _make_op_mode(state.nvtx)
        state.op_mode.__enter__()


def _stop_op_ranges(state: _State) -> None:
    if state.op_mode is not None:
        state.op_mode.__exit__(None, None, None)
        state.op_mode = None


def _open_step(state: _State) -> None:
    state.step_index += 1
    state.window.step_opening(state.step_index)  # the capture range opens before the step's range
    for callback in state.step_open_callbacks:
        callback(state.step_index)
    state.step_range = state.nvtx.start(f"{nvtx_names.STEP}{state.step_index}")
    _start_op_ranges_if_detail(state)


def _record_event(events: dict, step: int) -> None:
    """Record (never wait on) a CUDA timing event on the current stream at a step boundary: the
    GPU time between two boundaries is the step time even when the host runs ahead of the GPU,
    which host wall-clock time between boundaries is not (measured on the H100: a GPT-2 decode
    loop replaying a CUDA graph per token issued steps every 0.11 ms that took 1.5 ms on the GPU)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        events[step] = event


def step_gpu_times(state: _State) -> dict[str, int]:
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


def _record_peak_memory(state: _State) -> None:
    """Peak bytes allocated by PyTorch's CUDA allocator during the step now ending; resets the peak."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state.peak_memory_bytes[state.step_index] = int(torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()


def _close_step(state: _State) -> None:
    state.step_end_ns[state.step_index] = time.perf_counter_ns()
    _record_event(state.step_end_event, state.step_index)
    _stop_op_ranges(state)
    if not state.config.bare:  # ~100 µs a call on an H100 (a full memory_stats()): not in the bare run
        _record_peak_memory(state)
    if state.step_range is not None:
        state.nvtx.end(state.step_range)
        state.step_range = None
        state.steps_completed += 1


def step_boundary() -> None:
    """End the open step and open the next one (called at ``optimizer.step()`` or ``gpudiag.step()``)."""
    state = _state
    if state is None or state.window.closed:
        return
    with state.lock:
        if state.step_range is None and state.step_index == -1:
            return  # a boundary before any forward: nothing measured yet
        _close_step(state)
        done = state.window.step_closed(state.step_index)
        if not done:
            _open_step(state)
    if done:
        state.window.close(state)  # raises WindowComplete unless --run-to-end


def _ensure_step_open() -> None:
    state = _state
    # forward and generate steps open at their own calls (gpudiag.capture.call_steps)
    if state is not None and state.step_mode in ("optimizer", "call") and state.step_index == -1 \
            and not state.window.closed:
        with state.lock:
            if state.step_index == -1:
                _open_step(state)


def user_step(samples: int | None = None) -> None:
    """Backend of :func:`gpudiag.step`: a step boundary when steps come from calls; ``samples``
    is kept as the run's samples per step."""
    if _state is not None and samples:
        _state.window.samples_per_step = int(samples)
    if _state is not None and _state.step_mode == "call":
        _ensure_step_open()
        step_boundary()


# ---- modules -----------------------------------------------------------------------------------

def _unwrap_compiled(module):
    """The user's model inside a ``torch.compile`` wrapper (OptimizedModule), else ``module``."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is not None and isinstance(module, eval_frame.OptimizedModule):
        return module._orig_mod
    return module


def _module_name(state: _State, module) -> str:
    name = state.module_names.get(module)
    if name is None:
        # Not named yet, so no parent has run: it is a root. Name it and its whole subtree now.
        # torch.compile(model) wraps the model in an OptimizedModule whose only child is
        # `_orig_mod`: name the wrapper as the model itself so paths read as the user wrote them.
        named = _unwrap_compiled(module)
        root = type(named).__name__
        if named is not module:
            state.module_names[module] = root + "|" + root
        for path, sub in named.named_modules():
            if sub not in state.module_names:
                # a compiled submodule's wrapper and its `_orig_mod` share the user's path
                path = re.sub(r"(^|\.)_orig_mod(?=\.|$)", "", path).strip(".")
                state.module_names[sub] = (path or root) + "|" + type(_unwrap_compiled(sub)).__name__
        name = state.module_names[module]
    return name


def _compiling() -> bool:
    """True while Dynamo traces (``torch.compiler.is_compiling``). Dynamo inlines global module
    hooks into the graphs it captures: returning at once there keeps gpudiag out of compiled code
    (no graph break, no guard on gpudiag's state, no recompilation). Module ranges then stay
    outside compiled regions; the kernels inside are attributed through Inductor's provenance."""
    import torch

    return torch.compiler.is_compiling()


def _compiler_artifact(module) -> bool:
    """An FX GraphModule: what torch.compile's eager-running backends (aot_eager, eager) call at
    run time in place of the user's modules. Not a module of the user's: no range of its own."""
    fx = sys.modules.get("torch.fx")
    return fx is not None and isinstance(module, fx.GraphModule)


def _autocast_dtype() -> str:
    """CUDA autocast's dtype where it is on ("bfloat16", "float16"), else "off" (read by the
    GD-FP32-UNDER-AUTOCAST and GD-CUDNN-BENCHMARK rules' evidence)."""
    import torch

    try:
        on = torch.is_autocast_enabled("cuda")
        return str(torch.get_autocast_dtype("cuda")).removeprefix("torch.") if on else "off"
    except (TypeError, AttributeError, RuntimeError):  # torch before 2.4 has no device_type argument
        return "off"


def _cudnn_benchmark() -> bool | None:
    """``torch.backends.cudnn.benchmark`` at exit (None if torch cannot tell): GD-CUDNN-BENCHMARK."""
    try:
        import torch

        return bool(torch.backends.cudnn.benchmark)
    except Exception:  # noqa: BLE001 - the status must be written whatever torch's state
        return None


def _forward_pre_hook(module, args):
    if _compiling():
        return None
    state = _state
    if state is None:
        return None
    if state.config.bare:  # only what step boundaries need: no per-module cost
        if state.call_steps is not None:
            state.call_steps.pre(module)
        return None
    if state.step_index == -1 and model_modules.is_model(module):  # a transform's call opens no step
        _ensure_step_open()
    if state.call_steps is not None:
        state.call_steps.pre(module)
    if state.autocast_dtype is None:  # once: the first forward runs inside the user's autocast region, if any
        state.autocast_dtype = _autocast_dtype()
    if state.config.module_ranges and not _compiler_artifact(module):
        state.nvtx.push(nvtx_names.MODULE + _module_name(state, module))
    return None


def _forward_hook(module, args, output):
    if _compiling():
        return None
    state = _state
    if state is None:
        return None
    if not state.config.bare and state.config.module_ranges and not _compiler_artifact(module):
        state.nvtx.pop()
    if state.call_steps is not None:
        state.call_steps.post(module, output)
    return None


# ---- phases ------------------------------------------------------------------------------------

def _wrap_backward(torch):
    original = torch.autograd.backward

    def backward(*args, **kwargs):
        state = _state
        if state is None or _compiling():
            return original(*args, **kwargs)
        _ensure_step_open()
        _training_seen(state)
        state.window.record_loss(state.step_index, args[0] if args else kwargs.get("tensors"))
        state.nvtx.push(nvtx_names.PHASE + "backward")
        try:
            return original(*args, **kwargs)
        finally:
            state.nvtx.pop()

    backward.__wrapped__ = original
    torch.autograd.backward = backward


def _training_seen(state: _State) -> None:
    """A backward() or optimizer step: training, so steps are the optimizer's. The bare run then
    drops its forward hooks (no per-module cost in the timed steps) unless Dynamo already compiled
    with them: it guards on the global hook dicts, and removing them would compile a second graph."""
    if state.call_steps is None:
        return
    state.call_steps.training_seen()
    if state.config.bare and state.module_hooks and not state.call_steps.counting:
        if "torch._dynamo" not in sys.modules or not dynamo_stats.compile_summary():
            for handle in state.module_hooks:
                handle.remove()
            state.module_hooks = []


def _watch_optimizers(optim_module) -> None:
    """Note that an optimizer exists (``Optimizer.__init__`` wrapped once): in auto mode the
    optimizer's steps are then preferred to forward calls (:meth:`CallSteps._decide`)."""
    cls = optim_module.Optimizer
    if getattr(cls.__init__, "__gpudiag__", False):
        return
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if _state is not None:
            _state.optimizer_seen = True
            _state.optimizers_built.add(self)

    __init__.__gpudiag__ = True
    __init__.__wrapped__ = original
    cls.__init__ = __init__


def _optimizer_pre_hook(optimizer, args, kwargs):
    state = _state
    if state is not None and not _compiling():
        _training_seen(state)
        _ensure_step_open()
        state.nvtx.push(nvtx_names.PHASE + "optimizer")


def _optimizer_post_hook(optimizer, args, kwargs):
    state = _state
    if state is None or _compiling():
        return
    state.nvtx.pop()
    if state.step_mode == "optimizer" and _ends_iteration(state, optimizer):
        step_boundary()


def _ends_iteration(state: _State, optimizer) -> bool:
    """Whether this ``optimizer.step()`` ends a loop iteration: it is the step of the optimizer
    that stepped first time last, once every optimizer built has stepped. With one optimizer, every
    step; a GAN's discriminator then generator (pytorch/examples dcgan: ``optimizerD.step()``,
    ``optimizerG.step()`` per batch) or a critic stepped five times per generator step (WGAN), the
    generator's, so a step is one iteration of the script's loop; a wrapper optimizer (ZeRO,
    Lookahead) whose step runs its inner one's, the wrapper's. An optimizer built and never stepped
    delays the first boundary by :data:`OPTIMIZER_PATIENCE` steps at most."""
    if optimizer not in state.optimizers_stepped:
        state.optimizers_stepped.add(optimizer)
        state.last_new_optimizer = weakref.ref(optimizer)
    if state.last_new_optimizer() is not optimizer:
        return False
    if len(state.optimizers_stepped) < len(state.optimizers_built):  # the first iteration is not over
        state.steps_waiting += 1
        return state.steps_waiting > OPTIMIZER_PATIENCE
    return True


# ---- install / finish --------------------------------------------------------------------------

def detect_step_mode(config: CaptureConfig, script_source: str) -> str:
    """Resolve ``config.steps_from`` to ``"optimizer"``, ``"call"`` or ``"nvtx"``.

    Raises ValueError for an unknown value or an invalid ``nvtx:`` regular expression."""
    value = config.steps_from
    if value == "auto":
        return "call" if re.search(r"\bgpudiag\.step\(|\bfrom gpudiag import step\b", script_source) else "optimizer"
    if value in ("optimizer", "call", "forward", "generate"):
        return value
    if value.startswith("call:"):
        if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+", value[5:]):
            raise ValueError(f"--steps-from {value!r}: use call:package.module.function (or .Class.method)")
        return "call"
    if value.startswith("nvtx:"):
        try:
            re.compile(value[5:])
        except re.error as exc:  # re.error is not a ValueError
            raise ValueError(f"--steps-from {value!r}: invalid regular expression ({exc})") from None
        return "nvtx"
    raise ValueError(f"unknown --steps-from {value!r}: use auto, optimizer, call, call:module.function, forward, "
                     "generate or nvtx:REGEX")


def install(config: CaptureConfig, script_source: str = "", nvtx=None) -> _State:
    """Install the hooks in this process. ``nvtx`` defaults to :func:`default_nvtx`.

    Returns the capture state (steps seen, etc.). Raises ValueError for a bad ``steps_from``."""
    global _state
    import torch
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module

    if config.bare:
        config.module_ranges = config.op_ranges = False
        nvtx = NullNvtx()
    state = _State(config=config, nvtx=nvtx or default_nvtx(), window=Window(config))
    state.step_mode = detect_step_mode(config, script_source)
    if config.steps_from.startswith("call:"):
        wrap_call_target(config.steps_from[5:], user_step)
    if state.step_mode == "nvtx":
        state.step_regex = re.compile(config.steps_from[5:])
        wrap_user_nvtx(state, torch)
    elif config.steps_from == "auto" and state.step_mode == "optimizer":  # user "step N" ranges may be the steps
        state.step_regex, state.auto_nvtx = re.compile(AUTO_USER_STEP_REGEX), True
        wrap_user_nvtx(state, torch)
    _state = state
    # torch warns that global hooks fire once more for a compiled model's OptimizedModule wrapper:
    # gpudiag expects that (the wrapper is named as the model, the inner calls are traced no-ops),
    # and the warning would otherwise appear in the user's output as if their script caused it.
    warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
    if state.step_mode in ("forward", "generate") or (config.steps_from == "auto" and state.step_mode == "optimizer"):
        state.call_steps = CallSteps(state, "auto" if config.steps_from == "auto" else state.step_mode)
    if state.call_steps is not None or not config.bare:  # else the bare run has no per-module cost
        state.module_hooks = [nn_module.register_module_forward_pre_hook(_forward_pre_hook),
                              nn_module.register_module_forward_hook(_forward_hook, always_call=True)]
    _wrap_backward(torch)  # in the bare run too: it records the loss (see Window.record_loss)
    optim_module.register_optimizer_step_pre_hook(_optimizer_pre_hook)
    optim_module.register_optimizer_step_post_hook(_optimizer_post_hook)
    _watch_optimizers(optim_module)
    model_modules.claim()
    model_modules.register_disown(_disown)
    state.window.watch_batch(nn_module, torch)
    ddp_watch.install()
    return state


def _disown() -> None:
    """In a child forked from the instrumented process (a DataLoader worker, a pool's worker):
    drop the state and the global forward hooks, so the child counts no step, adds no range and is
    never ended at the window's end (see :mod:`gpudiag.capture.model_modules`)."""
    global _state
    state, _state = _state, None
    if state is None:
        return
    for handle in state.module_hooks:
        handle.remove()
    state.module_hooks = []
    state.window.unwatch_batch()


def owns(state) -> bool:
    """Whether ``state`` is this process's live capture state (False after :func:`finish`, and in a
    forked child): closures holding a state check it before they act."""
    return state is not None and state is _state


def step_wall_times(state: _State) -> dict[str, int]:
    """Host wall-clock time of each completed step in ns, by step index (as a string, for JSON).

    Steps from boundaries (optimizer.step(), gpudiag.step()): step k lasts from boundary k-1 to
    boundary k, so step 0 (opened at a first forward the bare run does not hook) has none. Steps
    from the user's NVTX ranges: each range's own push-to-pop time."""
    ends = state.step_end_ns
    if state.step_mode == "nvtx":
        return {str(k): ends[k] - state.step_start_ns[k] for k in sorted(ends) if k in state.step_start_ns}
    return {str(k): ends[k] - ends[k - 1] for k in sorted(ends) if k - 1 in ends}


def _safely(fn, state):
    """``fn(state)``, or {} if CUDA fails at the end of a crashed script: the status must be written."""
    try:
        return fn(state)
    except RuntimeError:
        return {}


def finish() -> dict:
    """Close what is still open (a step that never reached its boundary becomes the ``tail``
    range, which the analysis ignores) and return a summary of what was captured."""
    global _state
    state = _state
    if state is None:
        return {}
    with state.lock:
        _stop_op_ranges(state)
        state.window.stop_capture()  # a script that ended inside its window: the capture ends here
        if state.step_range is not None:
            state.nvtx.end(state.step_range)
            state.step_range = None
            state.nvtx.push(nvtx_names.TAIL)  # marks that the last opened step was incomplete
            state.nvtx.pop()
    _state = None
    return {
        "step_mode": state.step_mode,
        "steps_regex": state.step_regex.pattern if state.step_mode == "nvtx" else None,
        "steps_completed": state.steps_completed,
        "detail_step": state.config.effective_detail_step if state.config.op_ranges else None,
        "warmup_steps": state.config.warmup_steps,
        "peak_memory_bytes_per_step": {str(k): v for k, v in state.peak_memory_bytes.items()},
        "cudnn_benchmark": _cudnn_benchmark(),
        "autocast_dtype": state.autocast_dtype,
        "compile": dynamo_stats.compile_summary(),
        "step_wall_ns": step_wall_times(state),
        "step_gpu_ns": _safely(step_gpu_times, state),
        **_safely(lambda st: generate_summary(st.call_steps, st), state),
        **ddp_watch.summary(),
        **state.window.summary(),
    }
