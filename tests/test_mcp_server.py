"""``gpudiag mcp``: the MCP server answers the official SDK's own client (in-process, and over stdio
as an agent starts it), with report.json's numbers (written independently by ``gpudiag report``)
and gpudiag gate's verdict. Skipped without the optional ``mcp`` extra."""

from __future__ import annotations

import json
import os
import sys

import anyio
import pytest
from click.testing import CliRunner

pytest.importorskip("mcp")

from mcp import Client, StdioServerParameters  # noqa: E402

from gpudiag.cli.main import cli  # noqa: E402
from gpudiag.mcp_server import build_server  # noqa: E402

from conftest import EXPORTS, FIXTURES, ROOT  # noqa: E402

TOOLS = {"list_runs", "read_summary", "read_steps", "read_kernels", "read_recommendations", "read_ranks", "compare_runs",
         "read_patch"}


def cli_run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """name -> report folder written by gpudiag report (the independent answer)."""
    root = tmp_path_factory.mktemp("mcp-reports")
    for name in ("input_pipeline_good", "input_pipeline_bad"):
        assert cli_run("report", EXPORTS[name], "-o", root / name).exit_code == 0
    return root


def calls(server, *requests):
    """Connect the SDK's client to ``server``, list its tools and make each (tool, arguments) call;
    returns (tool names, results)."""
    async def main():
        async with Client(server) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            return names, [await client.call_tool(name, args) for name, args in requests]

    return anyio.run(main)


def answer(result) -> dict:
    """A tool result's JSON answer (its structured content and its text say the same)."""
    assert not result.is_error, result.content[0].text
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


def test_the_tools_answer_with_the_reports_numbers(reports):
    bad, good = str(EXPORTS["input_pipeline_bad"]), str(EXPORTS["input_pipeline_good"])
    names, results = calls(build_server(), ("read_recommendations", {"path": bad}), ("read_steps", {"path": bad}),
                           ("read_kernels", {"path": bad, "top": 3}), ("compare_runs", {"baseline": good, "candidate": bad}),
                           ("read_summary", {"path": bad}))
    assert names == TOOLS
    recs, steps, kernels, verdict, summary = (answer(r) for r in results)
    data = json.loads((reports / "input_pipeline_bad" / "report.json").read_text())
    assert recs["recommendations"] == data["recommendations"]
    # the CPU augmentation in the main process is also host compute (GD-HOST-COMPUTE, overlapping the stall)
    assert [r["rule_id"] for r in recs["recommendations"]] == ["GD-INPUT-STALL", "GD-HOST-COMPUTE", "GD-PAGEABLE-COPY"]
    assert steps["per_step"] == data["steps"]["per_step"] and steps["measured"] == data["steps"]["measured"]
    assert kernels["kernels"] == data["top_kernels"][:3]
    assert summary["breakdown_percent"] == data["breakdown_percent"] and summary["device"] == "NVIDIA H200"
    gate = json.loads(cli_run("gate", reports / "input_pipeline_good", reports / "input_pipeline_bad",
                              "--format", "json").output)
    assert (verdict["verdict"], verdict["exit_code"]) == (gate["verdict"], gate["exit_code"]) == ("regression", 1)
    assert verdict["metrics"] == gate["metrics"]


def test_list_runs_finds_run_directories_exports_and_reports(reports, tmp_path):
    (tmp_path / "run1").mkdir()
    (tmp_path / "run1" / "profile.sqlite").write_bytes(b"x")
    (tmp_path / "loose.sqlite.xz").write_bytes(b"x")
    (tmp_path / "run1" / "run.sqlite").write_bytes(b"x")  # gpudiag's run database: not a capture
    _, (listed, reported) = calls(build_server(), ("list_runs", {"folder": str(tmp_path)}),
                                  ("list_runs", {"folder": str(reports)}))
    kinds = {(r["path"], r["kind"]) for r in answer(listed)["runs"]}
    assert kinds == {(str(tmp_path / "loose.sqlite.xz"), "export"), (str(tmp_path / "run1"), "run_directory")}
    assert {r["kind"] for r in answer(reported)["runs"]} == {"report"}


def test_a_users_mistake_is_the_tools_one_line_error(tmp_path):
    missing = tmp_path / "nope.sqlite"
    _, (result, folder) = calls(build_server(), ("read_steps", {"path": str(missing)}),
                                ("list_runs", {"folder": str(missing)}))
    assert result.is_error and f"{missing}: no such file or directory" in result.content[0].text
    assert folder.is_error and "no such folder" in folder.content[0].text


def test_gpudiag_mcp_serves_over_stdio():
    """The command an agent starts (python -m gpudiag mcp), through the SDK's stdio client."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    server = StdioServerParameters(command=sys.executable, args=["-m", "gpudiag", "mcp"], cwd=str(ROOT), env=env)
    names, (result,) = calls(server, ("read_recommendations", {"path": str(EXPORTS["tiny_gemm_gelu"])}))
    assert names == TOOLS
    assert [r["rule_id"] for r in answer(result)["recommendations"]] == ["GD-TORCH-COMPILE"]


def test_without_the_sdk_the_command_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "mcp.server.mcpserver", None)  # as if the extra were not installed
    result = CliRunner().invoke(cli, ["mcp"])
    assert result.exit_code == 2
    assert result.output == "Error: gpudiag mcp needs the Model Context Protocol SDK (mcp>=2): pip install 'gpudiag[mcp]'\n"


def test_read_ranks_takes_a_jobs_rank_exports_as_a_list(tmp_path):
    """read_ranks on the two single-rank exports of one DDP job (split from the real 2-process
    capture), given as a list: the ranks table and the straggler of ``gpudiag report`` on the
    same files (written independently, through the command)."""
    from multi_gpu_exports import split_ranks

    exports = [str(p) for p in split_ranks(FIXTURES / "nccl" / "gpt_ddp_shm" / "profile.sqlite.xz", tmp_path)]
    assert cli_run("report", *exports, "-o", tmp_path / "out").exit_code == 0
    data = json.loads((tmp_path / "out" / "report.json").read_text())["ranks"]
    _, (ranks, single) = calls(build_server(), ("read_ranks", {"path": exports}),
                               ("read_ranks", {"path": str(EXPORTS["input_pipeline_good"])}))
    ranks = answer(ranks)
    assert len(ranks["ranks"]) == 2 and ranks["ranks"] == data["ranks"]
    assert ranks["straggler"] == data.get("straggler", data.get("slowest")) and ranks["straggler"] is not None
    assert answer(single)["ranks"] == []  # one process: no ranks table


def test_read_patch_returns_the_verified_diff_and_refuses_the_rest(tmp_path):
    """read_patch answers with the diff git applies; an unverified patch is the tool's error."""
    from test_apply import _run

    run_dir, script = _run(tmp_path / "verified")
    other, _ = _run(tmp_path / "unverified", status="inconclusive")
    _, (ok, refused) = calls(build_server(), ("read_patch", {"run_dir": str(run_dir)}),
                             ("read_patch", {"run_dir": str(other), "change": "fused-optimizer"}))
    patch = answer(ok)
    assert patch["change"] == "fused-optimizer" and patch["verification"]["status"] == "verified"
    assert patch["diff"] == (run_dir / "changes" / "fused-optimizer.patch").read_text()
    assert patch["script_dir"] == str(script.parent.resolve()) and "after" not in patch["files"][0]
    assert refused.is_error and "not verified" in refused.content[0].text
