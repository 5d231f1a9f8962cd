"""The partitions' state model (docs/requirements.md, "The state model"), kept on the filesystem.

One JSON record per partition in ``<pilot dir>/partitions/<id>.json`` and one per task in
``<pilot dir>/tasks/<id>.json``, each replaced whole (written to a file of its own, flushed,
renamed over the old one): a reader never sees half a record, however many read at once. Changes
that must see the whole pilot at once (new ids, which resources are free) hold an exclusive
``flock`` on ``<pilot dir>/lock``; a crash releases it with the process.

States: NEW -> PENDING -> STARTING -> ACTIVE -> DONE | FAILED | CANCELED. A
partition holds its slice of the allocation from PENDING (its request is published with the
resources it got) until it reaches a final state. Every change appends to its history, so a
crashed command leaves a record that says how far it got; ``recover`` settles what no process
will move on (see there).

The records decide what runs as the user (a task's command, an agent's), so the pilot directory
is trusted only when it is the user's own: it, ``partitions/``, ``tasks/`` and the lock are the
user's and writable by nobody else, and every directory above it is root's or the user's and not
writable by others unless sticky (``system.files.trusted_directory``) -- else another user could
make the directory first, or swap it later, and write tasks the user's agent would run. Each
record is opened without following a symlink or waiting on a FIFO, must be a regular file of
the user's, and must have a record's form (``StateError`` naming the file otherwise).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Callable, Iterator

from ..system.files import UntrustedPath, open_trusted_file, trusted_directory

NEW, PENDING, STARTING, ACTIVE, DONE, FAILED, CANCELED = (
    "NEW", "PENDING", "STARTING", "ACTIVE", "DONE", "FAILED", "CANCELED")
STATES = (NEW, PENDING, STARTING, ACTIVE, DONE, FAILED, CANCELED)
FINAL = frozenset({DONE, FAILED, CANCELED})
HOLDING = frozenset({PENDING, STARTING, ACTIVE})
TRANSITIONS = {
    NEW: {PENDING, FAILED, CANCELED},
    PENDING: {STARTING, FAILED, CANCELED},
    STARTING: {ACTIVE, DONE, FAILED, CANCELED},
    ACTIVE: {DONE, FAILED, CANCELED},
}
TASK_STATES = ("QUEUED", "RUNNING", "DONE", "FAILED", "CANCELED")
TERMINATED = "its agent was terminated (the allocation ended, or scancel)"
ENDED = "the allocation ended; its agent ended with it before it could report"


def stop_message(record: dict) -> str:
    """The message a stopped partition ends with: the stop's reason (``stop_reason``) or "stopped"."""
    return str(record.get("stop_reason") or "stopped")


def cancel_message(record: dict) -> str:
    """What an agent records when it ends on a stop or a SIGTERM: the stop's message, else that it
    was terminated."""
    return stop_message(record) if record.get("stop_requested") else TERMINATED


class StateError(Exception):
    """A transition the state model does not have, a record that is not there or not a record, or
    a pilot directory tether cannot trust."""


PART_ID = re.compile(r"part\.[0-9]{4,9}")
TASK_ID = re.compile(r"task\.[0-9]{6,9}")
UNTRUSTED = ("tether keeps a pilot's records only in a directory of your own that nobody else can write "
             "(another user could put tasks there that your agent would run): set TETHER_PILOT_DIR to "
             "a new directory below one of yours (your home, or the job's TETHER_JOB_DIR), or remove this "
             "one after checking what is in it")
NOT_OURS = "a pilot record is tether's own: remove it, or the pilot directory, if it is not"


