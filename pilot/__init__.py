"""Pilot partitions (docs/requirements.md): one allocation divided into partitions, each run by one agent.

Inside a Slurm allocation (a batch script or salloc) or a PBS job, ``Pilot()`` is the allocation
and its partitions::

    from tether.pilot import ALL, ACTIVE, FILL, Pilot, PartitionDescription as PD

    pilot = Pilot()
    a, b, c = pilot.reconfig(start=[PD(nodes=1), PD(size="50%"), PD(size=FILL)])
    a.wait(ACTIVE)
    print(pilot.run(a, ["hostname"]).output)
    pilot.reconfig(stop=ALL, start=[PD(nodes=1)] * 4)   # three fit: the fourth is FAILED

Each partition's agent is a job step on the partition's nodes (``tether-part.NNNN``), so Slurm
accounts, limits and ends it like any step; tether's default agent runs the partition's tasks as
steps of their own on the partition's nodes. On PBS the agent and each task's ranks are TM tasks
(``pbs_tmrsh``) instead: see ``allocation``. The records live in the pilot directory (see
``pilot_dir``); ``tether partition …`` is the same from a shell.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .allocation import (
    AGENT_MEMORY, STEP_PREFIX, Allocation, PbsAllocation, PilotError, SlurmAllocation, checked_job_id, current,
    job_id, step_environment,
)
from .resources import FILL, Description, Node, PartitionError, Slice, fit, parse_cpus_per_node, unused
from .state import (
    ACTIVE, CANCELED, DONE, FAILED, FINAL, HOLDING, NEW, PENDING, STARTING, STATES, PilotStore,
    StateError, open_record_file, recover, settle_tasks, stop_message,
)

__all__ = ["ACTIVE", "ALL", "CANCELED", "DONE", "FAILED", "FILL", "NEW", "PENDING", "STARTING", "STATES",
           "Partition", "PartitionDescription", "PartitionError", "Pilot", "PilotError", "Task", "pilot_dir"]

ALL = "ALL"
PartitionDescription = Description
DEFAULT_AGENTS = {"default": {"command": None, "cores": 0, "gpus": 0}}


def pilot_dir(env: os._Environ | dict | None = None, job: str | None = None) -> Path:
    """Where a pilot keeps its records: ``$TETHER_PILOT_DIR``; else the job's directory
    (``$TETHER_JOB_DIR/pilot``, removed with the job); else ``~/.tether/pilots/<job id>``. On PBS
    it must be a directory every host of the job sees (the agents on other hosts read it). It must
    be the user's own, below directories nobody else can change (``PilotStore.create`` checks).
    ``job``: another job than the one this process runs in (its records, from outside it)."""
    env = os.environ if env is None else env
    if job is not None:
        checked_job_id(job)     # it names a directory below the user's home
    if env.get("TETHER_PILOT_DIR"):
        return Path(env["TETHER_PILOT_DIR"])
    here = job_id(env)
    job = job or here
    if not job:
        raise PilotError("not inside an allocation (no SLURM_JOB_ID or PBS_JOBID): run it in a batch script or "
                         "salloc")
    if env.get("TETHER_JOB_DIR") and job == here:
        return Path(env["TETHER_JOB_DIR"]) / "pilot"
    return Path.home() / ".tether" / "pilots" / job


@dataclass
class Task:
    """A task (a unit, in the requirements' words) sent to a partition: its record and output."""

    pilot: "Pilot"
    id: str

    @property
    def record(self) -> dict:
        return self.pilot.store.read_task(self.id)

    @property
    def output(self) -> str:
        try:
            fd = open_record_file(self.pilot.store.tasks / f"{self.id}.out", os.O_RDONLY, "task output")
        except FileNotFoundError:
            return ""
        except OSError as exc:
            raise PilotError(f"task output {self.pilot.store.tasks / f'{self.id}.out'}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as fh:
            return fh.read().decode(errors="replace")

    def wait(self, timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            record = self.record
            if record["state"] in ("DONE", "FAILED", "CANCELED"):
                return record
            part = self.pilot.store.read(record["partition"])
            if part["state"] in FINAL:           # its agent is gone: nobody will run it
                return self.pilot.store.update_task(self.id, "CANCELED",
                                                    message=f"partition {part['id']} is {part['state']}")
            if deadline is not None and time.monotonic() > deadline:
                raise PilotError(f"{self.id}: not done after {timeout:g} s ({record['state']})")
            time.sleep(0.2)


@dataclass
class Partition:
    """One partition: its record, re-read on every access (other processes change it)."""

    pilot: "Pilot"
    id: str

    @property
    def record(self) -> dict:
        return self.pilot.store.read(self.id)

    @property
    def state(self) -> str:
        return self.record["state"]

    @property
    def nodes(self) -> list[str]:
        return list(self.record["slice"])

    def wait(self, state: str = ACTIVE, timeout: float | None = None) -> str:
        """Wait until the partition is in ``state`` or a final one; return the state it is in."""
        deadline = None if timeout is None else time.monotonic() + timeout
        checked = 0.0
        while True:
            if time.monotonic() - checked > 2:          # squeue at most every 2 s
                self.pilot.recover()
                checked = time.monotonic()
            now = self.state
            if now == state or now in FINAL:
                return now
            if deadline is not None and time.monotonic() > deadline:
                return now
            time.sleep(0.2)

    def stop(self) -> None:
        self.pilot.stop(self.id)


class Pilot:
    """The allocation this process runs in (``job``: another of the user's own), with its partitions."""

    def __init__(self, root: str | os.PathLike | None = None, job: str | None = None,
                 agents: dict | None = None, allocation: Allocation | None = None):
        self.allocation = allocation or current(job=job)
        self.job = self.allocation.job
        self.inside = job_id(os.environ) == self.job      # this process runs in the allocation
        store = PilotStore(root or pilot_dir(job=self.job))
        if root is None and not self.inside and not os.path.lexists(store.root):   # another job's: read, not made
            raise PilotError(f"job {self.job} has no pilot records in {store.root} (a pilot job keeps them "
                             f"there unless TETHER_PILOT_DIR says otherwise)")
        try:
            self.store = store.create()
        except StateError as exc:                     # a directory another user could write: refused
            raise PilotError(str(exc)) from None
        self.agents = {**DEFAULT_AGENTS, **(agents or {})}
        self._nodes: list[Node] | None = None

    @property
    def nodes(self) -> list[Node]:
        if self._nodes is None:
            self._nodes = self.allocation.nodes()
        return self._nodes

    @property
    def partitions(self) -> list[Partition]:
        return [Partition(self, p["id"]) for p in self.store.partitions()]

    def partition(self, pid: str) -> Partition:
        self.store.read(pid)
        return Partition(self, pid)

    def recover(self) -> list[str]:
        """Settle what no process will move on any more (``state.recover``); from outside the
        allocation, once it has ended, every partition not final is CANCELED."""
        ended = not self.inside and self.allocation.ended() is True
        return recover(self.store, self.allocation.alive, ended=ended)

    # -- reconfiguration --------------------------------------------------------------------
    def reconfig(self, stop: str | Sequence[str] | None = None,
                 start: Iterable[Description | dict | str] = (), reason: str | None = None) -> list[Partition]:
        """Stop partitions (ids, or ALL; ``reason``: their message, default "stopped"), then create
        one per description in ``start``. A description that does not fit makes its partition
        FAILED with the reason; when the partitions leave part of the allocation unused,
        ``self.warnings`` says so."""
        self.warnings: list[str] = []
        if stop is not None:
            ids = [p["id"] for p in self.store.partitions() if p["state"] not in FINAL] if stop == ALL \
                else [stop] if isinstance(stop, str) else list(stop)
            for pid in ids:
                self.stop(pid, wait=True, reason=reason)
        descriptions = [Description.parse(d) for d in start]
        created = []
        with self.store.lock():
            for desc in descriptions:
                agent = self._agent(desc)
                record = self.store.new_partition(desc.to_data(), agent)
                held = [Slice.from_data(p["slice"]) for p in self.store.partitions() if p["state"] in HOLDING]
                try:
                    got = fit(desc, self.nodes, held, agent["cores"], agent["gpus"])
                except PartitionError as exc:
                    self.store.transition_held(record["id"], FAILED, str(exc))
                    created.append(Partition(self, record["id"]))
                    continue
                self.store.transition_held(record["id"], PENDING, "", slice=got.to_data())
                created.append(Partition(self, record["id"]))
            held = [Slice.from_data(p["slice"]) for p in self.store.partitions() if p["state"] in HOLDING]
            if descriptions:
                warning = unused(self.nodes, held)
                if warning:
                    self.warnings.append(warning)
        for part in created:
            if part.state == PENDING:
                self._launch(part.record)
        return created

    def create(self, *descriptions: Description | dict | str) -> list[Partition]:
        return self.reconfig(start=descriptions)

    def _agent(self, desc: Description) -> dict:
        if desc.config not in self.agents:
            raise PartitionError(f"config {desc.config!r}: no such agent config (known: {', '.join(self.agents)})")
        agent = dict(self.agents[desc.config])
        if desc.command:
            agent["command"] = list(desc.command)
        return {"command": agent.get("command"), "cores": int(agent.get("cores") or 0),
                "gpus": int(agent.get("gpus") or 0), "config": desc.config}

    def _launch(self, record: dict) -> None:
        """Start the partition's agent on its slice, detached (PENDING -> STARTING): a job step
        on Slurm, TM tasks on PBS (``Allocation.agent_argv``)."""
        pid = record["id"]
        record = self.store.transition(pid, STARTING, "", step_name=STEP_PREFIX + pid, batch=self.allocation.kind,
                                       launched=time.time())
        argv = self.allocation.agent_argv(record, str(self.store.root))
        env = step_environment(os.environ)
        log = self.store.parts / f"{pid}.agent.log"
        child = os.fork()
        if child == 0:                                       # detached: the agent outlives this command
            try:
                os.setsid()
                if os.fork() == 0:
                    fd = open_record_file(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, "agent log")
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    null = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(null, 0)
                    os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        os.waitpid(child, 0)

    # -- stopping ------------------------------------------------------------------------------
    def stop(self, pid: str, wait: bool = True, timeout: float = 30, reason: str | None = None) -> None:
        """Stop a partition: record the request (every agent process reads it), and on Slurm
        SIGTERM its agent step (the agent ends its tasks and records CANCELED, with ``reason`` as
        the message: default "stopped"); what is left after ``timeout`` seconds is killed (Slurm:
        the agent's and tasks' steps; PBS: the agents' fan-out) and the partition recorded
        CANCELED."""
        record = self.store.read(pid)
        if record["state"] in FINAL:
            return
        with self.store.lock():
            record = self.store.update(pid, stop_requested=True, **({"stop_reason": reason} if reason else {}))
        if record["state"] in (NEW, PENDING) and not record.get("launched"):
            self.store.transition(pid, CANCELED, "stopped before its agent started")
            return
        self.allocation.ask_stop(record)
        if not wait:
            return
        deadline = time.monotonic() + timeout
        while self.store.read(pid)["state"] not in FINAL and time.monotonic() < deadline:
            time.sleep(0.2)
        self.allocation.kill(self.store.read(pid))
        self.store.transition(pid, CANCELED, stop_message(self.store.read(pid)))
        settle_tasks(self.store, pid, "the partition was stopped")

    # -- tasks ---------------------------------------------------------------------------------
    def run(self, partition: "Partition | str", command: Sequence[str], ntasks: int = 1,
            wait: bool = True, timeout: float | None = None) -> Task:
        """Send a task to a partition's agent; with ``wait``, return once it ended."""
        pid = partition.id if isinstance(partition, Partition) else partition
        record = self.store.read(pid)
        if record["agent"].get("command"):
            raise PilotError(f"{pid} runs its own agent ({record['agent']['command'][0]}), which takes no tasks "
                             f"from tether")
        if record["state"] in FINAL:
            raise PilotError(f"{pid} is {record['state']}: it runs no more tasks")
        if not command:
            raise PilotError("a task needs a command")
        task = Task(self, self.store.new_task(pid, list(command), int(ntasks))["id"])
        if wait:
            task.wait(timeout)
        return task
