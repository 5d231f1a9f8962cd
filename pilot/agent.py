"""tether's default partition agent: one job step per partition, one process per node.

``python -m tether.pilot.agent PILOT_DIR PART_ID`` is what ``Pilot._launch`` runs with srun on the
partition's nodes. The process on the step's first node (SLURM_PROCID 0) leads: it marks the
partition ACTIVE, takes the partition's QUEUED tasks and runs each as a job step of its own on
the partition's nodes (``srun --overlap``: inside the CPUs the agent step holds), with the task's
output in ``tasks/<id>.out``, and records how each ended. The other nodes' processes hold their
node's share until the step ends.

A partition with an agent command of its own (``command:``) runs that command instead, on every
node, with ``TETHER_PARTITION_ID``, ``TETHER_PARTITION_NODES`` and ``TETHER_PILOT_DIR``; the first
node's process marks it ACTIVE and, when the command ends, DONE or FAILED.

SIGTERM (``tether partition stop``, which scancels the agent step; or the allocation ending)
ends every running task's step, marks the partition CANCELED and exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from . import STEP_PREFIX, agent_environment
from .state import ACTIVE, CANCELED, DONE, FAILED, PilotStore, StateError

POLL = 0.2


class Agent:
    def __init__(self, root: str, pid: str):
        self.store = PilotStore(root)
        self.pid = pid
        self.record = self.store.read(pid)
        self.running: dict[str, subprocess.Popen] = {}
        self.stopping = False

    def env(self) -> dict[str, str]:
        env = agent_environment(os.environ)
        env.update(TETHER_PARTITION_ID=self.pid, TETHER_PARTITION_NODES=",".join(self.record["slice"]),
                   TETHER_PILOT_DIR=str(self.store.root))
        return env

    def on_term(self, *_: object) -> None:
        self.stopping = True

    def run_tasks(self) -> int:
        self.store.transition(self.pid, ACTIVE, "", agent_node=os.environ.get("SLURMD_NODENAME", ""))
        while not self.stopping:
            for task in self.store.tasks_of(self.pid):
                if task["state"] == "QUEUED" and task["id"] not in self.running:
                    self.start(task)
            for tid, proc in list(self.running.items()):
                rc = proc.poll()
                if rc is not None:
                    del self.running[tid]
                    self.store.update_task(tid, "DONE" if rc == 0 else "FAILED", exit_code=rc)
            time.sleep(POLL)
        self.end_tasks("the partition was stopped")
        record = self.store.read(self.pid)
        self.store.transition(self.pid, CANCELED, "stopped" if record.get("stop_requested") else
                              "its agent was terminated (the allocation ended, or scancel)")
        return 0

    def start(self, task: dict) -> None:
        nodes = list(self.record["slice"])
        ntasks = max(1, int(task["ntasks"]))
        use = nodes[:min(len(nodes), ntasks)]
        argv = ["srun", f"--jobid={os.environ.get('SLURM_JOB_ID', '')}", "--overlap", f"--nodelist={','.join(use)}",
                f"--nodes={len(use)}", f"--ntasks={ntasks}", f"--job-name={STEP_PREFIX}{self.pid}-{task['id']}",
                "--kill-on-bad-exit=1", "--quiet", "--", *task["command"]]
        env = self.env()
        env["TETHER_TASK_ID"] = task["id"]
        out = self.store.tasks / f"{task['id']}.out"
        with open(out, "ab") as fh:
            try:
                proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            except OSError as exc:
                self.store.update_task(task["id"], "FAILED", exit_code=127, message=f"srun: {exc.strerror}")
                return
        self.running[task["id"]] = proc
        self.store.update_task(task["id"], "RUNNING", nodes=use)

    def end_tasks(self, why: str) -> None:
        for proc in self.running.values():
            proc.terminate()                        # srun cancels the task's step
        for tid, proc in self.running.items():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
            self.store.update_task(tid, "CANCELED", exit_code=proc.returncode, message=why)
        self.running.clear()

    def run_command(self, command: list[str], lead: bool) -> int:
        if lead:
            self.store.transition(self.pid, ACTIVE, "", agent_node=os.environ.get("SLURMD_NODENAME", ""))
        try:
            proc = subprocess.Popen(command, env=self.env())
        except OSError as exc:
            if lead:
                self.store.transition(self.pid, FAILED, f"cannot run its agent {command[0]}: {exc.strerror}")
            return 127
        while proc.poll() is None:
            if self.stopping:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                break
            time.sleep(POLL)
        rc = proc.wait()
        if lead:
            record = self.store.read(self.pid)
            if self.stopping:
                self.store.transition(self.pid, CANCELED, "stopped" if record.get("stop_requested") else
                                      "its agent was terminated (the allocation ended, or scancel)")
            else:
                self.store.transition(self.pid, DONE if rc == 0 else FAILED,
                                      "" if rc == 0 else f"its agent exited with {rc}")
        return rc


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m tether.pilot.agent PILOT_DIR PART_ID", file=sys.stderr)
        return 2
    try:
        agent = Agent(*args)
    except StateError as exc:
        print(f"tether: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, agent.on_term)
    signal.signal(signal.SIGINT, agent.on_term)
    lead = os.environ.get("SLURM_PROCID", "0") == "0"
    command = agent.record["agent"].get("command")
    if command:
        return agent.run_command(list(command), lead)
    if not lead:                                    # hold this node's share until the step ends
        while not agent.stopping:
            time.sleep(1)
        return 0
    try:
        return agent.run_tasks()
    except Exception as exc:                        # the partition says why, never a silent end
        agent.end_tasks(f"its agent failed: {exc}")
        agent.store.transition(agent.pid, FAILED, f"its agent failed: {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
