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
``torch.compile``d code every hook is a no-op (see :func:`gpudiag.capture.steps_core.compiling`).

What happens at a step boundary is the step-boundary core's (:mod:`gpudiag.capture.steps_core`),
which every step source uses: the optimizer and ``backward()``
(:mod:`gpudiag.capture.training_steps`), forward and ``generate()`` calls and ``call:`` targets
(:mod:`gpudiag.capture.call_steps`), the user's NVTX ranges (:mod:`gpudiag.capture.user_ranges`),
and here ``gpudiag.step()`` and the module forward hooks. This module installs them all.

The NVTX calls go through a tiny backend object (:mod:`gpudiag.capture.op_ranges`, with the op
ranges' texts) so tests can record them on a CPU-only torch.
"""

from __future__ import annotations

import re
import sys
import warnings

from gpudiag import nvtx_names
from gpudiag.capture import ddp_watch, dynamo_stats, model_modules, steps_core, training_steps
from gpudiag.capture.call_steps import CallSteps, generate_summary, wrap_call_target
from gpudiag.capture.config import CaptureConfig
from gpudiag.capture.op_ranges import NullNvtx, default_nvtx
from gpudiag.capture.steps_core import (CaptureState, ensure_step_open, owns, step_boundary,
                                        step_gpu_times, step_wall_times)
from gpudiag.capture.user_ranges import wrap_user_nvtx
from gpudiag.capture.window import Window

__all__ = ["AUTO_USER_STEP_REGEX", "CaptureConfig", "detect_step_mode", "finish", "install", "owns",
           "step_boundary", "step_gpu_times", "step_wall_times", "user_step"]

# In auto mode, the user's ranges that are steps: text starting with step/iteration/iter ("step 3",
# "iteration_3"), stricter than the analysis's default (gpudiag.analysis.attribution.ranges), which also
# takes "train_step": at run time a nested "optimizer_step" must not become the step.
AUTO_USER_STEP_REGEX = r"(?i)^\s*(?:step|iteration|iter)(?:[^a-z]|$)"


# ---- gpudiag.step() ----------------------------------------------------------------------------

def user_step(samples: int | None = None) -> None:
    """Backend of :func:`gpudiag.step`: a step boundary when steps come from calls; ``samples``
    is kept as the run's samples per step."""
    state = steps_core.current()
    if state is not None and samples:
        state.window.samples_per_step = int(samples)
    if state is not None and state.step_mode == "call":
        ensure_step_open()
        step_boundary()


# ---- modules -----------------------------------------------------------------------------------

def _unwrap_compiled(module):
    """The user's model inside a ``torch.compile`` wrapper (OptimizedModule), else ``module``."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is not None and isinstance(module, eval_frame.OptimizedModule):
        return module._orig_mod
    return module


def _module_name(state: CaptureState, module) -> str:
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


# Dynamo inlines global module hooks into the graphs it captures: returning at once while it traces
# keeps gpudiag out of compiled code (no graph break, no guard on gpudiag's state, no recompilation).
# Module ranges then stay outside compiled regions; the kernels inside are attributed through
# Inductor's provenance (gpudiag.capture.inductor_provenance).
_compiling = steps_core.compiling


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
    state = steps_core.current()
    if state is None:
        return None
    if state.config.bare:  # only what step boundaries need: no per-module cost
        if state.call_steps is not None:
            state.call_steps.pre(module)
        return None
    if state.step_index == -1 and model_modules.is_model(module):  # a transform's call opens no step
        ensure_step_open()
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
    state = steps_core.current()
    if state is None:
        return None
    if not state.config.bare and state.config.module_ranges and not _compiler_artifact(module):
        state.nvtx.pop()
    if state.call_steps is not None:
        state.call_steps.post(module, output)
    return None


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


def install(config: CaptureConfig, script_source: str = "", nvtx=None) -> CaptureState:
    """Install the hooks in this process. ``nvtx`` defaults to :func:`default_nvtx`.

    Returns the capture state (steps seen, etc.). Raises ValueError for a bad ``steps_from``."""
    import torch
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module

    if config.bare:
        config.module_ranges = config.op_ranges = False
        nvtx = NullNvtx()
    state = CaptureState(config=config, nvtx=nvtx or default_nvtx(), window=Window(config))
    state.step_mode = detect_step_mode(config, script_source)
    if config.steps_from.startswith("call:"):
        wrap_call_target(config.steps_from[5:], user_step)
    if state.step_mode == "nvtx":
        state.step_regex = re.compile(config.steps_from[5:])
        wrap_user_nvtx(state, torch)
    elif config.steps_from == "auto" and state.step_mode == "optimizer":  # user "step N" ranges may be the steps
        state.step_regex, state.auto_nvtx = re.compile(AUTO_USER_STEP_REGEX), True
        wrap_user_nvtx(state, torch)
    steps_core.activate(state)
    # torch warns that global hooks fire once more for a compiled model's OptimizedModule wrapper:
    # gpudiag expects that (the wrapper is named as the model, the inner calls are traced no-ops),
    # and the warning would otherwise appear in the user's output as if their script caused it.
    warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
    if state.step_mode in ("forward", "generate") or (config.steps_from == "auto" and state.step_mode == "optimizer"):
        state.call_steps = CallSteps(state, "auto" if config.steps_from == "auto" else state.step_mode)
    if state.call_steps is not None or not config.bare:  # else the bare run has no per-module cost
        state.module_hooks = [nn_module.register_module_forward_pre_hook(_forward_pre_hook),
                              nn_module.register_module_forward_hook(_forward_hook, always_call=True)]
    training_steps.install(torch, optim_module)  # in the bare run too: backward() records the loss
    model_modules.claim()
    model_modules.register_disown(_disown)
    state.window.watch_batch(nn_module, torch)
    ddp_watch.install()
    return state


def _disown() -> None:
    """In a child forked from the instrumented process (a DataLoader worker, a pool's worker):
    drop the state and the global forward hooks, so the child counts no step, adds no range and is
    never ended at the window's end (see :mod:`gpudiag.capture.model_modules`)."""
    state = steps_core.release()
    if state is None:
        return
    for handle in state.module_hooks:
        handle.remove()
    state.module_hooks = []
    state.window.unwatch_batch()


def _safely(fn, state):
    """``fn(state)``, or {} if CUDA fails at the end of a crashed script: the status must be written."""
    try:
        return fn(state)
    except RuntimeError:
        return {}


def finish() -> dict:
    """Close what is still open (a step that never reached its boundary becomes the ``tail``
    range, which the analysis ignores) and return a summary of what was captured."""
    state = steps_core.current()
    if state is None:
        return {}
    with state.lock:
        steps_core.stop_op_ranges(state)
        state.window.stop_capture()  # a script that ended inside its window: the capture ends here
        if state.step_range is not None:
            state.nvtx.end(state.step_range)
            state.step_range = None
            state.nvtx.push(nvtx_names.TAIL)  # marks that the last opened step was incomplete
            state.nvtx.pop()
    steps_core.release()
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
        **training_steps.micro_batches(state),
        **ddp_watch.summary(),
        **state.window.summary(),
    }
