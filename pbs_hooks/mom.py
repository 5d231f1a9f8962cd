"""PBS MoM hooks: a tether job's directories, rank environment, containers for TM tasks, cleanup.

Run by ``tether_exec.py`` (the hook file qmgr imports) in each MoM's ``pbs_python``, as root:

execjob_begin   (every host of the job) ``<job_storage_root>/<job>/<host>/``, owned by the job user;
execjob_launch  (the job shell on the first host, and every task spawned through TM -- ``pbs_tmrsh``,
                ``pbsdsh``, MPI -- on any host) the rank environment; each TM task also gets its
                per-rank directories ``<host>/task-<task number>/rank-<RANK>/{tmp,work}`` and, when
                the job has a container image (``qsub -v TETHER_CONTAINER_IMAGE=…``), is handed to
                tether's container launcher (``e.progname``/``e.argv``). The job shell stays on the
                host (like Slurm's batch script), so ``pbs_tmrsh`` inside it works;
execjob_end, execjob_abort  the containers' leftover cleanup (as the job user) and the host's
                directories; the job's first host also removes whatever the job left directly in
                its directory; the job's directory goes with the last host.

What a MoM hook is given (recorded on OpenPBS 23.06; tests/fixtures/pbs/openpbs-mom-cases.json):
``job.exec_host`` is None -- the placement is ``exec_host2`` (``host:port/index*ncpus`` per chunk),
``exec_vnode`` (``(vnode:ncpus=N+...)`` per chunk) and ``schedselect`` (the chunks, with ``mpiprocs``);
``Resource_List`` holds no ``select``. A task's environment has no ``PBS_VNODENUM`` (Torque's) and,
for a TM task, no ``PBS_NODEFILE``; ``PBS_TASKNUM`` is the MoM's task number: ``1`` (decimal) for the
job shell, 8 upper-case hex digits for a TM task (OpenPBS's momtask_create: a counter per host, the
host's index in the job in the top bits). Hosts, node ranks and the ranks' layout come from the job's
placement, never from a variable; the task number only orders a host's tasks (a job's own TM client
can pass any value in tm_spawn's environment: it only renumbers that job's own ranks).

Directories are made and removed by ``tether-jobdirs``, the C helper built from the same source as
the SPANK plugin's directory code (no symlink is followed as root; ownership handed over atomically).
Jobs without tether resources or a container image are left alone. These hooks import nothing
from tether's config or planner: the settings they need were written into their JSON config by
``tether pbs install``.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import subprocess

from ..hooks.layout import job_dir_name
from ..hooks.rankenv import master_port, pbs_job_number, rank_env
from ..hooks.surface import PBS_RESOURCES, RUN_ARGV0, STARTED_MARK, SUBREAPER_VAR
from .attrs import resource, variable

HELPER_TIMEOUT = 20          # seconds; the hook's alarm is 30
LAUNCHER_NAMES = ("tether", "tether-run")


class HookFailure(Exception):
    """The job cannot run here; the message is for the user (and the MoM log)."""


def pbs_envvariable(value: str) -> str:
    """``value`` as ``e.env`` must hold it: PBS joins the variables with commas and reads ``\\,``,
    ``\\\\``, ``\\"`` and ``\\'`` back as the plain characters (newlines pass as they are)."""
    out = []
    for char in value:
        out.append("\\" + char if char in ",\\\"'" else char)
    return "".join(out)


def pbs_env_plain(value: str | None) -> str | None:
    """What a task sees for an ``e.env`` value (the reverse of pbs_envvariable)."""
    if value is None:
        return None
    out, i = [], 0
    while i < len(value):
        if value[i] == "\\" and i + 1 < len(value) and value[i + 1] in ",\\\"'":
            i += 1
        out.append(value[i])
        i += 1
    return "".join(out)


def job_hosts(exec_host: str | None) -> list[str]:
    """The job's hosts in order, once each, from ``exec_host`` (``h1/0*2+h2/0*2``) or ``exec_host2``
    (``h1:15002/0*2+h2:15002/0*2``)."""
    hosts: list[str] = []
    for host in chunk_hosts(exec_host):
        if host not in hosts:
            hosts.append(host)
    return hosts


