"""Pilot partitions (seed 003): one allocation divided into partitions, each run by one agent.

Inside a Slurm allocation (a batch script or salloc), ``Pilot()`` is the allocation and its
partitions::

    from tether.pilot import ALL, ACTIVE, FILL, Pilot, PartitionDescription as PD

    pilot = Pilot()
    a, b, c = pilot.reconfig(start=[PD(nodes=1), PD(size="50%"), PD(size=FILL)])
    a.wait(ACTIVE)
    print(pilot.run(a, ["hostname"]).output)
    pilot.reconfig(stop=ALL, start=[PD(nodes=1)] * 4)   # three fit: the fourth is FAILED

Each partition's agent is a job step on the partition's nodes (``tether-part.NNNN``), so Slurm
accounts, limits and ends it like any step; tether's default agent runs the partition's tasks as
steps of their own on the partition's nodes. The records live in the pilot directory (see
``pilot_dir``); ``tether partition …`` is the same from a shell.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .resources import FILL, Description, Node, PartitionError, Slice, fit, parse_cpus_per_node, unused
from .state import (
    ACTIVE, CANCELED, DONE, FAILED, FINAL, HOLDING, NEW, PENDING, STARTING, STATES, PilotStore,
    StateError, recover, settle_tasks,
)

__all__ = ["ACTIVE", "ALL", "CANCELED", "DONE", "FAILED", "FILL", "NEW", "PENDING", "STARTING", "STATES",
           "Partition", "PartitionDescription", "PartitionError", "Pilot", "PilotError", "Task", "pilot_dir"]

ALL = "ALL"
PartitionDescription = Description
STEP_PREFIX = "tether-"            # an agent's step is tether-part.NNNN; a task's tether-part.NNNN-task.NNNNNN
DEFAULT_AGENTS = {"default": {"command": None, "cores": 0, "gpus": 0}}
# An agent step holds its slice's CPUs and GPUs, and this much memory per node: Slurm 22.05's
# --overlap lets the tasks' steps share the agent's CPUs, not its memory, so the rest of each
# node's memory stays the job's, for the tasks.
AGENT_MEMORY = "256M"   # the agent, and an srun (~15 MB) per running task


class PilotError(Exception):
    """Not inside an allocation, or a command tether runs failed."""


def pilot_dir(env: os._Environ | dict | None = None) -> Path:
    """Where a pilot keeps its records: ``$TETHER_PILOT_DIR``; else the job's directory
    (``$TETHER_JOB_DIR/pilot``, removed with the job); else ``~/.tether/pilots/<job id>``."""
    env = os.environ if env is None else env
    if env.get("TETHER_PILOT_DIR"):
        return Path(env["TETHER_PILOT_DIR"])
    job = env.get("SLURM_JOB_ID")
    if not job:
        raise PilotError("not inside an allocation (no SLURM_JOB_ID): run it in a batch script or salloc")
    if env.get("TETHER_JOB_DIR"):
        return Path(env["TETHER_JOB_DIR"]) / "pilot"
    return Path.home() / ".tether" / "pilots" / job


def _run(argv: list[str], timeout: float = 60) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PilotError(f"{argv[0]}: {exc}") from None
    if out.returncode != 0:
        raise PilotError(f"{' '.join(argv)}: {out.stderr.strip() or f'exit {out.returncode}'}")
    return out.stdout


def _count_ids(text: str) -> int:
    """``0-7`` / ``0,2-3`` -> how many ids."""
    n = 0
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def allocation_nodes(job: str) -> list[Node]:
    """The job's nodes with the cores and GPUs Slurm gave it on each (``scontrol -d show job``)."""
    out = _run(["scontrol", "-d", "show", "job", job])
    nodes: list[Node] = []
    for m in re.finditer(r"^\s*Nodes=(\S+) CPU_IDs=(\S+)\s+Mem=\S*\s+GRES=(\S*)", out, re.M):
        names = _run(["scontrol", "show", "hostnames", m.group(1)]).split()
        gres = re.search(r"gpu(?::[^:(]+)?(?::(\d+))?\(IDX:([^)]*)\)", m.group(3))
        gpus = _count_ids(gres.group(2)) if gres and gres.group(2) not in (None, "N/A") else 0
        nodes += [Node(n, _count_ids(m.group(2)), gpus) for n in names]
    if not nodes:
        raise PilotError(f"cannot read job {job}'s nodes from scontrol -d show job")
    return nodes


def live_steps(job: str) -> set[str] | None:
    """The names of the job's steps now (None when squeue cannot tell)."""
    try:
        out = _run(["squeue", "-h", "-s", "-j", job, "-o", "%j"], timeout=30)
    except PilotError:
        return None
    return {line.strip() for line in out.splitlines() if line.strip()}


