"""tether's default partition agent: one process per node of the partition.

``python -m tether.pilot.agent PILOT_DIR PART_ID`` is what ``Pilot._launch`` runs with srun on the
partition's nodes (Slurm). The process on the first node (SLURM_PROCID 0) leads: it marks the
partition ACTIVE, takes the partition's QUEUED tasks and runs each as a job step of its own on
the partition's nodes (``srun --overlap``: inside the CPUs the agent step holds), with the task's
output in ``tasks/<id>.out``, and records how each ended. The other nodes' processes hold their
node's share until the partition ends.

On PBS (``Allocation`` in ``allocation.py``):

* ``--fan-out PILOT_DIR PART_ID`` runs detached on the calling host: it records itself in the
  partition (host, pid, start time: how ``tether partition list`` tells it is alive), starts one
  agent per node as a TM task (``pbs_tmrsh NODE … --node I``) and waits for them; an agent that
  ends while its partition runs fails the partition (and stops the others);
* ``--node I PILOT_DIR PART_ID`` is the agent on the I-th node (0 leads, as above, but starting
  each task's ranks with ``pbs_tmrsh``);
* ``--rank PILOT_DIR PART_ID TASK_ID R NODE`` wraps one rank of a task: it appends the rank's
  output to the task's and ends the rank when the task or its partition is stopped -- read from
  the records, since nothing inside a PBS job can signal a TM task on another host.

A partition with an agent command of its own (``command:``) runs that command instead, on every
node, with ``TETHER_PARTITION_ID``, ``TETHER_PARTITION_NODES`` and ``TETHER_PILOT_DIR``; the first
node's process marks it ACTIVE and, when the command ends, DONE or FAILED.

A stop (``stop_requested`` in the record; on Slurm also SIGTERM to the step) or SIGTERM (the
allocation ending) ends every running task, marks the partition CANCELED (with the stop's reason,
or that it was terminated) and exits. An agent killed outright records nothing: ``recover``
settles its partition once the allocation has ended (``tether partition list --job``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

from pathlib import Path

from ..pbs_hooks.commands import PBSCommandError
from .allocation import PbsAllocation, PilotError, SlurmAllocation, process_start, step_environment
from .state import (
    ACTIVE, CANCELED, DONE, FAILED, FINAL, PilotStore, StateError, cancel_message, open_record_file,
)

POLL = 0.2
RANK_POLL = 0.5          # how often a PBS rank wrapper reads whether it is stopped
STOP_GRACE = 20          # seconds from SIGTERM to SIGKILL for a task (or an agent command)
UP_TIMEOUT = 60          # PBS: how long the lead waits for every node's agent before ACTIVE


def _stopped(store: PilotStore, pid: str) -> bool:
    """Has a stop been asked for (or has the partition ended) -- the record says."""
    try:
        record = store.read(pid)
    except (StateError, ValueError, OSError):
        return False
    return bool(record.get("stop_requested")) or record["state"] in FINAL


def _end(proc: subprocess.Popen, group: bool) -> None:
    """SIGTERM, SIGKILL after the grace (the whole process group when ``group``)."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _why(exc: Exception) -> str:
    """An OSError as "path: reason", anything else as its message."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc)


def partition_env(record: dict, root: str) -> dict[str, str]:
    """What an agent command and every task run with: the job's environment for a step, and the
    partition's id, nodes and pilot directory."""
    env = step_environment(os.environ)
    env.update(TETHER_PARTITION_ID=record["id"], TETHER_PARTITION_NODES=",".join(record["slice"]),
               TETHER_PILOT_DIR=root)
    return env


