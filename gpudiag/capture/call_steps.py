"""Steps from calls, for scripts with no optimizer and no step ranges (inference and serving loops).

- ``forward``: each call of an outermost ``nn.Module`` forward (one called while no other module's
  forward runs) starts a step; the step runs until the next such call, so a request's own host
  work after the forward (``.cpu()``, ``.tolist()``) belongs to it, as in the optimizer mode.
- ``generate``: each call of a Hugging Face ``generate()`` starts a step; the forwards of the model
  it was called on (prefill, then one per new token) are its sub-steps, their starts kept for
  TTFT/TPOT (an encoder-decoder's encoder, called apart, is not one).
- ``auto`` (the launcher's default after ``gpudiag.step()``, the user's NVTX steps and the
  optimizer): undecided until the evidence comes. An optimizer step, or a ``backward()`` once an
  optimizer exists, keeps the optimizer's steps (a training loop with no torch.optim optimizer, its
  update written by hand, gets the model's calls as steps); an outermost forward called from inside ``generate()`` makes it ``generate``;
  a second call of the same outermost module with neither between makes it ``forward``. The first
  call before that is the start-up's last part: model construction and weight upload before it are
  in no step.
- ``call:package.module.function`` (:func:`wrap_call_target`): each call of that function.

A step source of the step-boundary core (:mod:`gpudiag.capture.steps_core`): its boundaries go
through :func:`~gpudiag.capture.steps_core.open_step` and :func:`~gpudiag.capture.steps_core.step_boundary`.

Cost. Deciding needs every module call: the launcher's two global forward hooks call
:meth:`CallSteps.pre` / :meth:`CallSteps.post`. Global hooks put PyTorch on its slow call path
for every module (H100: with them, the MLP-Mixer's bf16-weights trial ran 9.0 ms per batch where the same change
made by hand ran 5.5 ms; the runs made after this change agree with the hand-made ones within 15 %), so once the
stepping module is known the bare run hooks it alone and drops the global ones, unless Dynamo has
already compiled with them: it guards on the global hook dicts, and removing them would compile a
second graph (tests/capture/test_instrument_compile.py). The profiled run keeps them (its module ranges need
them); after the decision they cost a flag test or a depth count per module call.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref

from gpudiag.capture import dynamo_stats, model_modules, steps_core
from gpudiag.capture.steps_core import compiling as _compiling

MAX_FORWARDS_PER_STEP = 4096  # forward starts kept per generate() step (one per new token)
# Outermost model calls with an optimizer constructed and never stepped before auto mode takes the
# calls as steps (gpudiag's choice: a training loop's first optimizer step comes after one or two
# forwards — a GAN's after three — never after 64).
OPTIMIZER_PATIENCE = 64

_local = threading.local()  # depth of module calls on this thread


def root_parameters(module) -> dict | None:
    """{"bytes", "tensors", "dtype"} of a module's floating-point parameters (each counted once:
    tied weights are one tensor), or None for no module."""
    if module is None:
        return None
    seen, total, dtype = set(), 0, None
    for param in module.parameters():
        if param.is_floating_point() and id(param) not in seen:
            seen.add(id(param))
            total += param.numel() * param.element_size()
            dtype = dtype or str(param.dtype).removeprefix("torch.")
    return {"bytes": total, "tensors": len(seen), "dtype": dtype,
            "kv_bytes_per_position": _kv_bytes_per_position(getattr(module, "config", None), dtype)}


def _kv_bytes_per_position(config, dtype: str | None) -> int | None:
    """Bytes of KV cache per position of one sequence for a Hugging Face decoder-only config: 2 (K
    and V) × layers × key/value heads × head size × element size; None for other models."""
    try:
        if getattr(config, "is_encoder_decoder", False):
            return None
        layers, heads, hidden = config.num_hidden_layers, config.num_attention_heads, config.hidden_size
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
    except (AttributeError, TypeError, ZeroDivisionError):
        return None
    size = {"float32": 4, "float64": 8}.get(dtype or "", 2)
    return int(2 * layers * kv_heads * head_dim * size)


def _cuda_event():
    """A recorded (never waited on) CUDA timing event, or None without CUDA."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def generate_summary(tracker: "CallSteps | None", state) -> dict:
    """Status entry ``generate_forwards``: for each completed generate() step k ≥ 1, the start of
    each forward it ran (prefill first, then one per new token) as offsets from the step's start in
    ns: ``wall_ns`` (host clock) and ``gpu_ns`` (CUDA events, when the step's start has one).
    Synchronizes once (the script has ended). {} outside generate mode."""
    if tracker is None or not tracker.generating:
        return {}
    out = {}
    for step, marks in sorted(tracker.marks.items()):
        start_ns, start_event = state.step_end_ns.get(step - 1), state.step_end_event.get(step - 1)
        if start_ns is None or step not in state.step_end_ns:
            continue
        entry = {"wall_ns": [t - start_ns for t, _ in marks]}
        if start_event is not None and all(e is not None for _, e in marks):
            import torch

            torch.cuda.synchronize()
            entry["gpu_ns"] = [int(round(start_event.elapsed_time(e) * 1e6)) for _, e in marks]
        out[str(step)] = entry
    return {"generate_forwards": out}


