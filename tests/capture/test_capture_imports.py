"""Capture without its circle (issue 35, part 2), read from the imports: no import cycle among the
capture modules, no capture module using a sibling's private (underscore) name, and no import of
``gpudiag.trials`` from capture (the trials' changes reach the launcher through
:mod:`gpudiag.capture.trial_changes`). grimp reads every import statement, those inside functions
too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from gpudiag.capture import config as config_mod
from gpudiag.capture import trial_changes

CAPTURE = Path(__file__).resolve().parents[2] / "gpudiag" / "capture"
PACKAGE = "gpudiag.capture"


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("gpudiag", cache_dir=None)


def _capture_modules(graph) -> set[str]:
    return {m for m in graph.modules if m == PACKAGE or m.startswith(PACKAGE + ".")}


def test_no_import_cycle_among_capture_modules(graph):
    """Every direct import between two capture modules: the imported module never leads back."""
    capture = _capture_modules(graph)
    cycles = [(a, graph.find_shortest_chain(importer=b, imported=a))
              for a in sorted(capture) for b in sorted(graph.find_modules_directly_imported_by(a) & capture)
              if graph.chain_exists(importer=b, imported=a)]
    assert not cycles, "import cycles: " + "; ".join(f"{a} -> {' -> '.join(chain)}" for a, chain in cycles)


def test_capture_never_imports_the_trials(graph):
    """No chain of imports from any capture module to any trials module (the trials import capture)."""
    chains = graph.find_shortest_chains(importer=PACKAGE, imported="gpudiag.trials", as_packages=True)
    assert not chains, "capture imports the trials: " + "; ".join(" -> ".join(c) for c in chains)
    assert graph.chain_exists(importer="gpudiag.trials.changes", imported="gpudiag.capture.trial_changes")


def test_every_step_source_goes_through_the_core(graph):
    """The step sources import the step-boundary core, and the core imports none of them."""
    core = "gpudiag.capture.steps_core"
    for source in ("instrument", "training_steps", "call_steps", "user_ranges"):
        assert core in graph.find_modules_directly_imported_by(f"{PACKAGE}.{source}"), source
    reached = {m for m in _capture_modules(graph) - {PACKAGE, core} if graph.chain_exists(importer=core, imported=m)}
    assert reached <= {f"{PACKAGE}.config", f"{PACKAGE}.op_ranges"}, reached


def _private_uses(path: Path) -> list[str]:
    """``from gpudiag.capture.X import _name`` and ``X._name`` where X names a capture module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    siblings, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            siblings.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + "."):
            found += [f"{node.module}.{a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Import):
            siblings.update(a.asname for a in node.names if a.asname and a.name.startswith(PACKAGE + "."))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in siblings and _private(node.attr):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_capture_module_uses_a_siblings_private_name():
    """Each capture module reaches its siblings through their public names only."""
    uses = {str(p.relative_to(CAPTURE)): _private_uses(p) for p in sorted(CAPTURE.rglob("*.py"))}
    assert not {k: v for k, v in uses.items() if v}


def test_private_use_check_sees_both_forms(tmp_path):
    """The checker above flags the two forms the old circle used."""
    probe = tmp_path / "probe.py"
    probe.write_text("from gpudiag.capture import instrument as ins\n"
                     "from gpudiag.capture.op_ranges import _dtype_name\n"
                     "ins._open_step(None)\n")
    assert _private_uses(probe) == ["gpudiag.capture.op_ranges._dtype_name", "ins._open_step"]


def test_instrument_stays_short():
    """instrument.py was 570 lines with the core inside it; it installs the sources now."""
    assert len((CAPTURE / "instrument.py").read_text(encoding="utf-8").splitlines()) <= 450


# ---- the trials' changes through the registry ------------------------------------------------------

def test_trial_change_is_found_through_the_config_modules():
    """The config names the module that registers the changes; the registry imports it by name,
    applies the change and returns its summary (the trial's status entry)."""
    from gpudiag.trials import changes

    config = changes.with_change(config_mod.CaptureConfig(bare=True), "tf32")
    assert config.trial == "tf32" and config.change_modules == ["gpudiag.trials.changes"]
    assert config_mod.CaptureConfig.from_json(config.to_json()) == config
    change = trial_changes.lookup(config)
    assert change.name == "tf32" and set(changes.CHANGES) <= set(trial_changes.registered())
    assert changes.with_change(config, None).change_modules == []


def test_the_profiled_process_registers_the_changes_by_module_name():
    """In a fresh interpreter (as the launcher's), nothing of the trials is imported until the
    registry imports the module the config names."""
    code = ("import sys\n"
            "from gpudiag.capture import launch, rank_hook, trial_changes\n"
            "from gpudiag.capture.config import CaptureConfig\n"
            "assert not [m for m in sys.modules if m.startswith('gpudiag.trials')], 'trials imported early'\n"
            "assert trial_changes.registered() == ()\n"
            "config = CaptureConfig(trial='cudnn-benchmark', change_modules=['gpudiag.trials.changes'])\n"
            "print(trial_changes.lookup(config).name, 'gpudiag.trials.changes' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["cudnn-benchmark", "True"]


def test_unknown_change_names_the_known_ones():
    """A name no loaded module registered is a ValueError listing what is registered."""
    config = config_mod.CaptureConfig(trial="no-such-change", change_modules=["gpudiag.trials.changes"])
    with pytest.raises(ValueError, match="unknown change 'no-such-change': use one of compile, "):
        trial_changes.lookup(config)


def test_registered_change_is_installed_with_the_state(monkeypatch):
    """install() hands the capture state to the registered callable."""
    monkeypatch.setattr(trial_changes, "_registry", dict(trial_changes._registry))  # the probe leaves no trace
    seen = []
    trial_changes.register("probe-change", seen.append, lambda: {"change": "probe-change"})
    state = object()
    change = trial_changes.install(config_mod.CaptureConfig(trial="probe-change"), state)
    assert seen == [state] and change.summary() == {"change": "probe-change"}
