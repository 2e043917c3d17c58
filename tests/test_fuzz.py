"""A CI-sized slice of the seeded mutation fuzzing of ``gpudiag report`` (scripts/fuzz_report.py,
issue 13 part 5): real exports damaged in random ways end in a report with a warning or a
one-line error naming the file, never a traceback or a half-written report. The long run
(10,000 cases) is recorded in docs/notes/measurements.md."""

from __future__ import annotations

import importlib.util
import random
import sqlite3
import sys

import pytest

from conftest import ROOT

spec = importlib.util.spec_from_file_location("fuzz_report", ROOT / "scripts" / "fuzz_report.py")
fuzz_report = importlib.util.module_from_spec(spec)
sys.modules["fuzz_report"] = fuzz_report  # dataclasses look their module up there
spec.loader.exec_module(fuzz_report)

CI_CASES = 40  # ~0.3-1 s each on the 2-core CPU machine


@pytest.mark.parametrize("fixture, cases, seed", [("tiny_gemm_gelu", CI_CASES, 0), ("vit", 3, 7)])
def test_fuzzed_exports_end_in_a_report_or_a_one_line_error(fixture, cases, seed):
    outcome = fuzz_report.fuzz(cases, seed=seed, fixtures=(fixture,))
    assert outcome["counts"].get("ok") == cases, "\n".join(
        f"{f['case']}: {'; '.join(f['problems'])}" for f in outcome["failures"])


def test_every_mutation_changes_the_export(tmp_path):
    """The mutators are not no-ops: each one, applied to the real export, changes its content."""
    base = fuzz_report.decompressed("tiny_gemm_gelu", tmp_path)

    def dump(path):
        con = sqlite3.connect(path)
        con.text_factory = bytes  # non-UTF-8 text is one of the mutations
        tables = sorted(r[0].decode() for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'"))
        content = {t: (con.execute(f'SELECT * FROM "{t}" LIMIT 0').description,
                       sorted(map(repr, con.execute(f'SELECT * FROM "{t}"')))) for t in tables}
        con.close()
        return repr(content)

    original = dump(base)
    for mutate in set(fuzz_report.SQL_MUTATIONS):
        changed = 0
        for seed in range(6):  # a mutation picks its table at random; some picks touch nothing
            path = tmp_path / f"{mutate.__name__}{seed}.sqlite"
            path.write_bytes(base.read_bytes())
            con = sqlite3.connect(path)
            try:
                mutation = mutate(random.Random(seed), con)
            except sqlite3.OperationalError:
                mutation = None
            con.commit()
            con.close()
            changed += bool(mutation) and dump(path) != original
        assert changed, f"{mutate.__name__} never changed the export"
