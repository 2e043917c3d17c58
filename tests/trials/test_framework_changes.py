"""Trial changes through the framework's own switches (gpudiag.trials.framework_changes), on real
Lightning, transformers and accelerate objects on CPU: the switch is set where the script left the
default, an explicit choice is kept and reported not applicable, the root-module version of the
same change does not also act, and the advice names the switch of the framework the script used.
The import hook (gpudiag.capture.frameworks) is checked on a module imported after it, in-process,
and through the real launcher on a Lightning script.

Every class these tests patch is restored after each test (the ``restore`` fixture)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from gpudiag.capture import frameworks, import_hook
from gpudiag.capture.instrument import CaptureConfig
from gpudiag.trials import framework_changes, runner

torch = pytest.importorskip("torch")

from test_window import launch  # noqa: E402 - after the skip: it needs torch


def _fresh(change: str) -> dict:
    return {"change": change, "applied": [], "form": None, "not_applicable": None}


@pytest.fixture
def restore(monkeypatch):
    """Undo every patch a change makes in this process: the framework classes' methods, the import
    hook's finder and waiting callbacks, the accelerate state and the TF32 flags."""
    saved = []
    for module, cls, name in (("lightning.pytorch", "Trainer", "__init__"), ("pytorch_lightning", "Trainer", "__init__"),
                              ("transformers", "TrainingArguments", "__post_init__"),
                              ("transformers", "Trainer", "__init__"), ("accelerate", "Accelerator", "__init__")):
        try:
            klass = getattr(__import__(module, fromlist=[cls]), cls)
        except ImportError:
            continue
        saved.append((klass, name, klass.__dict__[name]))
    meta_path, hooks = list(sys.meta_path), {k: list(v) for k, v in import_hook._hooks.items()}
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.delenv("PL_TRAINER_PRECISION", raising=False)
    yield
    for klass, name, value in saved:
        setattr(klass, name, value)
    sys.meta_path[:] = meta_path
    import_hook._hooks.clear()
    import_hook._hooks.update(hooks)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    _reset_accelerate()


def _reset_accelerate() -> None:
    try:
        from accelerate.state import AcceleratorState, PartialState
    except ImportError:
        return
    AcceleratorState._reset_state(True)
    PartialState._reset_state()


def _lightning_trainer(package: str = "lightning.pytorch", **kwargs):
    pl = pytest.importorskip(package)
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, **kwargs)


# ---- Lightning -------------------------------------------------------------------------------------

@pytest.mark.parametrize("package", ["lightning.pytorch", "pytorch_lightning"])
def test_lightning_trainer_gets_bf16_mixed_where_precision_was_left_default(restore, package):
    applied = _fresh("bf16-autocast")
    framework_changes.install("bf16-autocast", applied)
    trainer = _lightning_trainer(package)
    assert trainer.precision == "bf16-mixed"
    assert applied["applied"] == ["Trainer(precision='bf16-mixed')"] and applied["not_applicable"] is None
    assert applied["framework"] == package.split(".")[0] and "Lightning" in applied["form"]


@pytest.mark.parametrize("precision", [32, "32-true"])
def test_lightning_fp32_precision_is_the_default_and_is_changed(restore, precision):
    applied = _fresh("bf16-autocast")
    framework_changes.install("bf16-autocast", applied)
    assert _lightning_trainer(precision=precision).precision == "bf16-mixed"


def test_lightning_explicit_half_precision_is_kept_and_not_applicable(restore):
    applied = _fresh("bf16-autocast")
    framework_changes.install("bf16-autocast", applied)
    assert _lightning_trainer(precision="bf16-true").precision == "bf16-true"
    assert applied["applied"] == [] and "Trainer(precision='bf16-true')" in applied["not_applicable"]
    assert framework_changes.owned(applied)  # the root modules' autocast stays off too


def test_lightning_precision_from_the_environment_is_the_scripts(restore, monkeypatch):
    monkeypatch.setenv("PL_TRAINER_PRECISION", "bf16-true")
    applied = _fresh("bf16-autocast")
    framework_changes.install("bf16-autocast", applied)
    _lightning_trainer()
    assert applied["applied"] == [] and "bf16-true" in applied["not_applicable"]


