"""Patches verified by running them (gpudiag.patches.verify): the verdict rule against interval
arithmetic written here, and a real patched script run bare against the unchanged one on the CPU
(a loader whose batches take 32 ms beside 30 ms of other work per step: a DataLoader worker
overlaps the two, measured through the trials' launcher and statistics)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpudiag.capture.instrument import CaptureConfig
from gpudiag.patches import make, verify

pytest.importorskip("torch")

SLOW_LOADER = '''"""A training loop whose DataLoader makes each sample in 4 ms on the host."""
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(0.004)  # decoding an image, say
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), i % 2


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Slow(), batch_size=8, shuffle=False)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.03)  # the GPU's share of the step: a worker loads the next batch meanwhile


if __name__ == "__main__":
    main()
'''

TRIAL = {"change": "loader-workers", "status": "measured", "saving_ns": 16e6, "saving_percent": 50.0,
         "baseline_step_ns": 32e6, "saving_ci_ns": [9.6e6, 19.2e6],  # 30 % to 60 % of the step
         "applied": ["DataLoader(Slow): num_workers 0 -> 2, persistent_workers=True, pin_memory=True"]}


def _record(saving_pct: float, lo: float, hi: float, status: str = "measured") -> dict:
    base = 100e6
    return {"status": status, "baseline_step_ns": base, "saving_percent": saving_pct,
            "saving_ci_ns": [lo * base / 100, hi * base / 100]}


@pytest.mark.parametrize("patched, expected", [
    (_record(45, 35, 55), "verified"),            # overlaps the trial's 30-60 %
    (_record(62, 61, 70), "verified"),            # above the trial's: said in the reason
    (_record(20, 10, 25), "saves less than its trial"),
    (_record(5, -3, 12, "inconclusive"), "inconclusive"),
    (_record(-20, -30, -10), "slower"),
    ({"status": "failed", "error": "boom"}, "failed"),
    ({"status": "changes results", "saving_ci_ns": [1, 2], "baseline_step_ns": 10}, "changes results"),
])
def test_judge_sets_the_patched_interval_against_the_trials(patched, expected):
    status, why = verify.judge(patched, TRIAL)
    assert status == expected, why
    assert ("more than the trial's [30.0, 60.0] %" in why) == (patched.get("saving_percent") == 62)
    # the trial's interval in % of its baseline step: 9.6/32 and 19.2/32
    assert verify._percent_interval(TRIAL) == pytest.approx([30.0, 60.0])


def test_a_loader_workers_patch_is_verified_by_running_the_patched_script(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    script = folder / "train.py"
    script.write_text(SLOW_LOADER)
    (folder / "data").mkdir()  # a data folder beside the script: linked into the scratch copy
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    patch = make.make_patch(script, "loader-workers", TRIAL)
    assert patch.made, patch.why_not
    assert "num_workers=2, persistent_workers=True, pin_memory=True" in patch.files[0]["after"]
    # the diff is git's: it applies to a copy of the folder
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "train.py").write_text(SLOW_LOADER)
    (tmp_path / "p.patch").write_text(patch.diff)
    subprocess.run(["git", "apply", "--check", str(tmp_path / "p.patch")], cwd=copy, check=True)

    lines: list[str] = []
    result = verify.verify(patch, script, [], run_dir, CaptureConfig(warmup_steps=2, window_steps=10), TRIAL,
                           budget_s=300, echo=lines.append)
    assert result["runs"] == {"baseline": 3, "patched": 2}, lines
    src = run_dir / "changes" / "loader-workers" / "src"
    assert (src / "data").is_symlink() and (src / "train.py").read_text() == patch.files[0]["after"]
    assert script.read_text() == SLOW_LOADER  # the user's file is never touched
    # the patched runs' interval, as % of the unchanged script's step, from the recorded step times
    record = result["record"]
    ci = result["saving_ci_percent"]
    assert ci == pytest.approx([100 * v / record["baseline_step_ns"] for v in record["saving_ci_ns"]])
    assert record["method"] == "host wall-clock time"
    # the workers load while the step sleeps: a saving far from zero on any machine with two cores
    assert ci[0] > 15.0, (result, lines)
    assert result["status"] == verify.judge({**record, "saving_percent": result["saving_percent"]}, TRIAL)[0]


def test_a_patch_whose_script_fails_is_reported_failed(tmp_path):
    folder = tmp_path / "p"
    folder.mkdir()
    script = folder / "train.py"
    script.write_text(SLOW_LOADER)
    patch = make.make_patch(script, "loader-workers", TRIAL)
    patch.files[0]["after"] = patch.files[0]["after"].replace("def main():", "def main():\n    raise SystemExit(3)")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = verify.verify(patch, script, [], run_dir, CaptureConfig(warmup_steps=2, window_steps=5), TRIAL,
                           budget_s=300, echo=lambda _line: None)
    assert result["status"] == "failed", result
    statuses = sorted(p.name for p in run_dir.glob("patch_loader-workers_*_patched.json"))
    assert statuses and all(json.loads((run_dir / n).read_text())["exit_code"] == 3 for n in statuses)


def test_verification_with_no_budget_runs_nothing(tmp_path):
    folder = tmp_path / "p"
    folder.mkdir()
    script = folder / "train.py"
    script.write_text(SLOW_LOADER)
    patch = make.make_patch(script, "loader-workers", TRIAL)
    result = verify.verify(patch, script, [], tmp_path, CaptureConfig(), TRIAL, budget_s=1, echo=lambda _l: None)
    assert result["status"] == verify.NOT_VERIFIED and result["runs"] == {"baseline": 0, "patched": 0}
