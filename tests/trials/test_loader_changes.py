"""The input pipeline's trial changes (gpudiag.trials.loader_changes) on CPU: the arguments a
DataLoader built after the change gets (workers, persistent, pinned; an IterableDataset left
alone; a larger explicit worker count kept), the copies made non_blocking (only the loader's pinned
batches, to CUDA, non_blocking not given: there is no CUDA here, so the decision is tested
directly, and Dynamo traces through the patched method), the plan (rules and generic trials), the
result check's "data stream" note, and the change applied by the real launcher.

Every patch is undone after each test (the ``restore`` fixture)."""

from __future__ import annotations

import textwrap
import warnings

import pytest

from gpudiag.capture import frameworks
from gpudiag.capture.instrument import CaptureConfig
from gpudiag.trials import loader_changes, plan, results, runner

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, IterableDataset, Subset, TensorDataset  # noqa: E402

from test_window import launch  # noqa: E402 - after the skip: it needs torch

TARGET = loader_changes.worker_target()


def _fresh(change: str) -> dict:
    return {"change": change, "applied": [], "form": None, "not_applicable": None}


@pytest.fixture
def restore():
    """Undo what installing a loader change patches: DataLoader.__init__, Tensor.to/.cuda and the
    loader's pinning function."""
    import torch.utils.data._utils.pin_memory as pinning

    saved = [(DataLoader, "__init__", DataLoader.__dict__["__init__"]), (torch.Tensor, "to", torch.Tensor.to),
             (torch.Tensor, "cuda", torch.Tensor.cuda), (pinning, "pin_memory", pinning.pin_memory)]
    yield
    for owner, name, value in saved:
        setattr(owner, name, value)


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(8.0).reshape(4, 2))


def _data() -> TensorDataset:
    return TensorDataset(torch.arange(16.0).reshape(8, 2), torch.arange(8))


# ---- the DataLoader's arguments ---------------------------------------------------------------------

def test_arguments_of_a_map_style_loader():
    new, what, reason = loader_changes.loader_arguments("loader-workers", {"dataset": 1, "batch_size": 4}, False, 7)
    assert new == {"dataset": 1, "batch_size": 4, "num_workers": 7, "persistent_workers": True, "pin_memory": True}
    assert what == ["num_workers 0 -> 7", "persistent_workers=True", "pin_memory=True"] and reason is None


def test_a_larger_explicit_worker_count_is_kept_and_a_smaller_one_raised():
    new, what, _ = loader_changes.loader_arguments("loader-workers", {"num_workers": 12}, False, 7)
    assert new["num_workers"] == 12 and what == ["persistent_workers=True", "pin_memory=True"]
    assert loader_changes.loader_arguments("loader-workers", {"num_workers": 2}, False, 7)[0]["num_workers"] == 7


def test_an_iterable_dataset_gets_no_workers_but_may_be_pinned():
    new, what, reason = loader_changes.loader_arguments("loader-workers", {"dataset": 1}, True, 7)
    assert new == {"dataset": 1} and what == [] and "IterableDataset" in reason
    new, what, reason = loader_changes.loader_arguments("pin-memory", {"dataset": 1}, True, 7)
    assert new == {"dataset": 1, "pin_memory": True} and reason is None


def test_a_dataset_on_the_gpu_is_left_alone():
    """A TensorDataset of CUDA tensors (faked: a device other than the CPU) has nothing to load on the
    host: no worker, no pinning."""
    on_meta = TensorDataset(torch.ones(4, 2, device="meta"))
    assert frameworks.on_device(on_meta) and frameworks.on_device(Subset(on_meta, [0, 1]))
    assert not frameworks.on_device(_data()) and not frameworks.on_device(Stream())
    for change in loader_changes.LOADER_CHANGES:
        new, what, reason = loader_changes.loader_arguments(change, {"dataset": on_meta}, False, 7, True)
        assert new == {"dataset": on_meta} and what == [] and "on the GPU" in reason
    assert "on the GPU" in plan.blocked("pin-memory", {}, _used(LOADER | {"on_device": True}))


def test_nothing_to_change_says_why():
    full = {"num_workers": 8, "persistent_workers": True, "pin_memory": True}
    assert "already" in loader_changes.loader_arguments("loader-workers", full, False, 7)[2]
    assert "already" in loader_changes.loader_arguments("pin-memory", {"pin_memory": True}, False, 7)[2]
    assert "no CPU core" in loader_changes.loader_arguments("loader-workers", {}, False, 0)[2]


