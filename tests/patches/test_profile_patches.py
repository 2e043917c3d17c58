"""``gpudiag profile`` end to end on the CPU (fake nsys: the analysis reads a fixture export, the
script and its trials run for real): the measured win of a DataLoader trial comes back as a patch
in RUN_DIR/changes/, verified by running it, shown in the terminal, report.json and report.html,
kept for ``gpudiag report RUN_DIR``, and applied by ``gpudiag apply``."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner

from gpudiag.cli.main import cli

pytest.importorskip("torch")

from test_run import fake_nsys  # noqa: E402,F401 - the fake nsys fixture
from test_verify import SLOW_LOADER  # noqa: E402


def test_profile_hands_back_the_measured_win_as_a_verified_patch(tmp_path, fake_nsys):
    folder = tmp_path / "project"
    folder.mkdir()
    script = folder / "train.py"
    script.write_text(SLOW_LOADER)
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(cli, ["profile", str(script), "-o", str(run_dir), "--nsys", str(fake_nsys),
                                      "--steps", "5", "--try", "loader-workers"])
    assert result.exit_code == 0, result.output
    report = json.loads((run_dir / "report.json").read_text())
    (trial,) = report["trials"]
    assert trial["status"] == "measured" and trial["saving_ns"] > 0, trial  # two workers against none
    (patch,) = report["patches"]
    assert patch["change"] == "loader-workers" and patch["made"] and "after" not in patch["files"][0]
    v = patch["verification"]
    assert v["runs"] == {"baseline": 3, "patched": 2} and v["status"] in ("verified", "saves less than its trial"), v
    assert v["saving_ci_percent"][0] > 0, v
    assert (run_dir / "changes" / "loader-workers.patch").read_text() == patch["diff"]
    assert f"patch loader-workers: {v['status']}" in result.output
    html = (run_dir / "report.html").read_text()
    assert "Patches: the measured wins as changes to your files" in html
    assert '<span class="add">+    loader = DataLoader(Slow(), batch_size=8, shuffle=False, num_workers=' in html
    # gpudiag report RUN_DIR keeps them
    again = CliRunner().invoke(cli, ["report", str(run_dir), "--force"])
    assert again.exit_code == 0, again.output
    assert json.loads((run_dir / "report.json").read_text())["patches"] == report["patches"]
    # the diff applies where the script lives; gpudiag apply writes it when verified
    subprocess.run(["git", "apply", "--check", str(run_dir / "changes" / "loader-workers.patch")], cwd=folder,
                   check=True)
    applied = CliRunner().invoke(cli, ["apply", str(run_dir), "loader-workers"])
    if v["status"] == "verified":
        assert applied.exit_code == 0 and "num_workers=" in script.read_text(), applied.output
    else:
        assert applied.exit_code == 2 and script.read_text() == SLOW_LOADER, applied.output
