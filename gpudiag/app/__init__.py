"""The application layer: the workflows of gpudiag (profile, report, gate, calibrate, the bundled
kernels) as plain functions over plain objects, raising :class:`gpudiag.errors.UserError`. The faces
(the command line :mod:`gpudiag.cli`, the library :mod:`gpudiag.api`, the MCP server
:mod:`gpudiag.mcp_server`) parse, call these and print; the stages below (capture, analysis,
renderers, trials) know nothing of them.

Modules import their heavy dependencies (pandas, the analysis, rich) inside the functions that use
them, so that ``gpudiag --help`` starts fast (tests/cli/test_startup.py)."""