def chunk_hosts(exec_host: str | None) -> list[str]:
    """The host of each chunk, from ``exec_host``/``exec_host2`` (one ``host[:port]/index[*ncpus]``
    per chunk, joined by ``+``)."""
    hosts = []
    for part in str(exec_host or "").split("+"):
        host = part.split("/", 1)[0].split(":", 1)[0].strip()
        if host:
            hosts.append(host)
    return hosts


def vnode_chunk_hosts(exec_vnode: str | None) -> list[str]:
    """The host of each chunk from ``exec_vnode`` (``(n1:ncpus=2)+(n2[0]:ncpus=1+n2[1]:ncpus=1)``):
    the chunk's first vnode, a ``[index]`` suffix dropped (the vnodes of one MoM's host)."""
    hosts = []
    for chunk in re.findall(r"\(([^()]*)\)", str(exec_vnode or "")):
        name = chunk.split("+", 1)[0].split(":", 1)[0].strip()
        if name:
            hosts.append(name.split("[", 1)[0])
    return hosts


def select_mpiprocs(schedselect: str | None) -> list[int] | None:
    """The node-file lines of each chunk of ``schedselect`` (``2:ncpus=2:mpiprocs=2+ncpus=1``):
    ``mpiprocs``, else 1 -- 0 for a chunk without ncpus -- as OpenPBS's MoM counts them. None when
    it is not a select statement."""
    counts: list[int] = []
    for spec in str(schedselect or "").split("+"):
        words = spec.split(":")
        repeat = 1
        if words and re.fullmatch(r"[0-9]{1,6}", words[0]):
            repeat = int(words.pop(0))
        values = dict(w.split("=", 1) for w in words if "=" in w)
        if not words or len(values) != len(words):
            return None
        procs, ncpus = values.get("mpiprocs"), values.get("ncpus", "0")
        if procs is not None and not re.fullmatch(r"[0-9]{1,6}", procs):
            return None
        counts += [int(procs) if procs is not None else (1 if ncpus.strip("0") else 0)] * repeat
    return counts or None


class Placement:
    """Where PBS placed a job: its hosts in order (the first is the MoM the job shell runs on) and the
    host index of each rank slot (one per line of the node file: mpiprocs per chunk)."""

    def __init__(self, hosts: list[str], slots: list[int]):
        self.hosts = hosts
        self.slots = slots

    def index(self, host: str) -> int | None:
        """``host``'s position in the job (PBS's node number), names compared up to their first '.'."""
        short = [short_host(h) for h in self.hosts]
        return short.index(short_host(host)) if short_host(host) in short else None


def job_placement(job) -> Placement:
    """The job's placement from what the server set (never from a task's variables): exec_host2 or
    exec_vnode for each chunk's host (exec_host where PBS gives it, as in server hooks), schedselect
    for each chunk's mpiprocs. Without a usable schedselect, one slot per host."""
    per_chunk: list[str] = []
    for name, parse in (("exec_host2", chunk_hosts), ("exec_vnode", vnode_chunk_hosts), ("exec_host", chunk_hosts)):
        per_chunk = parse(getattr(job, name, None))
        if per_chunk:
            break
    hosts = list(dict.fromkeys(per_chunk))
    procs = select_mpiprocs(getattr(job, "schedselect", None))
    if procs is None or len(procs) != len(per_chunk):
        return Placement(hosts, list(range(len(hosts))))
    slots = [hosts.index(host) for host, count in zip(per_chunk, procs) for _ in range(count)]
    return Placement(hosts, slots)


HEX_TASK = re.compile(r"[0-9A-F]{8}")
SHELL_TASK = "1"                   # the job shell's PBS_TASKNUM (decimal; TM tasks' are hex)


def task_number(text: str | None) -> int | None:
    """A TM task's PBS_TASKNUM as OpenPBS writes it (``%8.8X``: ``0000000A``), or None."""
    return int(text, 16) if text is not None and HEX_TASK.fullmatch(text) else None


def short_host(name: str) -> str:
    """A host name up to its first '.': PBS may spell a host short in one place (exec_host) and fully
    qualified in another (the MoM's node name, the node file); tether-jobdirs compares the same way."""
    return name.split(".", 1)[0]


def is_tether_job(job) -> bool:
    """A job with tether resources (flag=m makes them visible here) or a container image."""
    if any(resource(job.Resource_List, opt.pbs_resource) is not None for opt in PBS_RESOURCES):
        return True
    return bool(variable(job.Variable_List, "TETHER_CONTAINER_IMAGE"))