def test_root_modules_changed_first_leave_the_framework_alone(restore):
    """The script called its model before building the Trainer: the root-module autocast came
    first, and Lightning's precision is not also set."""
    applied = _fresh("bf16-autocast") | {"applied": ["Net.forward under torch.autocast('cuda', dtype=torch.bfloat16)"]}
    framework_changes.install("bf16-autocast", applied)
    assert _lightning_trainer().precision == "32-true" and not framework_changes.owned(applied)


# ---- Hugging Face TrainingArguments ----------------------------------------------------------------

def _training_arguments(tmp_path, **kwargs):
    transformers = pytest.importorskip("transformers")
    return transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kwargs)


def test_training_arguments_get_bf16(restore, tmp_path):
    applied = _fresh("bf16-autocast")
    framework_changes.install("bf16-autocast", applied)
    args = _training_arguments(tmp_path)
    assert args.bf16 is True and args.mixed_precision == "bf16"
    assert applied["applied"] == ["TrainingArguments(bf16=True)"] and applied["framework"] == "transformers"


@pytest.mark.parametrize("given", [{"bf16": True}, {"fp16": True}])
def test_training_arguments_keep_the_scripts_precision(restore, tmp_path, given):
    applied = _fresh("bf16-autocast")
    framework_changes.install("bf16-autocast", applied)
    if "fp16" in given:  # transformers refuses fp16 on CPU: the decision is all this checks
        applied_args = type("Args", (), {"bf16": False, "fp16": True})()
        framework_changes._hf_bf16(applied_args, applied)
    else:
        assert _training_arguments(tmp_path, **given).bf16 is True
    assert applied["applied"] == [] and f"{next(iter(given))}=True" in applied["not_applicable"]


def test_accelerate_config_precision_is_the_scripts(restore, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    applied = _fresh("bf16-autocast")
    framework_changes.install("bf16-autocast", applied)
    framework_changes._hf_bf16(type("Args", (), {"bf16": False, "fp16": False, "use_cpu": True})(), applied)
    assert applied["applied"] == [] and "ACCELERATE_MIXED_PRECISION=fp16" in applied["not_applicable"]


def test_seq2seq_training_arguments_go_through_the_same_post_init(restore, tmp_path):
    """A dataclass subclass generates its own __init__: the switch is set in __post_init__."""
    transformers = pytest.importorskip("transformers")
    applied = _fresh("compile")
    framework_changes.install("compile", applied)
    args = transformers.Seq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    assert args.torch_compile is True and args.torch_compile_backend == "inductor"
    assert applied["applied"] == ["TrainingArguments(torch_compile=True)"]


def test_training_arguments_optim_adamw_torch_becomes_fused(restore, tmp_path):
    applied = _fresh("fused-optimizer")
    framework_changes.install("fused-optimizer", applied)
    assert str(_training_arguments(tmp_path, optim="adamw_torch").optim.value) == "adamw_torch_fused"
    assert applied["applied"] == ["TrainingArguments(optim='adamw_torch_fused')"]


def test_transformers_default_optim_is_fused_already(restore, tmp_path):
    """transformers 5's default optim is adamw_torch_fused: nothing to change, said so."""
    applied = _fresh("fused-optimizer")
    framework_changes.install("fused-optimizer", applied)
    assert str(_training_arguments(tmp_path).optim.value) == "adamw_torch_fused"
    assert applied["applied"] == [] and "fused already" in applied["not_applicable"]


def test_training_arguments_tf32(restore, tmp_path, monkeypatch):
    """tf32=True where transformers finds a TF32 GPU (faked: this machine has none, and transformers
    refuses tf32=True without one); on CPU it is left unset, and tf32=False is the script's."""
    transformers = pytest.importorskip("transformers")
    applied = _fresh("tf32") | {"applied": ["torch.backends.cuda.matmul.allow_tf32 = True; ..."]}
    framework_changes.install("tf32", applied)
    assert _training_arguments(tmp_path).tf32 is None and len(applied["applied"]) == 1  # no TF32 here
    monkeypatch.setattr(transformers.utils, "is_torch_tf32_available", lambda: True)
    monkeypatch.setattr(transformers.training_args, "is_torch_tf32_available", lambda: True)
    assert _training_arguments(tmp_path).tf32 is True
    assert applied["applied"][-1] == "TrainingArguments(tf32=True)"
    declined = _fresh("tf32") | {"applied": ["torch.backends.cuda.matmul.allow_tf32 = True; ..."]}
    framework_changes._hf_tf32(type("Args", (), {"tf32": False})(), declined)
    assert declined["applied"] == [] and "tf32=False" in declined["not_applicable"]
    already = _fresh("tf32")
    framework_changes._hf_tf32(type("Args", (), {"tf32": True})(), already)
    assert already["applied"] == [] and "tf32=True) already" in already["not_applicable"]


def test_an_optimizer_the_script_hands_to_the_hf_trainer_is_still_fused(restore, tmp_path):
    """``TrainingArguments(optim="adamw_torch")`` takes the switch, but a script that builds its own
    AdamW and passes ``Trainer(optimizers=(opt, None))`` trains with that one: the generic change
    still makes it foreach/fused (the HF Trainer ignores ``optim`` then)."""
    import torch

    from gpudiag.trials import changes

    originals = {cls: cls.__dict__["__init__"] for cls in vars(torch.optim).values()
                 if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and "__init__" in cls.__dict__}
    changes.install("fused-optimizer", state=None)
    try:
        assert str(_training_arguments(tmp_path, optim="adamw_torch").optim.value) == "adamw_torch_fused"
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)  # built by the script
        assert "AdamW(foreach=True)" in changes.APPLIED["applied"]  # CPU parameters: foreach, not fused
    finally:
        for cls, init in originals.items():
            cls.__init__ = init


