"""Steps from training: a step ends at ``optimizer.step()`` (global optimizer step post-hook), and
the ``backward()`` and optimizer phases get push/pop ranges. A step source of the step-boundary
core (:mod:`gpudiag.capture.steps_core`), installed by :func:`gpudiag.capture.instrument.install`.

A backward() or an optimizer step also tells the call-step tracker (:mod:`gpudiag.capture.call_steps`)
that the script trains, so the optimizer's steps stay the steps.
"""

from __future__ import annotations

import sys
import weakref

from gpudiag import nvtx_names
from gpudiag.capture import dynamo_stats, steps_core
from gpudiag.capture.steps_core import CaptureState, compiling, ensure_step_open

# Optimizer steps before the first step boundary while an optimizer built has not stepped (one
# built and never used): gpudiag's choice, as call_steps.OPTIMIZER_PATIENCE.
OPTIMIZER_PATIENCE = 64


def install(torch, optim_module) -> None:
    """Wrap ``torch.autograd.backward`` and ``Optimizer.__init__`` and register the global
    optimizer step hooks (in the bare run too: the backward wrapper records the loss)."""
    wrap_backward(torch)
    optim_module.register_optimizer_step_pre_hook(optimizer_pre_hook)
    optim_module.register_optimizer_step_post_hook(optimizer_post_hook)
    watch_optimizers(optim_module)


def wrap_backward(torch) -> None:
    """``torch.autograd.backward`` (which ``Tensor.backward`` calls) inside a backward phase range;
    it opens step 0 if none is open and keeps the loss (:meth:`Window.record_loss`)."""
    original = torch.autograd.backward

    def backward(*args, **kwargs):
        state = steps_core.current()
        if state is None or compiling():
            return original(*args, **kwargs)
        ensure_step_open()
        training_seen(state)
        # backward() inside a closure optimizer.step() evaluates: one micro-batch however often
        # the closure runs (see micro_batches)
        calls = state.closure_backward_calls if state.closure_depth else state.backward_outside_closures
        calls[state.step_index] = calls.get(state.step_index, 0) + 1
        state.window.record_loss(state.step_index, args[0] if args else kwargs.get("tensors"))
        state.nvtx.push(nvtx_names.PHASE + "backward")
        try:
            return original(*args, **kwargs)
        finally:
            state.nvtx.pop()

    backward.__wrapped__ = original
    torch.autograd.backward = backward


def training_seen(state: CaptureState) -> None:
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


def watch_optimizers(optim_module) -> None:
    """Note that an optimizer exists (``Optimizer.__init__`` wrapped once): in auto mode the
    optimizer's steps are then preferred to forward calls (:meth:`CallSteps._decide`)."""
    cls = optim_module.Optimizer
    if getattr(cls.__init__, "__gpudiag__", False):
        return
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        state = steps_core.current()
        if state is not None:
            state.optimizer_seen = True
            state.optimizers_built.add(self)

    __init__.__gpudiag__ = True
    __init__.__wrapped__ = original
    cls.__init__ = __init__


def optimizer_pre_hook(optimizer, args, kwargs):
    """Before every ``optimizer.step()``: open step 0 if needed, push the optimizer phase range
    and, when the step was given a closure, run that closure outside it (:func:`outside_optimizer`).
    Returns the step's (args, kwargs) with the closure wrapped (torch's pre-hook protocol), or None
    when there is none."""
    state = steps_core.current()
    if state is None or compiling():
        return None
    training_seen(state)
    ensure_step_open()
    if not state.optimizer_depth:  # a wrapper optimizer's inner step is not another call
        state.optimizer_calls[state.step_index] = state.optimizer_calls.get(state.step_index, 0) + 1
    state.optimizer_depth += 1
    state.nvtx.push(nvtx_names.PHASE + "optimizer")
    # step(self, closure=None) in every torch.optim optimizer; args[0] is the optimizer itself. A
    # closure already wrapped (a wrapper optimizer passing it to its inner one) is not wrapped again.
    if len(args) > 1 and callable(args[1]) and not _wrapped(args[1]):
        return (args[0], outside_optimizer(state, args[1]), *args[2:]), kwargs
    if callable(kwargs.get("closure")) and not _wrapped(kwargs["closure"]):
        return args, {**kwargs, "closure": outside_optimizer(state, kwargs["closure"])}
    return None


