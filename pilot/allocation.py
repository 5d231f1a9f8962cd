"""The batch system around a pilot: a Slurm allocation or a PBS job.

What differs between them is small and lives here:

* **Resources** -- Slurm: the cores and GPUs of each node (``scontrol -d show job``); PBS: the
  job's ``exec_vnode`` (``qstat -f -F json``), each chunk's ``ncpus``/``ngpus`` summed per host
  (a vnode ``n1[0]`` is host ``n1``).
* **Starting an agent** -- Slurm: one job step on the partition's slice (``srun``, one task per
  node). PBS: one TM task per node through ``pbs_tmrsh`` (as MPI starts ranks, so the MoM
  accounts and, at the job's end, kills them), from a small fan-out process on the calling host.
* **A TM task starting another** -- a TM task (an agent) gets ``PATH=/bin:/usr/bin`` and no
  ``PBS_NODEFILE`` (recorded on OpenPBS 23.06.06: task-process-env-pbsdsh), both of which
  ``pbs_tmrsh`` needs. The fan-out, in the job shell, finds ``pbs_tmrsh`` once (``PBS_EXEC`` of
  the PBS config, else its PATH) and writes the job's node file from the placement the server
  gave the job (``qstat``: exec_host and the select's mpiprocs, as the MoM writes it), and the
  partition's record hands both to the agents (``tm``).
* **Is the agent alive** -- Slurm: its step is among the job's steps (``squeue -s``). PBS: the
  fan-out process (host, pid and start time in the record) still runs; from another host that
  cannot be told (None: nothing is settled).
* **Stopping** -- both record ``stop_requested`` first, which every agent process reads while it
  runs. Slurm also sends the agent step SIGTERM and, at the end, SIGKILL (``scancel``). PBS has
  no signal for a TM task from inside the job (``pbs_tmrsh`` passes none: killing it leaves the
  remote task running), so the record is the channel, and what is left at the end is the
  fan-out's own process group.

tether's PBS hooks are not needed for this (a PBS job without tether's resources can run a
pilot): only ``pbs_tmrsh``, ``qstat`` and a pilot directory every host sees.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sys
from typing import TYPE_CHECKING, Mapping

from ..system.proc import CommandError, run_command

from .resources import Node, Slice

if TYPE_CHECKING:
    from ..pbs_hooks.commands import JobStatus

# An agent step holds its slice's CPUs and GPUs, and this much memory per node. A task's step
# shares the agent's CPUs (--overlap) and asks for --mem=0: the job's memory on its nodes, not
# counted against other steps. Without it, Slurm 22.05 (whose --overlap shares CPUs, not memory;
# 23.02 shares all) gave a task its CPUs' DefMemPerCPU, which the agent's part had already taken:
# in a plain `sbatch -N3` every task failed with "Memory required by task is not available".
# Memory is not one of a partition's resources (the requirements name nodes, cores and GPUs): tasks of
# partitions sharing a node share the job's memory there, as every step does from 23.02.
AGENT_MEMORY = "256M"   # the agent, and an srun (~15 MB) per running task
STEP_PREFIX = "tether-"            # an agent's step is tether-part.NNNN; a task's tether-part.NNNN-task.NNNNNN


class PilotError(Exception):
    """Not inside an allocation, or a command tether runs failed."""


def _run(argv: list[str], timeout: float = 60) -> str:
    """``argv``'s output (tether's one subprocess entry point, in this process's session); a
    PilotError when it cannot run, times out or fails."""
    try:
        out = run_command(argv, timeout=timeout, check=False, new_session=False)
    except CommandError as exc:
        raise PilotError(f"{argv[0]}: {exc.reason}") from None
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


def step_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The environment for a step started from inside another (the batch script, an agent): the
    job's, without the step's own sizes, which srun would take as this step's."""
    drop = ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_CPUS_PER_TASK", "SLURM_NNODES",
            "SLURM_STEP_", "SLURM_DISTRIBUTION", "SLURM_EXACT", "SLURM_OVERLAP", "SLURM_TASKS_PER_NODE",
            "SLURM_GPUS", "SLURM_TRES_PER_TASK", "TETHER_STEP_")
    return {k: v for k, v in env.items() if not k.startswith(drop)}