def test_worker_target_is_the_free_cores_capped():
    assert 0 <= TARGET <= loader_changes.MAX_WORKERS


# ---- DataLoaders built after install -----------------------------------------------------------------

def test_a_loader_built_after_install_gets_workers_persistent_and_pinned(restore):
    plain = [x.tolist() for x, _ in DataLoader(_data(), 4)]
    applied = _fresh("loader-workers")
    loader_changes.install("loader-workers", applied)
    loader = DataLoader(_data(), 4)  # batch_size positional: bound by name
    if TARGET == 0:
        assert loader.num_workers == 0 and "no CPU core" in applied["not_applicable"]
        return
    assert (loader.num_workers, loader.persistent_workers, loader.pin_memory, loader.batch_size) == (TARGET, True, True, 4)
    assert applied["applied"] == [f"DataLoader(TensorDataset): num_workers 0 -> {TARGET}, persistent_workers=True, "
                                  "pin_memory=True"] and applied["not_applicable"] is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without an accelerator: PyTorch warns and does not pin
        batches = [x.tolist() for x, _ in loader]
    assert batches == plain  # same samples, same order


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # more workers than cores: on purpose
def test_an_explicit_larger_worker_count_is_kept(restore):
    loader_changes.install("loader-workers", _fresh("loader-workers"))
    assert DataLoader(_data(), batch_size=4, num_workers=TARGET + 3).num_workers == TARGET + 3


def test_an_iterable_dataset_loader_is_left_alone(restore):
    applied = _fresh("loader-workers")
    loader_changes.install("loader-workers", applied)
    loader = DataLoader(Stream(), batch_size=2)
    assert (loader.num_workers, loader.pin_memory) == (0, False)
    assert applied["applied"] == [] and "IterableDataset" in applied["not_applicable"]


def test_pin_memory_pins_every_loader_and_leaves_workers(restore):
    applied = _fresh("pin-memory")
    loader_changes.install("pin-memory", applied)
    map_style, stream = DataLoader(_data(), batch_size=4), DataLoader(Stream(), batch_size=2)
    assert (map_style.num_workers, map_style.pin_memory, stream.pin_memory) == (0, True, True)
    assert applied["applied"] == ["DataLoader(TensorDataset): pin_memory=True", "DataLoader(Stream): pin_memory=True"]


# ---- non_blocking copies ----------------------------------------------------------------------------

class Batch:
    """Stands for a tensor the loader pinned (no CUDA here to pin one): its device and the mark."""

    def __init__(self, device: str = "cpu", marked: bool = True) -> None:
        self.device = torch.device(device)
        if marked:
            setattr(self, loader_changes.PINNED_MARK, True)


@pytest.mark.parametrize("method, args, kwargs, expected", [
    ("to", ("cuda",), {}, True),
    ("to", (), {"device": "cuda:1"}, True),
    ("to", (torch.device("cuda", 0), torch.float16), {}, True),
    ("to", (0,), {}, True),  # a device index
    ("cuda", (), {}, True),
    ("to", ("cuda",), {"non_blocking": False}, False),  # the script's own choice
    ("to", ("cuda", torch.float16, False), {}, False),  # non_blocking given positionally
    ("cuda", (0, False), {}, False),
    ("to", ("cpu",), {}, False),  # CPU -> CPU
    ("to", (torch.float16,), {}, False),  # a cast, no copy to a device
])
def test_which_copies_become_non_blocking(method, args, kwargs, expected):
    assert loader_changes.make_non_blocking(Batch(), method, args, kwargs) is expected


def test_device_to_host_and_unpinned_copies_never_become_non_blocking():
    assert loader_changes.make_non_blocking(Batch("cuda"), "to", ("cpu",), {}) is False  # D2H
    assert loader_changes.make_non_blocking(Batch(marked=False), "to", ("cuda",), {}) is False
    assert loader_changes.make_non_blocking(torch.ones(2), "to", ("cuda",), {}) is False  # not the loader's


def test_patched_copies_pass_through_eager_and_dynamo(restore):
    applied = _fresh("pin-memory")
    loader_changes.install("pin-memory", applied)
    x = torch.arange(4.0)
    assert x.to(torch.float64).dtype == torch.float64 and x.to("cpu") is x

    @torch.compile(fullgraph=True, backend="eager")  # fullgraph: a graph break would raise
    def f(t):
        return t.to(torch.float64).sin().to("cpu")

    assert torch.equal(f(x), x.to(torch.float64).sin()) and applied["applied"] == []


