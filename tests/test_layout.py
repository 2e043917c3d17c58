"""The package laid out in layers (issue 35): the faces (``gpudiag.cli``, ``gpudiag.api``,
``gpudiag.mcp_server``) over the application layer ``gpudiag.app``, over the stages, with no arrow
back up and no import cycle; nothing imports ``gpudiag.cli`` but ``__main__``. Within the analysis
(issue 25, part 4) a stage imports only the stages before it, and no two modules of
``gpudiag.analysis`` import each other, directly or through others (imports inside functions count:
grimp reads every import statement).

The contracts live in pyproject.toml's ``[tool.importlinter]``; import-linter checks them on
grimp's import graph of the package under test."""

from __future__ import annotations

from pathlib import Path

import grimp
from importlinter import configuration
from importlinter.application.use_cases import lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_stage_contracts_hold(monkeypatch):
    """pyproject.toml's contracts: the package's layers, gpudiag.cli imported by __main__ only, the
    capture below the trials, the analysis stages' layers and no cycle among sibling modules."""
    monkeypatch.chdir(ROOT)
    configuration.configure()  # what the lint-imports command does first: the readers of pyproject.toml
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True), \
        "an import breaks the package's layout (the contract report above names it)"


def test_no_import_cycle_among_analysis_modules():
    """Every direct import between two analysis modules: the imported module never leads back."""
    graph = grimp.build_graph("gpudiag", cache_dir=None)
    analysis = {m for m in graph.modules if m == "gpudiag.analysis" or m.startswith("gpudiag.analysis.")}
    cycles = [(a, b, graph.find_shortest_chain(importer=b, imported=a))
              for a in sorted(analysis) for b in sorted(graph.find_modules_directly_imported_by(a) & analysis)
              if graph.chain_exists(importer=b, imported=a)]
    assert not cycles, "import cycles: " + "; ".join(f"{a} -> {' -> '.join(chain)}" for a, b, chain in cycles)


def test_only_main_imports_the_command_line():
    """The forbidden contract's claim, read from the graph directly: every importer of a gpudiag.cli
    module is gpudiag.__main__ or gpudiag.cli itself."""
    graph = grimp.build_graph("gpudiag", cache_dir=None)
    cli = {m for m in graph.modules if m == "gpudiag.cli" or m.startswith("gpudiag.cli.")}
    importers = {i for m in cli for i in graph.find_modules_that_directly_import(m)} - cli
    assert importers == {"gpudiag.__main__"}
