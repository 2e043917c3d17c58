"""Seeded mutation fuzzing of ``gpudiag report`` on real committed nsys exports (issue 13 part 5).

Each case copies a real export, applies one to three random mutations (SQL edits: dropped tables
and columns, NULL / negative / huge / wrong-typed cells, end before start, duplicated and missing
rows, timestamps out of order, damaged string ids; then possibly a file-level one: truncation,
foreign bytes, ``.xz`` compression, damaged ``.xz``) and runs ``gpudiag report`` in-process
(click's CliRunner). Every case must end in one of two ways:

- exit 0 with report.html (complete), report.json and run.sqlite written, and, when a mutation
  the report must notice was applied (:attr:`Mutation.must_warn`), at least one warning;
- exit 2 or 3 with one line ``Error: ...`` naming the input or output path, and no output folder
  left behind;

never a traceback, never another exit code, never a Python warning leaking to the terminal.

    python scripts/fuzz_report.py --cases 10000 --seed 1     # the recorded run (docs/notes/measurements.md)

tests/sources/test_fuzz.py imports this file and runs a CI-sized slice.
"""

from __future__ import annotations

import argparse
import collections
import json
import lzma
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from gpudiag.errors import INTERNAL_ERROR_MARK  # noqa: E402
from gpudiag.sources.nsys_sqlite import READ_COLUMNS  # noqa: E402
# Small real exports keep a case under a second: tiny GEMM+GELU (22 kernels), ViT from the zoo.
FIXTURES = {"tiny_gemm_gelu": ROOT / "tests" / "fixtures" / "tiny_gemm_gelu.sqlite.xz",
            "vit": ROOT / "tests" / "fixtures" / "zoo" / "vit.sqlite.xz"}

# Tables gpudiag reads (gpudiag/sources/nsys_sqlite.py; READ_COLUMNS names the columns it reads from
# each, and a missing one is a warning): damage there must show in a warning, elsewhere it may pass.
TIMED = {"CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMSET",
         "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"}
TARGETS = sorted(TIMED | {"NVTX_EVENTS", "StringIds", "TARGET_INFO_GPU", "ENUM_CUDA_MEMCPY_OPER"})
# start/end beyond 2**53 ns (104 days) cannot be held exactly in float64: gpudiag drops such rows
HUGE = [2**53 + 1, 2**62, 2**63 - 1, 1e300]
WRONG = ["abc", "", "1.5e9", 1.5, b"\x00\xff", "12 ns"]


@dataclass
class Mutation:
    """What was done to the case and whether a report of it must carry a warning."""

    description: str
    must_warn: bool = False
    # SQL counting the damaged rows still in the file; a later mutation can remove them (rows
    # deleted, table or column dropped: a dropped table or column warns on its own), and then no
    # warning is owed for this one. See :func:`recheck`.
    still: str | None = None


@dataclass
class Case:
    """One fuzz case: its seed, the mutations and the path given to gpudiag."""

    seed: int
    fixture: str
    mutations: list[Mutation] = field(default_factory=list)
    path: Path | None = None

    @property
    def must_warn(self) -> bool:
        return any(m.must_warn for m in self.mutations)

    def describe(self) -> str:
        return f"seed {self.seed} ({self.fixture}): " + "; ".join(m.description for m in self.mutations)


def _impossible_times(table: str) -> str:
    """SQL counting rows of ``table`` whose start/end no capture can hold: not an integer (NULL, text,
    bytes, 1.5), beyond 2**53 ns, or end before start. An oracle written apart from gpudiag's own
    check (gpudiag/sources/row_checks.valid_times), on the stored values."""
    lim = 2**53
    ok = " AND ".join([f"typeof({c}) IN ('integer', 'real') AND {c} = CAST({c} AS INTEGER) AND {c} > -{lim} AND {c} < {lim}"
                       for c in ("start", '"end"')] + ['"end" >= start'])
    return f'SELECT COUNT(*) FROM "{table}" WHERE NOT ({ok})'