def test_the_loaders_pinned_tensors_are_marked(restore, monkeypatch):
    import torch.utils.data._utils.pin_memory as pinning

    loader_changes.install("pin-memory", _fresh("pin-memory"))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a: self)  # no accelerator to pin with here
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self, *a: True)
    batch = pinning.pin_memory({"x": torch.ones(2), "y": [torch.zeros(1)]})
    assert getattr(batch["x"], loader_changes.PINNED_MARK) and getattr(batch["y"][0], loader_changes.PINNED_MARK)


# ---- the plan and the result check ----------------------------------------------------------------

def _used(*loaders) -> dict:
    return {"frameworks": {"dataloaders": {"built": len(loaders), "loaders": list(loaders)}}}


LOADER = {"dataset": "TensorDataset", "iterable": False, "on_device": False, "num_workers": 0, "pin_memory": False,
          "persistent_workers": False}


def test_the_input_rules_map_to_the_loader_changes():
    assert plan.RULE_CHANGES["GD-INPUT-STALL"] == ("loader-workers",)
    assert plan.RULE_CHANGES["GD-PAGEABLE-COPY"] == ("pin-memory",)


def test_loader_changes_are_blocked_where_they_cannot_help():
    report = {}
    assert plan.blocked("loader-workers", report, {}) is None  # a status from before loaders were recorded
    assert "no torch.utils.data.DataLoader" in plan.blocked("loader-workers", report, _used())
    assert "IterableDataset" in plan.blocked("loader-workers", report, _used(LOADER | {"iterable": True}))
    assert "pin memory already" in plan.blocked("pin-memory", report, _used(LOADER | {"pin_memory": True}))
    assert plan.blocked("pin-memory", report, _used(LOADER)) is None
    if TARGET:
        assert plan.blocked("loader-workers", report, _used(LOADER)) is None
        done = LOADER | {"num_workers": TARGET, "pin_memory": True, "persistent_workers": True}
        assert "already" in plan.blocked("loader-workers", report, _used(done))


def test_loader_workers_is_generic_only_with_an_input_stall_and_a_dataloader():
    step = {"steps": {"step_time_ns": {"median": 100e6}}}
    stalled = step | {"idle": {"step_start_idle_ns_per_step": 30e6}} | {"script": _used(LOADER)}
    assert "loader-workers" in dict(plan.generic_changes(stalled))
    assert "loader-workers" not in dict(plan.generic_changes(stalled | {"script": _used()}))
    assert "loader-workers" not in dict(plan.generic_changes(stalled | {"idle": {"step_start_idle_ns_per_step": 1e6}}))


def _window() -> dict:
    return {"warmup_steps": 1, "window_steps": 2, "step_gpu_ns": {"1": 10.0, "2": 12.0}}


def test_a_loss_changed_by_worker_seeding_is_noted_not_called_a_changed_result():
    baseline, trial = {"losses": {"1": 2.0}} | _window(), {"losses": {"1": 2.3}} | _window()
    assert results.tolerance_class(None, "loader-workers") == "fp32" == results.tolerance_class(None, "pin-memory")
    workers = results.trial_result({"change": "loader-workers"}, baseline, trial, 0, 1.0)
    assert workers["status"] != "changes results" and workers["result_difference"]["note"].startswith("data stream")
    pinned = results.trial_result({"change": "pin-memory"}, baseline, trial, 0, 1.0)
    assert pinned["status"] == "changes results"  # pinning changes no value: a difference is a real one


# ---- end to end: the launcher ----------------------------------------------------------------------------

TRAIN_WITH_LOADER = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(256, 4), torch.randn(256, 1)), batch_size=8)
for x, y in loader:
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_launcher_applies_loader_workers_and_records_the_loader(tmp_path):
    if TARGET == 0:
        pytest.skip("one core: no worker to give")
    config = runner.trial_config(CaptureConfig(warmup_steps=1, window_steps=2), "loader-workers")
    proc, status = launch(tmp_path, textwrap.dedent(TRAIN_WITH_LOADER), config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert status["trial"]["applied"] == [f"DataLoader(TensorDataset): num_workers 0 -> {TARGET}, "
                                          "persistent_workers=True, pin_memory=True"]
    loader = status["frameworks"]["dataloaders"]["loaders"][0]
    assert (loader["num_workers"], loader["persistent_workers"], loader["pin_memory"]) == (TARGET, True, True)
    assert status["steps_completed"] > 2 and status["exception"] is None
