"""After the trials: each measured win handed back as a patch to the user's files, the top one
(or all, or none: ``--verify-patches``) verified by running the patched script
(:mod:`gpudiag.patches`, docs/patches.md)."""

from __future__ import annotations

import time
from pathlib import Path

VERIFY_CHOICES = ("top", "all", "none")
# Seconds for verifying patches: a lone trial's five runs (A B A B A) of a script whose runs take
# ~20 s (docs/framework_suite.md: 10-25 s per run on the H200). gpudiag's choice.
DEFAULT_PATCH_BUDGET_S = 120.0


def wins(report: dict) -> list[dict]:
    """The trials that measured a saving (status "measured", saving > 0), largest saving first;
    an ``args:`` trial (other script arguments) is a command line, not a patch."""
    out = [t for t in report.get("trials") or [] if t.get("status") == "measured"
           and (t.get("saving_ns") or 0) > 0 and not str(t.get("change", "")).startswith("args:")]
    return sorted(out, key=lambda t: -float(t["saving_ns"]))


def hand_back(script, script_args: list[str], run_dir: Path, config, report: dict, profiled: dict,
              verify_patches: str = "top", budget_s: float = DEFAULT_PATCH_BUDGET_S, echo=print) -> list[dict]:
    """Make, write (``RUN_DIR/changes/``) and verify the patches of ``report``'s measured wins;
    returns their summaries (report.json's ``patches``), in the order of the wins. ``script``: a
    path (a module run with ``-m`` gets none); ``verify_patches``: one of :data:`VERIFY_CHOICES`."""
    from gpudiag.patches import make, verify

    from gpudiag.app.ranks import rank0_has

    measured = rank0_has("patch-wins", wins(report))  # under torchrun: every rank verifies rank 0's wins
    if not measured:
        return []
    if not isinstance(script, Path) or not script.is_file():
        echo("[patch] no patches: the script is not a file of yours gpudiag can edit (a module run with -m or under a "
             "launcher)")
        return []
    out, left = [], budget_s
    for trial in measured:
        patch = make.make_patch(script, trial["change"], trial, script_args)
        if not patch.made:
            echo(f"[patch] {trial['change']}: no patch: {patch.why_not}")
        elif verify_patches == "all" or (verify_patches == "top" and not any(p["made"] for p in out)):
            started = time.monotonic()
            patch.verification = verify.verify(patch, script, script_args, run_dir, config, trial, left, echo=echo,
                                               autocast_dtype=profiled.autocast_dtype)
            left -= time.monotonic() - started
            echo(f"[patch] {trial['change']}: {patch.verification['status']} ({patch.verification.get('why', '')}); "
                 f"{Path(run_dir) / make.CHANGES_DIR / (trial['change'] + '.patch')}")
        else:
            patch.verification = {"status": verify.NOT_VERIFIED, "why": "--verify-patches verified the top one only"
                                  if verify_patches == "top" else "--verify-patches none"}
        make.write(run_dir, patch)
        out.append(patch.summary())
    return out
