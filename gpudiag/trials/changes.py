"""The changes a trial applies inside the user's process, without editing the script.

Each change is installed by the launcher before the script runs (``CaptureConfig.trial``) and
records what it did in :data:`APPLIED`, which the launcher writes to the trial's status:
``{"change": ..., "applied": [what was changed], "form": how it was measured, "not_applicable":
reason or None}``. A change that found nothing to act on (no optimizer, no 4-D input) says so and
the trial is reported "not applicable", never as a saving of zero.

Root modules are the modules whose ``forward`` is called while no other module's forward runs
(the model, a loss module): a global forward pre-hook finds them on their first call, during the
first two steps, and is removed when step 2 opens, so later steps pay nothing for it. Two: the bare
run of a forward or generate() loop opens an empty step 0 and step 1 at once, at its first
outermost forward, which in an encoder-decoder's generate() is the encoder's; the model generate()
was called on comes after it (BART on the H100: the static-cache trial found no model).

The launcher reaches these changes through capture's registry (:mod:`gpudiag.capture.trial_changes`):
this module registers each change when imported, and :func:`with_change` names it in the run's
config (``CaptureConfig.change_modules``), so the profiled process imports it by that name. Capture
never imports the trials: the arrow goes trials → capture only.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
import weakref

from gpudiag.capture import model_modules, trial_changes
from gpudiag.capture.config import CaptureConfig
from gpudiag.trials import framework_changes, loader_changes

CHANGES = ("compile", "compile-graphs", "fused-optimizer", "channels-last", "tf32", "bf16-autocast",
           "cudnn-benchmark", "kernels", "half-weights", "static-cache", "static-cache-compile",
           *loader_changes.LOADER_CHANGES)
# Changes for inference only: half weights would break an optimizer's fp32 master weights, and a
# static KV cache exists only in Hugging Face generate().
INFERENCE_CHANGES = ("half-weights", "static-cache", "static-cache-compile")

APPLIED: dict = {}

_local = threading.local()  # forward depth per thread: only depth-0 calls are roots


def summary() -> dict:
    """What the installed change did (the trial's status entry)."""
    out = dict(APPLIED)
    if not out.get("applied") and not out.get("not_applicable"):
        out["not_applicable"] = _NOTHING_FOUND.get(out.get("change"), "nothing to change was found")
    return out


_NOTHING_FOUND = {
    "compile": "no root module was called", "compile-graphs": "no root module was called",
    "fused-optimizer": "no torch.optim optimizer with a fused or foreach implementation was built",
    "channels-last": "no root module with 4-D weights (convolutions) was called",
    "kernels": "no model gpudiag has kernels for (Hugging Face Llama/Mistral/Qwen2/GPT-2/BERT, timm Swin)",
    "bf16-autocast": "no root module was called",
    "half-weights": "no root module with floating-point weights was called",
    "static-cache": "no Hugging Face model with a generation_config was called",
    "static-cache-compile": "no Hugging Face model with a generation_config was called",
    **loader_changes.NOTHING_FOUND,
}


def install(change: str, state) -> None:
    """Install ``change`` (one of :data:`CHANGES`) in this process. ``state``: the launcher's
    instrumentation state (step callbacks, autocast). Raises ValueError for an unknown change."""
    if change not in CHANGES:
        raise ValueError(f"unknown change {change!r}: use one of {', '.join(CHANGES)}")
    import torch

    APPLIED.clear()
    APPLIED.update({"change": change, "applied": [], "form": None, "not_applicable": None})
    if change == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        _applied("torch.backends.cuda.matmul.allow_tf32 = True; torch.backends.cudnn.allow_tf32 = True")
    elif change == "cudnn-benchmark":
        torch.backends.cudnn.benchmark = True
        _applied("torch.backends.cudnn.benchmark = True")
    elif change == "fused-optimizer":
        _patch_optimizers(torch)
    elif change in loader_changes.LOADER_CHANGES:
        loader_changes.install(change, APPLIED)
    else:
        _on_roots(state, _ROOT_CHANGES[change])
        if change == "compile-graphs":
            # PyTorch's fix for "accessing tensor output of CUDAGraphs that has been overwritten by a
            # subsequent run" in training loops: mark where each step begins.
            state.step_open_callbacks.append(lambda _step: torch.compiler.cudagraph_mark_step_begin())
            APPLIED["form"] = ("torch.compile(mode='reduce-overhead') of the root modules, "
                               "torch.compiler.cudagraph_mark_step_begin() at each step; the optimizer stays "
                               "outside the graphs (one torch.cuda.graph of the whole step needs the script edited)")
    # where a framework owns the setting (Lightning, HF TrainingArguments, Accelerate), its own switch
    framework_changes.install(change, APPLIED)


def _applied(what: str) -> None:
    if what not in APPLIED["applied"]:
        APPLIED["applied"].append(what)


# ---- fused optimizers ----------------------------------------------------------------------------

def _all_cuda_float(params) -> bool:
    tensors = [p for group in params for p in (group["params"] if isinstance(group, dict) else [group])]
    return bool(tensors) and all(getattr(t, "is_cuda", False) and t.is_floating_point() for t in tensors)


def _patch_optimizers(torch) -> None:
    """Every ``torch.optim`` class with a ``fused`` or ``foreach`` argument builds with
    ``fused=True`` where all its parameters are CUDA floating-point tensors and the class has a
    fused implementation, else ``foreach=True``; an explicit choice of the script is kept."""
    for name in dir(torch.optim):
        cls = getattr(torch.optim, name)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)) or cls is torch.optim.Optimizer:
            continue
        parameters = inspect.signature(cls.__init__).parameters
        if "fused" in parameters or "foreach" in parameters:
            cls.__init__ = _fused_init(cls, cls.__init__, "fused" in parameters)


