"""The report.json of every committed export, as digests: the check that a rewrite of the data path
(issue 25, part 1) leaves every report unchanged.

    python scripts/report_digests.py --write   # record today's digests (tests/fixtures/report_digests.json)
    python scripts/report_digests.py           # analyse every export again; exit 1 naming each report that changed

Each export (``examples/`` and ``tests/fixtures/``, ``*.sqlite.xz``) is ingested and analysed as
``gpudiag report`` does it, with the launcher status committed beside it where there is one, and
report.json's text (``gpudiag.renderers.json_report.to_json``) is hashed with SHA-256. The analysis
is deterministic and report.json holds no timing of its own run, so a digest changes only when a
number, a text or the order of keys changes. The multi-process exports analyse their ranks in this
process (``rank_workers=1``) so the check needs no cluster.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGESTS = ROOT / "tests" / "fixtures" / "report_digests.json"


def exports() -> list[Path]:
    """Every committed nsys export, in a stable order."""
    return sorted(p for folder in ("examples", "tests/fixtures") for p in (ROOT / folder).rglob("*.sqlite.xz"))


def _status(export: Path) -> dict | None:
    """The launcher's status committed beside an export, where the tests use one."""
    for candidate in (export.parent / "script_status.json", ROOT / "tests" / "fixtures" / "status" /
                      f"{export.name.removesuffix('.sqlite.xz')}.json"):
        if candidate.exists():
            return json.loads(candidate.read_text())
    return None


def digest(export: Path, work: Path) -> str:
    """SHA-256 of report.json's text for ``export``."""
    from gpudiag import store
    from gpudiag.analysis.ingest import ingest
    from gpudiag.analysis.pipeline import analyse
    from gpudiag.renderers import json_report

    plain = work / "export.sqlite"
    with lzma.open(export) as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    # written in the background, as gpudiag report writes it (store.create_run_db)
    db = ingest(plain, work / "run.sqlite", source_name=export.name.removesuffix(".xz"), background=True)
    report = analyse(db, status=_status(export), rank_workers=1)
    store.close(db)
    return hashlib.sha256(json_report.to_json(report).encode()).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"record the digests in {DIGESTS.relative_to(ROOT)}")
    args = ap.parse_args()
    recorded = {} if args.write or not DIGESTS.exists() else json.loads(DIGESTS.read_text())
    now, changed = {}, []
    for export in exports():
        name = str(export.relative_to(ROOT))
        with tempfile.TemporaryDirectory() as tmp:
            try:
                now[name] = digest(export, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - an export the analysis refuses is recorded as such
                now[name] = f"error: {type(exc).__name__}: {exc}"
        if not args.write and recorded.get(name) != now[name]:
            changed.append(name)
        print(f"{name}: {now[name][:16]}{'' if name not in changed else '  CHANGED'}", flush=True)
    if args.write:
        DIGESTS.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        return 0
    changed += [name for name in recorded if name not in now]
    print(f"{len(now) - len(changed)} of {len(now)} reports unchanged" + (f"; changed: {', '.join(changed)}" if changed else ""))
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
