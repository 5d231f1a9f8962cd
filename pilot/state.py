"""The partitions' state model (seed 003), kept on the filesystem.

One JSON record per partition in ``<pilot dir>/partitions/<id>.json`` and one per task in
``<pilot dir>/tasks/<id>.json``, each replaced whole (written to a file of its own, flushed,
renamed over the old one): a reader never sees half a record, however many read at once. Changes
that must see the whole pilot at once (new ids, which resources are free) hold an exclusive
``flock`` on ``<pilot dir>/lock``; a crash releases it with the process.

States: NEW -> PENDING -> STARTING -> ACTIVE -> DONE | FAILED | CANCELED (seed 003). A
partition holds its slice of the allocation from PENDING (its request is published with the
resources it got) until it reaches a final state. Every change appends to its history, so a
crashed command leaves a record that says how far it got; ``recover`` settles what no process
will move on (see there).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Callable, Iterator

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
    """A transition the state model does not have, or a record that is not there."""


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read_json(path: Path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


class PilotStore:
    """The records of one pilot (one allocation) under ``root``."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.parts = self.root / "partitions"
        self.tasks = self.root / "tasks"

    def create(self) -> "PilotStore":
        for d in (self.root, self.parts, self.tasks):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- partitions --
    def partition_ids(self) -> list[str]:
        return sorted(p.stem for p in self.parts.glob("part.*.json"))

    def read(self, pid: str) -> dict:
        try:
            return _read_json(self.parts / f"{pid}.json")
        except FileNotFoundError:
            raise StateError(f"no partition {pid} in this pilot ({self.root})") from None

    def partitions(self) -> list[dict]:
        out = []
        for pid in self.partition_ids():
            with contextlib.suppress(StateError, ValueError):
                out.append(self.read(pid))
        return out

    def new_partition(self, description: dict, agent: dict) -> dict:
        """A NEW record with the next id (call with the lock held)."""
        ids = self.partition_ids()
        number = int(ids[-1].split(".")[1]) + 1 if ids else 0
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
        return sorted(p.stem for p in self.tasks.glob("task.*.json"))

    def read_task(self, tid: str) -> dict:
        try:
            return _read_json(self.tasks / f"{tid}.json")
        except FileNotFoundError:
            raise StateError(f"no task {tid} in this pilot ({self.root})") from None

    def new_task(self, partition: str, command: list[str], ntasks: int) -> dict:
        with self.lock():
            ids = self.task_ids()
            number = int(ids[-1].split(".")[1]) + 1 if ids else 0
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
            with contextlib.suppress(StateError, ValueError):
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
        lines = (store.parts / f"{pid}.agent.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f": {lines[-1][:300]}" if lines else ""
