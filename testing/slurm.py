"""A stateful fake Slurm (22.05) with tether's job_submit plugin inside: sbatch, srun, squeue,
scontrol, scancel, sacct.

For a site's own tests (and tether's): ``FakeSlurm(root, config=...)`` writes the commands into
``root/bin`` and keeps the cluster's state in ``root/state`` (jobs in one JSON file, under a lock).
Submission goes through tether's real job_submit handler (``tether.job_submit.handler``, the code
slurmctld runs), fed the request as sbatch and slurmctld would build it, with the site's
``tether.yaml``: the plan, the refusals and their messages are tether's own. Jobs stay PENDING
until the test runs them (``FakeSlurm.run_job``/``run_pending``: the batch script runs on this
host with the job's Slurm variables and its output in the job's ``--output`` file).

What is real and what is not:
- options: exactly sbatch's and srun's of Slurm 22.05 (tether.testing.slurm_options) plus tether's
  own; anything else is refused with getopt's message (``sbatch: unrecognized option '--foo'`` and
  ``Try "sbatch --help" for more information``, exit 255 -- seen on Slurm 22.05 here). ``#SBATCH``
  lines are read as sbatch reads them (until the first command line).
- a bad value of a tether option: ``sbatch: error: tether: --slots=abc: expected ...`` and
  ``sbatch: error: Invalid --slots argument: abc``, exit 255 (the SPANK plugin's check, as seen).
- a refusal by the job_submit plugin: ``sbatch: error: tether: ...`` then ``sbatch: error: Batch job
  submission failed: Unspecified error``, exit 1; notes of an accepted job: ``sbatch: tether: note: ...``.
- ``scontrol update`` of a tether job goes through the handler's modify (refused: ``Requested
  operation not supported on this system for job N``, exit 1).
- srun runs each task as a local process with the task variables slurmstepd sets (SLURM_PROCID,
  SLURM_LOCALID, SLURM_NODEID, ...) and, with a ``--container-*`` option, hands it to tether's
  container launcher as the SPANK plugin does (``TETHER_RUN_ARGV0``) with the rank directories made
  under the fake's job storage root. "Nodes" are names only: every task runs on this host.
- ``scontrol show hostnames [LIST]`` and ``scontrol show node NAME`` (the first lines of 22.05's
  record, ``NodeAddr`` from ``FakeSlurm(addresses=...)``, else the name; ``Node X not found``, exit
  1, for a name the cluster lacks -- both as seen on the sandbox).
- not modelled: scheduling (resources, limits, priorities), accounting beyond the job records,
  steps' cgroups, arrays; heterogeneous jobs are refused (``#SBATCH hetjob``, `` : ``), never
  taken as one job.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..hooks.hostlist import expand_hostlist
from .fakebin import FakeCommands, NO_ARG, OPTIONAL, REQUIRED, JobTable, UsageError, install_fakes, record_call, run_main
from .slurm_options import SBATCH_OPTIONS, SRUN_OPTIONS

COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sacct")
NO_VAL, NO_VAL16 = 0xfffffffe, 0xfffe
SLURM_VERSION_NUMBER = (22 << 16) + (5 << 8) + 8
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def _tether_options() -> dict[str, tuple[int, None]]:
    from ..hooks.surface import OPTIONS

    return {opt.name: (REQUIRED if opt.arginfo else NO_ARG, None) for opt in OPTIONS}


def _tables(options: dict[str, tuple[int, str | None]]) -> tuple[dict, dict, dict]:
    options = {**options, **_tether_options()}
    long_opts = {name: arg for name, (arg, _) in options.items()}
    short_opts = {short: arg for _, (arg, short) in options.items() if short}
    short_names = {short: name for name, (_, short) in options.items() if short}
    return long_opts, short_opts, short_names


# ---- state ---------------------------------------------------------------------------------------
class State(JobTable):
    """The fake cluster's state directory: ``cluster.json`` (set up by FakeSlurm) and the jobs."""

    EMPTY = {"next_job_id": 1, "jobs": {}}

    def __init__(self, path: str | Path):
        super().__init__(path)
        self.cluster = json.loads((self.path / "cluster.json").read_text())

    def read_jobs(self) -> dict[str, dict]:
        with self.jobs() as data:
            return data["jobs"]


# ---- the job_submit handler, in this process ---------------------------------------------------------
class PluginLib:
    """What the plugin's C gives the handler (tether/job_submit/bridge.h), for a handler run here;
    what the handler logs and reports is kept (``log``, ``health``)."""

    NO_VAL, NO_VAL16, SLURM_VERSION_NUMBER = NO_VAL, NO_VAL16, SLURM_VERSION_NUMBER

    def __init__(self):
        self.log: list[tuple[int, str]] = []

    def tether_log(self, level: int, msg: bytes) -> None:
        self.log.append((level, msg.decode() if isinstance(msg, bytes) else str(msg)))

    def tether_set_health(self, broken: int, reject_all: int, reason: bytes) -> None:
        self.health = (broken, reject_all, reason)

    def tether_config_loaded(self, *args) -> None:
        pass

    def tether_partitions_loaded(self, *args) -> None:
        self.partitions = args[-1].decode()

    def tether_answers_per_user(self, yes: int) -> None:
        self.per_user = yes


def bridge_ffi():
    """An FFI with the bridge struct (tether_job_t) as the plugin's C defines it."""
    import cffi

    from ..job_submit import build

    ffi = cffi.FFI()
    cdef = build.cdef().replace("char msg[...]", "char msg[2048]").replace("[...]", "[1024]")
    ffi.cdef("\n".join(line for line in cdef.splitlines() if not line.startswith("#define")))
    return ffi


