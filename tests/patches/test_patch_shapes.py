"""The patch recipes on a corpus of script shapes (tests/fixtures/patch_shapes: each case's script,
its trial record and the patched files written by hand from docs/patches.md). Per case: the patch
made (or refused, with its reason), each changed file equal to the hand-written one, the diff taken
by ``git apply --check`` in a copy of the folder, the patched files parsed by Python, and git's
apply then reverse giving back the original bytes."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gpudiag.patches import make

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# two corpora written by hand, independently, from docs/patches.md: patch_shapes, and patch_corpus
# (written by a second engineer who had not seen the first's expected files)
CORPORA = ("patch_shapes", "patch_corpus")
CASES = sorted(f"{c}/{p.name}" for c in CORPORA for p in (FIXTURES / c).iterdir() if (p / "case.json").is_file())


def _case(name: str) -> tuple[Path, dict]:
    folder = FIXTURES / name
    return folder, json.loads((folder / "case.json").read_text())


def test_the_corpus_covers_the_shapes_and_changes_the_issue_names():
    metas = [_case(n)[1] for n in CASES]
    assert len(CASES) >= 40
    changes = {m["change"] for m in metas}
    assert {"compile", "compile-graphs", "fused-optimizer", "tf32", "cudnn-benchmark", "channels-last",
            "bf16-autocast", "half-weights", "static-cache", "loader-workers", "pin-memory"} <= changes
    assert {(m["record"].get("framework")) for m in metas} >= {"lightning", "transformers", "accelerate"}
    assert sum(m["expect"] == "no patch" for m in metas) >= 5


@pytest.mark.parametrize("name", CASES)
def test_each_shape_is_patched_as_written_by_hand(name, tmp_path):
    folder, meta = _case(name)
    patch = make.make_patch(folder / meta.get("script", "train.py"), meta["change"], meta["record"], meta.get("args", []))
    if meta["expect"] == "no patch":
        assert not patch.made and meta["why_not_contains"] in patch.why_not, patch
        return
    assert patch.made, patch.why_not
    expected = {p.name: p.read_text() for p in (folder / "expected").iterdir()}
    assert {f["path"]: f["after"] for f in patch.files} == expected
    for text in expected.values():
        ast.parse(text)
    work = tmp_path / "copy"
    shutil.copytree(folder, work, ignore=shutil.ignore_patterns("expected", "case.json"))
    diff = tmp_path / "change.patch"
    diff.write_text(patch.diff, newline="")
    originals = {p.name: p.read_bytes() for p in work.iterdir()}
    subprocess.run(["git", "apply", "--check", str(diff)], cwd=work, check=True)
    subprocess.run(["git", "apply", str(diff)], cwd=work, check=True)
    assert {n: (work / n).read_text() for n in expected} == expected
    subprocess.run(["git", "apply", "-R", str(diff)], cwd=work, check=True)
    assert {p.name: p.read_bytes() for p in work.iterdir()} == originals