def _count(con, sql: str) -> int:
    try:
        return con.execute(sql).fetchone()[0]
    except sqlite3.OperationalError:  # the table or column is gone
        return 0


def recheck(con, case: "Case") -> None:
    """After all SQL mutations: a mutation whose damaged rows are no longer in the file (deleted,
    their table or column dropped by a later mutation) owes no warning of its own."""
    for m in case.mutations:
        if m.must_warn and m.still and not _count(con, m.still):
            m.must_warn = False
            m.description += " (undone by a later mutation)"


def _tables(con) -> list[str]:
    return [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]


def _columns(con, table: str) -> list[str]:
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]


def _unconstrained(con, table: str) -> None:
    """Re-create ``table`` without NOT NULL / PRIMARY KEY constraints (nsys declares them), so
    that NULLs and duplicates can be written the way a damaged file would hold them."""
    con.execute(f'CREATE TABLE "_fz" AS SELECT * FROM "{table}"')
    con.execute(f'DROP TABLE "{table}"')
    con.execute(f'ALTER TABLE "_fz" RENAME TO "{table}"')


def _pick_table(rng: random.Random, con) -> str | None:
    present = [t for t in TARGETS if t in _tables(con)]
    return rng.choice(present) if present else None


def _rows(con, table: str) -> int:
    return con.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0]


def _where(rng: random.Random) -> tuple[str, str]:
    """A random subset of rows: (SQL condition, words)."""
    k = rng.choice([1, 2, 3, 7])
    return (f"rowid % {k} = 0", "every row" if k == 1 else f"every {k}th row")


def m_drop_table(rng, con) -> Mutation | None:
    table = _pick_table(rng, con)
    if table is None:
        return None
    con.execute(f'DROP TABLE "{table}"')
    # every table gpudiag needs is named in "missing from the export", or the run is refused
    return Mutation(f"drop table {table}", must_warn=table in {"CUPTI_ACTIVITY_KIND_RUNTIME", "StringIds", "NVTX_EVENTS",
                                                                "TARGET_INFO_GPU"})


def m_drop_column(rng, con) -> Mutation | None:
    table = _pick_table(rng, con)
    if table is None:
        return None
    column = rng.choice(_columns(con, table))
    keep = [c for c in _columns(con, table) if c != column]
    if not keep:
        return None
    con.execute(f'CREATE TABLE "_fz" AS SELECT {", ".join(chr(34) + c + chr(34) for c in keep)} FROM "{table}"')
    con.execute(f'DROP TABLE "{table}"')
    con.execute(f'ALTER TABLE "_fz" RENAME TO "{table}"')
    # a column gpudiag reads is named in "missing from the export"; MEMSET.value, say, is not read
    return Mutation(f"drop column {table}.{column}", must_warn=column in READ_COLUMNS.get(table, {}))


def m_cells(rng, con) -> Mutation | None:
    table = _pick_table(rng, con)
    if table is None:
        return None
    column = rng.choice(_columns(con, table))
    kind = rng.choice(["NULL", "negative", "huge", "wrong type", "zero"])
    value = {"NULL": None, "negative": -rng.choice([1, 1000, 2**40]), "huge": rng.choice(HUGE),
             "wrong type": rng.choice(WRONG), "zero": 0}[kind]
    cond, words = _where(rng)
    _unconstrained(con, table)
    changed = con.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE {cond}', (value,)).rowcount
    timed = table in TIMED and column in {"start", "end"}
    # NULL, non-numeric, beyond-2**53 or backwards timestamps are dropped and counted ('1.5e9' is
    # stored as the integer 1500000000 in an INTEGER column: a time, if an odd one)
    still = _impossible_times(table) if timed else None
    return Mutation(f"{words} of {table}.{column} set to {kind} ({value!r}, {changed} rows)",
                    must_warn=timed and changed > 0 and _count(con, still) > 0, still=still)