def process_start(pid: int) -> str | None:
    """A process's start time (field 22 of /proc/PID/stat), to tell it from a later one with its pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class Allocation:
    """What a pilot needs of its batch system; see the module doc."""

    kind = ""

    def __init__(self, job: str):
        self.job = job

    def nodes(self) -> list[Node]:
        raise NotImplementedError

    def agent_argv(self, record: dict, root: str) -> list[str]:
        """The command that starts a partition's agent on its slice (run detached)."""
        raise NotImplementedError

    def alive(self, record: dict) -> bool | None:
        """Is the partition's agent still running (None: cannot tell from here)?"""
        raise NotImplementedError

    def ended(self) -> bool | None:
        """Has the allocation ended (None: cannot tell)? Once it has, nothing of it runs, and an
        agent killed outright with it could not record that (Slurm: when the batch script ends,
        the batch step's leftovers are SIGKILLed, the agent's srun among them, and srun's shepherd
        child then SIGKILLs the agent's step, often before the job's SIGTERM reaches it)."""
        return None

    def ask_stop(self, record: dict) -> None:
        """After ``stop_requested`` is recorded: anything more that tells the agent to end."""

    def kill(self, record: dict) -> None:
        """What is left of the agent (and its tasks) after the stop's grace: end it for good."""


class SlurmAllocation(Allocation):
    """A Slurm allocation (``SLURM_JOB_ID``): agents and tasks are job steps."""

    kind = "slurm"

    def nodes(self) -> list[Node]:
        out = _run(["scontrol", "-d", "show", "job", self.job])
        nodes: list[Node] = []
        for m in re.finditer(r"^\s*Nodes=(\S+) CPU_IDs=(\S+)\s+Mem=\S*\s+GRES=(\S*)", out, re.M):
            names = _run(["scontrol", "show", "hostnames", m.group(1)]).split()
            gres = re.search(r"gpu(?::[^:(]+)?(?::(\d+))?\(IDX:([^)]*)\)", m.group(3))
            gpus = _count_ids(gres.group(2)) if gres and gres.group(2) not in (None, "N/A") else 0
            nodes += [Node(n, _count_ids(m.group(2)), gpus) for n in names]
        if not nodes:
            raise PilotError(f"cannot read job {self.job}'s nodes from scontrol -d show job")
        return nodes

    def agent_argv(self, record: dict, root: str) -> list[str]:
        """One step on the slice, one task per node, holding the slice's CPUs (``--exact``;
        unbound: the agent only waits and starts steps, and a node whose CPU count is not the
        hardware's -- the sandbox's -- cannot bind them all)."""
        slice_ = Slice.from_data(record["slice"])
        cores = min(c for c, _ in slice_.parts.values())
        gpus = min(g for _, g in slice_.parts.values())
        argv = ["srun", f"--jobid={self.job}", "--exact", f"--nodelist={','.join(slice_.nodes)}",
                f"--nodes={len(slice_.nodes)}", f"--ntasks={len(slice_.nodes)}", "--ntasks-per-node=1",
                f"--cpus-per-task={cores}", "--cpu-bind=none", f"--mem={AGENT_MEMORY}",
                f"--job-name={record['step_name']}", "--kill-on-bad-exit=0", "--quiet"]
        if gpus:
            argv.append(f"--gres=gpu:{gpus}")
        return argv + ["--", sys.executable, "-m", "tether.pilot.agent", root, record["id"]]

    def steps(self) -> list[tuple[str, str]] | None:
        """(step id, step name) of the job's steps now; None when squeue cannot tell."""
        try:
            out = _run(["squeue", "-h", "-s", "-j", self.job, "-o", "%i %j"], timeout=30)
        except PilotError:
            return None
        return [tuple(line.split(None, 1)) for line in out.splitlines() if len(line.split()) == 2]

    def alive(self, record: dict) -> bool | None:
        steps = self.steps()
        return None if steps is None else record.get("step_name") in {name for _, name in steps}

    def ended(self) -> bool | None:
        """squeue: the job in a final state, or no longer known to slurmctld (purged after
        MinJobAge); a COMPLETING job is not ended yet (its steps may still report)."""
        try:
            out = run_command(["squeue", "-h", "-t", "all", "-j", self.job, "-o", "%T"], timeout=30, check=False,
                              new_session=False)
        except CommandError:
            return None
        if out.returncode != 0:
            return True if "Invalid job id" in out.stderr else None
        states = set(out.stdout.split())
        if not states:
            return True
        return not states & {"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "RESIZING",
                             "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED"}

    def _step_ids(self, record: dict, *, tasks: bool) -> list[str]:
        return [sid for sid, name in self.steps() or []
                if name == record.get("step_name") or (tasks and name.startswith(f"{STEP_PREFIX}{record['id']}-"))]

    def ask_stop(self, record: dict) -> None:
        agent = self._step_ids(record, tasks=False)
        if agent:
            _best_effort(["scancel", "--signal=TERM", *agent])

    def kill(self, record: dict) -> None:
        left = self._step_ids(record, tasks=True)
        if left:
            _best_effort(["scancel", *left])

    def task_argvs(self, pid: str, task: dict, nodes: list[str], env: Mapping[str, str]) -> list[list[str]]:
        """One step for the task, inside the CPUs the agent step holds (``--overlap``)."""
        ntasks = max(1, int(task["ntasks"]))
        return [["srun", f"--jobid={env.get('SLURM_JOB_ID', '')}", "--overlap", "--mem=0",
                 f"--nodelist={','.join(nodes)}",
                 f"--nodes={len(nodes)}", f"--ntasks={ntasks}", f"--job-name={STEP_PREFIX}{pid}-{task['id']}",
                 "--kill-on-bad-exit=1", "--quiet", "--", *task["command"]]]


