"""Trial changes made through the framework that owns the setting, and advice that names it.

Where a framework owns precision, compilation or the optimizer, a trial sets the framework's own
switch rather than patching under it: a ``torch.autocast`` around a Lightning module's forward
would run beside Lightning's precision plugin (its gradient scaling, its checkpoint dtype), and the
measured form would not be the one the user can write. So, in the script's process:

- Lightning (``lightning.pytorch.Trainer``, ``pytorch_lightning.Trainer``): bf16-autocast builds
  ``Trainer(precision="bf16-mixed")`` where the script left precision at its default (None, 32,
  "32-true"; ``PL_TRAINER_PRECISION`` counts as the script's).
- Hugging Face ``transformers.TrainingArguments``: bf16-autocast ``bf16=True`` (unless bf16 or fp16
  is set, or ``ACCELERATE_MIXED_PRECISION`` asks for one); tf32 ``tf32=True`` (transformers would
  otherwise turn TF32 off again for ``tf32=False``); fused-optimizer ``optim="adamw_torch_fused"``
  where the script chose ``"adamw_torch"`` (transformers 5's default is already the fused one);
  compile ``torch_compile=True``. Set in ``__post_init__``, not ``__init__``: a dataclass subclass
  (``Seq2SeqTrainingArguments``) generates an ``__init__`` of its own that never calls the parent's,
  and ``HfArgumentParser`` passes every field, so only the values tell the script's choice.
- Accelerate ``accelerate.Accelerator``: bf16-autocast ``mixed_precision="bf16"`` where the
  script gave none (and ``ACCELERATE_MIXED_PRECISION`` is unset or "no"). An Accelerator the HF
  Trainer builds is left alone: its precision comes from the TrainingArguments above.

The framework switch and the generic change (the root modules' autocast or compile,
:mod:`gpudiag.trials.changes`) never both act: once a framework took a change (applied or declined
it), ``APPLIED["framework"]`` names it and the root-module version does nothing; where the root
modules were changed first, the framework is left alone.

The classes are patched when the script imports them (:func:`gpudiag.capture.frameworks.when_imported`).
Each trial is a fresh process: nothing is undone.
"""

from __future__ import annotations

import inspect
import os
import sys

from gpudiag.capture import frameworks
from gpudiag.script_status import ScriptStatus

FRAMEWORK_CHANGES = ("bf16-autocast", "tf32", "fused-optimizer", "compile")
ROOT_CHANGES = ("bf16-autocast", "compile")  # the changes the root modules would also make
LIGHTNING = {"lightning": "lightning.pytorch.trainer.trainer", "pytorch_lightning": "pytorch_lightning.trainer.trainer"}
LIGHTNING_DEFAULT_PRECISION = ("None", "32", "32-true")
NAMES = {"transformers": "the Hugging Face Trainer", "lightning": "the Lightning Trainer",
         "accelerate": "Accelerate"}


def install(change: str, applied: dict) -> None:
    """Patch, as the script imports them, the framework classes that own ``change`` (nothing for
    a change no framework owns). ``applied``: the trial's ``APPLIED`` (change, applied, form,
    not_applicable), where each framework records what it set."""
    if change == "bf16-autocast":
        for package, module in LIGHTNING.items():
            frameworks.when_imported(module, lambda m, p=package: frameworks.wrap_init(
                m.Trainer, before=_lightning_bf16(p, applied)))
        frameworks.when_imported("accelerate.accelerator", lambda m: frameworks.wrap_init(
            m.Accelerator, before=_accelerate_bf16(m.Accelerator, applied)))
    if change in FRAMEWORK_CHANGES:
        frameworks.when_imported("transformers.training_args", lambda m: frameworks.wrap_method(
            m.TrainingArguments, "__post_init__", before=_hf_arguments(change, applied)))


def owned(applied: dict) -> bool:
    """Whether a framework took the change (applied or declined it): the generic version then
    does nothing."""
    return bool(applied.get("framework"))


def _take(applied: dict, change: str, framework: str) -> bool:
    """Whether ``framework`` may act on ``change``: not where the root modules already made it
    (they came first: the script called its model before building the framework's object)."""
    if applied.get("framework"):
        return True
    return not (change in ROOT_CHANGES and applied["applied"])