def test_hf_trainer_builds_its_accelerator_from_the_arguments_once(restore, tmp_path):
    """The HF Trainer's own Accelerator takes bf16 from TrainingArguments; the Accelerator patch
    does not also act on it."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    _reset_accelerate()
    applied = _fresh("bf16-autocast")
    framework_changes.install("bf16-autocast", applied)
    args = _training_arguments(tmp_path, max_steps=1)
    trainer = transformers.Trainer(model=torch.nn.Linear(2, 2), args=args)
    assert trainer.accelerator.mixed_precision == "bf16"
    assert applied["applied"] == ["TrainingArguments(bf16=True)"]


# ---- Accelerate -------------------------------------------------------------------------------------

def test_accelerator_gets_bf16_where_the_script_gave_none(restore):
    accelerate = pytest.importorskip("accelerate")
    _reset_accelerate()
    applied = _fresh("bf16-autocast")
    framework_changes.install("bf16-autocast", applied)
    assert accelerate.Accelerator(cpu=True).mixed_precision == "bf16"
    assert applied["applied"] == ["Accelerator(mixed_precision='bf16')"] and applied["framework"] == "accelerate"


@pytest.mark.parametrize("given", ["no", "NO"])
def test_accelerator_mixed_precision_no_is_fp32_and_gets_bf16(restore, given):
    """``mixed_precision="no"`` is what an argparse default passes on (accelerate's examples, the
    suite's accelerate_accum.py, whose bf16-autocast trial was "not applicable" on the H200)."""
    accelerate = pytest.importorskip("accelerate")
    _reset_accelerate()
    applied = _fresh("bf16-autocast")
    framework_changes.install("bf16-autocast", applied)
    assert accelerate.Accelerator(cpu=True, mixed_precision=given).mixed_precision == "bf16"
    assert applied["applied"] == ["Accelerator(mixed_precision='bf16')"]


def test_accelerator_keeps_the_scripts_mixed_precision(restore):
    accelerate = pytest.importorskip("accelerate")
    _reset_accelerate()
    applied = _fresh("bf16-autocast")
    framework_changes.install("bf16-autocast", applied)
    assert accelerate.Accelerator(cpu=True, mixed_precision="fp16").mixed_precision == "fp16"
    assert applied["applied"] == [] and "mixed_precision='fp16'" in applied["not_applicable"]


# ---- the import hook ----------------------------------------------------------------------------------

def test_a_class_imported_after_install_is_patched_and_its_loader_restored(restore, tmp_path, monkeypatch):
    (tmp_path / "gd_fake_framework.py").write_text("class Trainer:\n    def __init__(self, precision=None):\n"
                                                   "        self.precision = precision\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    frameworks.when_imported("gd_fake_framework", lambda m: frameworks.wrap_init(
        m.Trainer, before=lambda _s, a, k: (a, {**k, "precision": "bf16-mixed"}), after=lambda s: seen.append(s)))
    import gd_fake_framework

    try:
        trainer = gd_fake_framework.Trainer()
        assert trainer.precision == "bf16-mixed" and seen == [trainer]
        assert type(gd_fake_framework.__loader__).__name__ == "SourceFileLoader"  # the real loader, put back
        assert gd_fake_framework.__spec__.loader is gd_fake_framework.__loader__
    finally:
        del sys.modules["gd_fake_framework"]