def job_user(job) -> tuple[int, int]:
    """The job user's uid and gid (``egroup`` when PBS gives it, else the user's primary group)."""
    name = str(job.euser or "")
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise HookFailure(f"tether: the job's user {name!r} is unknown on this host") from None
    gid = pw.pw_gid
    if getattr(job, "egroup", None):
        try:
            gid = grp.getgrnam(str(job.egroup)).gr_gid
        except KeyError:
            pass
    return pw.pw_uid, gid


def run_helper(settings: dict, *args: str) -> str:
    """Run tether-jobdirs; its stdout, or HookFailure with the first line it wrote on stderr."""
    helper = settings["helper"]
    try:
        result = subprocess.run([helper, *args], capture_output=True, text=True, timeout=HELPER_TIMEOUT,
                                stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise HookFailure(f"tether: {helper} is missing on this host (run `tether pbs install` here)") from None
    except subprocess.TimeoutExpired:
        raise HookFailure(f"tether: {os.path.basename(helper)} {args[0]} did not finish in "
                          f"{HELPER_TIMEOUT} s") from None
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        raise HookFailure(lines[0] if lines else f"tether: {helper} {args[0]} failed ({result.returncode})")
    return result.stdout.strip()


def runs_tether(argv: list[str]) -> bool:
    """Is this task already tether's launch (``[/bin/sh -c STARTED_MARK FILE] [/usr/bin/env
    NAME=VALUE…] …/tether run …``, as the per-host launch script starts it)? Then it is not wrapped a
    second time."""
    words = list(argv)
    if len(words) > 4 and words[0] == "/bin/sh" and words[1:3] == ["-c", STARTED_MARK]:
        words = words[4:]
    if words and os.path.basename(words[0]) == "env":
        words = words[1:]
        while words and "=" in words[0] and not words[0].startswith("/"):
            words = words[1:]
    return bool(words) and os.path.basename(words[0]) in LAUNCHER_NAMES


def _is_job_shell(env, argv: list[str]) -> bool:
    task = variable(env, "PBS_TASKNUM")
    return str(task) == SHELL_TASK if task is not None else not argv


def begin(pbs, e, settings: dict) -> None:
    """execjob_begin: the job's and this host's directories."""
    job = e.job
    uid, gid = job_user(job)
    run_helper(settings, "begin", settings["job_storage_root"], job_dir_name(job.id),
               pbs.get_local_nodename(), str(uid), str(gid))


def _rank_values(placement: Placement, node_rank: int, task: int) -> tuple[int, int, int, int]:
    """The rank, local rank, world size and local world size of TM task ``task`` on the job's host
    ``node_rank``.

    The ranks are the job's node-file lines (mpiprocs per chunk, in chunk order), as pbsdsh starts a
    task per line; a host's tasks take its lines in the order its MoM numbered them (the low bits of
    the task number count up from 2 on the first host, whose 1 is the job shell, and from 1 on the
    others), and start over when there are more tasks than lines (a later step). A job with a host
    that has no line (mpiprocs=0) has one rank per host (one container per node)."""
    slots = placement.slots
    if len(set(slots)) < len(placement.hosts):
        slots = list(range(len(placement.hosts)))
    here = [rank for rank, host in enumerate(slots) if host == node_rank]
    node_bits = len(placement.slots).bit_length()          # OpenPBS's numbits(mpiprocs of the job)
    counter = task & ((1 << (32 - node_bits)) - 1)
    local = (counter - (2 if node_rank == 0 else 1)) % len(here)
    return here[local], local, len(slots), len(here)


def launch(pbs, e, settings: dict) -> None:
    """execjob_launch: the rank environment; for TM tasks per-rank directories and the container."""
    job = e.job
    env = e.env
    host = pbs.get_local_nodename()
    placement = job_placement(job)
    if not placement.hosts:                 # nothing says where PBS placed the job: this host alone
        placement = Placement([host], [0])
    node_rank = placement.index(host) or 0
    hosts = placement.hosts
    job_dir = os.path.join(settings["job_storage_root"], job_dir_name(job.id))
    # every host of a job derives the same port (the Slurm side's rule, PBS's sequence number as the job id)
    values = rank_env(job_dir=job_dir, nnodes=len(hosts), node_rank=node_rank, master_addr=hosts[0],
                      master_port=master_port(pbs_job_number(job.id)))
    for opt in PBS_RESOURCES:                          # TETHER_JOB_* as in the Slurm contract
        value = resource(job.Resource_List, opt.pbs_resource)
        if value is not None:
            values[opt.job_env] = str(value)
    argv = [str(a) for a in (e.argv or [])]
    if not _is_job_shell(env, argv):
        uid, gid = job_user(job)
        text = pbs_env_plain(variable(env, "PBS_TASKNUM"))
        task = task_number(text)
        if task is None:
            raise HookFailure(f"tether: PBS_TASKNUM={text!r} is not a task number OpenPBS gives a TM task "
                              f"(8 upper-case hex digits); the task was not started")
        rank, local, world, local_world = _rank_values(placement, node_rank, task)
        rank_dir = run_helper(settings, "task", settings["job_storage_root"], job_dir_name(job.id), host,
                              str(task), str(rank), str(uid), str(gid))
        # PBS's MoM gives the task its own TMPDIR
        values.update(rank_env(rank=rank, local_rank=local, world_size=world, local_world_size=local_world,
                               step_dir=os.path.dirname(rank_dir), rank_dir=rank_dir, tmpdir=False))
        image = pbs_env_plain(variable(env, "TETHER_CONTAINER_IMAGE")) or variable(job.Variable_List,
                                                                             "TETHER_CONTAINER_IMAGE")
        # a name alone: the job's container of that name on this host (the launcher says when there is none)
        named = pbs_env_plain(variable(env, "TETHER_CONTAINER_NAME"))
        if (image or named or runs_tether(argv)) and settings.get("user_dirs"):
            # the user's own directories on this host, for the launcher: the one this hook hands the
            # task to, or tether's own per-host launch (pbs-launch.sh's `tether run`)
            run_helper(settings, "user", settings["user_dirs"], str(uid), str(gid))
        if (image or named) and not runs_tether(argv):
            launcher = settings.get("launcher")
            if not launcher:
                raise HookFailure("tether: TETHER_CONTAINER_IMAGE: containers are not set up on this "
                                  "cluster (the hook config names no launcher; run `tether pbs install`)")
            if not os.access(launcher, os.X_OK):
                raise HookFailure(f"tether: the container launcher {launcher} is missing on this host "
                                  f"(run `tether pbs install` here)")
            values[RUN_ARGV0] = argv[0] if argv else str(e.progname)
            values[SUBREAPER_VAR] = "0"     # the launcher makes itself a child subreaper
            e.progname = launcher
            e.argv = [launcher, *argv[1:]]
    for name, value in values.items():
        env[name] = pbs_envvariable(value)


def end(pbs, e, settings: dict) -> None:
    """execjob_end / execjob_abort: leftover container cleanup, then this host's directories."""
    job = e.job
    uid, gid = job_user(job)
    host = pbs.get_local_nodename()
    args = ["end", settings["job_storage_root"], job_dir_name(job.id), host, str(uid), str(gid),
            settings.get("launcher") or "-"]
    hosts = job_placement(job).hosts
    if hosts and short_host(hosts[0]) == short_host(host):
        args += hosts        # the first host also removes what the job left in its directory
    run_helper(settings, *args)


def handle(pbs, e, settings: dict) -> None:
    """The MoM hooks' entry point (ends the hook: accept or reject)."""
    import traceback

    if e.job is None or not is_tether_job(e.job):
        e.accept()
    actions = {pbs.EXECJOB_BEGIN: begin, pbs.EXECJOB_LAUNCH: launch, pbs.EXECJOB_END: end,
               pbs.EXECJOB_ABORT: end}
    action = actions.get(e.type)
    if action is None:
        e.accept()
    ending = action is end
    try:
        action(pbs, e, settings)
    except HookFailure as exc:
        pbs.logmsg(pbs.LOG_ERROR, str(exc))
        if not ending:
            e.reject(str(exc))
    except Exception as exc:                     # never start a tether task half set up
        pbs.logmsg(pbs.LOG_ERROR, "tether: internal error:\n" + traceback.format_exc())
        if not ending:
            e.reject(f"tether unavailable: internal error ({type(exc).__name__}); details in the MoM log")
    e.accept()
