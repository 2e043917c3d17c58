"""Every command README.md documents, checked as written (issue 47, part 4).

Each ```bash line of the README is, first, parsed by gpudiag's own command line (click), so an option
renamed or removed in the code fails here; then the commands a CPU machine can run are run, in order,
in a folder that has the files they name (the repository's examples, a run directory the earlier
commands made, a copied export). The few that cannot run here are listed in :data:`NOT_RUN` with
the reason and the test that runs the same command elsewhere; a command the README gains that is
neither run nor listed fails :func:`test_every_documented_command_is_run_or_listed`. docs/api.md's
Python blocks are run by tests/test_api_doc.py; its three documented-not-run calls are listed there.
"""

from __future__ import annotations

import json
import lzma
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from conftest import ROOT
from gpudiag.cli.main import cli

README = ROOT / "README.md"

# command prefix -> why it does not run here (and where the same command runs)
NOT_RUN = {
    "python -m pip install": "installs; .ci/run runs the set-up-and-test line verbatim (tests/test_readme.py)",
    "gpudiag profile": "needs nsys and a GPU: tests/test_api.py and tests/capture profile with a fake nsys",
    "gpudiag report rank0.sqlite rank1.sqlite": "needs a job's per-rank exports: tests/analysis/ranks/test_engine.py",
    "gpudiag report exports/": "the same: tests/analysis/ranks/test_engine.py reads a folder of rank exports",
    "gpudiag report 'exports/rank*.sqlite.xz' --scheduler": "needs a Dask scheduler at that address "
                                                            "(tests/analysis/ranks run a local one)",
    "gpudiag calibrate": "measures a GPU's peaks: needs CUDA",
    "gpudiag kernels bench": "times a Triton kernel on a GPU (tests/fused run the kernels in Triton's interpreter)",
    "gpudiag apply": "needs a run with a verified patch: tests/patches/test_apply.py applies one",
    "bash scripts/mutation.sh": "hours on 2 cores (its own README section)",
    "MUTMUT_SAMPLE=50 bash scripts/mutation.sh": "the same, sampled",
    "mutmut results": "reads a mutation run's results",
}
# run by tests/test_readme.py already (the Quickstart's main job)
RUN_ELSEWHERE = ("gpudiag report examples/swin_t_train_bf16.sqlite.xz", "gpudiag report examples/gpt2_train_bf16.sqlite.xz",
                 "gpudiag report tests/fixtures/swin_t_train_bf16_dataflow.sqlite.xz")


def commands() -> list[str]:
    """Every command line of README.md's ```bash blocks, in order, comments dropped."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.splitlines():
            line = re.split(r"\s+#", line)[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def _not_run(command: str) -> str | None:
    return next((why for prefix, why in NOT_RUN.items() if command.startswith(prefix)), None)


def _gpudiag_argv(command: str) -> list[str] | None:
    """The arguments after ``gpudiag`` (a pipe's tail dropped), or None for another program."""
    argv = shlex.split(command.split(" | ")[0])
    return argv[1:] if argv and argv[0] == "gpudiag" else None


@pytest.mark.parametrize("command", [c for c in commands() if _gpudiag_argv(c) is not None])
def test_every_gpudiag_command_parses(command):
    """gpudiag's click command line takes the documented arguments (options exist, values fit)."""
    argv = _gpudiag_argv(command)
    group = cli
    while isinstance(group, click.Group):
        sub = group.get_command(click.Context(group), argv[0])
        assert sub is not None, f"{command}: no command {argv[0]!r}"
        group, argv = sub, argv[1:]
    group.make_context(group.name, list(argv), resilient_parsing=False)


def test_every_documented_command_is_run_or_listed():
    seen = commands()
    assert len(seen) >= 25
    runnable = [c for c in seen if _not_run(c) is None and not c.startswith(RUN_ELSEWHERE)]
    assert runnable == RUNS, ("a README command is neither run by test_the_runnable_commands_run_as_written "
                              "nor listed in NOT_RUN: " + repr(sorted(set(runnable) ^ set(RUNS))))
    assert all(any(c.startswith(p) for c in seen) for p in NOT_RUN), "NOT_RUN lists a command the README lost"


# the commands run here, in README order (test_every_documented_command_is_run_or_listed keeps it so)
RUNS = [
    "gpudiag report gpudiag-runs/train-20261121-101500 --force",
    "gpudiag report someone_elses.sqlite --steps-from 'nvtx:^train_step$' -o their-report",
    "gpudiag report examples/swin_t_train_fp32.sqlite.xz -o fp32 --json | jq .breakdown_percent",
    "gpudiag baseline save gpudiag-runs/train-20261121-101500 -o perf/baseline.json",
    "gpudiag gate perf/baseline.json gpudiag-run",
    "gpudiag gate perf/baseline.json gpudiag-run --format github",
    "python -m gpudiag.sources.scrub profile.sqlite",
]


def _world(tmp_path: Path) -> Path:
    """A folder holding what the commands name: the repository's examples, a run directory, an
    export of someone else's (a plain one, with its own NVTX step ranges), a candidate run."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    export = tmp_path / "someone_elses.sqlite"
    with lzma.open(ROOT / "examples" / "swin_t_train_bf16.sqlite.xz") as f, open(export, "wb") as g:
        shutil.copyfileobj(f, g)
    shutil.copy(export, tmp_path / "profile.sqlite")
    for run_dir in ("gpudiag-runs/train-20261121-101500", "gpudiag-run"):  # as `gpudiag profile` leaves them
        (tmp_path / run_dir).mkdir(parents=True)
        shutil.copy(export, tmp_path / run_dir / "profile.sqlite")
    assert _gpudiag(tmp_path, ["report", "gpudiag-run", "--force"]).returncode == 0
    return tmp_path


def _gpudiag(cwd: Path, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudiag", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**__import__("os").environ, "COLUMNS": "160"})


def test_the_runnable_commands_run_as_written(tmp_path):
    world = _world(tmp_path)
    for command in RUNS:
        head, _, pipe = command.partition(" | ")
        argv = shlex.split(head)
        if argv[0] == "gpudiag":
            result = _gpudiag(world, argv[1:])
        else:
            result = subprocess.run([sys.executable, *argv[1:]], cwd=world, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, (command, result.stdout[-1500:], result.stderr[-1500:])
        if pipe:  # `--json | jq .breakdown_percent`: the key jq reads is in the JSON printed
            assert pipe == "jq .breakdown_percent" and json.loads(result.stdout)["breakdown_percent"]
    assert (world / "perf" / "baseline.json").is_file() and (world / "their-report" / "report.json").is_file()