def open_record_file(path: Path, flags: int, what: str = "pilot file") -> int:
    """An fd of a file in the pilot directory (a record, a task's output, an agent's log): never
    through a symlink, never waiting on a FIFO, only the user's own regular file."""
    try:
        return open_trusted_file(path, flags, os.geteuid(), what)
    except UntrustedPath as exc:
        raise StateError(str(exc)) from None


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)                              # a crashed writer's with this pid
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600),
                   "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read_json(path: Path, what: str) -> object:
    with os.fdopen(open_record_file(path, os.O_RDONLY, what), "rb") as fh:
        data = fh.read()
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as exc:                        # UnicodeDecodeError is one
        raise StateError(f"{what} {path}: not JSON ({exc}) ({NOT_OURS})") from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _is_strs(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _command(value: object) -> bool:
    return _is_strs(value) and len(value) > 0


# What each field of a record must be: every reader relies on it (missing optional fields are
# absent, never of another type).
PARTITION_FIELDS: dict[str, tuple[bool, Callable[[object], bool], str]] = {
    "state": (True, lambda v: v in STATES, f"one of {', '.join(STATES)}"),
    "description": (True, lambda v: isinstance(v, dict), "a mapping"),
    "agent": (True, lambda v: isinstance(v, dict) and (v.get("command") is None or _command(v["command"]))
              and all(_is_int(v.get(k, 0)) and v.get(k, 0) >= 0 for k in ("cores", "gpus")),
              "a mapping: command (a list of strings, or null), cores, gpus"),
    "slice": (True, lambda v: isinstance(v, dict) and all(
        isinstance(r, list) and len(r) == 2 and all(_is_int(x) and x >= 0 for x in r) for r in v.values()),
        "a mapping of node to [cores, gpus]"),
    "message": (True, lambda v: isinstance(v, str), "text"),
    "history": (True, lambda v: isinstance(v, list) and len(v) > 0 and all(
        isinstance(h, list) and len(h) >= 2 and isinstance(h[0], str) and _is_number(h[1]) for h in v),
        "a list of [state, time, ...]"),
    "stop_requested": (False, lambda v: isinstance(v, bool), "true or false"),
    "stop_reason": (False, lambda v: v is None or isinstance(v, str), "text"),
    "launched": (False, _is_number, "a time"),
    "step_name": (False, lambda v: isinstance(v, str), "text"),
    "batch": (False, lambda v: v in ("slurm", "pbs"), "slurm or pbs"),
    "agent_node": (False, lambda v: isinstance(v, str), "text"),
    "nodes_up": (False, _is_strs, "a list of node names"),
    "tm": (False, lambda v: isinstance(v, dict) and all(isinstance(v.get(k), str) and os.path.isabs(v[k])
                                                         for k in ("tmrsh", "nodefile")),
           "tmrsh, nodefile (absolute paths)"),
    "fan_out": (False, lambda v: isinstance(v, dict) and isinstance(v.get("host"), str) and _is_int(v.get("pid"))
                and v["pid"] > 0 and _is_int(v.get("pgid")) and v["pgid"] > 0
                and (v.get("start") is None or isinstance(v["start"], str)), "host, pid, pgid, start"),
}
TASK_FIELDS: dict[str, tuple[bool, Callable[[object], bool], str]] = {
    "partition": (True, lambda v: isinstance(v, str) and PART_ID.fullmatch(v) is not None, "a partition id"),
    "command": (True, _command, "a list of strings (a command and its arguments)"),
    "ntasks": (True, lambda v: _is_int(v) and v >= 1, "a whole number >= 1"),
    "state": (True, lambda v: v in TASK_STATES, f"one of {', '.join(TASK_STATES)}"),
    "exit_code": (True, lambda v: v is None or _is_int(v), "a whole number or null"),
    "nodes": (True, _is_strs, "a list of node names"),
    "history": (True, lambda v: isinstance(v, list) and all(
        isinstance(h, list) and len(h) >= 2 and isinstance(h[0], str) and _is_number(h[1]) for h in v),
        "a list of [state, time]"),
    "message": (False, lambda v: isinstance(v, str), "text"),
    "cancel_requested": (False, lambda v: isinstance(v, bool), "true or false"),
}


def checked_record(data: object, rid: str, fields: dict, what: str, path: Path) -> dict:
    """``data`` when it is a record of id ``rid`` with ``fields`` of their form, else a StateError
    naming ``path`` and what is wrong."""
    def bad(why: str) -> StateError:
        return StateError(f"{what} {path}: {why} ({NOT_OURS})")
    if not isinstance(data, dict):
        raise bad(f"not a mapping but {type(data).__name__}")
    if data.get("id") != rid:
        raise bad(f"id: {str(data.get('id'))[:40]!r}, not {rid!r}")
    for key, (required, ok, form) in fields.items():
        if key not in data:
            if required:
                raise bad(f"{key}: missing")
        elif not ok(data[key]):
            raise bad(f"{key}: not {form}")
    return data


def checked_id(rid: str, pattern: re.Pattern, form: str) -> str:
    """``rid`` when it has the form of a record's id (it names a file), else a StateError."""
    if not isinstance(rid, str) or not pattern.fullmatch(rid):
        raise StateError(f"{rid!r} is not a {form}")
    return rid


class PilotStore:
    """The records of one pilot (one allocation) under ``root``."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.parts = self.root / "partitions"
        self.tasks = self.root / "tasks"

    def create(self) -> "PilotStore":
        """Make the pilot directory (0700) or use the user's own; StateError when it is not one
        tether can trust (see the module doc)."""
        return self._trusted(create=True)

    def open(self) -> "PilotStore":
        """An existing pilot directory (an agent's, the records of another job), checked as
        ``create`` checks it; nothing is made but the lock."""
        return self._trusted(create=False)

    def _trusted(self, create: bool) -> "PilotStore":
        uid = os.geteuid()
        try:
            root = trusted_directory(self.root, uid, "pilot directory", create=create)
            for sub in ("partitions", "tasks"):
                trusted_directory(root / sub, uid, "pilot directory", create=create)
        except UntrustedPath as exc:
            raise StateError(f"{exc}: {UNTRUSTED}") from None
        except FileNotFoundError as exc:
            raise StateError(f"no pilot directory {exc.filename or self.root}") from None
        except OSError as exc:
            raise StateError(f"pilot directory {exc.filename or self.root}: {exc.strerror}") from None
        self.root, self.parts, self.tasks = root, root / "partitions", root / "tasks"
        os.close(self._lock_fd())
        return self

    def _lock_fd(self) -> int:
        try:
            return open_trusted_file(self.root / "lock", os.O_RDWR | os.O_CREAT, os.geteuid(), "pilot lock")
        except UntrustedPath as exc:
            raise StateError(f"{exc}: {UNTRUSTED}") from None
        except OSError as exc:
            raise StateError(f"pilot lock {self.root / 'lock'}: {exc.strerror}") from None

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        fd = self._lock_fd()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- partitions --
    def partition_ids(self) -> list[str]:
        """The ids of the partition records (other names in ``partitions/`` are not records)."""
        return sorted((p.name[:-5] for p in self.parts.glob("part.*.json") if PART_ID.fullmatch(p.name[:-5])),
                      key=lambda i: (len(i), i))

    def read(self, pid: str) -> dict:
        """Partition ``pid``'s record; StateError when there is none, or it is not one tether wrote."""
        path = self.parts / f"{checked_id(pid, PART_ID, 'partition id (part.NNNN)')}.json"
        try:
            data = _read_json(path, "partition record")
        except FileNotFoundError:
            raise StateError(f"no partition {pid} in this pilot ({self.root})") from None
        except OSError as exc:
            raise StateError(f"partition record {path}: {exc.strerror}") from None
        return checked_record(data, pid, PARTITION_FIELDS, "partition record", path)

    def partitions(self) -> list[dict]:
        out = []
        for pid in self.partition_ids():
            with contextlib.suppress(StateError):
                out.append(self.read(pid))
        return out

    def new_partition(self, description: dict, agent: dict) -> dict:
        """A NEW record with the next id (call with the lock held)."""
        number = max((int(i.split(".")[1]) for i in self.partition_ids()), default=-1) + 1
        record = {"id": f"part.{number:04d}", "description": description, "agent": agent, "slice": {},
                  "state": NEW, "message": "", "history": [[NEW, time.time(), ""]], "stop_requested": False}
        _write_json(self.parts / f"{record['id']}.json", record)
        return record

    def update(self, pid: str, **fields) -> dict:
        """Change fields of a record that are not its state (call with the lock held)."""
        record = self.read(pid)
        record.update(fields)
        _write_json(self.parts / f"{pid}.json", record)
        return record

    def transition(self, pid: str, state: str, message: str = "", **fields) -> dict:
        """Move a partition to ``state`` (and set ``fields``); StateError when the model has no
        such step. A final partition stays as it is (a late report of its agent changes nothing):
        that is not an error, the record is returned unchanged."""
        with self.lock():
            return self.transition_held(pid, state, message, **fields)

    def transition_held(self, pid: str, state: str, message: str = "", **fields) -> dict:
        """``transition`` for a caller that holds the lock already (flock is per open file: taking
        it again would wait for itself)."""
        record = self.read(pid)
        if record["state"] in FINAL:
            return record
        if state not in TRANSITIONS.get(record["state"], ()):
            raise StateError(f"{pid}: {record['state']} -> {state} is not a transition of the state model")
        record.update(fields, state=state, message=message or record.get("message", ""))
        record["history"].append([state, time.time(), message])
        _write_json(self.parts / f"{pid}.json", record)
        return record

    # -- tasks --
    def task_ids(self) -> list[str]:
        """The ids of the task records (other names in ``tasks/`` are not records)."""
        return sorted((p.name[:-5] for p in self.tasks.glob("task.*.json") if TASK_ID.fullmatch(p.name[:-5])),
                      key=lambda i: (len(i), i))

    def read_task(self, tid: str) -> dict:
        """Task ``tid``'s record; StateError when there is none, or it is not one tether wrote (an
        agent runs no other)."""
        path = self.tasks / f"{checked_id(tid, TASK_ID, 'task id (task.NNNNNN)')}.json"
        try:
            data = _read_json(path, "task record")
        except FileNotFoundError:
            raise StateError(f"no task {tid} in this pilot ({self.root})") from None
        except OSError as exc:
            raise StateError(f"task record {path}: {exc.strerror}") from None
        return checked_record(data, tid, TASK_FIELDS, "task record", path)

    def new_task(self, partition: str, command: list[str], ntasks: int) -> dict:
        with self.lock():
            number = max((int(i.split(".")[1]) for i in self.task_ids()), default=-1) + 1
            record = {"id": f"task.{number:06d}", "partition": partition, "command": command,
                      "ntasks": ntasks, "state": "QUEUED", "exit_code": None, "nodes": [],
                      "history": [["QUEUED", time.time()]]}
            _write_json(self.tasks / f"{record['id']}.json", record)
            return record

    def update_task(self, tid: str, state: str | None = None, **fields) -> dict:
        record = self.read_task(tid)
        if record["state"] in ("DONE", "FAILED", "CANCELED"):
            return record
        record.update(fields)
        if state:
            record["state"] = state
            record["history"].append([state, time.time()])
        _write_json(self.tasks / f"{tid}.json", record)
        return record

    def tasks_of(self, partition: str) -> list[dict]:
        out = []
        for tid in self.task_ids():
            with contextlib.suppress(StateError):
                task = self.read_task(tid)
                if task["partition"] == partition:
                    out.append(task)
        return out


def recover(store: PilotStore, alive: "Callable[[dict], bool | None] | set[str] | None", *,
            grace: float = 30.0, ended: bool = False) -> list[str]:
    """Settle partitions no process will move on any more; returns their ids. ``alive(record)``:
    whether the partition's agent still runs, None when that cannot be told (then that partition
    is not settled); or the names of the job's steps now (Slurm's squeue), or None when unknown
    (then nothing is settled). ``ended``: the allocation itself has ended -- nothing of it runs
    any more, so every partition not final is CANCELED (its agent may have been killed outright
    with the allocation, before it could record that; see ``Allocation.ended``).

    * NEW: the command creating it ended before it found resources -> FAILED;
    * PENDING: published, but the agent was never started (no ``launched`` time) and the
      command is gone (older than ``grace``) -> FAILED;
    * STARTING/ACTIVE whose agent step is no longer among the job's steps (after ``grace``
      seconds from the launch: srun needs a moment to create it; on PBS: its fan-out process is
      gone) -> FAILED, or CANCELED when a
      stop was asked for;
    * and the tasks of an ended partition still QUEUED or RUNNING -> CANCELED.
    """
    if ended:
        return _settle_ended(store)
    if alive is None:
        return []
    if not callable(alive):
        steps = alive
        alive = lambda record: record.get("step_name") in steps          # noqa: E731
    settled = []
    now = time.time()
    for record in store.partitions():
        state, pid = record["state"], record["id"]
        age = now - record["history"][-1][1]
        if state == NEW and age > grace:
            store.transition(pid, FAILED, "the command creating it ended before it got resources")
        elif state == PENDING and not record.get("launched") and age > grace:
            store.transition(pid, FAILED, "the command creating it ended before it started the agent")
        elif state in (STARTING, ACTIVE) and record.get("launched") and now - record["launched"] > grace \
                and alive(record) is False:
            if record.get("stop_requested"):
                store.transition(pid, CANCELED, stop_message(record))
            else:
                store.transition(pid, FAILED, "its agent step ended without reporting" + _log_tail(store, pid))
        else:
            if state in FINAL:
                settle_tasks(store, pid, f"partition {pid} is {state}")
            continue
        settle_tasks(store, pid, f"partition {pid} is {store.read(pid)['state']}")
        settled.append(pid)
    return settled


def _settle_ended(store: PilotStore) -> list[str]:
    settled = []
    for record in store.partitions():
        pid = record["id"]
        if record["state"] not in FINAL:
            store.transition(pid, CANCELED, stop_message(record) if record.get("stop_requested") else ENDED)
            settled.append(pid)
        settle_tasks(store, pid, f"partition {pid} is {store.read(pid)['state']}")
    return settled


def settle_tasks(store: PilotStore, pid: str, why: str) -> None:
    """Tasks of an ended partition that are still QUEUED or RUNNING: nobody runs them any more."""
    for task in store.tasks_of(pid):
        if task["state"] in ("QUEUED", "RUNNING"):
            store.update_task(task["id"], "CANCELED", message=why)


def _log_tail(store: PilotStore, pid: str) -> str:
    """The last line of the agent step's own output (srun's reason when it could not start)."""
    try:
        with os.fdopen(open_record_file(store.parts / f"{pid}.agent.log", os.O_RDONLY, "agent log"), "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 4096))
            lines = fh.read().decode(errors="replace").strip().splitlines()
    except (OSError, StateError):
        return ""
    return f": {lines[-1][:300]}" if lines else ""
