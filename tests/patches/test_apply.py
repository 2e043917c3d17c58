"""``gpudiag apply``: a verified patch written to the user's files, its refusals (one line each,
exit code 2, nothing written), and git as the oracle: the diff applies with ``git apply`` and
``git apply -R`` after ``gpudiag apply`` gives back the original bytes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudiag.cli.main import cli
from gpudiag.patches import make

SCRIPT = '''import torch  # the model
from torch import nn

model = nn.Linear(4, 2)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)   # odd spacing kept
for step in range(3):
    loss = model(torch.randn(2, 4)).sum()
    loss.backward()
    opt.step()'''  # no newline at the end: git's marker in the diff


def _run(tmp_path: Path, status: str = "verified") -> tuple[Path, Path]:
    folder = tmp_path / "project"
    folder.mkdir(parents=True)
    script = folder / "train.py"
    script.write_bytes(SCRIPT.encode())
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    patch = make.make_patch(script, "fused-optimizer", {"applied": ["AdamW(fused=True)"]})
    assert patch.made, patch.why_not
    patch.verification = {"status": status, "saving_percent": 12.0, "saving_ci_percent": [8.0, 15.0]}
    make.write(run_dir, patch)
    (run_dir / "report.json").write_text(json.dumps({"patches": [patch.summary()]}))
    return run_dir, script


def _apply(*args: str):
    return CliRunner().invoke(cli, ["apply", *map(str, args)])


def test_apply_writes_the_verified_patch_and_git_reverses_it_to_the_original_bytes(tmp_path):
    run_dir, script = _run(tmp_path)
    result = _apply(run_dir)
    assert result.exit_code == 0, result.output
    assert "applied fused-optimizer" in result.output and "12.0 % [8.0, 15.0]" in result.output
    assert script.read_text().splitlines()[4] == \
        "opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)   # odd spacing kept"
    subprocess.run(["git", "apply", "-R", str(run_dir / "changes" / "fused-optimizer.patch")], cwd=script.parent,
                   check=True)
    assert script.read_bytes() == SCRIPT.encode()
    # and forwards with git: the same bytes gpudiag apply wrote
    subprocess.run(["git", "apply", str(run_dir / "changes" / "fused-optimizer.patch")], cwd=script.parent, check=True)
    assert script.read_text() == make.read(run_dir, "fused-optimizer").files[0]["after"]


def test_dry_run_prints_the_diff_and_writes_nothing(tmp_path):
    run_dir, script = _run(tmp_path, status="inconclusive")
    result = _apply(run_dir, "fused-optimizer", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "+opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)" in result.output
    assert script.read_bytes() == SCRIPT.encode()


def test_a_last_line_without_newline_round_trips_through_git(tmp_path):
    """The hunk reaches the file's last line, which has no newline: git's marker makes it apply."""
    script = tmp_path / "serve.py"
    script.write_bytes(b"import torch\r\nprint(torch.ones(2))")
    patch = make.make_patch(script, "tf32", {"applied": []})
    assert "\\ No newline at end of file" in patch.diff
    (tmp_path / "p.patch").write_text(patch.diff, newline="")
    subprocess.run(["git", "apply", str(tmp_path / "p.patch")], cwd=tmp_path, check=True)
    assert script.read_bytes() == patch.files[0]["after"].encode()
    subprocess.run(["git", "apply", "-R", str(tmp_path / "p.patch")], cwd=tmp_path, check=True)
    assert script.read_bytes() == b"import torch\r\nprint(torch.ones(2))"


@pytest.mark.parametrize("case, words", [
    ("unverified", "not verified"),
    ("none_verified", "no verified patch"),
    ("changed", "changed since the run"),
    ("applied", "already holds"),
    ("unknown", "no patch for compile"),
    ("outside", "outside the script's folder"),
    ("no_patches", "has no patches"),
    ("not_made", "no patch was made"),
])
def test_apply_refuses_with_one_line_and_writes_nothing(tmp_path, case, words):
    run_dir, script = _run(tmp_path, status="inconclusive" if "verified" in case else "verified")
    args = [run_dir]
    if case == "unverified":
        args.append("fused-optimizer")
    elif case == "changed":
        script.write_text(SCRIPT + "\n# edited since\n")
    elif case == "applied":
        assert _apply(run_dir).exit_code == 0
    elif case == "unknown":
        args.append("compile")
    elif case == "outside":
        record = json.loads((run_dir / "changes" / "fused-optimizer.json").read_text())
        record["files"][0]["path"] = "../elsewhere.py"
        (tmp_path / "elsewhere.py").write_bytes(SCRIPT.encode())
        (run_dir / "changes" / "fused-optimizer.json").write_text(json.dumps(record))
    elif case == "no_patches":
        for f in (run_dir / "changes").iterdir():
            f.unlink()
        (run_dir / "changes").rmdir()
    elif case == "not_made":
        make.write(run_dir, make.Patch("compile", False, str(script.parent), why_not="a framework builds the model",
                                       snippet="model.compile()", where="after the model"))
        args.append("compile")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.py")}
    result = _apply(*args)
    assert result.exit_code == 2, result.output
    assert words in result.output and len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.py")} == before
