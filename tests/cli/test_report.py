"""``gpudiag report`` through click's CliRunner: the README's main job, errors without tracebacks."""

from __future__ import annotations

import json
import shutil

from click.testing import CliRunner

from gpudiag.cli.main import cli

from conftest import EXPORTS, FIXTURES, ROOT


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_report_on_the_bundled_example(tmp_path):
    """The README quickstart: an .xz export in, report.html + report.json + summary out."""
    out = tmp_path / "swin"
    result = run("report", EXPORTS["swin_t_train_bf16"], "-o", out)
    assert result.exit_code == 0, result.output
    assert {"report.html", "report.json", "run.sqlite"} <= {p.name for p in out.iterdir()}
    assert "NVIDIA H200" in result.output and f"report: {out / 'report.html'}" in result.output
    data = json.loads((out / "report.json").read_text())
    assert data["source"] == "swin_t_train_bf16.sqlite.xz" and data["steps"]["measured"] == 7


def test_refuses_to_overwrite_without_force(tmp_path):
    out = tmp_path / "r"
    assert run("report", EXPORTS["tiny_gemm_gelu"], "-o", out).exit_code == 0
    again = run("report", EXPORTS["tiny_gemm_gelu"], "-o", out)
    assert again.exit_code == 2
    assert "already exists: pass --force" in again.output and "Traceback" not in again.output
    assert run("report", EXPORTS["tiny_gemm_gelu"], "-o", out, "--force").exit_code == 0


def test_an_unrelated_run_database_is_not_overwritten_without_force(tmp_path):
    """Bad-input matrix row 39: a run.sqlite already in the output folder stays byte for byte."""
    out = tmp_path / "r"
    out.mkdir()
    (out / "run.sqlite").write_bytes(b"someone's database")
    result = run("report", EXPORTS["tiny_gemm_gelu"], "-o", out)
    assert result.exit_code == 2 and f"{out / 'run.sqlite'} already exists: pass --force" in result.output
    assert (out / "run.sqlite").read_bytes() == b"someone's database"
    assert sorted(p.name for p in out.iterdir()) == ["run.sqlite"]


def test_the_input_is_never_the_output(tmp_path, export_path):
    """Bad-input matrix row 40: <dir>/run.sqlite as input with -o <dir> is refused, even with
    --force, and the input is unchanged."""
    folder = tmp_path / "d"
    folder.mkdir()
    source = folder / "run.sqlite"
    shutil.copy(export_path("tiny_gemm_gelu"), source)
    before = source.read_bytes()
    for extra in ([], ["--force"]):
        result = run("report", source, "-o", folder, *extra)
        assert result.exit_code == 2 and "the input would be overwritten" in result.output
    assert source.read_bytes() == before and sorted(p.name for p in folder.iterdir()) == ["run.sqlite"]