def _wrapped(closure) -> bool:
    return getattr(closure, "__gpudiag_closure__", False)


def outside_optimizer(state: CaptureState, closure):
    """``closure`` run outside the optimizer phase: Lightning's automatic optimization, LBFGS and
    any ``optimizer.step(closure)`` evaluate the forward, the loss and ``backward()`` inside the
    step, and that work is not the optimizer's (a ResNet-50 under Lightning had 59 % of its step
    counted as optimizer time, issue 45). Each call pops the optimizer ranges open (a wrapper
    optimizer's and its inner one's), runs the closure inside a ``gpudiag:closure`` range (the
    micro-batch count reads it) and pushes them again, so the optimizer's share is what its own
    update launches. When the closure raises, its range is popped and the optimizer ranges stay
    closed: the step raises too and its post-hook never runs (a caller that catches the error, as
    Lightning's batch-size finder does on out-of-memory, then has no range left open)."""
    def closure_outside_optimizer(*args, **kwargs):
        if not steps_core.owns(state) or compiling():
            return closure(*args, **kwargs)
        depth = state.optimizer_depth
        for _ in range(depth):
            state.nvtx.pop()
        state.nvtx.push(nvtx_names.CLOSURE)
        state.closure_depth += 1
        try:
            result = closure(*args, **kwargs)
        except BaseException:
            _end_closure(state)
            state.optimizer_depth = 0  # closed; a step that catches it pops nothing more
            raise
        _end_closure(state)
        for _ in range(depth):
            state.nvtx.push(nvtx_names.PHASE + "optimizer")
        return result

    closure_outside_optimizer.__wrapped__ = closure
    closure_outside_optimizer.__gpudiag_closure__ = True
    return closure_outside_optimizer


def _end_closure(state: CaptureState) -> None:
    """Close a closure's range and count its evaluation."""
    state.closure_depth -= 1
    state.closure_calls[state.step_index] = state.closure_calls.get(state.step_index, 0) + 1
    state.nvtx.pop()


def optimizer_post_hook(optimizer, args, kwargs) -> None:
    """After every ``optimizer.step()``: pop the phase range (unless a closure that raised closed
    it already); a step boundary when this step ends a loop iteration (:func:`ends_iteration`) and
    steps are the optimizer's."""
    state = steps_core.current()
    if state is None or compiling():
        return
    if state.optimizer_depth:
        state.optimizer_depth -= 1
        state.nvtx.pop()
    if state.step_mode == "optimizer" and ends_iteration(state, optimizer):
        steps_core.step_boundary()


def ends_iteration(state: CaptureState, optimizer) -> bool:
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


def micro_batches(state: CaptureState) -> dict:
    """The launcher status's count of what each step held, keyed by step (as text): the calls of
    ``optimizer.step()`` (``optimizer_calls``), the closures they evaluated (``closure_calls``) and
    the micro-batches (``micro_batches``): the ``backward()`` calls outside those closures plus one
    when a closure called ``backward()``: a closure computes one batch however often an optimizer
    evaluates it (LBFGS: up to ``max_iter`` times), and Lightning's manual optimization passes a
    closure that does nothing. With gradient accumulation a step is one optimizer step over k
    micro-batches (Lightning ``accumulate_grad_batches``, HF ``gradient_accumulation_steps``,
    ``accelerator.accumulate``). A step with several ``optimizer.step()`` calls (a GAN's two
    optimizers) has no micro-batch count: its backward() calls are not micro-batches of one update."""
    # the first steps only, as the window keeps its losses: a --steps 0 run of a long script
    keep = state.window.MAX_LOSSES
    steps = sorted(set(state.backward_outside_closures) | set(state.closure_backward_calls) | set(state.optimizer_calls))
    counts = {str(s): state.backward_outside_closures.get(s, 0) + (1 if state.closure_backward_calls.get(s) else 0)
              for s in steps[:keep] if s >= 0 and state.optimizer_calls.get(s, 0) == 1}
    return {"optimizer_calls": {str(s): n for s, n in sorted(state.optimizer_calls.items())[:keep] if s >= 0},
            "closure_calls": {str(s): n for s, n in sorted(state.closure_calls.items())[:keep] if s >= 0},
            "micro_batches": counts}