PBS_CONF = "/etc/pbs.conf"


def pbs_client(name: str, env: Mapping[str, str] | None = None) -> str:
    """The absolute path of PBS's command ``name``: ``<PBS_EXEC>/bin/<name>`` from the PBS config
    (``$PBS_CONF_FILE``, else /etc/pbs.conf), else ``name`` found on PATH; a PilotError otherwise."""
    env = os.environ if env is None else env
    try:
        with open(env.get("PBS_CONF_FILE") or PBS_CONF, encoding="utf-8", errors="replace") as fh:
            conf = dict(line.strip().partition("=")[::2] for line in fh if "=" in line)
    except OSError:
        conf = {}
    if conf.get("PBS_EXEC"):
        path = os.path.join(conf["PBS_EXEC"].strip(), "bin", name)
        if os.access(path, os.X_OK):
            return path
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    if not found:
        raise PilotError(f"cannot find {name}: neither PBS_EXEC in {env.get('PBS_CONF_FILE') or PBS_CONF} "
                         f"nor PATH has it")
    return os.path.abspath(found)


def nodefile_lines(attrs: Mapping) -> list[str]:
    """A job's node file as the MoM writes it (one line per mpiproc of each chunk, in the chunks'
    order) from what ``qstat -f`` shows of its placement: exec_host (exec_vnode without it) and the
    select's mpiprocs (schedselect, else Resource_List.select)."""
    from types import SimpleNamespace

    from ..pbs_hooks.mom import job_placement

    select = attrs.get("schedselect") or (attrs.get("Resource_List") or {}).get("select")
    job = SimpleNamespace(exec_host2=None, exec_host=attrs.get("exec_host"),
                          exec_vnode=None if attrs.get("exec_host") else attrs.get("exec_vnode"),
                          schedselect=str(select) if select else None)
    placement = job_placement(job)
    return [placement.hosts[slot] for slot in placement.slots]