def _set(applied: dict, framework: str, what: str, form: str) -> None:
    applied["framework"] = framework
    if what not in applied["applied"]:
        applied["applied"].append(what)
    applied["form"] = form
    applied["not_applicable"] = None


def _decline(applied: dict, framework: str, reason: str) -> None:
    applied["framework"] = framework
    if not applied["applied"]:
        applied["not_applicable"] = reason


# ---- Lightning -----------------------------------------------------------------------------------

def _precision_plugin(plugins) -> bool:
    """Whether Trainer(plugins=...) holds a precision plugin (Lightning refuses one beside
    ``precision``)."""
    items = plugins if isinstance(plugins, (list, tuple)) else [plugins] if plugins is not None else []
    return any(c.__name__ == "Precision" for p in items for c in type(p).__mro__)


def _lightning_bf16(package: str, applied: dict):
    def before(_trainer, args, kwargs):
        if not _take(applied, "bf16-autocast", package):
            return args, kwargs
        given = kwargs.get("precision", os.environ.get("PL_TRAINER_PRECISION"))
        if str(given) not in LIGHTNING_DEFAULT_PRECISION:
            _decline(applied, package, f"the script builds Trainer(precision={given!r}): its own precision is kept")
        elif _precision_plugin(kwargs.get("plugins")):
            _decline(applied, package, "the script passes a precision plugin in Trainer(plugins=...)")
        else:
            kwargs = {**kwargs, "precision": "bf16-mixed"}
            _set(applied, package, "Trainer(precision='bf16-mixed')",
                 "Lightning's bf16 mixed precision (Trainer(precision='bf16-mixed')); the root modules left alone")
        return args, kwargs
    return before


# ---- Hugging Face TrainingArguments ----------------------------------------------------------------

def _env_precision() -> str | None:
    """The mixed precision ``accelerate launch`` (its config) asks for, None for none or "no"."""
    value = os.environ.get("ACCELERATE_MIXED_PRECISION")
    return None if value in (None, "", "no") else value


def _hf_bf16(args, applied: dict) -> None:
    from transformers.utils import is_torch_bf16_gpu_available

    if args.bf16 or args.fp16:
        _decline(applied, "transformers", f"the script sets TrainingArguments({'bf16' if args.bf16 else 'fp16'}=True)")
    elif _env_precision():
        _decline(applied, "transformers", f"ACCELERATE_MIXED_PRECISION={_env_precision()} (accelerate's config)")
    elif not (args.use_cpu or is_torch_bf16_gpu_available()):  # transformers would refuse bf16=True
        _decline(applied, "transformers", "transformers finds no bf16 support on this GPU")
    else:
        args.bf16 = True
        _set(applied, "transformers", "TrainingArguments(bf16=True)", "the Hugging Face Trainer's bf16 mixed "
             "precision (TrainingArguments(bf16=True)); the root modules left alone")


def _hf_tf32(args, applied: dict) -> None:
    if args.tf32 is True:
        _decline(applied, "transformers", "the script sets TrainingArguments(tf32=True) already")
        return
    if args.tf32 is False:
        applied["applied"].clear()  # transformers turns TF32 off again after gpudiag turned it on
        _decline(applied, "transformers", "the script sets TrainingArguments(tf32=False)")
        return
    from transformers.utils import is_torch_tf32_available

    if args.tf32 is None and is_torch_tf32_available():  # transformers refuses tf32=True without a TF32 GPU
        args.tf32 = True
        _set(applied, "transformers", "TrainingArguments(tf32=True)",
             "TF32 through TrainingArguments(tf32=True) and torch.backends' flags")


def _hf_optim(args, applied: dict) -> None:
    optim = str(getattr(args.optim, "value", args.optim))
    if optim == "adamw_torch":
        args.optim = "adamw_torch_fused"
        _set(applied, "transformers", "TrainingArguments(optim='adamw_torch_fused')",
             "the Hugging Face Trainer's fused AdamW (TrainingArguments(optim='adamw_torch_fused'))")
    elif optim == "adamw_torch_fused":
        _decline(applied, "transformers", "TrainingArguments(optim='adamw_torch_fused'): the optimizer is fused "
                                          "already (transformers' default)")
    # any other optim: torch.optim classes transformers builds go through the generic change