class JobSubmit:
    """tether's job_submit handler with a site config, answering requests built like slurmctld's."""

    def __init__(self, config: str | None):
        from ..job_submit.handler import Handler

        self.ffi, self.lib = bridge_ffi(), PluginLib()
        self.handler = Handler(self.ffi, self.lib, env={"TETHER_CONFIG": config} if config else {})
        self.handler.init()
        self._keep: list[Any] = []

    def struct(self, job: dict):
        """A tether_job_t for ``job`` (a request: the keys of a job record)."""
        ffi = self.ffi
        c = ffi.new("tether_job_t *")
        for key, missing in (("min_nodes", NO_VAL), ("max_nodes", NO_VAL), ("num_tasks", NO_VAL),
                             ("ntasks_per_node", NO_VAL16), ("cpus_per_task", NO_VAL16), ("req_node_count", 0),
                             ("het_job_offset", NO_VAL)):
            value = job.get(key)
            setattr(c, key, missing if value is None else int(value))
        c.job_id = int(job.get("id") or 0)
        c.user_id = int(job.get("uid", os.getuid()))
        for key in ("partition", "account", "tres_per_job", "tres_per_node", "tres_per_task", "tres_per_socket",
                    "features"):
            if job.get(key):
                buf = ffi.new("char[]", str(job[key]).encode())
                self._keep.append(buf)
                setattr(c, key, buf)
        entries = [ffi.new("char[]", f"{k}={v}".encode()) for k, v in job.get("spank_env", {}).items()]
        array = ffi.new("char *[]", entries or [ffi.NULL])
        self._keep += [*entries, array]
        c.spank_env, c.spank_env_size = array, len(entries)
        return c

    def submit(self, job: dict) -> tuple[bool, str]:
        """(accepted, message for the user); an accepted ``job`` gets the plan's fields."""
        from ..job_submit.handler import ACCEPT

        c = self.struct(job)
        wanted = 1 if job.get("spank_env") else 0
        answer = self.handler.submit(c, job.get("uid", os.getuid()), wanted) if wanted else ACCEPT
        message = self.ffi.string(c.msg).decode(errors="replace")
        if answer == ACCEPT:
            self.apply(c, job)
        return answer == ACCEPT, message

    def modify(self, update: dict, current: dict) -> bool:
        from ..job_submit.handler import ACCEPT

        u, c = self.struct(update), self.struct(current)
        if self.handler.modify(u, c, os.getuid()) != ACCEPT:
            return False
        self.apply(u, update)
        return True

    def apply(self, c, job: dict) -> None:
        """Copy the answer's fields into ``job`` (what the plugin's C writes into job_desc)."""
        ffi = self.ffi
        if c.set_nodes:
            job["min_nodes"], job["max_nodes"] = c.out_min_nodes, c.out_max_nodes
        for key in ("num_tasks", "ntasks_per_node", "cpus_per_task", "requeue"):
            if getattr(c, "set_" + key):
                job[key] = getattr(c, "out_" + key)
        for key in ("tres_per_job", "tres_per_node", "tres_per_task", "partition", "wckey", "features"):
            if getattr(c, "set_" + key):
                job[key] = ffi.string(getattr(c, "out_" + key)).decode()


# ---- sbatch --------------------------------------------------------------------------------------
def directive_args(script: str) -> list[str]:
    """The options of the ``#SBATCH`` lines, read until the first command line (sbatch's rule)."""
    args: list[str] = []
    for line in script.splitlines()[1:] if script.startswith("#!") else script.splitlines():
        stripped = line.strip()
        if line.startswith("#SBATCH"):
            try:
                args += shlex.split(line[len("#SBATCH"):], comments=True)
            except ValueError:
                args.append(line[len("#SBATCH"):].strip())
            continue
        if stripped and not stripped.startswith("#"):
            break
    return args


def _check_tether_values(prog: str, given: dict[str, str]) -> dict[str, str]:
    """The SPANK plugin's client-side check: a bad value fails sbatch/srun with its message."""
    from ..hooks.errors import RequestError
    from ..job_submit.handler import checked_values

    try:
        return checked_values(given)
    except RequestError as exc:
        name = next(n for n in given if f"--{n}" in str(exc))
        raise UsageError(f"{prog}: error: tether: {exc}\n{prog}: error: Invalid --{name} argument: "
                         f"{given[name]}", status=255) from None


def request_from_options(prog: str, opts: list[tuple[str, str | None]], env: dict[str, str],
                         cluster: dict) -> dict:
    """A job record from parsed options, as sbatch + slurmctld fill job_desc."""
    from ..hooks.surface import OPTIONS, env_fallbacks

    tether_names = {o.name for o in OPTIONS}
    values: dict[str, str] = {}
    job: dict[str, Any] = {"options": [[n, v] for n, v in opts]}
    for name, value in opts:
        if name in tether_names:
            values[name] = "1" if value is None else value
    # the plugin's environment fallbacks: TETHER_<NAME>, then pyxis's PYXIS_CONTAINER_<NAME>
    values.update({name: value for name, (value, _) in env_fallbacks(values, env).items()})
    values = _check_tether_values(prog, values)
    job["tether"] = values
    job["spank_env"] = {next(o.env for o in OPTIONS if o.name == n): v for n, v in values.items()}
    for name, value in opts:
        if name == "nodes":
            lo, _, hi = str(value).partition("-")
            job["min_nodes"], job["max_nodes"] = int(lo), int(hi or lo)
        elif name == "ntasks":
            job["num_tasks"] = int(value)
        elif name == "ntasks-per-node":
            job["ntasks_per_node"] = int(value)
        elif name == "cpus-per-task":
            job["cpus_per_task"] = int(value)
        elif name == "nodelist":
            job["req_node_count"] = len(expand_hostlist(value))
            job["nodelist"] = value
            job.setdefault("min_nodes", job["req_node_count"])
        elif name == "gpus":
            job["tres_per_job"] = "gres:gpu:" + value
        elif name == "gpus-per-node":
            job["tres_per_node"] = "gres:gpu:" + value
        elif name == "gres":
            job["tres_per_node"] = ",".join("gres:" + g for g in value.split(","))
        elif name == "gpus-per-task":
            job["tres_per_task"] = "gres:gpu:" + value
        elif name in ("partition", "account", "output", "error", "chdir", "job-name", "wckey", "dependency"):
            job[name.replace("-", "_")] = value
        elif name == "hold":
            job["hold"] = True
        elif name == "no-requeue":
            job["requeue"] = 0
    return job