class PbsAllocation(Allocation):
    """A PBS job (``PBS_JOBID``): agents and task ranks are TM tasks started with ``pbs_tmrsh``."""

    kind = "pbs"
    NODEFILE = "pbs_nodefile"

    def __init__(self, job: str, tm: dict | None = None):
        """``tm``: a partition's ``pbs_tmrsh`` and node file (``tm_setup``), for an agent's TM tasks."""
        super().__init__(job)
        self.tm = tm

    def tm_setup(self, root: str | os.PathLike) -> dict[str, str]:
        """In the job shell, for the TM tasks to come: ``pbs_tmrsh``'s path and the node file it
        needs, written into the pilot directory from the job's placement (never from a variable)."""
        tmrsh = pbs_client("pbs_tmrsh")
        job = _qstat_job(self.job, history=False)
        lines = nodefile_lines(job.attrs) if job is not None else []
        if not lines:
            raise PilotError(f"job {self.job} has no exec_host (qstat -f): is it running?")
        path = os.path.join(os.fspath(root), self.NODEFILE)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as fh:
            fh.write("".join(f"{line}\n" for line in lines))
        os.replace(tmp, path)
        return {"tmrsh": tmrsh, "nodefile": path}

    def tm_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The environment of the ``pbs_tmrsh`` a TM task (an agent) runs: ``env`` and the node
        file (what pbs_tmrsh passes on to the task it starts is the job's, not this)."""
        return {**env, "PBS_NODEFILE": self.tm["nodefile"]} if self.tm else dict(env)

    def nodes(self) -> list[Node]:
        job = _qstat_job(self.job, history=False)
        if job is None:
            raise PilotError(f"cannot read job {self.job} from qstat -f -F json")
        nodes = parse_exec_vnode(str(job.attrs.get("exec_vnode") or ""))
        if not nodes:
            raise PilotError(f"job {self.job} has no exec_vnode (qstat -f): is it running?")
        return nodes

    def agent_argv(self, record: dict, root: str) -> list[str]:
        return [sys.executable, "-m", "tether.pilot.agent", "--fan-out", root, record["id"]]

    def alive(self, record: dict) -> bool | None:
        fan_out = record.get("fan_out")
        if not fan_out:
            return False
        if fan_out.get("host") != socket.gethostname():
            return None
        return process_start(int(fan_out["pid"])) == fan_out.get("start")

    def ended(self) -> bool | None:
        """qstat -x: the job finished (F), or unknown to the server."""
        from ..pbs_hooks.commands import PBSCommandError

        try:
            job = _qstat_job(self.job, history=True)
        except PBSCommandError as exc:
            return True if exc.kind == "unknown_job" else None
        return None if job is None or not job.state_code else job.state_code == "F"

    def kill(self, record: dict) -> None:
        fan_out = record.get("fan_out")
        if fan_out and self.alive(record):
            try:
                os.killpg(int(fan_out["pgid"]), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def task_argvs(self, pid: str, task: dict, nodes: list[str], env: Mapping[str, str]) -> list[list[str]]:
        """One ``pbs_tmrsh`` per rank, round robin over the nodes; each runs the rank under tether's
        rank wrapper (``--rank``), which appends to the task's output and ends the rank when the
        task or partition is stopped (a TM task gets no signal from here)."""
        ntasks = max(1, int(task["ntasks"]))
        root = env["TETHER_PILOT_DIR"]
        if not self.tm:
            raise PilotError("the partition's record has no pbs_tmrsh (its fan-out did not start it)")
        return [[self.tm["tmrsh"], nodes[r % len(nodes)], sys.executable, "-m", "tether.pilot.agent", "--rank",
                 root, pid, task["id"], str(r), nodes[r % len(nodes)]] for r in range(ntasks)]

    def fan_out_argvs(self, record: dict, root: str) -> list[list[str]]:
        """One agent per node of the slice, the first leading (``record["tm"]``: tm_setup's)."""
        return [[record["tm"]["tmrsh"], node, sys.executable, "-m", "tether.pilot.agent", "--node", str(i), root,
                 record["id"]] for i, node in enumerate(record["slice"])]


def _qstat_job(job: str, *, history: bool) -> "JobStatus | None":
    """The job as ``qstat -f -F json [-x] JOB`` shows it, read by tether's one PBS client
    (pbs_hooks.commands.job_status, which repairs what OpenPBS's clients print); None when the answer
    holds no job. nodes() turns its errors into a PilotError; ended() reads their kind."""
    from ..pbs_hooks.commands import PBSCommandError, job_status

    try:
        jobs = job_status([job], history=history, timeout=30)
    except PBSCommandError as exc:
        if history:
            raise
        raise PilotError(f"cannot read job {job} from qstat -f -F json: {exc}") from None
    return next(iter(jobs.values()), None)


def parse_exec_vnode(text: str) -> list[Node]:
    """``(n1:ncpus=4:ngpus=1)+(n2[0]:ncpus=2+n2[1]:ncpus=2)`` -> hosts in order with summed cores
    and GPUs (a chunk may span vnodes of one host, joined by ``+`` inside its parentheses)."""
    cores: dict[str, list[int]] = {}
    for part in re.split(r"[()+]", text):
        if not part.strip():
            continue
        name, *resources = part.strip().split(":")
        host = name.split("[", 1)[0].split(".", 1)[0]
        entry = cores.setdefault(host, [0, 0])
        for item in resources:
            key, _, value = item.partition("=")
            if key in ("ncpus", "ngpus") and value.isdigit():
                entry[0 if key == "ncpus" else 1] += int(value)
    return [Node(h, c, g) for h, (c, g) in cores.items()]


# A job id given by hand (``tether partition list --job``): Slurm's (1234, an array task 1234_5, a
# heterogeneous component 1234+1) or PBS's (1234.server, an array's 1234[5].server). It names a
# directory (~/.tether/pilots/<id>): nothing else, no "/" or "..", gets that far.
SLURM_JOB_ID_RE = re.compile(r"[0-9]{1,20}(?:[_+][0-9]{1,10})?")
PBS_JOB_ID_RE = re.compile(r"[0-9]{1,20}(?:\[[0-9]{0,10}\])?\.[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9][A-Za-z0-9_-]*)*")


def checked_job_id(job: str) -> str:
    """``job`` when it has the form of a Slurm or a PBS job id, else a PilotError saying so."""
    if SLURM_JOB_ID_RE.fullmatch(job) or (len(job) <= 255 and PBS_JOB_ID_RE.fullmatch(job)):
        return job
    raise PilotError(f"{job!r} is not a job id (Slurm: 1234, 1234_5 or 1234+1; PBS: 1234.server)")


def current(env: Mapping[str, str] | None = None, job: str | None = None) -> Allocation:
    """The allocation this process runs in: Slurm's (``SLURM_JOB_ID``) or PBS's (``PBS_JOBID``).
    ``job``: another job (checked); from outside any job, its id's form tells the scheduler."""
    env = os.environ if env is None else env
    if job is not None:
        pbs = PBS_JOB_ID_RE.fullmatch(checked_job_id(job)) or (env.get("PBS_JOBID") and not env.get("SLURM_JOB_ID"))
        return PbsAllocation(job) if pbs else SlurmAllocation(job)
    if env.get("SLURM_JOB_ID"):
        return SlurmAllocation(env["SLURM_JOB_ID"])
    if env.get("PBS_JOBID"):
        return PbsAllocation(env["PBS_JOBID"])
    raise PilotError("not inside an allocation (no SLURM_JOB_ID or PBS_JOBID): run it in a batch script or "
                     "salloc")


def job_id(env: Mapping[str, str]) -> str | None:
    return env.get("SLURM_JOB_ID") or env.get("PBS_JOBID") or None


def _best_effort(argv: list[str]) -> None:
    """A stop's scancel: its answer changes nothing (stop records the partition CANCELED either
    way, and the allocation's end takes what is left), so a slow or missing scancel must not
    abort the stop before that is recorded."""
    try:
        run_command(argv, timeout=30, check=False, new_session=False)
    except CommandError:
        pass