def m_end_before_start(rng, con) -> Mutation | None:
    present = [t for t in TIMED if t in _tables(con)]
    if not present:
        return None
    table = rng.choice(sorted(present))
    cond, words = _where(rng)
    swap = rng.random() < 0.5
    sql = 'SET start = "end", "end" = start' if swap else f'SET "end" = start - {rng.choice([1, 1000, 10**9])}'
    changed = con.execute(f'UPDATE "{table}" {sql} WHERE {cond} AND "end" > start').rowcount
    return Mutation(f"{words} of {table}: end before start ({'swapped' if swap else 'shifted'}, {changed} rows)",
                    must_warn=changed > 0, still=_impossible_times(table))


def m_duplicate_rows(rng, con) -> Mutation | None:
    table = _pick_table(rng, con)
    if table is None:
        return None
    cond, words = _where(rng)
    _unconstrained(con, table)
    changed = con.execute(f'INSERT INTO "{table}" SELECT * FROM "{table}" WHERE {cond}').rowcount
    # duplicated kernels (same correlation id twice) are counted by gpudiag's row checks
    columns = ", ".join(f'"{c}"' for c in _columns(con, table))
    still = f'SELECT COUNT(*) FROM (SELECT 1 FROM "{table}" GROUP BY {columns} HAVING COUNT(*) > 1)'
    return Mutation(f"{words} of {table} duplicated ({changed} rows)",
                    must_warn=table == "CUPTI_ACTIVITY_KIND_KERNEL" and changed > 0, still=still)


def m_delete_rows(rng, con) -> Mutation | None:
    table = _pick_table(rng, con)
    if table is None:
        return None
    cond, words = _where(rng)
    con.execute(f'DELETE FROM "{table}" WHERE {cond}')
    return Mutation(f"{words} of {table} deleted")


def m_out_of_order(rng, con) -> Mutation | None:
    """Rows stored in reverse time order, or timestamps shuffled between rows."""
    present = [t for t in TIMED | {"NVTX_EVENTS"} if t in _tables(con)]
    if not present:
        return None
    table = rng.choice(sorted(present))
    if rng.random() < 0.5:
        _unconstrained(con, table)
        con.execute(f'CREATE TABLE "_fz" AS SELECT * FROM "{table}" ORDER BY start DESC')
        con.execute(f'DROP TABLE "{table}"')
        con.execute(f'ALTER TABLE "_fz" RENAME TO "{table}"')
        return Mutation(f"{table} stored in reverse time order")
    shift = rng.choice([-1, 1]) * rng.choice([10**3, 10**6, 10**9])
    cond, words = _where(rng)
    con.execute(f'UPDATE "{table}" SET start = start + {shift}, "end" = "end" + {shift} WHERE {cond}')
    return Mutation(f"{words} of {table} shifted by {shift} ns")


