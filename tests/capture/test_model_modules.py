"""Steps come from the model, never from its data pipeline (issue 34), through the real launcher
on CPU: a ``Dataset`` whose transforms are ``nn.Module``s, loaded with 0 and 2 workers (fork,
and spawn/forkserver), keeps the optimizer's steps, the right batch size and its workers; a child
forked from the instrumented process counts no step and is never ended at the window's end."""

from __future__ import annotations

import pytest

from gpudiag.capture.instrument import CaptureConfig

torch = pytest.importorskip("torch")

from test_window import launch  # noqa: E402 - after the skip: it needs torch

from gpudiag.capture import model_modules  # noqa: E402

# An ImageNet-style script: parameter-free nn.Module transforms in the Dataset (as torchvision's
# transforms.v2 are), a DataLoader, a CNN, SGD; the optimizer is built before the data is touched.
PIPELINE = """
import os, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Normalize(nn.Module):
    def __init__(self, mean, std):
        super().__init__()
        self.mean, self.std = mean, std

    def forward(self, x):
        return (x - self.mean) / self.std


class RandomFlip(nn.Module):
    def forward(self, x):
        return x.flip(-1) if torch.rand(()) < 0.5 else x


class Compose(nn.Module):
    def __init__(self, transforms):
        super().__init__()
        self.transforms = transforms

    def forward(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class Images(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, 255, (n, 3, 24, 24), dtype=torch.uint8, generator=g)
        self.transform = Compose([RandomFlip(), Normalize(0.5, 0.25)])

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.transform(self.data[i].float() / 255), int(i % 10)


def main():
    workers, context = int(sys.argv[1]), sys.argv[2]
    loader = DataLoader(Images(2048), batch_size=16, shuffle=True, num_workers=workers,
                        multiprocessing_context=None if workers == 0 else context,
                        persistent_workers=workers > 0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    iterations = 0
    for epoch in range(100):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            iterations += 1
            print("iteration", iterations, flush=True)
            opt.step()
    print("loop finished", flush=True)


if __name__ == "__main__":
    main()
"""


def _run(tmp_path, body: str, config: CaptureConfig, *args: str):
    """``launch`` with script arguments (the helper passes none): written into the script."""
    argv = ", ".join(repr(a) for a in ("train.py", *args))
    return launch(tmp_path, f"import sys\nsys.argv = [{argv}]\n" + body, config)


@pytest.mark.parametrize("bare", [True, False], ids=["bare", "profiled"])
@pytest.mark.parametrize("workers,context", [(0, "fork"), (2, "fork")])
def test_transform_modules_in_the_dataset_are_never_steps(tmp_path, workers, context, bare):
    config = CaptureConfig(warmup_steps=2, window_steps=5, bare=bare)
    proc, status = _run(tmp_path, PIPELINE, config, str(workers), context)
    assert proc.returncode == 0, proc.stderr
    assert "exited unexpectedly" not in proc.stderr
    # the optimizer's steps, one per iteration: 2 warm-up + 5, then the script was ended there
    assert status["step_mode"] == "optimizer"
    assert status["stopped_after_window"] == 7
    assert proc.stdout.count("iteration ") == 7 and "loop finished" not in proc.stdout
    # the batch (16 images) is the model's input's dimension 0, not a transform's [3, 24, 24]
    assert status["samples_per_step"] == 16 and status["first_input_shape"] == [16, 3, 24, 24]


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_spawned_and_forkserver_workers_survive(tmp_path, context):
    config = CaptureConfig(warmup_steps=1, window_steps=3, bare=True)
    proc, status = _run(tmp_path, PIPELINE, config, "2", context)
    assert proc.returncode == 0, proc.stderr
    assert "exited unexpectedly" not in proc.stderr
    assert status["step_mode"] == "optimizer" and status["stopped_after_window"] == 4
    assert proc.stdout.count("iteration ") == 4


# A featurizer with parameters runs inside the forked workers: in the child it is called again and
# again with no optimizer step, which in the parent would make it a stepping model. The child must
# count nothing and never be ended at the window's end (the parent's window is 4 steps; each worker
# calls the featurizer far more often than that).
FORKED_MODEL = """
import os
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

featurizer = nn.Linear(4, 4)


class Features(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        with torch.no_grad():
            return featurizer(torch.full((4,), float(i % 7))), i % 2


if __name__ == "__main__":
    torch.manual_seed(0)
    loader = DataLoader(Features(), batch_size=32, num_workers=2, multiprocessing_context="fork")
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        print("iteration", i + 1, os.getpid(), flush=True)
        opt.step()
"""


def test_a_forked_worker_running_a_module_is_not_instrumented(tmp_path):
    proc, status = launch(tmp_path, FORKED_MODEL, CaptureConfig(warmup_steps=1, window_steps=3, bare=True))
    assert proc.returncode == 0, proc.stderr
    assert "exited unexpectedly" not in proc.stderr
    assert status["step_mode"] == "optimizer" and status["stopped_after_window"] == 4
    assert proc.stdout.count("iteration ") == 4


# The model called twice before training starts (a sanity check, a summary): with an optimizer
# built, auto mode waits for its step instead of taking forward calls as steps.
SANITY_THEN_TRAIN = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with torch.no_grad():
    for _ in range(5):
        model(torch.randn(2, 8))  # checks before training
for step in range(1000):
    loss = model(torch.randn(32, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    print("iteration", step + 1, flush=True)
    opt.step()
"""


def test_auto_prefers_optimizer_steps_when_an_optimizer_exists(tmp_path):
    proc, status = launch(tmp_path, SANITY_THEN_TRAIN, CaptureConfig(warmup_steps=2, window_steps=3, bare=True))
    assert proc.returncode == 0, proc.stderr
    assert status["step_mode"] == "optimizer" and status["stopped_after_window"] == 5
    assert proc.stdout.count("iteration ") == 5


def test_is_model_needs_state_on_the_compute_device():
    from torch import nn

    assert not model_modules.is_model(nn.ReLU())  # no parameters, no buffers
    assert model_modules.is_model(nn.Linear(2, 2))  # CPU parameters on a CPU-only torch
    assert model_modules.is_model(nn.BatchNorm1d(2, affine=False))  # buffers only
    assert not model_modules.holds_device_state(nn.Linear(2, 2), "cuda")
    assert model_modules.holds_device_state(nn.Linear(2, 2, device="meta"), "meta")


def test_a_transform_package_class_is_never_the_model():
    from torch import nn

    transform = type("Normalize", (nn.Linear,), {"__module__": "torchvision.transforms.v2._misc"})(2, 2)
    assert model_modules.is_data_transform(transform) and not model_modules.is_model(transform)


def test_a_module_without_parameters_that_returned_a_device_tensor_is_learned():
    from torch import nn

    wrapper = nn.Identity()
    assert not model_modules.is_model(wrapper)
    model_modules.learn_from_output(wrapper, (torch.zeros(1), {"y": torch.zeros(1, device="meta")}))
    assert not model_modules.is_model(wrapper)  # a meta tensor is not CUDA work
    assert model_modules.returned_device_tensor({"y": [torch.zeros(1, device="meta")]}, "meta")
    assert not model_modules.returned_device_tensor([torch.zeros(1)], "meta")