def _generate_model():
    """The model a Hugging Face ``generate()`` on this thread's stack was called on (its
    forwards are the generation's; an encoder-decoder's encoder is called apart), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "generate" and "transformers" in frame.f_code.co_filename:
            return frame.f_locals.get("self")
        frame = frame.f_back
    return None


class CallSteps:
    """The call-step tracker of one launcher state (see the module docstring). ``mode``: "auto",
    "forward" or "generate"."""

    def __init__(self, state, mode: str) -> None:
        self.state, self.mode = state, mode
        self.training = False
        self.counting = True  # depth is counted while undecided and in forward mode
        self.roots: weakref.WeakSet = weakref.WeakSet()
        self.root = None  # weak ref to the stepping module: its calls are steps, or generate()'s forwards
        self.generating = False  # generate mode decided: forwards are marked, not steps
        self.marks: dict[int, list] = {}  # step -> [(perf_counter ns, CUDA event)] per forward start
        self.calls_waiting = 0  # outermost model calls seen while an optimizer exists and has not stepped

    def training_seen(self) -> None:
        """A backward() or optimizer step: in auto mode the optimizer's steps stay; stop tracking
        (the hooks stay, as flag tests: see the module docstring)."""
        if not self.training and self.mode == "auto" and self.state.step_mode == "optimizer":
            if not getattr(self.state, "optimizer_seen", False):
                # training with no torch.optim optimizer (pytorch/examples word_language_model updates
                # p.data by hand): no optimizer step will come, so the model's calls may be the steps
                return
            self.training = True
            self.counting = False

    # ---- hooks ------------------------------------------------------------------------------------
    def post(self, module, output) -> None:
        """At the end of every module call outside compiled code (the launcher's global forward
        hook, while it is installed)."""
        if self.counting:
            depth = max(getattr(_local, "depth", 1) - 1, 0)
            _local.depth = depth
            if depth == 0 and self._is_root(module):
                self._root_done(output)
            elif depth == 0 and self.root is None:
                model_modules.learn_from_output(module, output)

    def pre(self, module) -> None:
        """At every module call outside compiled code (the launcher's global forward pre-hook,
        while it is installed)."""
        if not self.counting:
            return
        depth = getattr(_local, "depth", 0)
        _local.depth = depth + 1
        if depth or self.state.window.closed:
            return
        if self.root is not None:
            if self._is_root(module):
                self._root_call()
            return
        self._decide(module)
        if self._is_root(module) and self.generating:
            self._mark()

    def _is_root(self, module) -> bool:
        return self.root is not None and self.root() is module

    def _root_call(self) -> None:
        """A call of the stepping module: a step boundary (forward mode) or, inside generate(),
        one forward's start (prefill, then one per new token)."""
        if self.state.window.closed:
            return
        if self.generating:
            self._mark()
        else:
            self.boundary()

    def _root_done(self, output) -> None:
        """The stepping module's call returned: the bare run keeps a sample of its output (the
        first of each step, see Window.record_output) to check the trials' results."""
        if self.state.config.bare:
            self.state.window.record_output(self.state.step_index, output)

    def _go_local(self, root) -> None:
        """In the bare run, once the stepping module is known: hooks on it alone instead of the
        global ones, whose every-module-call cost (PyTorch's slow call path; see the module
        docstring for what it did to a trial on the H100) would be in the timed steps.
        Not once Dynamo has compiled: it guards on the global hook dicts (a second graph)."""
        if not self.state.config.bare or not self.state.module_hooks or dynamo_stats.compile_summary():
            return
        for handle in self.state.module_hooks:
            handle.remove()
        self.state.module_hooks = []
        self.counting = False
        tracker = weakref.proxy(self)

        def root_pre(_module, _args):
            if not _compiling():
                tracker._root_call()

        def root_post(_module, _args, output):
            if not _compiling():
                tracker._root_done(output)

        root.register_forward_pre_hook(root_pre)
        root.register_forward_hook(root_post)

    def _mark(self) -> None:
        """The start of a forward inside the open generate() step (host time and a CUDA event)."""
        step = self.state.step_index
        marks = self.marks.setdefault(step, []) if step >= 0 else None
        if marks is not None and len(marks) < MAX_FORWARDS_PER_STEP:
            marks.append((time.perf_counter_ns(), _cuda_event()))

    def _decide(self, module) -> None:
        """At an outermost forward while undecided (or in explicit forward mode, its first call)."""
        if self.state.step_mode == "nvtx":  # the user's own step ranges won (instrument's auto mode)
            self.counting = False
            return
        model = _generate_model() if self.mode in ("auto", "generate") else None
        if model is not None:
            self._switch("generate", model)
            return
        if self.mode == "generate":  # a forward outside generate(): not a step
            return
        if not model_modules.is_model(module):  # a data transform, or a module off the compute device
            return
        if self.mode == "auto":
            # the same outermost module called again with no backward or optimizer step between:
            # a second request (a training loop calls its model and then its loss module, once each)
            if module not in self.roots:
                self.roots.add(module)
                return
            if self.state.steps_completed or self._optimizer_first():
                return
        self._switch("forward", module)

    def _optimizer_first(self) -> bool:
        """Auto mode with an optimizer constructed: wait for its step (training), unless the model
        has been called :data:`OPTIMIZER_PATIENCE` times with none (an optimizer built and never
        stepped, e.g. to load a checkpoint, in an inference script)."""
        if not getattr(self.state, "optimizer_seen", False):
            return False
        self.calls_waiting += 1
        return self.calls_waiting < OPTIMIZER_PATIENCE

    def _switch(self, mode: str, root=None) -> None:
        """Steps from now on come from ``mode``; this call is a step boundary. ``root``: the
        outermost module (whose parameters the report's decode roofline reads)."""
        self.state.step_mode = mode
        self.state.window.root_parameters = root_parameters(root)
        self.root = weakref.ref(root)
        if mode == "generate":
            self.generating = True
            _wrap_generate(self)
        if self.mode == "auto" and self.state.step_index == -1:
            # The profiled run opened step 0 at the first forward; the bare run (no forward hooks)
            # opens it here, empty, so that step k is the same request in both.
            self.boundary()
        self.boundary()
        self._go_local(root)

    def boundary(self) -> None:
        """A step starts here: the open one ends (the first call opens step 0)."""
        state = self.state
        if state.window.closed or not steps_core.owns(state):  # a forked child: not gpudiag's process
            return
        if state.step_index == -1:
            with state.lock:
                steps_core.open_step(state)
            return
        steps_core.step_boundary()


