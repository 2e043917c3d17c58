"""The gate compares one workload only (issue 47, part 4): Swin-T against GPT-2 is refused, not
called a regression, unless --force; two runs of one script, or two exports of one model, compare."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from conftest import FIXTURES
from gpudiag.analysis.gate import SAME_WORKLOAD_PERCENT, workload_difference, workload_of
from gpudiag.cli.main import cli


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _run(root, name, export_path, export, status=None):
    folder = root / name
    folder.mkdir()
    shutil.copy(export_path(export), folder / "profile.sqlite")
    if status:
        shutil.copy(FIXTURES / "status" / f"{status}.json", folder / "script_status.json")
    assert invoke("report", folder).exit_code == 0
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory, export_path):
    root = tmp_path_factory.mktemp("workloads")
    return {"swin": _run(root, "swin", export_path, "swin_t_train_bf16"),
            "swin_repeat": _run(root, "swin_repeat", export_path, "swin_t_train_bf16_repeat"),
            "gpt2": _run(root, "gpt2", export_path, "gpt2_train_bf16"),
            "swin_script": _run(root, "swin_script", export_path, "swin_t_train_bf16", "swin_t_train_bf16"),
            "gpt2_script": _run(root, "gpt2_script", export_path, "gpt2_train_bf16", "gpt2_train_bf16")}


def _report(folder):
    return json.loads((folder / "report.json").read_text())


def test_exports_of_unrelated_models_are_refused_and_forced_compared(runs):
    result = invoke("gate", runs["swin"], runs["gpt2"])
    assert result.exit_code == 3 and "REGRESSION" not in result.output
    assert "not one workload" in result.output and "--force" in result.output
    forced = invoke("gate", runs["swin"], runs["gpt2"], "--force", "--format", "json")
    assert forced.exit_code in (0, 1)
    assert "not one workload" in json.loads(forced.stdout)["forced"]


def test_two_exports_of_one_model_share_most_kernel_time(runs):
    """The oracle: the shared share written out here, from the two reports' own top kernels."""
    a, b = (_report(runs[n])["top_kernels"] for n in ("swin", "swin_repeat"))
    shares = {k["name"]: k["share_of_kernel_time_percent"] for k in a}
    shared = sum(min(shares[k["name"]], k["share_of_kernel_time_percent"]) for k in b if k["name"] in shares)
    assert shared >= SAME_WORKLOAD_PERCENT
    assert invoke("gate", runs["swin"], runs["swin_repeat"]).exit_code == 0


def test_scripts_decide_where_both_runs_name_one(runs):
    swin, gpt2 = workload_of(_report(runs["swin_script"])), workload_of(_report(runs["gpt2_script"]))
    assert swin["script"] == "swin_train.py" and gpt2["script"] == "gpt2_train.py"
    assert workload_difference(swin, gpt2) == "script swin_train.py -> gpt2_train.py"
    assert invoke("gate", runs["swin_script"], runs["gpt2_script"]).exit_code == 3
    # the same script with other kernels (a precision or compile change) is one workload
    assert workload_difference(swin, {**swin, "kernels": {"other": 100.0}}) is None


def test_a_baseline_file_keeps_the_workload(runs, tmp_path):
    baseline = tmp_path / "baseline.json"
    assert invoke("baseline", "save", runs["swin"], "-o", baseline).exit_code == 0
    assert json.loads(baseline.read_text())["workload"]["kernels"]
    assert invoke("gate", baseline, runs["gpt2"]).exit_code == 3
    assert invoke("gate", baseline, runs["swin_repeat"]).exit_code == 0
