"""A trial's change as a patch to the user's own files: :func:`make_patch` parses the script and
the ``.py`` files of its folder, runs the change's recipe (:mod:`gpudiag.patches.recipes`) and
returns a :class:`Patch` with the unified diff; :func:`write` and :func:`read` keep it in
``RUN_DIR/changes/`` (docs/patches.md, "Files").
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from pathlib import Path

from gpudiag.patches import locate, recipes

CHANGES_DIR = "changes"
NO_NEWLINE = "\\ No newline at end of file\n"


@dataclasses.dataclass
class FileEdit:
    """One file the patch changes: ``path`` relative to the script's folder (POSIX), the sha256 of
    its bytes before and after (hex), and its text after."""

    path: str
    sha256_before: str
    sha256_after: str
    after: str


@dataclasses.dataclass
class Patch:
    """A change as a patch: ``made`` with the unified ``diff`` and its ``files``, or not made with
    ``why_not``, the ``snippet`` to add by hand and ``where`` it goes; ``notes``: what the patch
    replaced that the user may miss (an option's expression); ``script_dir``: the folder
    the paths are relative to (absolute); ``verification``: what running the patched script
    measured (:mod:`gpudiag.patches.verify`), None until then."""

    change: str
    made: bool
    script_dir: str
    diff: str = ""
    files: list = dataclasses.field(default_factory=list)
    why_not: str | None = None
    snippet: str | None = None
    where: str | None = None
    notes: list = dataclasses.field(default_factory=list)
    verification: dict | None = None

    def summary(self) -> dict:
        """The record without the files' texts (report.json's ``patches`` entries)."""
        out = dataclasses.asdict(self)
        out["files"] = [{k: v for k, v in f.items() if k != "after"} for f in out["files"]]
        return out


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def folder_files(script: Path) -> list[str]:
    """The script and the other ``.py`` files of its folder (not its sub-folders), script first."""
    others = sorted(p.name for p in script.parent.glob("*.py") if p.name != script.name and p.is_file())
    return [script.name, *others]


def _sources(script: Path) -> list[locate.Source]:
    """The script and the modules of its folder it imports, directly or through one another,
    parsed (the script first): only they can hold what its run did. A module that does not parse
    is left out; the script itself raises NoPatch."""
    try:
        first = locate.Source.parse(script.parent, script.name)
    except Exception as exc:  # noqa: BLE001 - libcst's syntax error, an undecodable file: never a traceback
        raise recipes.NoPatch(f"{script.name} could not be parsed ({type(exc).__name__}): no patch") from None
    local = {Path(name).stem: name for name in folder_files(script)[1:]}
    out, todo = [first], [first]
    while todo:
        for stem in sorted(locate.imports_of(todo.pop()) & set(local)):
            try:
                source = locate.Source.parse(script.parent, local.pop(stem))
            except Exception:  # noqa: BLE001 - as above: that module is left out
                continue
            out.append(source)
            todo.append(source)
    return out


def _with_torch_import(plan: recipes.Plan, source: locate.Source, new_code: str) -> str:
    """Adds ``import torch`` after the imports of a file whose edits name ``torch`` but that does
    not import it; raises NoPatch when the file has no import to put it after."""
    if not plan.of(source).uses_torch or locate.imports_torch(source):
        return new_code
    end = locate.header_end(source)
    if end is None:
        raise recipes.NoPatch(f"{source.path} has no imports to add `import torch` after", None,
                              f"{source.path}: after the imports")
    plan.of(source).add_import(end, "import torch")
    return plan.of(source).apply(source.module).code


def unified_diff(path: str, before: str, after: str) -> str:
    """The git-style unified diff of one file (``a/PATH``, ``b/PATH``), with git's marker for a
    last line without a newline."""
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 f"a/{path}", f"b/{path}", n=3)
    out = [f"diff --git a/{path} b/{path}\n"]
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n" + NO_NEWLINE)
    return "".join(out)


def make_patch(script: Path, change: str, record: dict, script_args: list[str] | tuple = ()) -> Patch:
    """The patch of ``change`` as the trial ``record`` made it (its ``applied`` lines and
    ``framework``), against ``script`` and the ``.py`` files of its folder; ``script_args``: the
    run's arguments (an option they set is changed there, not in the script). Never raises for a
    script gpudiag cannot patch: the Patch says why (``made`` False)."""
    script = Path(script).resolve()
    folder = str(script.parent)
    try:
        plan = recipes.Plan(change, _sources(script), list(script_args))
        recipes.make(plan, record)
        files = []
        for source in plan.sources:
            edits = plan.edits.get(source.path)
            if edits is None or edits.empty():
                continue
            after = _with_torch_import(plan, source, edits.apply(source.module).code)
            if after != source.text:
                files.append(FileEdit(source.path, source.sha256, sha256(after), after))
    except recipes.NoPatch as exc:
        return Patch(change, False, folder, why_not=exc.why, snippet=exc.snippet, where=exc.where)
    if not files:
        return Patch(change, False, folder, why_not="the recipe found nothing to change")
    texts = {s.path: s.text for s in plan.sources}
    diff = "".join(unified_diff(f.path, texts[f.path], f.after) for f in files)
    return Patch(change, True, folder, diff=diff, files=[dataclasses.asdict(f) for f in files], notes=plan.notes)


def write(run_dir: Path, patch: Patch) -> Path:
    """``RUN_DIR/changes/<change>.json`` (and ``.patch`` when made); returns the JSON's path."""
    folder = Path(run_dir) / CHANGES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    if patch.made:
        (folder / f"{patch.change}.patch").write_text(patch.diff, encoding="utf-8", newline="")
    path = folder / f"{patch.change}.json"
    path.write_text(json.dumps(dataclasses.asdict(patch), indent=1), encoding="utf-8")
    return path


def read(run_dir: Path, change: str) -> Patch | None:
    """The patch of ``change`` kept in ``run_dir``, or None when there is none. Raises ValueError
    for a record that is not a patch's JSON."""
    path = Path(run_dir) / CHANGES_DIR / f"{change}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    fields = {f.name for f in dataclasses.fields(Patch)}
    if not isinstance(data, dict) or not {"change", "made", "script_dir"} <= set(data):
        raise ValueError(f"{path} is not a gpudiag patch record")
    return Patch(**{k: v for k, v in data.items() if k in fields})


def kept(run_dir: Path) -> list[Patch]:
    """Every patch record of ``run_dir``, in name order."""
    folder = Path(run_dir) / CHANGES_DIR
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        patch = read(run_dir, path.stem)
        if patch is not None:
            out.append(patch)
    return out