def test_a_failing_patch_never_breaks_the_scripts_constructor(restore):
    class Thing:
        def __init__(self, value=1):
            self.value = value

    frameworks.wrap_init(Thing, before=lambda *_: 1 / 0)
    assert Thing(value=3).value == 3 and "ZeroDivisionError" in frameworks.summary()["errors"][-1]


# ---- advice ---------------------------------------------------------------------------------------------

def _status(**constructed) -> dict:
    return {"frameworks": {"constructed": {k.replace("__", "."): v for k, v in constructed.items()}}}


def test_advice_names_the_frameworks_switch():
    hf = frameworks.used(_status(transformers__Trainer=1, accelerate__Accelerator=1)["frameworks"])
    assert hf == ["transformers"]  # the Trainer's own Accelerator is not the script's
    assert framework_changes.rule_how_to("GD-FP32-MATMUL", hf) == \
        "With the Hugging Face Trainer: `TrainingArguments(bf16=True, tf32=True)`."
    assert framework_changes.rule_how_to("GD-UNFUSED-OPTIMIZER", hf).endswith('`TrainingArguments(optim="adamw_torch_fused")`.')
    assert framework_changes.rule_how_to("GD-FP32-MATMUL", ["lightning"]).endswith('`Trainer(precision="bf16-mixed")`.')
    assert framework_changes.rule_how_to("GD-FP32-MATMUL", ["accelerate"]).endswith('`Accelerator(mixed_precision="bf16")`.')
    assert framework_changes.framework_how_to("loader-workers", ["lightning"]) is None
    assert framework_changes.rule_how_to("GD-HOST-SYNC", hf) is None


def test_name_switches_puts_the_switch_first_once():
    report = {"script": _status(lightning__Trainer=1),
              "recommendations": [{"rule_id": "GD-FP32-MATMUL", "how_to_fix": "Use bf16 autocast."},
                                  {"rule_id": "GD-MEASURED", "trial_change": "cudnn-benchmark", "how_to_fix": "x"},
                                  {"rule_id": "GD-HOST-SYNC", "how_to_fix": "Remove .item()."}]}
    framework_changes.name_switches(report)
    framework_changes.name_switches(report)  # idempotent: gpudiag report re-attaches
    fp32, measured, sync = report["recommendations"]
    assert fp32["how_to_fix"] == 'With the Lightning Trainer: `Trainer(precision="bf16-mixed")`. Otherwise: Use bf16 autocast.'
    assert measured["framework_switch"] == "With the Lightning Trainer: `Trainer(benchmark=True)`."
    assert sync["how_to_fix"] == "Remove .item()." and "framework_switch" not in sync


# ---- end to end: the launcher on a Lightning script ----------------------------------------------------

LIGHTNING_TRAIN = """
import torch
import lightning as L
from torch import nn

class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    def training_step(self, batch, _):
        x, y = batch
        out = self.net(x)
        print("DTYPE", out.dtype, flush=True)
        return nn.functional.mse_loss(out.float(), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

if __name__ == "__main__":
    L.seed_everything(0, verbose=False)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = L.Trainer(max_steps=8, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=8))
"""


def test_launcher_sets_lightning_precision_and_records_the_framework(tmp_path):
    """Through the real launcher (Lightning imported by the script, after the change is installed):
    the Trainer runs bf16-mixed (Lightning's CPU autocast: the net's outputs are bf16), the trial's
    status names the switch, the root-module autocast is not also applied, and the status says a
    Lightning Trainer and a DataLoader were built."""
    pytest.importorskip("lightning")
    config = runner.trial_config(CaptureConfig(warmup_steps=1, window_steps=2), "bf16-autocast")
    proc, status = launch(tmp_path, textwrap.dedent(LIGHTNING_TRAIN), config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert status["trial"]["applied"] == ["Trainer(precision='bf16-mixed')"]
    assert status["trial"]["framework"] == "lightning" and status["trial"]["not_applicable"] is None
    assert "DTYPE torch.bfloat16" in proc.stdout
    used = status["frameworks"]
    assert used["constructed"] == {"lightning.Trainer": 1} and "lightning" in used["imported"]
    assert used["dataloaders"]["built"] >= 1 and used["dataloaders"]["loaders"][0]["num_workers"] == 0
    assert frameworks.used(used) == ["lightning"]