class Agent:
    def __init__(self, root: str, pid: str, node_index: int | None = None):
        self.store = PilotStore(root).open()          # the user's own, or refused: its tasks run as the user
        self.pid = pid
        self.record = self.store.read(pid)
        self.pbs = self.record.get("batch") == "pbs"
        self.allocation = PbsAllocation(os.environ.get("PBS_JOBID", ""), self.record.get("tm")) if self.pbs else \
            SlurmAllocation(os.environ.get("SLURM_JOB_ID", ""))
        nodes = list(self.record["slice"])
        self.node = nodes[node_index] if node_index is not None and node_index < len(nodes) else \
            os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".", 1)[0]
        self.running: dict[str, list[subprocess.Popen]] = {}
        self.stopping = False

    def env(self) -> dict[str, str]:
        return partition_env(self.record, str(self.store.root))

    def on_term(self, *_: object) -> None:
        self.stopping = True

    def report_up(self) -> None:
        """PBS: this node's agent runs (the lead waits for every node's before ACTIVE)."""
        if self.pbs:
            with self.store.lock():
                record = self.store.read(self.pid)
                self.store.update(self.pid, nodes_up=sorted({*record.get("nodes_up", []), self.node}))

    def activate(self) -> bool:
        """The lead: ACTIVE once every node's agent runs (on Slurm srun started them all at once);
        False when the partition ended or was stopped meanwhile, or a node's agent never came."""
        deadline = time.monotonic() + UP_TIMEOUT
        while self.pbs:
            record = self.store.read(self.pid)
            if record["state"] in FINAL:
                return False
            if record.get("stop_requested") or self.stopping:
                self.store.transition(self.pid, CANCELED, cancel_message(record))
                return False
            missing = [n for n in record["slice"] if n not in record.get("nodes_up", [])]
            if not missing:
                break
            if time.monotonic() > deadline:
                self.store.transition(self.pid, FAILED, f"its agent on {','.join(missing)} did not start within "
                                                        f"{UP_TIMEOUT} s")
                return False
            time.sleep(POLL)
        return self.store.transition(self.pid, ACTIVE, "", agent_node=self.node)["state"] == ACTIVE

    def run_tasks(self) -> int:
        self.report_up()
        if not self.activate():
            return 1
        while not self.stopping:
            if _stopped(self.store, self.pid):
                break
            for task in self.store.tasks_of(self.pid):
                if task["state"] == "QUEUED" and task["id"] not in self.running:
                    self.start(task)
            for tid, procs in list(self.running.items()):
                codes = [proc.poll() for proc in procs]
                if all(rc is not None for rc in codes):
                    del self.running[tid]
                    rc = next((c for c in codes if c != 0), 0)
                    never = self.ranks_never_ran(tid, codes) if self.pbs else ""
                    self.store.update_task(tid, "DONE" if rc == 0 and not never else "FAILED", exit_code=rc or
                                           (1 if never else 0), **({"message": never} if never else {}))
            time.sleep(POLL)
        self.end_tasks("the partition was stopped")
        record = self.store.read(self.pid)
        self.store.transition(self.pid, CANCELED, cancel_message(record))
        return 0

    def start(self, task: dict) -> None:
        nodes = list(self.record["slice"])
        ntasks = max(1, int(task["ntasks"]))
        use = nodes[:min(len(nodes), ntasks)]
        env = self.env()
        env["TETHER_TASK_ID"] = task["id"]
        try:
            fh = os.fdopen(open_record_file(self.store.tasks / f"{task['id']}.out",
                                            os.O_WRONLY | os.O_APPEND | os.O_CREAT, "task output"), "ab")
        except (OSError, StateError) as exc:
            self.store.update_task(task["id"], "FAILED", exit_code=1, message=_why(exc))
            return
        procs = []
        launch_env = self.allocation.tm_env(env) if self.pbs else env
        with fh:
            for argv in self.allocation.task_argvs(self.pid, task, use, env):
                try:
                    procs.append(subprocess.Popen(argv, env=launch_env, stdin=subprocess.DEVNULL, stdout=fh,
                                                  stderr=subprocess.STDOUT, start_new_session=True))
                except OSError as exc:
                    for proc in procs:
                        _end(proc, group=False)
                    self.store.update_task(task["id"], "FAILED", exit_code=127, message=f"{argv[0]}: {exc.strerror}")
                    return
        self.running[task["id"]] = procs
        self.store.update_task(task["id"], "RUNNING", nodes=use)

    def ranks_never_ran(self, tid: str, codes: list[int]) -> str:
        """PBS: the ranks of a task whose wrapper never started (no marker: pbs_tmrsh exits 0 without
        a word when a MoM's execjob_launch hook rejects the task -- recorded on OpenPBS 23.06.06),
        said as the task's message; "" when every rank ran."""
        nodes = list(self.store.read_task(tid).get("nodes") or self.record["slice"])
        missing = [r for r in range(len(codes)) if not rank_marker(self.store, tid, r).exists()]
        if not missing:
            return ""
        where = ", ".join(f"{r} on {nodes[r % len(nodes)]} (pbs_tmrsh exit {codes[r]})" for r in missing)
        return (f"rank {where} never ran: its TM task did not start (a MoM's execjob_launch hook may have "
                f"rejected it: see that MoM's log)")

    def end_tasks(self, why: str) -> None:
        for tid, procs in self.running.items():
            self.store.update_task(tid, cancel_requested=True)   # a PBS rank wrapper reads this
            for proc in procs:
                proc.terminate()                    # srun cancels the task's step
        for tid, procs in self.running.items():
            for proc in procs:
                try:
                    proc.wait(timeout=STOP_GRACE)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            self.store.update_task(tid, "CANCELED", exit_code=next((p.returncode for p in procs
                                                                    if p.returncode != 0), 0), message=why)
        self.running.clear()

    def hold(self) -> int:
        """A node that does not lead: hold its share until the partition ends."""
        self.report_up()
        while not self.stopping and not _stopped(self.store, self.pid):
            time.sleep(1)
        return 0

    def run_command(self, command: list[str], lead: bool) -> int:
        self.report_up()
        if lead and not self.activate():
            return 1
        try:
            proc = subprocess.Popen(command, env=self.env())
        except OSError as exc:
            if lead:
                self.store.transition(self.pid, FAILED, f"cannot run its agent {command[0]}: {exc.strerror}")
            return 127
        checked = time.monotonic()
        while proc.poll() is None:
            if not self.stopping and time.monotonic() - checked > 1:
                self.stopping = _stopped(self.store, self.pid)
                checked = time.monotonic()
            if self.stopping:
                _end(proc, group=False)
                break
            time.sleep(POLL)
        rc = proc.wait()
        if lead:
            record = self.store.read(self.pid)
            if self.stopping:
                self.store.transition(self.pid, CANCELED, cancel_message(record))
            else:
                self.store.transition(self.pid, DONE if rc == 0 else FAILED,
                                      "" if rc == 0 else f"its agent exited with {rc}")
        return rc


