"""``gpudiag mcp``: serve the analysis to coding agents over the Model Context Protocol (stdio)."""

from __future__ import annotations

import click

from gpudiag.errors import UserError

INSTALL = "pip install 'gpudiag[mcp]'"


@click.command()
def mcp() -> None:
    """Serve gpudiag's analysis to coding agents over MCP, on stdin/stdout.

    Tools: list_runs(folder), read_summary(path), read_steps(path), read_kernels(path, top),
    read_recommendations(path), read_ranks(path), compare_runs(baseline, candidate). A path is what
    gpudiag report takes: a run directory, an nsys SQLite export (.sqlite, .sqlite.xz), a report.json,
    a folder of rank exports, a glob, or a list of exports; answers are report.json's records.
    Needs the mcp SDK: pip install 'gpudiag[mcp]'.

    \b
    Example (an agent's MCP configuration):
        {"mcpServers": {"gpudiag": {"command": "gpudiag", "args": ["mcp"]}}}
    """
    try:  # the SDK is an optional extra; imported here, so that --help starts fast
        import mcp.server.mcpserver  # noqa: F401
    except ImportError:
        raise UserError(f"gpudiag mcp needs the Model Context Protocol SDK (mcp>=2): {INSTALL}") from None
    from gpudiag.mcp_server import build_server

    build_server().run("stdio")
