"""The launcher's status as a typed object (gpudiag.script_status, issue 47 part 3b): every committed
status file reads and writes back unchanged; an odd file is one UserError naming it."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from gpudiag.errors import UserError
from gpudiag.script_status import ScriptStatus, read_status, read_status_lenient, write_status

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = sorted(p for folder in ("tests", "benchmarks") for p in (ROOT / folder).rglob("*status.json*")
                  if p.is_file() and p.name.endswith(("status.json", "status.json.xz")))


def _load(path: Path) -> dict:
    raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    return json.loads(raw)


def test_fixtures_found():
    assert len(FIXTURES) >= 40  # the zoo, ranks, trials, nccl and patch-suite runs


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_committed_status_round_trips(path):
    data = _load(path)
    status = ScriptStatus.from_json(data, path)
    assert status.to_json() == data
    assert list(status.to_json()) == list(data)  # the file's key order too
    # attributes hold the file's values (the oracle: the JSON itself)
    assert status.exit_code == data.get("exit_code") and status.step_mode == data.get("step_mode")
    if data.get("bare_run") is not None:
        assert status.bare_run.step_wall_ns == data["bare_run"].get("step_wall_ns")
    for entry, raw in zip(status.ranks or [], data.get("ranks") or []):
        assert entry.rank == raw.get("rank") and entry.to_json() == raw


def test_older_and_newer_files_read_each_other():
    older = {"script": "train.py", "exit_code": 0}  # a launcher that wrote none of the later keys
    status = ScriptStatus.from_json(older)
    assert status.losses is None and status.bare_run is None
    assert status.to_json() == older  # missing keys stay missing
    newer = {**older, "gpu_clock_mhz": {"0": 1980}, "exit_code": 1}  # a key this gpudiag does not know
    status = ScriptStatus.from_json(newer)
    assert status.extra == {"gpu_clock_mhz": {"0": 1980}} and status.exit_code == 1 and status.failed
    assert status.to_json() == newer
    assert ScriptStatus.from_json(status.replaced(bare_run=None).to_json()).to_json() == {**newer, "bare_run": None}


@pytest.mark.parametrize("text, said", [
    ("{not json", "damaged JSON"),
    ("[1, 2]", "a JSON list"),
    ('{"exit_code": "zero"}', "'exit_code' is a JSON string"),
    ('{"steps_completed": true}', "'steps_completed' is a JSON boolean"),
    ('{"bare_run": 3}', "'bare_run' is a JSON number"),
    ('{"ranks": [1]}', "a JSON int"),
])
def test_an_odd_file_is_one_line_naming_it(tmp_path, text, said):
    path = tmp_path / "script_status.json"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        read_status(path)
    message = err.value.message
    assert message.startswith(f"{path}: ") and said in message and "\n" not in message


def test_lenient_reading_for_the_capture(tmp_path):
    path = tmp_path / "script_status.json"
    assert not read_status_lenient(path)  # absent: empty
    path.write_text('{"exit_code": 0, "steps')  # written half by a killed run
    assert not read_status_lenient(path)
    write_status(path, ScriptStatus.from_json({"exit_code": 0, "interrupted": {"stage": "profiling"}}))
    assert json.loads(path.read_text()) == {"exit_code": 0, "interrupted": {"stage": "profiling"}}
    path.write_text('{"exit_code": []}')  # whole but odd: still said
    with pytest.raises(UserError):
        read_status_lenient(path)


def test_update_writes_what_a_dict_update_would():
    """The launcher's and the rank hook's way of writing: ScriptStatus.update gives the same file
    as dict.update on the file's dict (nulls kept, unknown keys kept, order of first setting)."""
    plain: dict = {}
    typed = ScriptStatus()
    for entries in ({"script": "train.py", "exit_code": None, "exception": None},
                    {"steps_completed": 5, "step_wall_ns": {"2": 1.5e6}, "a_newer_key": [1, 2]},
                    {"exit_code": 0, "ranks": None}):
        plain.update(entries)
        typed.update(entries)
    assert typed.to_json() == plain and list(typed.to_json()) == list(plain)
    assert typed.exit_code == 0 and typed.extra == {"a_newer_key": [1, 2]}
    assert ScriptStatus.from_json(typed.to_json()) == typed