def run_agent(root: str, pid: str, lead: bool, node_index: int | None = None) -> int:
    try:
        agent = Agent(root, pid, node_index)
    except StateError as exc:
        print(f"tether: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, agent.on_term)
    signal.signal(signal.SIGINT, agent.on_term)
    command = agent.record["agent"].get("command")
    if command:
        return agent.run_command(list(command), lead)
    if not lead:
        return agent.hold()
    try:
        return agent.run_tasks()
    except Exception as exc:                        # the partition says why, never a silent end
        print(f"tether: {agent.pid}: its agent failed: {_why(exc)}", file=sys.stderr)
        with contextlib.suppress(StateError, OSError):
            agent.end_tasks(f"its agent failed: {exc}")
            agent.store.transition(agent.pid, FAILED, f"its agent failed: {type(exc).__name__}: {exc}")
        return 1


def fan_out(root: str, pid: str) -> int:
    """PBS: one agent per node of the partition as a TM task; see the module doc."""
    try:
        store = PilotStore(root).open()
    except StateError as exc:
        print(f"tether: {exc}", file=sys.stderr)
        return 1
    me = os.getpid()
    allocation = PbsAllocation(os.environ.get("PBS_JOBID", ""))
    try:
        tm = allocation.tm_setup(store.root)            # here, in the job shell: see allocation.py
    except (PilotError, PBSCommandError, OSError) as exc:
        store.transition(pid, FAILED, f"cannot start its agents: {exc}")
        return 1
    with store.lock():
        record = store.update(pid, fan_out={"host": socket.gethostname(), "pid": me, "pgid": os.getpgrp(),
                                            "start": process_start(me)}, tm=tm)
    allocation.tm = tm
    argvs = allocation.fan_out_argvs(record, root)
    procs = []
    for argv in argvs:
        try:
            procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=allocation.tm_env(os.environ)))
        except OSError as exc:
            store.transition(pid, FAILED, f"cannot start its agents: {argv[0]}: {exc.strerror}")
            with store.lock():
                store.update(pid, stop_requested=True)
            break
    pending = dict(zip(procs, record["slice"]))
    while pending:
        for proc, node in list(pending.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del pending[proc]
            record = store.read(pid)
            if record["state"] not in FINAL and not record.get("stop_requested"):
                store.transition(pid, FAILED, f"its agent on {node} ended (pbs_tmrsh exit {rc}) while the "
                                              f"partition ran" if node in record.get("nodes_up", []) else
                                 f"its agent on {node} never started (pbs_tmrsh exit {rc}; a MoM's execjob_launch "
                                 f"hook may have rejected the TM task: see that MoM's log)")
                with store.lock():
                    store.update(pid, stop_requested=True)       # the other nodes' agents end too
        time.sleep(POLL)
    return 0


def rank_marker(store: PilotStore, tid: str, rank: int) -> Path:
    """The file a PBS rank's wrapper makes when it starts: its agent's proof that the TM task ran."""
    return store.tasks / f"{tid}.rank{rank}.ran"


def run_rank(root: str, pid: str, tid: str, rank: str, node: str) -> int:
    """PBS: one rank of a task, ended when the task or its partition is stopped."""
    try:
        store = PilotStore(root).open()
        record, task = store.read(pid), store.read_task(tid)
        fd = open_record_file(store.tasks / f"{tid}.out", os.O_WRONLY | os.O_APPEND | os.O_CREAT, "task output")
        # this TM task runs: what its agent checks (a launch a MoM hook rejects looks like success)
        os.close(open_record_file(rank_marker(store, tid, int(rank)), os.O_WRONLY | os.O_CREAT, "rank marker"))
    except (OSError, StateError, ValueError) as exc:
        print(f"tether: rank {rank} on {node}: {_why(exc)}", file=sys.stderr)
        return 1
    env = partition_env(record, str(store.root))
    env.update(TETHER_TASK_ID=tid, TETHER_TASK_RANK=rank, TETHER_TASK_NODE=node)
    try:
        proc = subprocess.Popen(task["command"], env=env, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
                                start_new_session=True)
    except OSError as exc:
        os.write(fd, f"tether: rank {rank} on {node}: cannot run {task['command'][0]}: {exc.strerror}\n".encode())
        return 127
    finally:
        os.close(fd)
    terminated = []
    signal.signal(signal.SIGTERM, lambda *_: terminated.append(1))   # the job's end: the MoM's SIGTERM
    while proc.poll() is None:
        if terminated or _stopped(store, pid) or store.read_task(tid).get("cancel_requested"):
            _end(proc, group=True)
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=RANK_POLL)          # a task's end is seen at once, a stop within RANK_POLL
    rc = proc.wait()
    return 128 - rc if rc < 0 else rc


USAGE = """usage: python -m tether.pilot.agent PILOT_DIR PART_ID            (Slurm: the agent step)
       python -m tether.pilot.agent --fan-out PILOT_DIR PART_ID  (PBS: starts the agents)
       python -m tether.pilot.agent --node I PILOT_DIR PART_ID   (PBS: the agent on the I-th node)
       python -m tether.pilot.agent --rank PILOT_DIR PART_ID TASK_ID RANK NODE"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2:
        return run_agent(*args, lead=os.environ.get("SLURM_PROCID", "0") == "0")
    if len(args) == 3 and args[0] == "--fan-out":
        return fan_out(*args[1:])
    if len(args) == 4 and args[0] == "--node" and args[1].isdigit():
        return run_agent(args[2], args[3], lead=args[1] == "0", node_index=int(args[1]))
    if len(args) == 6 and args[0] == "--rank":
        return run_rank(*args[1:])
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
