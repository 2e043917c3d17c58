"""The library (``gpudiag.load``, docs/api.md) on real captures: its frames hold what report.json
holds for the same file (written independently, by ``gpudiag report`` through click's CliRunner),
``compare`` gives ``gpudiag gate``'s verdict, and a user's mistake is a one-line UserError naming
the file."""

from __future__ import annotations

import json
import lzma
import subprocess
import sys

import pytest
from click.testing import CliRunner

import gpudiag
from gpudiag.api import KERNEL_COLUMNS, RANK_COLUMNS, RECOMMENDATION_COLUMNS, STEP_COLUMNS, UserError
from gpudiag.cli.main import cli

from conftest import EXPORTS, FIXTURES, ROOT
from test_run import TRAIN_LOOP, fake_nsys  # noqa: F401 - the fake nsys fixture of the capture tests

NAMES = ("input_pipeline_good", "input_pipeline_bad", "tiny_gemm_gelu")  # small real captures (H200)


def cli_run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """name -> (report folder written by gpudiag report, report.json's content)."""
    root = tmp_path_factory.mktemp("reports")
    out = {}
    for name in NAMES:
        result = cli_run("report", EXPORTS[name], "-o", root / name)
        assert result.exit_code == 0, result.output
        out[name] = (root / name, json.loads((root / name / "report.json").read_text()))
    return out