@dataclass
class Task:
    """A task (the seed's unit) sent to a partition: its record and output."""

    pilot: "Pilot"
    id: str

    @property
    def record(self) -> dict:
        return self.pilot.store.read_task(self.id)

    @property
    def output(self) -> str:
        path = self.pilot.store.tasks / f"{self.id}.out"
        return path.read_text(errors="replace") if path.exists() else ""

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
                 agents: dict | None = None):
        self.job = job or os.environ.get("SLURM_JOB_ID") or ""
        if not self.job:
            raise PilotError("not inside an allocation (no SLURM_JOB_ID): run it in a batch script or salloc")
        self.store = PilotStore(root or pilot_dir()).create()
        self.agents = {**DEFAULT_AGENTS, **(agents or {})}
        self._nodes: list[Node] | None = None

    @property
    def nodes(self) -> list[Node]:
        if self._nodes is None:
            self._nodes = allocation_nodes(self.job)
        return self._nodes

    @property
    def partitions(self) -> list[Partition]:
        return [Partition(self, p["id"]) for p in self.store.partitions()]

    def partition(self, pid: str) -> Partition:
        self.store.read(pid)
        return Partition(self, pid)

    def recover(self) -> list[str]:
        return recover(self.store, live_steps(self.job))

    # -- reconfiguration --------------------------------------------------------------------
    def reconfig(self, stop: str | Sequence[str] | None = None,
                 start: Iterable[Description | dict | str] = ()) -> list[Partition]:
        """Stop partitions (ids, or ALL), then create one per description in ``start``. A
        description that does not fit makes its partition FAILED with the reason; when the
        partitions leave part of the allocation unused, ``self.warnings`` says so."""
        self.warnings: list[str] = []
        if stop is not None:
            ids = [p["id"] for p in self.store.partitions() if p["state"] not in FINAL] if stop == ALL \
                else [stop] if isinstance(stop, str) else list(stop)
            for pid in ids:
                self.stop(pid, wait=True)
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
        """Start the partition's agent as a job step on its slice, detached (PENDING -> STARTING).
        The step holds the slice's CPUs (``--exact``; unbound: the agent only waits and starts
        steps, and a node whose CPU count is not the hardware's -- the sandbox's -- cannot bind
        them all)."""
        pid, slice_ = record["id"], Slice.from_data(record["slice"])
        step_name = STEP_PREFIX + pid
        cores = min(c for c, _ in slice_.parts.values())
        gpus = min(g for _, g in slice_.parts.values())
        argv = ["srun", f"--jobid={self.job}", "--exact", f"--nodelist={','.join(slice_.nodes)}",
                f"--nodes={len(slice_.nodes)}", f"--ntasks={len(slice_.nodes)}", "--ntasks-per-node=1",
                f"--cpus-per-task={cores}", "--cpu-bind=none", f"--mem={AGENT_MEMORY}", f"--job-name={step_name}",
                "--kill-on-bad-exit=0", "--quiet"]
        if gpus:
            argv.append(f"--gres=gpu:{gpus}")
        argv += ["--", sys.executable, "-m", "tether.pilot.agent", str(self.store.root), pid]
        env = agent_environment(os.environ)
        log = self.store.parts / f"{pid}.agent.log"
        self.store.transition(pid, STARTING, "", step_name=step_name, launched=time.time())
        child = os.fork()
        if child == 0:                                       # detached: the agent outlives this command
            try:
                os.setsid()
                if os.fork() == 0:
                    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    null = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(null, 0)
                    os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        os.waitpid(child, 0)

    # -- stopping ------------------------------------------------------------------------------
    def stop(self, pid: str, wait: bool = True, timeout: float = 30) -> None:
        """Stop a partition: SIGTERM to its agent step (the agent ends its tasks' steps and records
        CANCELED); what is left after ``timeout`` seconds -- the agent's step, its tasks' steps --
        is scancelled (SIGKILL) and recorded CANCELED."""
        record = self.store.read(pid)
        if record["state"] in FINAL:
            return
        with self.store.lock():
            record = self.store.update(pid, stop_requested=True)
        if record["state"] in (NEW, PENDING) and not record.get("launched"):
            self.store.transition(pid, CANCELED, "stopped before its agent started")
            return
        agent = self._steps(pid, record, tasks=False)
        if agent:
            subprocess.run(["scancel", "--signal=TERM", *agent], capture_output=True, timeout=30)
        if not wait:
            return
        deadline = time.monotonic() + timeout
        while self.store.read(pid)["state"] not in FINAL and time.monotonic() < deadline:
            time.sleep(0.2)
        left = self._steps(pid, record, tasks=True)
        if left:
            subprocess.run(["scancel", *left], capture_output=True, timeout=30)
        self.store.transition(pid, CANCELED, "stopped")
        settle_tasks(self.store, pid, "the partition was stopped")

    def _steps(self, pid: str, record: dict, *, tasks: bool) -> list[str]:
        """The ids of the partition's agent step (and its tasks' steps) now running."""
        out = _run(["squeue", "-h", "-s", "-j", self.job, "-o", "%i %j"], timeout=30)
        found = []
        for line in out.splitlines():
            words = line.split()
            if len(words) == 2 and (words[1] == record.get("step_name") or
                                    (tasks and words[1].startswith(f"{STEP_PREFIX}{pid}-"))):
                found.append(words[0])
        return found

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


def agent_environment(env: dict | os._Environ) -> dict[str, str]:
    """The environment for a step started from inside another (the batch script, an agent): the
    job's, without the step's own sizes, which srun would take as this step's."""
    drop = ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_CPUS_PER_TASK", "SLURM_NNODES",
            "SLURM_STEP_", "SLURM_DISTRIBUTION", "SLURM_EXACT", "SLURM_OVERLAP", "SLURM_TASKS_PER_NODE", "SLURM_GPUS", "SLURM_TRES_PER_TASK", "TETHER_STEP_")
    return {k: v for k, v in env.items() if not k.startswith(drop)}
