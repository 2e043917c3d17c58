"""The launcher's status (``script_status.json``, ``bare_status.json`` and each rank's status) as a
typed object: :class:`ScriptStatus`.

The launcher (:mod:`gpudiag.capture.launch`) and each rank's hook (:mod:`gpudiag.capture.rank_hook`)
fill one from inside the user's process (:meth:`ScriptStatus.update`, unchecked there: the status is
written whatever the script left) and write it with :meth:`ScriptStatus.to_json`; everything after
reads it through :meth:`ScriptStatus.from_json` / :func:`read_status` (checked: an odd file is one
line naming it), and the capture, the trials and ``gpudiag profile`` pass it on as this object. The JSON keys are the field names; a file round-trips unchanged
(:meth:`to_json` gives back the dict :meth:`from_json` read: its keys, its nulls, its order), so an
older gpudiag reads what this one writes and the other way round:

- a key an older launcher did not write is ``None`` here and stays absent when written back;
- a key this gpudiag does not know is kept in :attr:`ScriptStatus.extra` and written back as read.

Units: ``*_ns`` nanoseconds, ``*_unix_s`` seconds since the epoch, ``*_bytes*`` bytes. Per-step maps
(``step_wall_ns``, ``losses``, ...) are keyed by the step index as a string (JSON object keys).
A file that is not a JSON object, or a known key of the wrong JSON type, is one
:class:`gpudiag.errors.UserError` naming the file (and the key)."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from gpudiag.errors import UserError

Json = Any  # a value as ``json`` reads it: dict, list, str, int, float, bool or None


@dataclass
class ScriptStatus:
    """One process's launcher status. Every field is ``None`` where the file lacks the key."""

    # the run: what ran and how it ended
    script: str | None = None  # the script's file name (no folder)
    args: list | None = None  # its command-line arguments
    exit_code: int | None = None
    exception: str | None = None  # "Type: message" of the exception that ended the script
    traceback: str | None = None
    interrupted: bool | dict | None = None  # True (Ctrl-C in the script) or gpudiag profile's stage record
    started_unix_s: float | None = None
    ended_unix_s: float | None = None
    torch_version: str | None = None
    torch_cuda_version: str | None = None
    # a rank of a launched job (gpudiag.capture.rank_hook.rank_ids)
    pid: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    ranks: list[ScriptStatus] | None = None  # the statuses the job's ranks wrote, by rank
    # the steps (gpudiag.capture.instrument.finish)
    step_mode: str | None = None  # "optimizer", "backward", "forward", "generate", "nvtx", "call", ...
    steps_regex: str | None = None  # the user's NVTX range pattern when step_mode is "nvtx"
    steps_completed: int | None = None
    detail_step: int | None = None  # the step whose aten ops were recorded
    warmup_steps: int | None = None
    step_wall_ns: dict | None = None  # step -> host wall-clock time, ns
    step_gpu_ns: dict | None = None  # step -> CUDA-event time, ns
    startup_ns: int | None = None
    warmup_ns: int | None = None
    samples_per_step: int | None = None
    first_input_shape: list | None = None
    root_parameters: dict | None = None
    outputs: dict | None = None
    losses: dict | None = None  # step -> loss; {} when backward ran and no loss was kept
    generate_forwards: dict | None = None
    backward_calls: dict | None = None
    closure_calls: dict | None = None
    optimizer_calls: dict | None = None
    micro_batches: dict | None = None
    peak_memory_bytes_per_step: dict | None = None  # step -> bytes
    # the capture window (gpudiag.capture.window)
    capture_range: bool | None = None
    capture_started_step: int | None = None
    window_steps: int | None = None
    window_complete: bool | None = None
    window_start_unix_s: float | None = None
    run_to_end: bool | None = None
    stopped_after_window: int | None = None
    rank_exit_after_window: str | None = None  # torchrun's failure when a rank failed only at exit, after the window
    # the settings the script ran under
    cudnn_benchmark: bool | None = None
    autocast_dtype: str | None = None
    compile: dict | None = None  # torch._dynamo's counters
    ddp: dict | None = None
    fsdp: dict | None = None
    frameworks: dict | None = None
    inductor_provenance: dict | None = None
    # what gpudiag profile adds after the capture
    bare_run: ScriptStatus | None = None  # the run without the profiler (app.profile_steps.BARE_KEYS)
    trial: dict | None = None  # a trial run's change
    trials: list | None = None
    trials_left_out: list | None = None
    trials_budget: dict | None = None
    patches: list | None = None
    # the analysis's view of one rank (gpudiag.analysis.ranks.processes.status_of_process)
    job_status: ScriptStatus | None = None
    # keys this gpudiag does not know (a newer launcher's), written back as read
    extra: dict = field(default_factory=dict)
    # the keys the file had, in its order: to_json writes them back, nulls included
    _keys: tuple = field(default=(), repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Json, path: Path | str | None = None) -> ScriptStatus:
        """The status of ``data`` (a dict as ``json`` reads a status file). Missing keys are None,
        unknown keys go to :attr:`extra`. Raises :class:`UserError` (naming ``path`` where given)
        when ``data`` is not a dict or a known key holds the wrong JSON type."""
        where = f"{path}: " if path is not None else ""
        if not isinstance(data, dict):
            raise UserError(f"{where}not a gpudiag status file (a JSON {type(data).__name__}, not an object); "
                            "delete it to report without the script's status")
        values, extra = {}, {}
        for key, value in data.items():
            kinds = _FIELD_KINDS.get(key)
            if kinds is None:
                extra[key] = value
                continue
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise UserError(f"{where}not a gpudiag status file ({key!r} is a JSON {_json_name(value)}); "
                                "delete it to report without the script's status")
            values[key] = _nested(key, value, path)
        return cls(**values, extra=extra, _keys=tuple(data))

    @classmethod
    def of(cls, status: ScriptStatus | dict | None) -> ScriptStatus | None:
        """``status`` as a ScriptStatus: a dict is read with :meth:`from_json`; None stays None.
        For the analysis's public functions, which callers (tests, notebooks) may give a dict."""
        return cls.from_json(status) if isinstance(status, dict) else status

    def to_json(self) -> dict:
        """The status file's dict: the keys read (in their order, nulls kept), then keys set since
        that are not None, then unknown keys. ``from_json(d).to_json() == d`` for every dict
        :meth:`from_json` accepts."""
        out: dict = {}
        for key in self._keys:
            out[key] = _plain(getattr(self, key)) if key in _FIELD_KINDS else self.extra[key]
        for key in _FIELD_KINDS:
            if key not in out and getattr(self, key) is not None:
                out[key] = _plain(getattr(self, key))
        out.update((k, v) for k, v in self.extra.items() if k not in out)
        return out

    def replaced(self, **changes) -> ScriptStatus:
        """A copy with ``changes`` (field names); a changed field is written by :meth:`to_json` even
        as None, as assigning the key in the file's dict would."""
        return dataclasses.replace(self, **changes, _keys=tuple(dict.fromkeys((*self._keys, *changes))))

    def update(self, data: dict | None = None, **entries) -> None:
        """Set entries in place, as ``dict.update`` on the file's dict would (the launcher's and the
        rank hook's writing inside the user's process): known keys become fields, others go to
        :attr:`extra`; every key given is written by :meth:`to_json`, nulls included. Nothing is
        checked here (a status must be written whatever the script left): :meth:`from_json` checks
        on reading."""
        entries = {**(data or {}), **entries}
        for key, value in entries.items():
            if key in _FIELD_KINDS:
                setattr(self, key, value)
            else:
                self.extra[key] = value
        self._keys = tuple(dict.fromkeys((*self._keys, *entries)))

    def without(self, *keys: str) -> ScriptStatus:
        """A copy without ``keys`` (fields become None and are not written; unknown keys dropped)."""
        fields = {k: None for k in keys if k in _FIELD_KINDS}
        extra = {k: v for k, v in self.extra.items() if k not in keys}
        return dataclasses.replace(self, **fields, extra=extra, _keys=tuple(k for k in self._keys if k not in keys))

    def __bool__(self) -> bool:
        """False for a status with no key at all (as an empty dict: the launcher never wrote one)."""
        return bool(self._keys or self.extra) or any(getattr(self, k) is not None for k in _FIELD_KINDS)

    @property
    def failed(self) -> bool:
        """True when the script ended with a non-zero exit code (unknown counts as not failed)."""
        return self.exit_code not in (0, None)

    @property
    def exit_code_or_failure(self) -> int:
        """The exit code, 1 where the launcher recorded none (it never ran, or was killed)."""
        return 1 if self.exit_code is None else int(self.exit_code)