def _hf_compile(args, applied: dict) -> None:
    if args.torch_compile or args.torch_compile_mode or args.torch_compile_backend:
        _decline(applied, "transformers", "the script sets TrainingArguments(torch_compile=True)")
    else:
        args.torch_compile = True
        _set(applied, "transformers", "TrainingArguments(torch_compile=True)",
             "the Hugging Face Trainer compiles the model (TrainingArguments(torch_compile=True)); "
             "the root modules left alone")


_HF = {"bf16-autocast": _hf_bf16, "tf32": _hf_tf32, "fused-optimizer": _hf_optim, "compile": _hf_compile}


def _hf_arguments(change: str, applied: dict):
    """``TrainingArguments.__post_init__``'s ``before``: the fields adjusted in place, before
    transformers derives the rest from them (mixed_precision, the compile backend, TF32)."""
    def before(training_args, args, kwargs):
        if _take(applied, change, "transformers"):
            _HF[change](training_args, applied)
        return args, kwargs
    return before


# ---- Accelerate ----------------------------------------------------------------------------------

def _from_transformers() -> bool:
    """Whether the Accelerator being built was asked for by transformers (the HF Trainer's own):
    the first caller outside gpudiag and accelerate is a transformers module."""
    return built_by_transformers(("gpudiag.", "accelerate."))