def m_strings(rng, con) -> Mutation | None:
    if "StringIds" not in _tables(con):
        return None
    kind = rng.choice(["duplicate ids", "non-UTF-8", "emptied", "markup", "kernel names missing", "huge name"])
    _unconstrained(con, "StringIds")
    if kind == "duplicate ids":
        con.execute("INSERT INTO StringIds SELECT id, value || '_dup' FROM StringIds WHERE rowid % 2 = 0")
    elif kind == "non-UTF-8":
        blob = rng.random() < 0.5  # a BLOB, or TEXT holding bytes that are not UTF-8
        con.execute("UPDATE StringIds SET value = " + ("CAST(value || X'FFFE80' AS BLOB)" if blob else
                    "CAST(CAST(value AS BLOB) || X'FFFE80' AS TEXT)") + " WHERE rowid % 3 = 0")
    elif kind == "emptied":
        con.execute("DELETE FROM StringIds")
    elif kind == "markup":
        con.execute("UPDATE StringIds SET value = '<img src=x onerror=alert(1)>' || value WHERE rowid % 2 = 0")
    elif kind == "kernel names missing" and "CUPTI_ACTIVITY_KIND_KERNEL" in _tables(con):
        con.execute("DELETE FROM StringIds WHERE id IN (SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    elif kind == "huge name":
        con.execute("UPDATE StringIds SET value = value || ? WHERE rowid % 5 = 0", ("x" * 100_000,))
    must = kind in {"duplicate ids", "non-UTF-8", "emptied", "kernel names missing"}
    still = {"duplicate ids": "SELECT COUNT(*) FROM (SELECT id FROM StringIds GROUP BY id HAVING COUNT(*) > 1)",
             "non-UTF-8": "SELECT COUNT(*) FROM StringIds WHERE instr(CAST(value AS BLOB), X'FFFE80') > 0"}.get(kind)
    return Mutation(f"StringIds: {kind}", must_warn=must, still=still)


SQL_MUTATIONS = (m_drop_table, m_drop_column, m_cells, m_cells, m_cells, m_end_before_start, m_duplicate_rows,
                 m_delete_rows, m_out_of_order, m_strings)


def _file_mutation(rng: random.Random, case: Case, path: Path) -> Path:
    """Maybe a file-level mutation of the finished SQLite file; returns the path to report on."""
    kind = rng.choice(["none", "none", "none", "xz", "truncate", "truncate xz", "garbage", "header", "text",
                       "empty", "plain named xz", "damaged xz"])
    data = path.read_bytes()
    if kind == "none":
        return path
    out = path.with_name("case.sqlite.xz" if "xz" in kind else "case2.sqlite")
    if kind == "xz":
        out.write_bytes(lzma.compress(data, preset=0))
    elif kind == "truncate":
        out.write_bytes(data[:rng.randrange(0, len(data))])
    elif kind == "truncate xz":
        packed = lzma.compress(data, preset=0)
        out.write_bytes(packed[:rng.randrange(0, len(packed))])
    elif kind == "garbage":
        out.write_bytes(rng.randbytes(rng.choice([1, 100, 4096, 65536])))
    elif kind == "header":  # the right magic, damaged pages
        body = bytearray(data)
        for _ in range(rng.choice([1, 10, 100])):
            i = rng.randrange(100, len(body))
            body[i] = rng.randrange(256)
        out.write_bytes(bytes(body))
    elif kind == "text":
        out.write_text("this is not an export\n" * rng.choice([1, 100]))
    elif kind == "empty":
        out.write_bytes(b"")
    elif kind == "plain named xz":
        out.write_bytes(data)
    elif kind == "damaged xz":
        packed = bytearray(lzma.compress(data, preset=0))
        packed[rng.randrange(0, len(packed))] ^= 0xFF
        out.write_bytes(bytes(packed))
    # a damaged page is something a report may not notice; the others end in an error
    case.mutations.append(Mutation(f"file: {kind}", must_warn=False))
    return out


def make_case(seed: int, fixture: str, base: Path, folder: Path) -> Case:
    """The mutated input of case ``seed`` in ``folder`` (a copy of the decompressed ``base``)."""
    rng = random.Random(seed)
    case = Case(seed, fixture)
    path = folder / "case.sqlite"
    shutil.copyfile(base, path)
    con = sqlite3.connect(path)
    try:
        for _ in range(rng.choice([1, 1, 2, 3])):
            try:
                mutation = rng.choice(SQL_MUTATIONS)(rng, con)
            except sqlite3.OperationalError:  # not applicable after an earlier mutation (column gone)
                con.rollback()  # undoes this mutation only: each applied one is committed below
                continue
            if mutation:
                case.mutations.append(mutation)
            con.commit()
        recheck(con, case)
    finally:
        con.close()
    case.path = _file_mutation(rng, case, path)
    return case


def check(case: Case, result, out: Path) -> list[str]:
    """What is wrong with the outcome of ``case`` (empty when it ended in a report or a clean error)."""
    problems = []
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        tb = "".join(traceback.format_exception(*result.exc_info)[-3:])
        return [f"traceback: {type(result.exception).__name__}: {result.exception}\n{tb}"]
    text = result.output
    if "Warning" in text or "Traceback" in text:
        problems.append(f"a Python warning or traceback reached the terminal: {text[:500]!r}")
    if result.exit_code == 0:
        if not (out / "report.json").is_file() or not (out / "run.sqlite").is_file():
            return problems + ["exit 0 without report.json and run.sqlite"]
        page = (out / "report.html").read_text(encoding="utf-8") if (out / "report.html").is_file() else ""
        if not page.rstrip().endswith("</html>"):
            problems.append("exit 0 with an incomplete report.html")
        report = json.loads((out / "report.json").read_text(encoding="utf-8"))
        if case.must_warn and not report.get("warnings"):
            problems.append("report of a damaged export carries no warning")
        if report.get("invariants") and not report.get("warnings"):
            problems.append(f"invariants violated without a warning: {report['invariants']}")
        return problems
    if result.exit_code not in (2, 3):
        problems.append(f"exit code {result.exit_code}")
    lines = text.strip().splitlines()
    if INTERNAL_ERROR_MARK in text:
        problems.append(f"internal error: {text.strip()[:400]}")
    if len(lines) != 1 or not lines[0].startswith("Error: "):
        problems.append(f"not a one-line error: {text[:300]!r}")
    elif case.path.name not in lines[0] and str(out) not in lines[0]:
        problems.append(f"the error does not name the file: {lines[0][:300]}")
    if out.exists():
        problems.append(f"a failed run left {sorted(p.name for p in out.iterdir())} in the output folder")
    return problems


def run_case(seed: int, fixture: str, base: Path, work: Path) -> tuple[Case, list[str]]:
    """Make case ``seed``, report it into a fresh folder under ``work``; (case, problems)."""
    from click.testing import CliRunner

    from gpudiag.cli.main import cli

    folder = Path(tempfile.mkdtemp(dir=work))
    try:
        case = make_case(seed, fixture, base, folder)
        out = folder / "out"
        result = CliRunner().invoke(cli, ["report", str(case.path), "-o", str(out), "--json"])
        return case, check(case, result, out)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def decompressed(fixture: str, folder: Path) -> Path:
    """The committed export ``fixture`` decompressed into ``folder``."""
    target = folder / f"{fixture}.sqlite"
    if not target.exists():
        with lzma.open(FIXTURES[fixture]) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return target


def fuzz(cases: int, seed: int = 0, fixtures: tuple[str, ...] = ("tiny_gemm_gelu",), log=None) -> dict:
    """Run ``cases`` cases (seeds ``seed`` .. ``seed + cases - 1``, fixtures in turn); returns
    counts of outcomes and the failing cases with their problems."""
    import warnings

    warnings.simplefilter("default")  # a warning the CLI lets through must show up in its output
    counts: collections.Counter = collections.Counter()
    failures = []
    # in memory where there is a tmpfs: SQLite's fsyncs on a disk would take most of the time
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="gpudiag-fuzz-", dir=shm) as tmp:
        work = Path(tmp)
        bases = {f: decompressed(f, work) for f in fixtures}
        for i in range(cases):
            fixture = fixtures[i % len(fixtures)]
            case, problems = run_case(seed + i, fixture, bases[fixture], work)
            counts["failed" if problems else "ok"] += 1
            if problems:
                failures.append({"case": case.describe(), "problems": problems})
                if log:
                    print(f"FAIL {case.describe()}\n  " + "\n  ".join(problems), file=log, flush=True)
            if log and (i + 1) % 100 == 0:
                print(f"{i + 1} cases, {counts['failed']} failed", file=log, flush=True)
    return {"cases": cases, "counts": dict(counts), "failures": failures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fixture", action="append", choices=sorted(FIXTURES),
                        help="export(s) to mutate [default: tiny_gemm_gelu]")
    parser.add_argument("--json", type=Path, help="write the outcome here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    outcome = fuzz(args.cases, args.seed, tuple(args.fixture or ["tiny_gemm_gelu"]), log=sys.stderr)
    outcome["seconds"] = round(time.perf_counter() - start, 1)
    if args.json:
        args.json.write_text(json.dumps(outcome, indent=1))
    print(json.dumps({k: v for k, v in outcome.items() if k != "failures"}))
    return 1 if outcome["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