def _place(prog: str, job: dict, cluster: dict) -> None:
    """The partition (the default one when none is asked for), checked as slurmctld checks it."""
    partitions = cluster["partitions"]
    if not job.get("partition"):
        job["partition"] = next(name for name, p in partitions.items() if p.get("default"))
    if job["partition"] not in partitions:
        raise UsageError(f"{prog}: error: Batch job submission failed: Invalid partition name specified"
                         if prog == "sbatch" else
                         f"{prog}: error: Unable to allocate resources: Invalid partition name specified")
    nodes = len(partitions[job["partition"]]["nodes"])
    if (job.get("min_nodes") or 1) > nodes:
        raise UsageError(f"{prog}: error: {'Batch job submission failed' if prog == 'sbatch' else 'Unable to allocate resources'}: "
                         f"Node count specification invalid")


def sbatch(argv: list[str], state: State) -> int:
    long_opts, short_opts, short_names = _tables(SBATCH_OPTIONS)
    opts, rest = getopt_or_exit("sbatch", argv, long_opts, short_opts, short_names)
    names = [n for n, _ in opts]
    if "version" in names:
        print("slurm 22.05.8")
        return 0
    wrap = next((v for n, v in opts if n == "wrap"), None)
    if rest[:1] == [":"]:                                   # `sbatch OPTS : OPTS script`: a component each
        raise UsageError("sbatch: error: heterogeneous jobs (#SBATCH hetjob, ' : ') are not modelled by "
                         "tether's fake sbatch; test them on a real cluster (tether sandbox up)")
    if wrap is not None:
        if rest:
            raise UsageError("sbatch: error: Script arguments not permitted with --wrap option")
        script, command, args = f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{wrap}\n", "(wrap)", []
    elif rest:
        try:
            script = Path(rest[0]).read_text()
        except OSError as exc:
            raise UsageError(f"sbatch: error: Unable to open file {rest[0]}: {exc.strerror}") from None
        command, args = os.path.abspath(rest[0]), rest[1:]
    else:
        script, command, args = sys.stdin.read(), "(stdin)", []
    if not script.startswith("#!"):
        raise UsageError("sbatch: error: This does not look like a batch script.  The first\n"
                         "sbatch: error: line must start with #! followed by the path to an interpreter.\n"
                         "sbatch: error: For instance: #!/bin/sh")
    directives = directive_args(script)
    if {"hetjob", "packjob"} & set(directives):
        # a real sbatch submits one job per component; pretending to be one job would hide every
        # per-component answer of the job_submit plugin (--gateways, each component's plan)
        raise UsageError("sbatch: error: heterogeneous jobs (#SBATCH hetjob, ' : ') are not modelled by "
                         "tether's fake sbatch; test them on a real cluster (tether sandbox up)")
    directive_opts, _ = getopt_or_exit("sbatch", directives, long_opts, short_opts, short_names)
    merged = directive_opts + opts                          # the command line wins
    job = request_from_options("sbatch", merged, dict(os.environ), state.cluster)
    accepted, message = JobSubmit(state.cluster.get("config")).submit(job)   # partition still unset: as in slurmctld
    if not accepted:
        for line in message.splitlines():
            sys.stderr.write(f"sbatch: error: {line}\n")
        sys.stderr.write("sbatch: error: Batch job submission failed: Unspecified error\n")
        return 1
    _place("sbatch", job, state.cluster)
    for line in message.splitlines():
        sys.stderr.write(f"sbatch: {line}\n")
    user = pwd.getpwuid(os.getuid()).pw_name
    with state.jobs() as data:
        job_id = data["next_job_id"]
        data["next_job_id"] += 1
        work_dir = job.get("chdir") or os.getcwd()
        name = job.get("job_name") or (os.path.basename(command) if command not in ("(wrap)", "(stdin)") else
                                       "wrap" if command == "(wrap)" else "sbatch")
        job.update(id=job_id, name=name, user=user, uid=os.getuid(), gid=os.getgid(),
                   state="PENDING", reason="JobHeldUser" if job.get("hold") else "None",
                   command=command, args=args, script=script, work_dir=work_dir, batch=True,
                   submit_time=time.strftime("%Y-%m-%dT%H:%M:%S"), exit_code=None, message=message,
                   env={k: v for k, v in os.environ.items()},
                   stdout=_output_path(job.get("output") or "slurm-%j.out", job_id, name, user, work_dir),
                   stderr=_output_path(job.get("error") or job.get("output") or "slurm-%j.out", job_id, name,
                                       user, work_dir))
        job.setdefault("requeue", 1)
        data["jobs"][str(job_id)] = job
    print(job_id if "parsable" in names else f"Submitted batch job {job_id}")
    return 0


def _output_path(pattern: str, job_id: int, name: str, user: str, work_dir: str) -> str:
    text = pattern.replace("%j", str(job_id)).replace("%J", str(job_id)).replace("%x", name) \
        .replace("%u", user).replace("%%", "%")
    return text if text.startswith("/") else os.path.join(work_dir, text)


def getopt_or_exit(prog: str, argv: list[str], long_opts, short_opts, short_names):
    from .fakebin import getopt_long

    try:
        return getopt_long(prog, argv, long_opts, short_opts, short_names=short_names)
    except UsageError as exc:
        raise UsageError(f"{exc}\nTry \"{prog} --help\" for more information", status=255) from None