def _wrap_generate(tracker: CallSteps) -> None:
    """Each later ``GenerationMixin.generate`` call is a step boundary (the running one, which
    was already under way, is step 0 and ends at the next call)."""
    utils = sys.modules.get("transformers.generation.utils")
    mixin = getattr(utils, "GenerationMixin", None)
    if mixin is None or getattr(mixin.generate, "__gpudiag__", False):
        return
    original = mixin.generate

    def generate(self, *args, **kwargs):
        tracker.boundary()
        return original(self, *args, **kwargs)

    generate.__gpudiag__ = True
    generate.__wrapped__ = original
    generate.__doc__ = original.__doc__
    mixin.generate = generate


def wrap_call_target(target: str, step) -> None:
    """``--steps-from call:package.module.function`` (or ``.Class.method``): each call of it starts
    a step (``step()``, the launcher's step boundary, runs at its entry). The longest importable
    prefix of ``target`` is imported before the script runs. Raises ValueError naming what could
    not be found (a function of the script itself cannot be reached before it runs: call
    ``gpudiag.step()`` in it instead)."""
    import functools
    import importlib

    parts = target.split(".")
    owner, rest = None, []
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner, rest = importlib.import_module(".".join(parts[:cut])), parts[cut:]
            break
        except ImportError:
            continue
    if owner is None:
        raise ValueError(f"--steps-from call:{target}: no importable module in it (a function of the script itself: "
                         "call gpudiag.step() at the end of each step instead)")
    for name in rest[:-1]:
        owner = getattr(owner, name, None)
        if owner is None:
            raise ValueError(f"--steps-from call:{target}: {name!r} not found")
    original = getattr(owner, rest[-1], None)
    if not callable(original):
        raise ValueError(f"--steps-from call:{target}: {rest[-1]!r} is not a function of {owner!r}")

    @functools.wraps(original)
    def stepped(*args, **kwargs):
        step()
        return original(*args, **kwargs)

    setattr(owner, rest[-1], stepped)