def built_by_transformers(through: tuple[str, ...] = ("gpudiag.", "accelerate.", "torch.")) -> bool:
    """Whether the first caller outside the modules ``through`` (name prefixes) is a transformers
    module: an object the HF Trainer builds itself (its optimizer after ``optim=...``, its
    Accelerator), not one the script built and handed to it (``Trainer(optimizers=(opt, None))``)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(through):
            return name.startswith("transformers.")
        frame = frame.f_back
    return False


def _accelerate_bf16(cls, applied: dict):
    signature = inspect.signature(cls.__init__)

    def before(accelerator, args, kwargs):
        if _from_transformers() or not _take(applied, "bf16-autocast", "accelerate"):
            return args, kwargs
        bound = signature.bind(accelerator, *args, **kwargs)
        given = bound.arguments.get("mixed_precision")
        # "no" is fp32, what an argparse default passes on (accelerate's own examples, the suite's
        # accelerate_accum.py): nothing to keep, as Lightning's precision=32
        if given is not None and str(getattr(given, "value", given)).lower() != "no":
            _decline(applied, "accelerate", f"the script builds Accelerator(mixed_precision={str(given)!r})")
        elif _env_precision():
            _decline(applied, "accelerate", f"ACCELERATE_MIXED_PRECISION={_env_precision()} (accelerate's config)")
        else:
            bound.arguments["mixed_precision"] = "bf16"
            _set(applied, "accelerate", "Accelerator(mixed_precision='bf16')",
                 "Accelerate's bf16 mixed precision (Accelerator(mixed_precision='bf16')); the root modules left alone")
        return bound.args[1:], bound.kwargs
    return before


# ---- advice that names the switch -------------------------------------------------------------------

# change -> framework -> the switch that makes it there
CHANGE_SWITCHES = {
    "bf16-autocast": {"transformers": "`TrainingArguments(bf16=True)`",
                      "lightning": '`Trainer(precision="bf16-mixed")`',
                      "accelerate": '`Accelerator(mixed_precision="bf16")`'},
    "tf32": {"transformers": "`TrainingArguments(tf32=True)`",
             "lightning": '`torch.set_float32_matmul_precision("high")` before `trainer.fit(...)` (no Trainer switch)'},
    "fused-optimizer": {"transformers": '`TrainingArguments(optim="adamw_torch_fused")`',
                        "lightning": "`fused=True` on the optimizer `configure_optimizers()` returns "
                                     "(`torch.optim.AdamW(self.parameters(), fused=True)`)"},
    "compile": {"transformers": "`TrainingArguments(torch_compile=True)`",
                "lightning": "`trainer.fit(torch.compile(model))`",
                "accelerate": '`Accelerator(dynamo_backend="inductor")`'},
    "compile-graphs": {"transformers": '`TrainingArguments(torch_compile=True, torch_compile_mode="reduce-overhead")`'},
    "cudnn-benchmark": {"lightning": "`Trainer(benchmark=True)`"},
    "loader-workers": {"transformers": "`TrainingArguments(dataloader_num_workers=N, dataloader_persistent_workers=True, "
                                       "dataloader_pin_memory=True)`"},
    "pin-memory": {"transformers": "`TrainingArguments(dataloader_pin_memory=True, "
                                   'accelerator_config={"non_blocking": True})`',
                   "accelerate": "`DataLoader(pin_memory=True)` and "
                                 "`Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))`"},
}
# rule -> framework -> the switch (the rule's own, where it joins several changes); a rule not here
# takes the switch of its measured trial's change, if any
RULE_SWITCHES = {
    "GD-FP32-MATMUL": {"transformers": "`TrainingArguments(bf16=True, tf32=True)`",
                       **{k: v for k, v in CHANGE_SWITCHES["bf16-autocast"].items() if k != "transformers"}},
    "GD-HALF-WEIGHTS": {"transformers": "`TrainingArguments(bf16_full_eval=True)` for evaluation and prediction",
                        "lightning": '`Trainer(precision="bf16-true")`'},
    "GD-UNFUSED-OPTIMIZER": CHANGE_SWITCHES["fused-optimizer"],
    "GD-TORCH-COMPILE": CHANGE_SWITCHES["compile"],
    "GD-OVERHEAD-BOUND": CHANGE_SWITCHES["compile-graphs"],
    "GD-CUDNN-BENCHMARK": CHANGE_SWITCHES["cudnn-benchmark"],
    "GD-INPUT-STALL": CHANGE_SWITCHES["loader-workers"],
    "GD-PAGEABLE-COPY": CHANGE_SWITCHES["pin-memory"],
}


def _sentence(switches: dict, used: list[str]) -> str | None:
    framework = next((f for f in used if f in switches), None)
    return None if framework is None else f"With {NAMES[framework]}: {switches[framework]}."


def framework_how_to(change: str, used: list[str]) -> str | None:
    """The sentence naming the switch that makes ``change`` in the first framework of ``used``
    (:func:`gpudiag.capture.frameworks.used`: "transformers", "lightning", "accelerate") that has
    one, e.g. "With the Lightning Trainer: `Trainer(precision="bf16-mixed")`."; None when none has."""
    return _sentence(CHANGE_SWITCHES.get(change) or {}, used)


def rule_how_to(rule_id: str, used: list[str]) -> str | None:
    """Like :func:`framework_how_to`, for a rule's advice (GD-FP32-MATMUL under the HF Trainer:
    "With the Hugging Face Trainer: `TrainingArguments(bf16=True, tf32=True)`.")."""
    return _sentence(RULE_SWITCHES.get(rule_id) or {}, used)


def name_switches(report: dict, status: ScriptStatus | dict | None = None) -> dict:
    """Put the framework's switch first in each recommendation's ``how_to_fix`` and in
    ``framework_switch``: the rule's (:func:`rule_how_to`), else that of the change its trial
    measured (``trial_change``: a GD-MEASURED win). ``status``: the launcher's (its
    ``frameworks``), else the report's ``script``. Idempotent; returns ``report``."""
    owned = ScriptStatus.of(status).frameworks if status is not None else (report.get("script") or {}).get("frameworks")
    used = frameworks.used(owned)
    if not used:
        return report
    for rec in report.get("recommendations") or []:
        text = rule_how_to(rec.get("rule_id"), used)
        if text is None and rec.get("trial_change"):
            text = framework_how_to(rec["trial_change"], used)
        if text is None:
            continue
        rec["framework_switch"] = text
        advice = rec.get("how_to_fix") or ""
        if not advice.startswith(text):
            rec["how_to_fix"] = f"{text} Otherwise: {advice}" if advice else text
    return report