@pytest.fixture(scope="module")
def runs():
    return {name: gpudiag.load(EXPORTS[name]) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_frames_hold_what_report_json_holds(name, reported, runs):
    run, (_, data) = runs[name], reported[name]
    steps = run.steps
    assert list(steps.columns[:len(STEP_COLUMNS)]) == list(STEP_COLUMNS)
    assert len(steps) == data["steps"]["count"] and int(steps["measured"].sum()) == data["steps"]["measured"]
    assert steps["step_time_ns"].tolist() == [s["step_time_ns"] for s in data["steps"]["per_step"]]
    measured = steps[steps["measured"] & ~steps["outlier"]]
    assert measured["step_time_ns"].median() == data["steps"]["step_time_ns"]["median"]
    kernels = run.kernels
    assert list(kernels.columns[:len(KERNEL_COLUMNS)]) == list(KERNEL_COLUMNS)
    assert kernels["name"].tolist() == [k["name"] for k in data["top_kernels"]]
    assert kernels["time_ns_per_step"].tolist() == [k["time_ns_per_step"] for k in data["top_kernels"]]
    assert kernels["time_ns_per_step"].is_monotonic_decreasing
    recs = run.recommendations
    assert list(recs.columns[:len(RECOMMENDATION_COLUMNS)]) == list(RECOMMENDATION_COLUMNS)
    assert recs["rule_id"].tolist() == [r["rule_id"] for r in data["recommendations"]]
    assert recs["saving_ns_per_step"].tolist() == [r["saving_ns_per_step"] for r in data["recommendations"]]
    assert run.fusion_candidates["saving_ns_per_step"].tolist() == [
        c["saving_ns_per_step"] for c in data["fusion_candidates"]]
    assert run.ranks.empty and list(run.ranks.columns) == list(RANK_COLUMNS)  # one process
    assert run.report == data and run.to_json() == (reported[name][0] / "report.json").read_text()


def test_the_findings_of_the_captures(runs):
    """What each capture is known for (tests/analysis/rules/test_recommendations.py): the frames show it."""
    assert runs["input_pipeline_bad"].recommendations["rule_id"].iloc[0] == "GD-INPUT-STALL"
    assert "GD-INPUT-STALL" not in runs["input_pipeline_good"].recommendations["rule_id"].tolist()
    assert len(runs["tiny_gemm_gelu"].fusion_candidates) >= 1


def test_to_json_and_to_html_write_files(runs, tmp_path):
    run = runs["tiny_gemm_gelu"]
    assert json.loads(run.to_json(tmp_path / "r.json").read_text()) == run.report
    page = run.to_html(tmp_path / "r.html").read_text()
    assert page.startswith("<!DOCTYPE html>") or "<html" in page[:500]
    assert "GD-TORCH-COMPILE" in page and len(page) > 10_000


def test_a_written_report_is_read_back(reported, tmp_path):
    folder, data = reported["tiny_gemm_gelu"]
    assert gpudiag.load(folder).report == data and gpudiag.load(folder / "report.json").report == data
    with pytest.raises(UserError, match="cannot be analysed again"):
        gpudiag.load(folder / "report.json", warmup_steps=1)


def test_ranks_of_a_capture_of_several_processes(tmp_path):
    """The ranks frame of a two-rank DDP run (its committed report.json): one row per rank."""
    report = tmp_path / "report.json"
    report.write_bytes(lzma.open(FIXTURES / "ranks" / "ddp_a" / "report.json.xz").read())
    data = json.loads(report.read_text())
    ranks = gpudiag.load(report).ranks
    assert ranks["rank"].tolist() == [0, 1]
    assert ranks["step_time_ns_median"].tolist() == [r["step_time_ns_median"] for r in data["ranks"]["ranks"]]
    assert ranks["overhead_percent"].tolist() == [r["breakdown_percent"]["overhead"] for r in data["ranks"]["ranks"]]


def test_compare_gives_the_gates_verdict(reported, runs):
    """Run.compare is gpudiag gate's comparison: the same verdict and metrics as the command on the
    report folders gpudiag report wrote."""
    gate = cli_run("gate", reported["input_pipeline_good"][0], reported["input_pipeline_bad"][0], "--format", "json")
    expected = json.loads(gate.output)
    got = runs["input_pipeline_good"].compare(runs["input_pipeline_bad"])
    assert (got["verdict"], got["exit_code"]) == (expected["verdict"], expected["exit_code"]) == ("regression", 1)
    assert got["metrics"] == expected["metrics"]
    assert runs["input_pipeline_good"].compare(runs["input_pipeline_good"])["exit_code"] == 0


def test_bad_inputs_are_one_line_errors_naming_the_file(tmp_path):
    missing = tmp_path / "nope.sqlite"
    with pytest.raises(UserError) as info:
        gpudiag.load(missing)
    assert info.value.format_message().startswith(f"{missing}: no such file or directory")
    text = tmp_path / "notes.sqlite"
    text.write_text("not an export\n")
    with pytest.raises(UserError) as info:
        gpudiag.load(text)
    assert str(text) in info.value.format_message() and "\n" not in info.value.format_message()
    junk = tmp_path / "report.json"
    junk.write_text("[1, 2]")
    with pytest.raises(UserError, match="not a gpudiag report.json"):
        gpudiag.load(junk)
    with pytest.raises(UserError, match="invalid regular expression"):
        gpudiag.load(EXPORTS["tiny_gemm_gelu"], steps_from="nvtx:[")


def test_import_gpudiag_stays_light():
    """``import gpudiag`` does not import the library's pandas: gpudiag.load is imported on first use."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import gpudiag"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 0 and "gpudiag" in proc.stderr and "pandas" not in proc.stderr


@pytest.fixture(scope="module")
def rank_exports(tmp_path_factory):
    """The two single-rank exports of one DDP job (split from the real 2-process capture
    tests/fixtures/nccl/gpt_ddp_shm), alone in a folder, and gpudiag report's report.json of them."""
    from multi_gpu_exports import split_ranks

    scratch, folder = tmp_path_factory.mktemp("split"), tmp_path_factory.mktemp("rank-exports")
    exports = [p.rename(folder / p.name) for p in split_ranks(FIXTURES / "nccl" / "gpt_ddp_shm" / "profile.sqlite.xz",
                                                              scratch)]
    out = tmp_path_factory.mktemp("rank-report")
    assert cli_run("report", *exports, "-o", out, "--force").exit_code == 0
    return exports, json.loads((out / "report.json").read_text())


def test_load_takes_what_gpudiag_report_takes(rank_exports):
    """A list of rank exports, their folder and a glob string give the job's ranks, as the
    command's report.json has them (one row per rank, the same straggler)."""
    exports, data = rank_exports
    by_list = gpudiag.load(exports)
    assert by_list.report["ranks"] == data["ranks"]
    assert by_list.ranks["step_time_ns_median"].tolist() == [r["step_time_ns_median"] for r in data["ranks"]["ranks"]]
    assert gpudiag.load(exports[0].parent).report["ranks"] == data["ranks"]
    assert gpudiag.load(str(exports[0].parent / "rank*.sqlite")).report["ranks"] == data["ranks"]
    assert by_list.source == ", ".join(str(p) for p in exports)


def test_load_of_many_refuses_what_it_cannot_use(rank_exports, tmp_path):
    exports, _ = rank_exports
    with pytest.raises(UserError, match="the pattern matches none"):
        gpudiag.load(str(tmp_path / "rank*.sqlite"))
    with pytest.raises(UserError, match="ncu goes with one export"):
        gpudiag.load(exports, ncu=tmp_path / "x.ncu-rep")
    with pytest.raises(UserError, match="no path given"):
        gpudiag.load([])


def test_profile_returns_the_analysed_run_directory(tmp_path, fake_nsys, capsys):
    """gpudiag.profile(script, *args, **options) is ``gpudiag profile``: the run directory it writes
    holds the report the returned Run is (plumbing on CPU: the export is the fake nsys's fixture,
    tests/capture/test_run.py), the script's arguments and exit code are kept, the stages printed."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN_LOOP + "import sys\nassert sys.argv[1:] == ['--epochs', '1'], sys.argv\n"
                      "for _ in range(3):\n    train_step()\n")
    run_dir = tmp_path / "run"
    run = gpudiag.profile(script, "--epochs", "1", run_dir=run_dir, nsys_path=str(fake_nsys), try_changes="none",
                          bare_run=False)
    assert isinstance(run, gpudiag.Run) and run.source == str(run_dir) and run.exit_code == 0
    assert run.report == json.loads((run_dir / "report.json").read_text())
    assert run.report["script"]["args"] == ["--epochs", "1"] and run.report["script"]["steps_completed"] == 3
    printed = capsys.readouterr().out
    assert "[1/3]" in printed and "[3/3]" in printed


def test_profile_mistakes_are_one_line_errors(tmp_path, fake_nsys):
    with pytest.raises(UserError, match="no option 'stepz'"):
        gpudiag.profile(tmp_path / "train.py", stepz=3)
    with pytest.raises(UserError, match="no such script") as info:
        gpudiag.profile(tmp_path / "missing.py", nsys_path=str(fake_nsys))
    assert info.value.exit_code == 2