def _fused_init(cls, original, has_fused: bool):
    def __init__(self, params, *args, **kwargs):
        # fused and foreach are keyword-only in torch.optim; a subclass's own __init__ is left alone;
        # an optimizer the HF Trainer builds after its own switch (optim=...) is the framework's, one
        # the script builds and hands to it (Trainer(optimizers=(opt, None))) is changed here
        if framework_changes.owned(APPLIED) and framework_changes.built_by_transformers():
            pass
        elif type(self) is cls and kwargs.get("fused") is None and kwargs.get("foreach") is None:
            params = list(params)  # a generator would be spent by the check below
            if has_fused and _all_cuda_float(params):
                kwargs["fused"] = True
                _applied(f"{cls.__name__}(fused=True)")
            else:
                kwargs["foreach"] = True
                _applied(f"{cls.__name__}(foreach=True)")
        elif type(self) is cls and (kwargs.get("fused") or kwargs.get("foreach")):
            APPLIED["not_applicable"] = f"the script already builds {cls.__name__} with fused or foreach set"
        original(self, params, *args, **kwargs)

    __init__.__wrapped__ = original
    return __init__


# ---- changes made to root modules ----------------------------------------------------------------

def _compile(module, mode: str | None = None) -> None:
    """The module's forward compiled in place (an instance attribute: every caller, HF generate()
    included, gets it). Not ``nn.Module.compile()``: on torch 2.13 (CPU) a module compiled that way
    ran its first calls uncompiled, with no Dynamo frame recorded; the bound forward compiles on
    2.11 (the H100/H200 image) and 2.13 alike."""
    import torch

    module.forward = torch.compile(module.forward, **({"mode": mode} if mode else {}))
    name = type(module).__name__
    _applied(f"{name}.forward = torch.compile({name}.forward{', mode=' + repr(mode) if mode else ''})")


def _channels_last(module) -> None:
    import torch

    if not any(p.dim() == 4 for p in module.parameters()):
        return
    # 4-D tensors only: Module.to(memory_format=channels_last) also converts 5-D ones and raises
    # "required rank 4 tensor" (timm train.py's training task on the H200, 2026-11-28)
    module._apply(lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t)

    def inputs_channels_last(_module, args):
        return tuple(a.contiguous(memory_format=torch.channels_last)
                     if isinstance(a, torch.Tensor) and a.dim() == 4 and a.is_floating_point() else a for a in args)

    module.register_forward_pre_hook(inputs_channels_last)
    _applied(f"{type(module).__name__}.to(memory_format=torch.channels_last) and its 4-D float inputs")


def _bf16_autocast(module) -> None:
    import torch

    if not any(True for _ in module.parameters()):
        return
    module.forward = torch.autocast("cuda", dtype=torch.bfloat16)(module.forward)
    _applied(f"{type(module).__name__}.forward under torch.autocast('cuda', dtype=torch.bfloat16)")


def _kernels(module) -> None:
    from gpudiag.fused import hf, timm_swin

    if type(module).__module__.startswith("timm.models.swin"):
        timm_swin.apply(module)
        _applied(f"gpudiag.fused.timm_swin.apply({type(module).__name__})")
        return
    try:
        result = hf.apply(module)
    except (ValueError, TypeError):  # not a model family hf.apply knows
        return
    if result.get("kernels"):
        _applied(f"gpudiag.fused.hf.apply({type(module).__name__}): {result['kernels']}")


