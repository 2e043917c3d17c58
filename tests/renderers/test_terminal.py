"""The terminal summary (gpudiag.renderers.terminal) where its output is not a terminal or is
narrow (issue 35, part 4): rule ids, kernel classes, evidence and verdicts are never cut, and names
are cut to a sane width (a 10 MB kernel name took 323 s to wrap into the fusion table)."""

from __future__ import annotations

import copy
import io
import json
import time

import pytest
from click.testing import CliRunner
from rich.console import Console

from gpudiag.cli.main import cli
from gpudiag.renderers import terminal

from conftest import ROOT


def _text(report: dict, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, record=True)
    terminal.render(report, console)
    return console.export_text()


def _words(report: dict) -> list[str]:
    """What must show whole: the rule ids of the recommendations shown, the top kernels' classes and
    evidence, the trial verdicts."""
    recs = report.get("recommendations") or []
    return ([r["rule_id"] for r in recs[:5]] + [k["kernel_class"] for k in report["top_kernels"][:5]]
            + [k["evidence"] for k in report["top_kernels"][:5]])


def test_a_bundled_example_piped_shows_every_rule_id_whole(tmp_path, monkeypatch):
    """``gpudiag report`` on a bundled example, its output not a terminal (CliRunner: rich's 80
    columns): every rule id of report.json appears whole (it printed ``GD-UNFUSED-ATTEN``)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["report", str(ROOT / "examples" / "swin_t_train_fp32.sqlite.xz"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    ids = [r["rule_id"] for r in report["recommendations"]]
    assert "GD-UNFUSED-ATTENTION" in ids
    for word in ids[:5] + [k["kernel_class"] for k in report["top_kernels"][:5]]:
        assert word in result.output, word
    assert "…" not in "".join(line for line in result.output.splitlines() if "GD-" in line)


@pytest.mark.parametrize("width", [40, 60, 80, 120])
def test_ids_classes_and_verdicts_are_whole_at_any_width(analysed, width):
    """The gpt2 capture's summary at 40 to 120 columns: each rule id, kernel class and evidence
    word is on one line, whole (names may be cut; ids never)."""
    _, report = analysed("gpt2_train_bf16")
    text = _text(report, width)
    assert {"GD-FP32-UNDER-AUTOCAST", "GD-TORCH-COMPILE"} <= {r["rule_id"] for r in report["recommendations"][:5]}
    for word in _words(report):
        assert word in text, (width, word)
    # a verdict of several words may wrap between them, never inside one
    assert all(w in text.split() for w in ("not", "measured")), text


def test_trial_changes_and_statuses_are_whole_in_a_narrow_terminal(analysed):
    """The trials table at 60 columns keeps each change (an id) and status (a verdict) whole."""
    _, report = analysed("gpt2_train_bf16")
    report = copy.deepcopy(report)
    report["trials"] = [{"change": "fused_optimizer_and_channels_last", "status": "inconclusive", "saving_ns": None,
                         "baseline_step_ns": 1e6, "trial_step_ns": 1e6}]
    console = Console(file=io.StringIO(), width=60, record=True)
    terminal.render_trials(report, console)
    text = console.export_text()
    assert "fused_optimizer_and_channels_last" in text and "inconclusive" in text


def test_a_10_mb_name_is_cut_in_the_terminal_and_kept_in_the_report(analysed):
    """A top kernel, a fusion chain and a reference kernel of 10 MB each: the summary is printed in
    well under a second per table (it took 323 s to wrap), no line is near that long, and the report
    passed in still holds the whole names."""
    _, report = analysed("gpt2_train_bf16")
    huge = "void f<" + "x" * 10_000_000 + ">"
    report = copy.deepcopy(report)
    report["top_kernels"][0].update(name=huge, label=huge)
    candidate = report["fusion_candidates"][0]
    candidate.update(ops=[huge, "aten::add"], reference_kernel=huge)
    started = time.perf_counter()
    text = _text(report, 120)
    assert time.perf_counter() - started < 5
    assert max(len(line) for line in text.splitlines()) < 300
    assert "…" in text and "GD-TORCH-COMPILE" in text
    assert len(report["top_kernels"][0]["name"]) == len(huge) and candidate["reference_kernel"] == huge


def test_contradicted_and_uncredited_trials_are_said_in_terminal_and_html(analysed):
    """Issue 45, part 4, in the faces: on a real report (GPT-2 training, H200), a prediction its own
    trial contradicts reads "contradicted" with the measurement, and a trial that saved more than a
    rule's evidence covers is named as not credited, in the terminal and in the HTML."""
    from gpudiag.renderers import html
    from gpudiag.trials import results

    _, report = analysed("gpt2_train_bf16")
    report = copy.deepcopy(report)
    first = report["recommendations"][0]
    first["saving_percent_of_step"] = 40.0
    first["covers_ns_per_step"] = 1e6
    from gpudiag.trials.plan import RULE_CHANGES

    change = RULE_CHANGES[first["rule_id"]][0]
    empty = results._empty({"change": change, "rule_id": first["rule_id"], "predicted_saving_ns": 8e6}, {}, 30.0)
    trials = [empty | {"status": "inconclusive", "verdict": "inconclusive", "saving_ns": 0.2e6,
                       "saving_ci_ns": [-0.5e6, 0.9e6], "saving_percent": 1.0, "baseline_step_ns": 20e6}]
    results.attach(report, trials, [])
    rec = next(r for r in report["recommendations"] if r["rule_id"] == first["rule_id"])
    assert rec["trial_contradicts"] is True
    assert terminal.trial_saving_text(rec, True).startswith(f"contradicted: {change} measured 200")
    assert "<b>contradicted</b>" in html.render(report)
    # the same change measured 5 ms for sure (interval 4 to 6 ms) against 1 ms covered: not the rule's
    trials[0].update(status="measured", verdict="measured", saving_ns=5e6, saving_ci_ns=[4e6, 6e6], saving_percent=25.0)
    results.attach(report, trials, [])
    rec = next(r for r in report["recommendations"] if r["rule_id"] == first["rule_id"])
    assert terminal.trial_saving_text(rec, True).startswith("not credited: ")
    assert "not credited: " in html.render(report)
