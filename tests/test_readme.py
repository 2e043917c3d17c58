"""The README's Quickstart as a newcomer runs it: the set-up-and-test command is the one `.ci/run`
runs (in a fresh virtual environment), and the main-job commands work as written."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

from conftest import ROOT

README = ROOT / "README.md"


def quickstart_commands() -> list[str]:
    """Command lines of the Quickstart's ```bash blocks, in order (comments dropped)."""
    text = README.read_text()
    section = text[text.index("## Quickstart"):text.index("## Commands")]
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        lines += [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    return lines


def test_ci_runs_the_readme_set_up_and_test_command_verbatim():
    setup = [c for c in quickstart_commands() if "pytest" in c]
    assert len(setup) == 1, "the Quickstart must have exactly one set-up-and-test command"
    assert setup[0].startswith("python -m pip install") and setup[0].endswith("python -m pytest -q")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert setup[0] in [line.strip() for line in ci], ".ci/run must run the README's command as written"
    # the constraints file the command names exists and pins what the issue was about
    pins = (ROOT / "constraints.txt").read_text()
    assert re.search(r"^triton==3\.\d+\.\d+$", pins, flags=re.M) and "torch==2.13.0" in pins


def test_quickstart_main_job_commands_run_as_written(tmp_path):
    """Each `gpudiag report` line of the Quickstart, run in a folder that has the repository's
    example paths: exit 0, the files the README names, and a summary that shows fusion candidates
    for the two captures the README says have them."""
    for name in ("examples", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    jobs = [c for c in quickstart_commands() if c.startswith("gpudiag ")]
    assert len(jobs) == 3
    env = {**os.environ, "COLUMNS": "160"}
    for command in jobs:
        argv = shlex.split(command)
        result = subprocess.run([sys.executable, "-m", "gpudiag", *argv[1:]], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (command, result.stderr[-2000:])
        out_dir = tmp_path / argv[argv.index("-o") + 1]
        report = json.loads((out_dir / "report.json").read_text())
        assert (out_dir / "report.html").stat().st_size > 10_000
        assert report["steps"]["step_time_ns"]["median"] > 0
        if "fusion" in " ".join(quickstart_text_before(command)):
            assert report["fusion_candidates"], command
            assert "fusion" in result.stdout.lower(), "the summary must show the fusion candidates"


def quickstart_text_before(command: str) -> list[str]:
    """The Quickstart prose of the paragraph that introduces ``command``'s block (lower case)."""
    text = README.read_text()
    section = text[text.index("## Quickstart"):text.index("## Commands")]
    before = section[:section.index(command)]
    return [before.rsplit("```", 2)[-2].lower()] if before.count("```") >= 2 else [before.lower()]


def _rule_table_script():
    spec = importlib.util.spec_from_file_location("rule_table", ROOT / "scripts" / "rule_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_rule_table_is_generated_from_the_registry():
    """The README's rule table is what scripts/rule_table.py makes from the rule registry: every id
    a rule emits has its row (GD-TORCH-COMPILE and GD-FP32-UNDER-AUTOCAST were missing), none
    more; after a change to the rules, run ``python scripts/rule_table.py``."""
    script = _rule_table_script()
    ids = script.rule_ids()
    assert {"GD-TORCH-COMPILE", "GD-FP32-UNDER-AUTOCAST", "GD-CHANNELS-LAST", "GD-MEASURED"} <= set(ids)
    in_readme = re.findall(r"^\| `(GD-[A-Z0-9-]+)` \|", script.readme_table(README.read_text()), flags=re.M)
    assert in_readme == ids, "README.md's rule table drifted from the registry: run python scripts/rule_table.py"
    assert script.readme_table(README.read_text()) == script.table()
    assert script.main(["--check"]) == 0


def test_rule_table_check_fails_on_a_drifted_readme(tmp_path, monkeypatch):
    """A README whose table lacks a row fails the check (exit 1) and is rewritten whole."""
    script = _rule_table_script()
    drifted = README.read_text().replace(next(line for line in README.read_text().splitlines()
                                              if line.startswith("| `GD-TORCH-COMPILE`")) + "\n", "")
    monkeypatch.setattr(script, "README", tmp_path / "README.md")
    script.README.write_text(drifted)
    assert script.main(["--check"]) == 1
    assert script.main([]) == 0 and script.main(["--check"]) == 0
    assert script.README.read_text() == README.read_text()