def test_run_directory_with_a_failed_script(tmp_path, export_path):
    """A run directory of a script that crashed: the report says so."""
    run_dir = tmp_path / "crashed"
    run_dir.mkdir()
    shutil.copy(export_path("swin_t_train_bf16_crash"), run_dir / "profile.sqlite")
    shutil.copy(FIXTURES / "status" / "swin_t_train_bf16_crash.json", run_dir / "script_status.json")
    result = run("report", run_dir, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["script"]["exit_code"] == 1
    assert any("planted failure at step 6" in w for w in data["warnings"])
    assert (run_dir / "report.html").exists()


def test_steps_from_user_ranges(tmp_path):
    result = run("report", EXPORTS["tiny_gemm_gelu"], "-o", tmp_path / "t", "--steps-from", "nvtx:^step[0-9]$",
                 "--warmup-steps", "1", "--json")
    assert result.exit_code == 0, result.output
    steps = json.loads(result.output)["steps"]
    assert steps["kind"] == "nvtx" and "step[0-9]" in steps["source"]


def test_bad_inputs_are_one_line_errors(tmp_path):
    missing = run("report", tmp_path / "nope.sqlite")
    assert missing.exit_code == 2 and "no such file or directory" in missing.output
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database")
    bad = run("report", junk, "-o", tmp_path / "o")
    assert bad.exit_code == 2 and "not an SQLite file" in bad.output and "Traceback" not in bad.output
    bad_xz = tmp_path / "bad.sqlite.xz"
    bad_xz.write_bytes(b"nope")
    assert "not a readable .xz file" in run("report", bad_xz, "-o", tmp_path / "o2").output
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    assert "no profile.sqlite" in run("report", empty_dir).output
    regex = run("report", EXPORTS["tiny_gemm_gelu"], "-o", tmp_path / "o3", "--steps-from", "sometimes")
    assert regex.exit_code == 2 and "nvtx:REGEX" in regex.output


def test_more_bad_inputs(tmp_path, export_path):
    bad_regex = run("report", EXPORTS["tiny_gemm_gelu"], "-o", tmp_path / "a", "--steps-from", "nvtx:[")
    assert bad_regex.exit_code == 2 and "invalid regular expression" in bad_regex.output
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    on_file = run("report", EXPORTS["tiny_gemm_gelu"], "-o", a_file)
    assert on_file.exit_code == 2 and "is not a directory" in on_file.output
    run_dir = tmp_path / "damaged"
    run_dir.mkdir()
    shutil.copy(export_path("tiny_gemm_gelu"), run_dir / "profile.sqlite")
    (run_dir / "script_status.json").write_text("{not json")
    damaged = run("report", run_dir)
    assert damaged.exit_code == 2 and "script_status.json: not a gpudiag status file" in damaged.output


def test_markup_like_regex_prints_verbatim(tmp_path):
    """A step regex holding rich markup ("[/]") is printed as text, not parsed (no MarkupError)."""
    result = run("report", EXPORTS["tiny_gemm_gelu"], "-o", tmp_path / "m", "--steps-from", "nvtx:[/]?step[0-9]")
    assert result.exit_code == 0, result.output
    assert "[/]?step[0-9]" in result.output


def test_a_run_directory_uses_its_own_warmup_setting(tmp_path, export_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    shutil.copy(export_path("swin_t_train_bf16_bare"), run_dir / "profile.sqlite")
    status = json.loads((FIXTURES / "status" / "swin_t_train_bf16_bare.json").read_text())
    status["warmup_steps"] = 4
    (run_dir / "script_status.json").write_text(json.dumps(status))
    data = json.loads(run("report", run_dir, "--json").output)
    assert data["steps"]["warmup_steps"] == 4 and data["steps"]["measured"] == 6


def test_a_failed_report_leaves_no_output_folder(tmp_path, monkeypatch):
    """Folders this invocation created are removed when it fails; one that existed stays, contents
    and all."""
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database")
    fresh = tmp_path / "new" / "nested"
    assert run("report", junk, "-o", fresh).exit_code == 2
    assert not (tmp_path / "new").exists()
    monkeypatch.chdir(tmp_path)  # the default output folder, gpudiag-reports/junk
    assert run("report", junk).exit_code == 2
    assert not (tmp_path / "gpudiag-reports").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    assert run("report", junk, "-o", kept).exit_code == 2
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]


def test_nsys_reports_and_empty_files_are_named_for_what_they_are(tmp_path):
    """A .nsys-rep must be exported first; an empty file is called empty. One line each, exit 2,
    no output folder left behind."""
    report_file = tmp_path / "train.nsys-rep"
    report_file.write_bytes(b"\x00\x01nsys-rep payload")
    empty_report = tmp_path / "crashed.nsys-rep"
    empty_report.write_bytes(b"")
    empty_export = tmp_path / "profile.sqlite"
    empty_export.write_bytes(b"")
    expected = {
        report_file: "train.nsys-rep: an Nsight Systems report, not its SQLite export; export it first: "
                     "nsys export --type sqlite -o train.sqlite train.nsys-rep, then pass train.sqlite",
        empty_report: "crashed.nsys-rep: empty file (0 bytes): nothing was captured into it; capture again with "
                      "nsys profile, then run: nsys export --type sqlite -o crashed.sqlite crashed.nsys-rep",
        empty_export: "profile.sqlite: empty file (0 bytes); pass an nsys SQLite export, made with: "
                      "nsys export --type sqlite -o profile.sqlite profile.nsys-rep",
    }
    for path, message in expected.items():
        result = run("report", path, "-o", tmp_path / "out")
        assert result.exit_code == 2 and result.output == f"Error: {path.parent}/{message}\n"
        assert not (tmp_path / "out").exists()


def test_every_command_has_a_readme_section():
    """A newcomer finds each command of `gpudiag --help` under the README's Commands, with options
    that exist (gpudiag calibrate was missing)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    headings = [line for line in readme.splitlines() if line.startswith("### `gpudiag ")]
    for name in cli.commands:
        assert any(f"`gpudiag {name}" in h for h in headings), name
    calibrate_options = {o for p in cli.commands["calibrate"].params for o in p.opts}
    assert "gpudiag calibrate --force --json" in readme and {"--force", "--json"} <= calibrate_options


def test_the_same_export_gives_the_same_report_in_every_process(tmp_path):
    """report.json does not depend on Python's string hash seed (set order): two processes with
    different PYTHONHASHSEED give identical JSON on an export whose fusion candidates list
    several forward intermediates the backward reads (saved_for_backward)."""
    import os
    import subprocess
    import sys

    export = EXPORTS["gpt2_train_bf16"]  # its order differed between hash seeds before the fix
    reports = []
    for seed in ("1", "2"):
        out = tmp_path / f"seed{seed}"
        subprocess.run([sys.executable, "-m", "gpudiag", "report", str(export), "-o", str(out)], check=True,
                       capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed})
        reports.append(json.loads((out / "report.json").read_text()))
    saved = [c["saved_for_backward"] for c in reports[0]["fusion_candidates"] if len(c["saved_for_backward"]) > 1]
    assert saved, "the export should exercise the ordering"
    assert reports[0] == reports[1]


JOB = FIXTURES / "nccl" / "gpt_ddp_shm" / "profile.sqlite.xz"  # one real DDP job, two processes


def _shift_session(export, seconds: int) -> None:
    """Move ``export``'s capture start by ``seconds``, as another job's capture would have it."""
    import sqlite3

    with sqlite3.connect(export) as conn:
        conn.execute("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + ?", (seconds * 10**9,))


def test_ranks_of_one_job_agree_and_the_engine_is_named(tmp_path):
    """The two rank exports of one job overlap in time and ran one command: no warning."""
    from multi_gpu_exports import split_ranks

    from gpudiag.app.ranks import job_mismatches

    exports = split_ranks(JOB, tmp_path)
    assert job_mismatches(exports) == []
    _shift_session(exports[1], 86400)
    warnings = job_mismatches(exports)
    assert len(warnings) == 1 and "do not overlap in time" in warnings[0] and "rank1.sqlite" in warnings[0]


def test_exports_of_two_jobs_are_warned_of(tmp_path):
    """``gpudiag report A B``: with B's capture a day after A's, the terminal warns that they cannot be
    ranks of one job, and says where the ranks were analysed (here a local process pool: --scheduler
    and Dask are tested in tests/analysis/ranks/test_engine.py)."""
    from multi_gpu_exports import split_ranks

    from gpudiag.app.options import AnalysisOptions
    from gpudiag.app.ranks import engine_note

    exports = split_ranks(JOB, tmp_path)
    _shift_session(exports[1], 86400)
    result = run("report", *exports, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "warning: rank0.sqlite" in result.output and "cannot be ranks of one job" in result.output
    assert "ranks: 2 analysed on " in result.output
    # said in every face: report.json (the library and the MCP server read it) and report.html
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert any("cannot be ranks of one job" in w for w in report["warnings"])
    assert "cannot be ranks of one job" in (tmp_path / "out" / "report.html").read_text()
    from gpudiag import load

    assert any("cannot be ranks of one job" in w for w in load([str(e) for e in exports]).report["warnings"])
    assert engine_note(AnalysisOptions(None, None), 2) == "ranks: 2 analysed in a local process pool"
    assert engine_note(AnalysisOptions(None, None, dask=True, scheduler="tcp://h:8786"), 2) == \
        "ranks: 2 analysed on the Dask cluster at tcp://h:8786"
    assert engine_note(AnalysisOptions(None, None), 1) is None