# ---- running jobs and steps ----------------------------------------------------------------------
def _nodes_of(job: dict, cluster: dict) -> list[str]:
    """The nodes a job gets: its --nodelist, else as many as its minimum and its tasks need (at
    --ntasks-per-node), within its maximum and its partition."""
    nodes = cluster["partitions"][job["partition"]]["nodes"]
    if job.get("nodelist"):
        return expand_hostlist(job["nodelist"])
    count = int(job.get("min_nodes") or 1)
    if job.get("num_tasks") and job.get("ntasks_per_node"):
        count = max(count, -(-int(job["num_tasks"]) // int(job["ntasks_per_node"])))
    if job.get("max_nodes"):
        count = min(count, int(job["max_nodes"]))
    return nodes[:max(1, count)]


def job_env(job: dict, nodes: list[str], *, batch: bool = True) -> dict[str, str]:
    """The Slurm variables of a job's batch script (slurmd/slurmstepd set these); with ``batch``
    also the job's tether options as TETHER_* (the SPANK plugin's defaults for the job's steps,
    which srun then reads from its environment)."""
    env = {"SLURM_JOB_ID": str(job["id"]), "SLURM_JOBID": str(job["id"]), "SLURM_JOB_NAME": job["name"],
           "SLURM_JOB_PARTITION": job["partition"], "SLURM_JOB_NUM_NODES": str(len(nodes)),
           "SLURM_NNODES": str(len(nodes)), "SLURM_JOB_NODELIST": ",".join(nodes),
           "SLURM_NODELIST": ",".join(nodes), "SLURM_SUBMIT_DIR": job["work_dir"], "SLURM_JOB_USER": job["user"],
           "SLURM_JOB_UID": str(job["uid"]), "SLURMD_NODENAME": nodes[0], "SLURM_CLUSTER_NAME": "fake"}
    if job.get("num_tasks"):
        env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(job["num_tasks"])
    if job.get("ntasks_per_node"):
        env["SLURM_NTASKS_PER_NODE"] = str(job["ntasks_per_node"])
    if job.get("cpus_per_task"):
        env["SLURM_CPUS_PER_TASK"] = str(job["cpus_per_task"])
    for key, var in (("tres_per_job", "SLURM_GPUS"), ("tres_per_node", "SLURM_GPUS_PER_NODE"),
                     ("tres_per_task", "SLURM_GPUS_PER_TASK")):
        if job.get(key) and "gpu" in job[key]:
            env[var] = job[key].rsplit(":", 1)[-1]
    if batch:
        for name, value in job.get("tether", {}).items():
            env["TETHER_" + name.upper().replace("-", "_")] = value
    return env


def run_job(state: State, job_id: int, *, timeout: float = 300) -> dict:
    """Run a pending batch job's script now, on this host; returns its final record."""
    with state.jobs() as data:
        job = data["jobs"][str(job_id)]
        if job["state"] != "PENDING":
            raise ValueError(f"job {job_id} is {job['state']}, not PENDING")
        nodes = _nodes_of(job, state.cluster)
        job.update(state="RUNNING", nodes=nodes, start_time=time.strftime("%Y-%m-%dT%H:%M:%S"))
    env = {**job["env"], **job_env(job, nodes), "PATH": f"{state.cluster['bin_dir']}:{job['env'].get('PATH', '/usr/bin:/bin')}"}
    script = state.path / f"job-{job_id}.sh"
    script.write_text(job["script"])
    script.chmod(0o755)
    with open(job["stdout"], "ab") as out:
        err = out if job["stderr"] == job["stdout"] else open(job["stderr"], "ab")
        try:
            proc = subprocess.Popen([str(script), *job["args"]], cwd=job["work_dir"], env=env, stdout=out,
                                    stderr=err, start_new_session=True)
            with state.jobs() as data:
                data["jobs"][str(job_id)]["pid"] = proc.pid
            try:
                status = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                status = -9
        finally:
            if err is not out:
                err.close()
    with state.jobs() as data:
        job = data["jobs"][str(job_id)]
        if job["state"] == "RUNNING":
            job["state"] = "COMPLETED" if status == 0 else ("CANCELLED" if status < 0 else "FAILED")
        job["exit_code"] = f"{max(status, 0)}:{-status if status < 0 else 0}"
        job["end_time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        return job


def srun(argv: list[str], state: State) -> int:
    long_opts, short_opts, short_names = _tables(SRUN_OPTIONS)
    opts, command = getopt_or_exit("srun", argv, long_opts, short_opts, short_names)
    if any(n == "version" for n, _ in opts):
        print("slurm 22.05.8")
        return 0
    if not command:
        raise UsageError("srun: fatal: No command given to execute.", status=1)
    env = dict(os.environ)
    step_opts = request_from_options("srun", opts, env, state.cluster)
    if "SLURM_JOB_ID" in env:                                 # a step of an existing allocation
        with state.jobs() as data:
            job = data["jobs"].get(env["SLURM_JOB_ID"])
            if job is None or job["state"] != "RUNNING":
                raise UsageError(f"srun: error: Unable to confirm allocation for job {env['SLURM_JOB_ID']}: "
                                 f"Invalid job id specified\nsrun: Check SLURM_JOB_ID environment variable. "
                                 f"Expired or invalid job {env['SLURM_JOB_ID']}", status=1)
            step_id = job.setdefault("next_step", 0)
            job["next_step"] = step_id + 1
    else:                                                     # srun makes its own job
        accepted, message = JobSubmit(state.cluster.get("config")).submit(step_opts)
        if not accepted:
            for line in message.splitlines():
                sys.stderr.write(f"srun: error: {line}\n")
            sys.stderr.write("srun: error: Unable to allocate resources: Unspecified error\n")
            return 1
        _place("srun", step_opts, state.cluster)
        with state.jobs() as data:
            job_id = data["next_job_id"]
            data["next_job_id"] += 1
            job = {**step_opts, "id": job_id, "name": os.path.basename(command[0]), "user": pwd.getpwuid(os.getuid()).pw_name,
                   "uid": os.getuid(), "state": "RUNNING", "work_dir": os.getcwd(), "batch": False, "command": command[0],
                   "exit_code": None, "next_step": 1}
            job["nodes"] = _nodes_of(job, state.cluster)
            data["jobs"][str(job_id)] = job
        step_id = 0
    nodes = job.get("nodes") or _nodes_of(job, state.cluster)
    inside = "SLURM_JOB_ID" in env
    if inside and step_opts.get("min_nodes"):
        nodes = nodes[:step_opts["min_nodes"]]
    tasks = _task_count(step_opts, len(nodes)) or (_task_count(job, len(nodes)) if inside else None) or len(nodes)
    status = run_step(state, job, step_id, nodes, tasks, command, {**env, **step_opts.get("spank_env", {})},
                      step_opts["tether"])
    if not inside:
        with state.jobs() as data:
            record = data["jobs"][str(job["id"])]
            record["state"] = "COMPLETED" if status == 0 else "FAILED"
            record["exit_code"] = f"{status}:0"
    return status


def _task_count(request: dict, nodes: int) -> int | None:
    """Tasks asked for: --ntasks, else --ntasks-per-node times the nodes; None when neither."""
    if request.get("num_tasks"):
        return int(request["num_tasks"])
    if request.get("ntasks_per_node"):
        return int(request["ntasks_per_node"]) * nodes
    return None


def container_step(values: dict[str, str], env: dict[str, str]) -> tuple[bool, str | None]:
    """Does the step run in a container, as the SPANK plugin decides (spank/stepd.c, post_opt): with
    a non-empty image (``--container-image=``: on the host), or a name alone (the job's container of
    that name); other container options typed without either: (False, the reason the step fails);
    TETHER_CONTAINER_* variables alone are defaults that do not apply to a step on the host."""
    from ..hooks.surface import env_fallbacks

    defaults = env_fallbacks(values, env)

    def given(option: str) -> str | None:
        return values[option] if option in values else defaults.get(option, (None,))[0]

    image, name = given("container-image"), given("container-name")
    if image is not None or name:
        return bool(image) if image is not None else True, None
    for option in values:
        if option.startswith(("container-", "no-container-")):
            return False, (f"tether: --{option} needs --container-image or --container-name: without either "
                           f"this step would run on the host without it")
    return False, None


def run_step(state: State, job: dict, step_id: int, nodes: list[str], tasks: int, command: list[str],
             env: dict[str, str], values: dict[str, str]) -> int:
    """Run a step's tasks here, block-distributed over ``nodes``; the largest exit status."""
    from ..hooks.layout import RANK_TMP, RANK_WORK, job_dir_name, rank_dir_name, step_dir_name
    from ..hooks.rankenv import SlurmStep, SlurmTask, slurm_rank_env        # slurmstepd's (spank/rankenv.c)
    from ..hooks.surface import RANK_VAR, RUN_ARGV0

    per_node = [tasks // len(nodes) + (1 if i < tasks % len(nodes) else 0) for i in range(len(nodes))]
    container, refused = container_step(values, env)
    if refused:
        print(refused, file=sys.stderr)
        return 1
    procs = []
    rank = 0
    for node_index, (node, count) in enumerate(zip(nodes, per_node)):
        for local in range(count):
            task_env = {**env, **job_env(job, nodes, batch=False), "SLURM_STEP_ID": str(step_id), "SLURM_STEPID": str(step_id),
                        "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node_index),
                        "SLURM_NTASKS": str(tasks), "SLURM_STEP_NUM_TASKS": str(tasks),
                        "SLURM_STEP_NUM_NODES": str(len(nodes)), "SLURM_STEP_NODELIST": ",".join(nodes),
                        "SLURMD_NODENAME": node}
            argv = list(command)
            if values.get("slots") or container:               # a tether step: the rank contract
                step_dir = Path(state.cluster["job_storage_root"], job_dir_name(str(job["id"])), node,
                                step_dir_name(str(step_id)))
                rank_dir = step_dir / rank_dir_name(rank)
                for sub in (RANK_TMP, RANK_WORK):
                    (rank_dir / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
                step = SlurmStep(job_id=int(job["id"]), step_id=step_id, ntasks=tasks, nlocal=count,
                                 nnodes=len(nodes), job_dir=str(step_dir.parent.parent), step_dir=str(step_dir))
                task_env.update(slurm_rank_env(step, SlurmTask(global_id=rank, local_id=local, node_id=node_index)))
                task_env[RANK_VAR["MASTER_ADDR"]] = nodes[0]     # slurmstepd's lookup: the node's name here
            if container:                                     # the SPANK plugin's hand-off
                task_env[RUN_ARGV0] = argv[0]
                argv[0] = state.cluster["launcher"]
            procs.append(subprocess.Popen(argv, env=task_env))
            rank += 1
    record_call(state.path, {"tool": "srun-step", "job": job["id"], "step": step_id, "tasks": tasks,
                             "nodes": nodes, "container": container})
    statuses = [p.wait() for p in procs]
    return max((s if s >= 0 else 128 - s) for s in statuses)


# ---- squeue / scontrol / scancel / sacct ------------------------------------------------------------
_SQUEUE_FIELDS = {"i": lambda j: str(j["id"]), "j": lambda j: j["name"], "T": lambda j: j["state"],
                  "t": lambda j: _short_state(j["state"]), "u": lambda j: j["user"], "P": lambda j: j["partition"],
                  "D": lambda j: str(j.get("min_nodes") or 1), "r": lambda j: j.get("reason", "None"),
                  "Z": lambda j: j["work_dir"], "N": lambda j: ",".join(j.get("nodes") or []),
                  "A": lambda j: str(j["id"]), "C": lambda j: str((j.get("num_tasks") or 1) * (j.get("cpus_per_task") or 1))}


def _short_state(state: str) -> str:
    return {"PENDING": "PD", "RUNNING": "R", "COMPLETED": "CD", "FAILED": "F", "CANCELLED": "CA"}.get(state, state[:2])


def squeue(argv: list[str], state: State) -> int:
    long_opts = {"noheader": NO_ARG, "jobs": REQUIRED, "user": REQUIRED, "format": REQUIRED, "states": REQUIRED,
                 "partition": REQUIRED, "name": REQUIRED, "help": NO_ARG, "version": NO_ARG, "me": NO_ARG}
    short = {"h": NO_ARG, "j": REQUIRED, "u": REQUIRED, "o": REQUIRED, "t": REQUIRED, "p": REQUIRED, "n": REQUIRED,
             "V": NO_ARG}
    names = {"h": "noheader", "j": "jobs", "u": "user", "o": "format", "t": "states", "p": "partition",
             "n": "name", "V": "version"}
    opts, rest = getopt_or_exit("squeue", argv, long_opts, short, names)
    if rest:
        raise UsageError(f"squeue: error: Unrecognized option: {rest[0]}\nUsage: squeue [-A account] ...")
    given = dict(opts)
    fmt = given.get("format", "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R")
    jobs = [j for j in state.read_jobs().values() if j["state"] in ("PENDING", "RUNNING")]
    if "jobs" in given:
        wanted = given["jobs"].split(",")
        if not any(str(j["id"]) in wanted for j in state.read_jobs().values()):
            sys.stderr.write("slurm_load_jobs error: Invalid job id specified\n")
            return 1
        jobs = [j for j in jobs if str(j["id"]) in wanted]
    if "user" in given:
        jobs = [j for j in jobs if j["user"] in given["user"].split(",")]
    if "states" in given:
        wanted_states = {s.upper() for s in given["states"].split(",")}
        jobs = [j for j in jobs if j["state"] in wanted_states or _short_state(j["state"]) in wanted_states]
    for key in ("partition", "name"):
        if key in given:
            field = "partition" if key == "partition" else "name"
            jobs = [j for j in jobs if j[field] in given[key].split(",")]

    def render(job: dict | None) -> str:
        def one(m: re.Match) -> str:
            letter = m.group(2)
            if letter not in _SQUEUE_FIELDS and letter not in "MRl":
                raise UsageError(f"squeue: error: Invalid job format specification: {letter}")
            if job is None:
                return {"i": "JOBID", "j": "NAME", "T": "STATE", "t": "ST", "u": "USER", "P": "PARTITION",
                        "D": "NODES", "R": "NODELIST(REASON)", "M": "TIME", "r": "REASON", "Z": "WORK_DIR",
                        "N": "NODELIST", "A": "JOBID", "C": "CPUS", "l": "TIME_LIMIT"}[letter]
            if letter == "M":
                return "0:00"
            if letter == "l":
                return "UNLIMITED"
            if letter == "R":
                return ",".join(job.get("nodes") or []) if job["state"] == "RUNNING" else f"({job.get('reason', 'None')})"
            return _SQUEUE_FIELDS[letter](job)
        def sized(m: re.Match) -> str:
            text, spec = one(m), m.group(1)
            width = int(spec.lstrip(".-") or 0)
            if not width:
                return text
            return text[:width].rjust(width) if spec.startswith(".") else text[:width].ljust(width)
        return re.sub(r"%([.\-]?\d*)([A-Za-z])", sized, fmt)

    if "noheader" not in given:
        print(render(None))
    for job in sorted(jobs, key=lambda j: j["id"]):
        print(render(job))
    return 0


def scontrol(argv: list[str], state: State) -> int:
    oneliner = "-o" in argv or "--oneliner" in argv
    args = [a for a in argv if a not in ("-o", "--oneliner")]
    unknown = [a for a in args if a.startswith("-")]
    if unknown:
        raise UsageError(f"scontrol: unrecognized option '{unknown[0]}'\nTry \"scontrol --help\" for more "
                         f"information", status=1)
    if args[:2] == ["show", "job"] or args[:2] == ["show", "jobs"]:
        jobs = state.read_jobs()
        wanted = args[2:3]
        if wanted and wanted[0] not in jobs:
            sys.stderr.write("slurm_load_jobs error: Invalid job id specified\n")
            return 1
        for job_id in (wanted or sorted(jobs, key=int)):
            print(show_job(jobs[job_id], oneliner))
        return 0
    if args[:2] == ["show", "hostnames"]:
        # Slurm's: the list given, else $SLURM_JOB_NODELIST; "host list is empty" and 0 when neither
        hosts = expand_hostlist(args[2] if len(args) > 2 else os.environ.get("SLURM_JOB_NODELIST", ""))
        if hosts:
            print("\n".join(hosts))
        else:
            sys.stderr.write("scontrol: error: host list is empty\n")
        return 0
    if args[:2] == ["show", "node"] and len(args) == 3:
        if args[2] not in state.cluster["nodes"]:
            sys.stderr.write(f"Node {args[2]} not found\n")
            return 1
        # the first lines of Slurm 22.05's record, as the sandbox prints them
        addr = state.cluster.get("addresses", {}).get(args[2], args[2])
        print(f"NodeName={args[2]} Arch=x86_64 CoresPerSocket=1 \n   CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=0.00\n"
              f"   AvailableFeatures=(null)\n   ActiveFeatures=(null)\n   Gres=(null)\n"
              f"   NodeAddr={addr} NodeHostName={args[2]} Version=22.05.8")
        return 0
    if args[:1] == ["update"]:
        return _update(args[1:], state)
    if args[:1] in (["hold"], ["release"]):
        with state.jobs() as data:
            for job_id in args[1].split(","):
                data["jobs"][job_id]["reason"] = "JobHeldUser" if args[0] == "hold" else "None"
        return 0
    sys.stderr.write(f"invalid keyword: {args[0] if args else ''}\n")
    return 1


def show_job(job: dict, oneliner: bool = False) -> str:
    """``scontrol show job``'s fields (a subset, in Slurm's order and spelling)."""
    nodes = (f"{job.get('min_nodes') or 1}-{job.get('max_nodes') or job.get('min_nodes') or 1}"
             if job["state"] == "PENDING" else str(len(job.get("nodes") or []) or 1))
    fields = [
        [f"JobId={job['id']}", f"JobName={job['name']}"],
        [f"UserId={job['user']}({job['uid']})", f"GroupId={job['user']}({job.get('gid', job['uid'])})"],
        [f"Account={job.get('account') or '(null)'}", f"WCKey={job.get('wckey') or '*'}"],
        [f"JobState={job['state']}", f"Reason={job.get('reason', 'None')}",
         f"Dependency={job.get('dependency') or '(null)'}"],
        [f"Requeue={job.get('requeue', 1)}", f"BatchFlag={1 if job.get('batch') else 0}",
         f"ExitCode={job.get('exit_code') or '0:0'}"],
        [f"Partition={job['partition']}"],
        [f"ReqNodeList={job.get('nodelist') or '(null)'}", f"NodeList={','.join(job.get('nodes') or []) or '(null)'}"],
        [f"NumNodes={nodes}", f"NumTasks={job.get('num_tasks') or 1}", f"CPUs/Task={job.get('cpus_per_task') or 1}"],
    ]
    tres = [f"{k}={job[key]}" for k, key in (("TresPerJob", "tres_per_job"), ("TresPerNode", "tres_per_node"),
                                             ("TresPerTask", "tres_per_task")) if job.get(key)]
    if tres:
        fields.append(tres)
    if job.get("ntasks_per_node"):
        fields.append([f"NtasksPerN:B:S:C={job['ntasks_per_node']}:0:*:*"])
    fields += [[f"Command={job['command']}"], [f"WorkDir={job['work_dir']}"]]
    if job.get("batch"):
        fields += [[f"StdErr={job['stderr']}"], ["StdIn=/dev/null"], [f"StdOut={job['stdout']}"]]
    if oneliner:
        return " ".join(f for line in fields for f in line)
    return "\n".join(("   " if i else "") + " ".join(line) for i, line in enumerate(fields))


def _update(args: list[str], state: State) -> int:
    pairs = dict(a.split("=", 1) for a in args if "=" in a)
    job_id = pairs.pop("JobId", pairs.pop("jobid", None))
    with state.jobs() as data:
        job = data["jobs"].get(str(job_id))
        if job is None:
            sys.stderr.write(f"Invalid job id specified for job {job_id}\n")
            return 1
        if job["state"] != "PENDING" and set(pairs) & {"Partition", "NumNodes", "NumTasks"}:
            sys.stderr.write(f"Job is no longer pending execution for job {job_id}\n")
            return 1
        update: dict[str, Any] = {"id": job["id"]}
        for key, value in pairs.items():
            if key == "Partition":
                update["partition"] = value
            elif key == "NumNodes":
                lo, _, hi = value.partition("-")
                update["min_nodes"], update["max_nodes"] = int(lo), int(hi or lo)
            elif key == "NumTasks":
                update["num_tasks"] = int(value)
            elif key not in ("TimeLimit", "Comment", "Name", "JobName", "Dependency", "Nice"):
                sys.stderr.write(f"Update of this parameter is not supported: {key}={value}\n")
                return 1
        if job.get("tether") and not JobSubmit(state.cluster.get("config")).modify(update, job):
            sys.stderr.write(f"Requested operation not supported on this system for job {job_id}\n")
            return 1
        if "partition" in update and update["partition"] not in state.cluster["partitions"]:
            sys.stderr.write(f"Invalid partition name specified for job {job_id}\n")
            return 1
        job.update({k: v for k, v in update.items() if k != "id"})
        for key in ("Comment", "Name", "JobName", "Dependency"):
            if key in pairs:
                job[{"Name": "name", "JobName": "name"}.get(key, key.lower())] = pairs[key]
    return 0


def scancel(argv: list[str], state: State) -> int:
    long_opts = {"signal": REQUIRED, "user": REQUIRED, "name": REQUIRED, "state": REQUIRED, "quiet": NO_ARG,
                 "batch": NO_ARG, "full": NO_ARG, "help": NO_ARG, "version": NO_ARG, "verbose": NO_ARG}
    short = {"s": REQUIRED, "u": REQUIRED, "n": REQUIRED, "t": REQUIRED, "Q": NO_ARG, "b": NO_ARG, "f": NO_ARG,
             "V": NO_ARG, "v": NO_ARG}
    names = {"s": "signal", "u": "user", "n": "name", "t": "state", "Q": "quiet", "b": "batch", "f": "full",
             "V": "version", "v": "verbose"}
    opts, ids = getopt_or_exit("scancel", argv, long_opts, short, names)
    given = dict(opts)
    with state.jobs() as data:
        targets = [data["jobs"][i] for i in ids if i in data["jobs"]]
        if "user" in given:
            targets += [j for j in data["jobs"].values() if j["user"] == given["user"] and j not in targets]
        for job in targets:
            if job["state"] in FINAL:
                continue
            if job.get("pid"):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job["pid"], 15 if "signal" not in given else _signal(given["signal"]))
            if "signal" not in given:
                job["state"], job["exit_code"] = "CANCELLED", "0:15"
    return 0


def _signal(name: str) -> int:
    import signal

    return int(name) if name.isdigit() else int(getattr(signal, "SIG" + name.upper().removeprefix("SIG")))


_SACCT_FIELDS = {"jobid": lambda j: str(j["id"]), "jobname": lambda j: j["name"], "state": lambda j: j["state"],
                 "exitcode": lambda j: j.get("exit_code") or "0:0", "partition": lambda j: j["partition"],
                 "user": lambda j: j["user"], "nnodes": lambda j: str(len(j.get("nodes") or []) or j.get("min_nodes") or 1),
                 "ntasks": lambda j: str(j.get("num_tasks") or 1), "wckey": lambda j: j.get("wckey") or "",
                 "account": lambda j: j.get("account") or "", "workdir": lambda j: j["work_dir"],
                 "reqtres": lambda j: ",".join(filter(None, [j.get("tres_per_job"), j.get("tres_per_node")])),
                 "start": lambda j: j.get("start_time", "Unknown"), "end": lambda j: j.get("end_time", "Unknown"),
                 "submit": lambda j: j.get("submit_time", "Unknown")}


def sacct(argv: list[str], state: State) -> int:
    long_opts = {"jobs": REQUIRED, "noheader": NO_ARG, "parsable2": NO_ARG, "parsable": NO_ARG, "format": REQUIRED,
                 "allusers": NO_ARG, "user": REQUIRED, "starttime": REQUIRED, "endtime": REQUIRED, "state": REQUIRED,
                 "help": NO_ARG, "version": NO_ARG, "brief": NO_ARG, "long": NO_ARG, "allocations": NO_ARG}
    short = {"j": REQUIRED, "n": NO_ARG, "P": NO_ARG, "p": NO_ARG, "o": REQUIRED, "a": NO_ARG, "u": REQUIRED,
             "S": REQUIRED, "E": REQUIRED, "s": REQUIRED, "X": NO_ARG, "b": NO_ARG, "l": NO_ARG, "V": NO_ARG}
    names = {"j": "jobs", "n": "noheader", "P": "parsable2", "p": "parsable", "o": "format", "a": "allusers",
             "u": "user", "S": "starttime", "E": "endtime", "s": "state", "X": "allocations", "b": "brief",
             "l": "long", "V": "version"}
    opts, rest = getopt_or_exit("sacct", argv, long_opts, short, names)
    given = dict(opts)
    fields = [f.strip().lower().split("%")[0] for f in given.get("format", "JobID,JobName,Partition,Account,"
                                                                            "State,ExitCode").split(",")]
    unknown = [f for f in fields if f not in _SACCT_FIELDS]
    if unknown:
        sys.stderr.write(f"Invalid field requested: \"{unknown[0]}\"\n")
        return 1
    jobs = sorted(state.read_jobs().values(), key=lambda j: j["id"])
    if "jobs" in given:
        jobs = [j for j in jobs if str(j["id"]) in given["jobs"].split(",")]
    if "state" in given:
        jobs = [j for j in jobs if j["state"] in given["state"].upper().split(",")]
    sep = "|" if ("parsable2" in given or "parsable" in given) else " "
    if "noheader" not in given:
        print(sep.join(f.capitalize() if f != "jobid" else "JobID" for f in fields))
    for job in jobs:
        print(sep.join(_SACCT_FIELDS[f](job) for f in fields) + ("|" if "parsable" in given else ""))
    return 0


_DISPATCH = {"sbatch": sbatch, "srun": srun, "squeue": squeue, "scontrol": scontrol, "scancel": scancel,
             "sacct": sacct}


def main(name: str, argv: list[str], state_dir: str) -> int:
    state = State(state_dir)
    record_call(state_dir, {"tool": name, "argv": [name, *argv], "cwd": os.getcwd()})
    return run_main(name, lambda: _DISPATCH[name](argv, state))


# ---- the test's side ------------------------------------------------------------------------------
# The container launchers built in this process, by what each was built from: fakes of one
# configuration share one build (tether-run is a compile, ~0.3 s; a test session makes dozens of
# fakes), in a directory of this process's own, removed when it exits.
_LAUNCHERS: dict[str, Path] = {}


def _container_launcher(site) -> Path:
    """tether's container launcher for ``site`` (a Config), as ``tether slurm install`` writes it."""
    from ..admin.host import install_launcher
    from ..container.run import config_identity
    from ..hooks.configfile import DEFAULT_CONFIG_PATH

    source = DEFAULT_CONFIG_PATH if site.source.startswith("<") else site.source
    made_from = json.dumps([site.source, config_identity(source), site.data["container"]], sort_keys=True,
                           default=str)
    launcher = _LAUNCHERS.get(made_from)
    if launcher is None or not launcher.exists():
        libexec = Path(tempfile.mkdtemp(prefix="tether-fake-launcher-"))
        atexit.register(shutil.rmtree, libexec, ignore_errors=True)
        launcher = _LAUNCHERS[made_from] = install_launcher(libexec, site)
    return launcher


class FakeSlurm(FakeCommands):
    """The fake cluster: commands in ``bin_dir``, state in ``state``; see the module doc."""

    def __init__(self, root: Path, *, config: str | Path | None = None, nodes: int = 3,
                 partitions: dict[str, dict] | None = None, addresses: dict[str, str] | None = None):
        from ..hooks.configfile import load_config

        self.root = Path(root)
        self.bin_dir, self.state_dir = self.root / "bin", self.root / "state"
        install_fakes(self.bin_dir, "slurm", COMMANDS, self.state_dir)
        node_names = [f"n{i}" for i in range(1, nodes + 1)]
        config_path = str(config) if config else None
        site = load_config(config_path, env={})
        if partitions is None:
            pools = [site.data.get("default_compute_resource_pool"), site.data.get("default_aux_resource_pool")]
            partitions = {"debug": {"default": True}}
            partitions.update({p: {} for p in pools if p and p != "debug"})
        for p in partitions.values():
            p.setdefault("nodes", node_names)
        launcher = _container_launcher(site)
        storage = self.root / "job_storage_root"
        storage.mkdir(exist_ok=True)
        cluster = {"config": config_path, "nodes": node_names, "partitions": partitions, "bin_dir": str(self.bin_dir),
                   "launcher": str(launcher), "job_storage_root": str(storage), "addresses": addresses or {}}
        (self.state_dir / "cluster.json").write_text(json.dumps(cluster, indent=1))
        self.state = State(self.state_dir)

    def sbatch(self, *argv: str, **kwargs) -> str:
        """Submit with the fake sbatch (``--parsable``); the job id. Raises when refused."""
        result = self.run("sbatch", "--parsable", *argv, **kwargs)
        if result.returncode != 0:
            raise SubmissionRefused(result.returncode, result.stderr)
        return result.stdout.strip()

    def job(self, job_id: str | int) -> JobRecord:
        """A job's record: the fields tether's plan set (min_nodes, max_nodes, num_tasks,
        ntasks_per_node, cpus_per_task, tres_per_job/node/task, partition, wckey, requeue), state...;
        a field nobody set is None, as in the job_submit plugin's view of the request."""
        return JobRecord(self.state.read_jobs()[str(job_id)])

    def jobs(self) -> dict[str, dict]:
        return self.state.read_jobs()

    def run_job(self, job_id: str | int, timeout: float = 300) -> dict:
        """Run a pending job's batch script now; its final record."""
        return run_job(self.state, int(job_id), timeout=timeout)

    def run_pending(self) -> list[dict]:
        return [self.run_job(j["id"]) for j in sorted(self.jobs().values(), key=lambda j: j["id"])
                if j["state"] == "PENDING" and j.get("reason") != "JobHeldUser"]



class JobRecord(dict):
    """A fake job's record: a field that was never set reads as None (Slurm's unset), not KeyError."""

    def __missing__(self, key: str) -> None:
        return None


class SubmissionRefused(Exception):
    """The fake sbatch refused a job (``status``, and ``stderr`` with the messages)."""

    def __init__(self, status: int, stderr: str):
        super().__init__(stderr.strip())
        self.status, self.stderr = status, stderr


__all__ = ["FakeSlurm", "JobRecord", "SubmissionRefused", "JobSubmit", "PluginLib", "bridge_ffi", "expand_hostlist", "OPTIONAL"]
