"""Scrub an nsys SQLite export before sharing it: exports record the capture machine's environment
variables (which can hold secrets), working directory and absolute paths.

    python -m gpudiag.sources.scrub EXPORT.sqlite [...]

In place: deletes the identifying rows of ``TARGET_INFO_SYSTEM_ENV`` (environment, host name,
install folder, system id; driver, CUDA, OS and CPU descriptions stay: the gate compares them) and
the ``META_DATA_CAPTURE`` environment/directory entries, replaces every absolute path in every text column
with its last component, replaces environment blocks (three or more ``NAME=value``) whole (``/home/me/run/train.py`` -> ``train.py``), then VACUUMs so no deleted
page keeps the old text. Kernel names, NVTX text and timings are untouched.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from pathlib import Path

# An absolute path: "/" then at least two path components, not inside a word (so "a/b" ratios and
# kernel template text stay). Replaced by its last component.
ABSOLUTE_PATH = re.compile(r"(?<![\w.])(?:/[\w.+@%~-]+){2,}/?")
# Environment blocks (e.g. of exec'd processes, stored in StringIds): several NAME=value tokens.
ENV_ASSIGNMENT = re.compile(r"(?:^|[\s\x00])[A-Z_][A-Z0-9_]*=")  # exec environments are NUL-separated
ENV_REMOVED = "[environment removed by gpudiag scrub]"
SYSTEM_ENV_DROP = ("DeviceEnvironment", "Hostname", "TargetInstallDir", "SystemUID")
_DROP_META = re.compile(r"env|environment|directory|cwd|path", re.IGNORECASE)


def _last_component(match: re.Match) -> str:
    parts = [p for p in match.group(0).split("/") if p]
    return parts[-1] if parts else ""


def scrub_text(text: str) -> str:
    """``text`` with every absolute path replaced by its last component (a ``:``-joined path list
    collapses the same way per entry); a text holding three or more ``NAME=value`` assignments is
    an environment block and is replaced whole by :data:`ENV_REMOVED`."""
    if len(ENV_ASSIGNMENT.findall(text)) >= 3:
        return ENV_REMOVED
    return ABSOLUTE_PATH.sub(_last_component, text)


def scrub(path: Path) -> int:
    """Scrub the export at ``path`` in place; returns the number of text values changed."""
    conn = sqlite3.connect(path)
    conn.create_function("gpudiag_scrub", 1, lambda v: scrub_text(v) if isinstance(v, str) else v, deterministic=True)
    changed = 0
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        if "TARGET_INFO_SYSTEM_ENV" in tables:
            conn.execute("DELETE FROM TARGET_INFO_SYSTEM_ENV WHERE name IN ({})".format(
                ",".join("?" * len(SYSTEM_ENV_DROP))), SYSTEM_ENV_DROP)
        if "META_DATA_CAPTURE" in tables:
            names = [r[0] for r in conn.execute("SELECT DISTINCT name FROM META_DATA_CAPTURE")]
            for name in names:
                if _DROP_META.search(name or ""):
                    conn.execute("DELETE FROM META_DATA_CAPTURE WHERE name = ?", (name,))
        for table in tables:
            cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")') if (r[2] or "").upper() in ("TEXT", "")]
            for col in cols:
                cur = conn.execute(f'UPDATE "{table}" SET "{col}" = gpudiag_scrub("{col}") '
                                   f'WHERE typeof("{col}") = \'text\' AND gpudiag_scrub("{col}") != "{col}"')
                changed += cur.rowcount
        conn.commit()
        conn.execute("VACUUM")
    finally:
        conn.close()
    return changed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m gpudiag.sources.scrub EXPORT.sqlite [...]", file=sys.stderr)
        return 2
    for name in args:
        print(f"{name}: {scrub(Path(name))} text values scrubbed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