def read_status(path: Path) -> ScriptStatus | None:
    """The status file at ``path`` (None when absent). Raises :class:`UserError` naming the file
    when it is not UTF-8 JSON, not an object, or a known key holds the wrong type."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise UserError(f"{path}: not a gpudiag status file (damaged JSON); "
                        "delete it to report without the script's status") from None
    return ScriptStatus.from_json(data, path)


def read_status_lenient(path: Path) -> ScriptStatus:
    """The status file at ``path``, or an empty status when it is absent or was written half (a
    run killed while writing it): for the capture's own bookkeeping, which must never stop on it.
    An odd file that is whole JSON still raises :class:`UserError` (see :func:`read_status`)."""
    try:
        return read_status(path) or ScriptStatus()
    except UserError:
        if _is_json(path):
            raise
        return ScriptStatus()


def write_status(path: Path, status: ScriptStatus) -> None:
    """Write ``status`` to ``path`` as the launcher does (JSON, indent 1)."""
    Path(path).write_text(json.dumps(status.to_json(), indent=1), encoding="utf-8")


def _is_json(path: Path) -> bool:
    try:
        json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, OSError):
        return False
    return True


def _nested(key: str, value: Json, path) -> Json:
    """Entries that are statuses themselves become ScriptStatus (the bare run, each rank)."""
    if key in ("bare_run", "job_status") and value is not None:
        return ScriptStatus.from_json(value, path)
    if key == "ranks" and value is not None:
        return [ScriptStatus.from_json(entry, path) for entry in value]
    return value


def _plain(value: Json) -> Json:
    if isinstance(value, ScriptStatus):
        return value.to_json()
    if isinstance(value, list) and value and all(isinstance(v, ScriptStatus) for v in value):
        return [v.to_json() for v in value]
    return value


def _json_name(value: Json) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _kinds(hint) -> tuple[type, ...]:
    """The Python types ``json`` gives for a field's annotation (float accepts an int)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
    out: list[type] = []
    for arg in args:
        base = typing.get_origin(arg) or arg
        base = dict if base is ScriptStatus else base
        out.extend((float, int) if base is float else (base,))
    return tuple(out)


_HINTS = typing.get_type_hints(ScriptStatus)
_FIELD_KINDS: dict[str, tuple[type, ...]] = {f.name: _kinds(_HINTS[f.name]) for f in dataclasses.fields(ScriptStatus)
                                             if f.name not in ("extra", "_keys")}
