"""``gpudiag apply RUN_DIR [CHANGE]``: a verified patch written to the user's files, all of them or
none, after checking that each still has the bytes the patch was made from and lies inside the
script's folder (docs/patches.md)."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path

from gpudiag.errors import UserError
from gpudiag.patches.make import CHANGES_DIR, Patch, kept, read, sha256


@dataclasses.dataclass
class Applied:
    """What :func:`apply` did: the patch, the files written (absolute paths) and whether it was a
    dry run (nothing written)."""

    patch: Patch
    files: list[Path]
    dry_run: bool


def _order(run_dir: Path) -> list[str]:
    """The changes in the report's order (largest measured saving first), else by name."""
    try:
        report = json.loads((run_dir / "report.json").read_text())
        return [p["change"] for p in report.get("patches") or []]
    except (OSError, ValueError, TypeError, KeyError):
        return [p.change for p in kept(run_dir)]


def _patch(run_dir: Path, change: str | None) -> Patch:
    if not (run_dir / CHANGES_DIR).is_dir():
        raise UserError(f"{run_dir} has no patches ({CHANGES_DIR}/ is missing): gpudiag profile writes them when a "
                        "trial measures a win")
    try:
        if change is None:
            patches = [read(run_dir, c) for c in _order(run_dir)]
            chosen = next((p for p in patches if p and p.made and _verified(p)), None)
            if chosen is None:
                raise UserError(f"{run_dir}: no verified patch; name one with gpudiag apply {run_dir} CHANGE --dry-run "
                                f"to see it ({', '.join(_order(run_dir)) or 'none kept'})")
            return chosen
        patch = read(run_dir, change)
    except ValueError as exc:
        raise UserError(f"{exc}: re-run gpudiag profile to write it again") from None
    if patch is None:
        raise UserError(f"{run_dir}: no patch for {change} (kept: {', '.join(_order(run_dir)) or 'none'})")
    return patch


def _verified(patch: Patch) -> bool:
    return (patch.verification or {}).get("status") == "verified"


def _targets(patch: Patch) -> list[tuple[Path, dict]]:
    """(absolute path, file record) of each file, refusing one outside the script's folder."""
    folder = Path(patch.script_dir).resolve()
    out = []
    for record in patch.files:
        path = (folder / record["path"]).resolve()
        if path.parent != folder and folder not in path.parents:
            raise UserError(f"{record['path']} lies outside the script's folder {folder}: gpudiag apply never "
                            "writes there")
        out.append((path, record))
    return out


def _check(patch: Patch, targets: list[tuple[Path, dict]], run_dir: Path) -> None:
    diff = run_dir / CHANGES_DIR / f"{patch.change}.patch"
    for path, record in targets:
        try:
            now = sha256(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError):
            raise UserError(f"{path} cannot be read: the patch was made for a file there; restore it or apply {diff} "
                            "by hand") from None
        if now == record["sha256_after"]:
            raise UserError(f"{path} already holds the {patch.change} patch: nothing to apply")
        if now != record["sha256_before"]:
            raise UserError(f"{path} changed since the run: re-run gpudiag profile, or apply {diff} with git apply "
                            "and check the result")


def _write(path: Path, text: str) -> None:
    """``text`` replaces ``path`` at once (a temporary file beside it, then renamed), mode kept."""
    mode = path.stat().st_mode
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".gpudiag")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def apply(run_dir: Path, change: str | None = None, dry_run: bool = False) -> Applied:
    """Apply the verified patch of ``change`` (None: the verified patch of the largest measured
    win) from ``run_dir``; ``dry_run``: check and return it, write nothing (an unverified patch
    may be shown). Raises UserError: no run directory or patches, no such change, no patch made,
    not verified (unless ``dry_run``), a file outside the script's folder, changed since the run,
    or already patched."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a run directory: give the folder gpudiag profile wrote")
    patch = _patch(run_dir, change)
    if not patch.made:
        hint = f"; by hand: {patch.snippet} ({patch.where})" if patch.snippet else ""
        raise UserError(f"{patch.change}: no patch was made ({patch.why_not}){hint}")
    if not dry_run and not _verified(patch):
        state = (patch.verification or {}).get("status", "not verified")
        raise UserError(f"{patch.change}: the patch is {state}, not verified; gpudiag apply writes verified patches "
                        f"only (see it with --dry-run)")
    targets = _targets(patch)
    _check(patch, targets, run_dir)
    if not dry_run:
        for path, record in targets:
            _write(path, record["after"])
    return Applied(patch, [p for p, _ in targets], dry_run)