def _half_weights(module) -> None:
    """The root's weights in bf16 (``module.to(torch.bfloat16)``), its float inputs cast to bf16
    and its bf16 outputs back to the weights' former dtype, so the code around it runs unchanged.
    Applied after the call in progress (its inputs are already fp32): from the next call on.
    bf16, not fp16: the same tensor-core speed and fp32's range (no overflow to handle)."""
    import torch

    params = [p for p in module.parameters() if p.is_floating_point()]
    if not params or params[0].dtype not in (torch.float32, torch.float64):
        return
    before = params[0].dtype

    def cast(value, dtype, source):
        if isinstance(value, torch.Tensor):
            return value.to(dtype) if value.dtype == source else value
        if isinstance(value, (tuple, list)) and not hasattr(value, "_fields"):
            return type(value)(cast(v, dtype, source) for v in value)
        if isinstance(value, dict):  # a Hugging Face ModelOutput is a dict: its keys stay, in place
            for key in list(value.keys()):
                value[key] = cast(value[key], dtype, source)
        return value

    def inputs(_module, args, kwargs):
        return cast(args, torch.bfloat16, before), cast(kwargs, torch.bfloat16, before)

    def outputs(_module, _args, output):
        return cast(output, before, torch.bfloat16)

    def convert(mod, _args, _output):
        handle.remove()
        mod.to(torch.bfloat16)
        mod.register_forward_pre_hook(inputs, with_kwargs=True)
        mod.register_forward_hook(outputs)

    handle = module.register_forward_hook(convert)
    _applied(f"{type(module).__name__}.to(torch.bfloat16), float inputs cast to bf16 and outputs back to {before}")


def _static_cache(module, compiled: bool) -> None:
    """``generation_config.cache_implementation = "static"`` on a Hugging Face model (its next
    generate() calls). transformers compiles the decoding forward by itself when the cache is
    static (generate()'s automatic compilation): ``static-cache`` turns that off to measure the
    cache alone (``generation_config.disable_compile = True``), ``static-cache-compile`` keeps it."""
    config = getattr(module, "generation_config", None)
    if config is None:
        return
    config.cache_implementation = "static"
    config.disable_compile = not compiled
    _applied(f"{type(module).__name__}.generation_config.cache_implementation = 'static'"
             + ("" if compiled else "; generation_config.disable_compile = True"))
    APPLIED["form"] = ("a static KV cache; generate() compiles the decoding step by itself" if compiled
                       else "a static KV cache with generate()'s automatic compilation turned off")


_ROOT_CHANGES = {
    "compile": _compile,
    "compile-graphs": lambda m: _compile(m, "reduce-overhead"),
    "channels-last": _channels_last,
    "bf16-autocast": _bf16_autocast,
    "kernels": _kernels,
    "half-weights": _half_weights,
    "static-cache": lambda m: _static_cache(m, compiled=False),
    "static-cache-compile": lambda m: _static_cache(m, compiled=True),
}


def _on_roots(state, apply) -> None:
    """Call ``apply(module)`` once on each root module seen in the first two steps (see the module
    docstring); the hooks go when step 2 opens. Compiler artefacts (FX GraphModules) and
    modules inside compiled code are skipped."""
    import torch
    from torch.nn.modules import module as nn_module

    seen: weakref.WeakSet = weakref.WeakSet()

    def pre(module, _args):
        if torch.compiler.is_compiling():  # first: Dynamo must trace nothing of gpudiag's state
            return
        depth = getattr(_local, "depth", 0)
        _local.depth = depth + 1
        # the model only: a DataLoader worker's transform modules (in a forked child, or on the main
        # thread with no workers) are neither changed nor compiled (model_modules: issue 34)
        if depth == 0 and module not in seen and not isinstance(module, torch.fx.GraphModule) \
                and model_modules.owned() and model_modules.is_model(module):
            seen.add(module)
            if not framework_changes.owned(APPLIED):  # the framework's switch made this change instead
                apply(module)

    def post(_module, _args, _output):
        if not torch.compiler.is_compiling():
            _local.depth = max(getattr(_local, "depth", 1) - 1, 0)

    handles = [nn_module.register_module_forward_pre_hook(pre),
               nn_module.register_module_forward_hook(post, always_call=True)]

    def disown() -> None:  # in a forked child: no change is applied there
        for handle in handles:
            handle.remove()
        handles.clear()

    model_modules.register_disown(disown)

    def remove_after_first_step(step: int) -> None:
        if step >= 2 and handles:
            for handle in handles:
                handle.remove()
            handles.clear()

    state.step_open_callbacks.append(remove_after_first_step)


# ---- registration --------------------------------------------------------------------------------

def with_change(config: CaptureConfig, change: str | None) -> CaptureConfig:
    """``config`` for a run with ``change`` applied (None: the unchanged script): the change's name
    and this module's path, which the profiled process imports to register the changes (see
    :mod:`gpudiag.capture.trial_changes`: capture reaches the trials only through it)."""
    return dataclasses.replace(config, trial=change, change_modules=[__name__] if change else [])


def _register() -> None:
    """Register every change of :data:`CHANGES` in capture's registry (on import, in the profiled
    process: :func:`gpudiag.capture.trial_changes.load`)."""
    for name in CHANGES:
        trial_changes.register(name, functools.partial(install, name), summary)


_register()
