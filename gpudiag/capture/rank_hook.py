"""Instrumenting the ranks of a multi-process job (issue 22), from inside each worker process.

The launcher (:mod:`gpudiag.capture.launch`) sets, for the processes its command starts:
``GPUDIAG_CHILD_CONFIG`` (the :class:`~gpudiag.capture.config.CaptureConfig` as JSON),
``GPUDIAG_CHILD_STATUS_DIR`` (where each rank writes ``rank<RANK>.json``) and puts
``gpudiag/capture/child_site`` first on ``PYTHONPATH``. A worker (``RANK`` set) installs the same
instrumentation as a single-process script and writes its status at exit: rank, local rank, world
size, pid, steps and step times. Its own children (DataLoader workers) are left alone: the variable
is removed once read. A trial's change is installed in each rank as in the launcher, through
:mod:`gpudiag.capture.trial_changes` (the config names the modules that register the changes).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

from gpudiag.script_status import ScriptStatus

CHILD_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child_site")
ENV_CONFIG, ENV_STATUS_DIR = "GPUDIAG_CHILD_CONFIG", "GPUDIAG_CHILD_STATUS_DIR"


# Launcher modules whose every Python child runs the user's script (a single-process `accelerate
# launch` starts one without RANK): their children are instrumented even without RANK.
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "accelerate", "deepspeed")
ENV_EVERY_CHILD = "GPUDIAG_CHILD_ANY"


def child_environment(config_json: str, status_dir: str, environ: dict, every_child: bool = False) -> dict:
    """``environ`` with what the workers of a launched job need to instrument themselves
    (``every_child``: also the children without ``RANK``, see :data:`LAUNCHER_MODULES`)."""
    env = dict(environ)
    env[ENV_CONFIG], env[ENV_STATUS_DIR] = config_json, status_dir
    if every_child:
        env[ENV_EVERY_CHILD] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (CHILD_SITE, env.get("PYTHONPATH", "")) if p)
    return env


def rank_ids(environ=os.environ) -> dict:
    """{"rank", "local_rank", "world_size"} from the variables torchrun (and accelerate, deepspeed)
    set; None where one is missing or not a number."""
    def num(name):
        try:
            return int(environ[name])
        except (KeyError, ValueError):
            return None
    return {"rank": num("RANK"), "local_rank": num("LOCAL_RANK"), "world_size": num("WORLD_SIZE")}


AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
_runs_made: dict[str, int] = {}  # run name -> runs of that name so far (a run repeated gets a new key)


def _agent_store(env: dict, timeout_s: float):
    """(torchrun's agent store, this rank) when gpudiag itself is one rank of a torchrun job of
    more than one rank (``torchrun … -m gpudiag profile``), else None."""
    ids = rank_ids(env)
    if env.get(AGENT_STORE) != "True" or not env.get("MASTER_PORT") or ids["rank"] is None \
            or (ids["world_size"] or 1) <= 1:
        return None
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore(env.get("MASTER_ADDR", "127.0.0.1"), int(env["MASTER_PORT"]), is_master=False,
                     timeout=timedelta(seconds=timeout_s))
    return store, ids["rank"]


def fresh_rendezvous(env: dict, run_name: str, timeout_s: float = 900.0) -> dict:
    """``env`` for one more run of a rank's script when gpudiag itself is the rank (``torchrun …
    -m gpudiag profile``): each of gpudiag's runs (bare, profiled, each trial) starts the script
    again, and torchrun's agent store still holds the first run's rendezvous keys, so a second
    ``init_process_group`` on it waits for ever (seen on CPU with gloo, torch 2.13). Rank 0 picks a
    free port for this run and publishes it on the agent store under ``run_name`` (the same name
    in every rank: each rank's gpudiag makes the runs rank 0 makes, in the same order, see
    :func:`as_rank0_decides`); every rank's script
    then rendezvous there, rank 0's hosting the store (``TORCHELASTIC_USE_AGENT_STORE=False``:
    torch.distributed.rendezvous). ``env`` is returned as it is outside torchrun or for one rank.
    Raises TimeoutError when rank 0 publishes no port within ``timeout_s``."""
    import socket

    try:
        found = _agent_store(env, timeout_s)
        if found is None:
            return env
        store, rank = found
        _runs_made[run_name] = _runs_made.get(run_name, 0) + 1
        key = f"gpudiag/{run_name}/{_runs_made[run_name]}/master_port"
        if rank == 0:
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
            store.set(key, str(port))
        else:
            port = int(store.get(key))
    except RuntimeError as exc:  # the store's own timeout or a lost agent
        raise TimeoutError(f"rank {rank_ids(env)['rank']}: no port from rank 0 for the run {run_name} ({exc})") from None
    return {**env, "MASTER_PORT": str(port), AGENT_STORE: "False"}


def as_rank0_decides(name: str, mine: str, env=None, timeout_s: float = 900.0) -> str:
    """Rank 0's ``mine`` for the decision ``name`` (e.g. whether to make the 4th planned trial run),
    when gpudiag itself is one rank of a torchrun job; ``mine`` elsewhere. Each rank's gpudiag
    decides its runs from its own timings (a change decided early, the budget left), and two ranks
    can decide apart: the one that starts a run rank 0 does not make waits for ever for its
    rendezvous (a 2-rank CPU job in CI, 2026-11-28: 600 s, then killed). So rank 0 publishes each
    decision on torchrun's agent store and the other ranks take it. Raises TimeoutError when rank 0
    publishes nothing within ``timeout_s`` (it stopped)."""
    env = dict(os.environ) if env is None else env
    try:
        found = _agent_store(env, timeout_s)
        if found is None:
            return mine
        store, rank = found
        _runs_made["decision/" + name] = _runs_made.get("decision/" + name, 0) + 1
        key = f"gpudiag/decision/{name}/{_runs_made['decision/' + name]}"
        if rank == 0:
            store.set(key, mine)
            return mine
        return store.get(key).decode()
    except RuntimeError as exc:
        raise TimeoutError(f"rank {rank_ids(env)['rank']}: no decision from rank 0 on {name} ({exc})") from None


def as_rank0_has(name: str, value, env=None, timeout_s: float = 900.0):
    """:func:`as_rank0_decides` for a JSON value (the trials a rank chose, the wins it hands back
    as patches): rank 0's ``value`` in every rank of a torchrun job, ``value`` itself elsewhere.
    Each rank's report is its own, and two ranks may choose different trials or wins from it; their
    runs must be the same ones. Raises TimeoutError as :func:`as_rank0_decides`."""
    text = json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o))  # numpy numbers
    agreed = as_rank0_decides(name, text, env, timeout_s)
    return value if agreed == text else json.loads(agreed)


def _script_source() -> str:
    try:
        with open(sys.argv[0], encoding="utf-8", errors="replace") as f:
            return f.read()
    except (OSError, IndexError):
        return ""


def install_from_environment() -> None:
    """In a worker: install the instrumentation with the launcher's config and write this rank's
    status at exit. Raises ValueError for a bad config (the hook reports it and runs on)."""
    from gpudiag.capture import frameworks, instrument, trial_changes
    from gpudiag.capture.window import release_process_group

    config = instrument.CaptureConfig.from_json(os.environ.pop(ENV_CONFIG))
    status_dir = os.environ.pop(ENV_STATUS_DIR, None)
    os.environ.pop(ENV_EVERY_CHILD, None)
    state = instrument.install(config, _script_source())
    frameworks.install()  # which framework owns precision, compile, the optimizer (as the launcher's own)
    change = None
    if config.trial:  # a trial run under a launcher: the change acts in each rank, where the model is
        change = trial_changes.install(config, state)  # registered by config.change_modules (trial_changes)
    status = ScriptStatus()
    status.update(pid=os.getpid(), **rank_ids(), script=os.path.basename(sys.argv[0] if sys.argv else ""),
                  started_unix_s=time.time(), exception=None)
    previous_hook = sys.excepthook

    def excepthook(kind, value, tb):
        status.update(exception=f"{kind.__name__}: {value}")
        previous_hook(kind, value, tb)

    sys.excepthook = excepthook

    def write() -> None:
        if os.getpid() != status.pid:  # a child forked from the rank that exits through atexit: not a rank
            return
        status.update(instrument.finish(), frameworks=frameworks.summary())
        if change is not None:
            status.update(trial=change.summary())
        status.update(ended_unix_s=time.time())
        if status_dir:
            os.makedirs(status_dir, exist_ok=True)
            name = f"rank{status.rank}" if status.rank is not None else f"pid{status.pid}"
            path = os.path.join(status_dir, name + ".json")
            with open(path + ".tmp", "w", encoding="utf-8") as f:  # whole or not at all, as the launcher's
                json.dump(status.to_json(), f, indent=1)
            os.replace(path + ".tmp", path)
        if state.window.closed and not config.run_to_end:  # gpudiag ended this rank's script
            release_process_group()

    atexit.register(write)


def collect(status_dir: str) -> list[dict]:
    """The ranks' statuses written in ``status_dir``, by rank ([] when none)."""
    out = []
    if not os.path.isdir(status_dir):
        return out
    for name in sorted(os.listdir(status_dir)):
        if name.startswith(("rank", "pid")) and name.endswith(".json"):
            try:
                with open(os.path.join(status_dir, name), encoding="utf-8") as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                continue
    return sorted(out, key=lambda s: (s.get("rank") is None, s.get("rank") or 0))
