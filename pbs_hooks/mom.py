"""PBS MoM hooks: a tether job's directories, rank environment, containers for TM tasks, cleanup.

Run by ``tether_exec.py`` (the hook file qmgr imports) in each MoM's ``pbs_python``, as root:

execjob_begin   (every host of the job) ``<job_storage_root>/<job>/<host>/``, owned by the job user;
execjob_launch  (the job shell on the first host, and every task spawned through TM -- ``pbs_tmrsh``,
                ``pbsdsh``, MPI -- on any host) the rank environment; each TM task also gets its
                per-rank directories ``<host>/task-<PBS_TASKNUM>/rank-<RANK>/{tmp,work}`` and, when
                the job has a container image (``qsub -v TETHER_CONTAINER_IMAGE=…``), is handed to
                tether's container launcher (``e.progname``/``e.argv``). The job shell stays on the
                host (like Slurm's batch script), so ``pbs_tmrsh`` inside it works;
execjob_end, execjob_abort  the containers' leftover cleanup (as the job user) and the host's
                directories; the job's first host also removes whatever the job left directly in
                its directory; the job's directory goes with the last host.

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
import stat
import subprocess

from ..hooks.layout import RANK_WORK, job_dir_name
from ..hooks.surface import MASTER_PORT_BASE, MASTER_PORT_JOBS, PBS_RESOURCES, RUN_ARGV0
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
    """What a task sees for an ``e.env`` value (the reverse of pbs_env_value)."""
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
    """The job's hosts in order, once each, from ``exec_host`` (``h1/0*2+h2/0*2``)."""
    hosts: list[str] = []
    for part in str(exec_host or "").split("+"):
        host = part.split("/", 1)[0].strip()
        if host and host not in hosts:
            hosts.append(host)
    return hosts


def short_host(name: str) -> str:
    """A host name up to its first '.': PBS may spell a host short in one place (exec_host) and fully
    qualified in another (the MoM's node name, the node file); tether-jobdirs compares the same way."""
    return name.split(".", 1)[0]


def master_port(job_id: str) -> int:
    """Every host of a job derives the same port; jobs with neighbouring ids get different ones
    (the Slurm side's rule, with PBS's sequence number as the job id)."""
    digits = "".join(c for c in str(job_id).split(".", 1)[0] if c.isdigit()) or "0"
    return MASTER_PORT_BASE + (int(digits) % MASTER_PORT_JOBS) * 16


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
    """Is this task already tether's launch (``[/usr/bin/env NAME=VALUE…] …/tether run …``, as the
    per-host launch script starts it)? Then it is not wrapped a second time."""
    words = list(argv)
    if words and os.path.basename(words[0]) == "env":
        words = words[1:]
        while words and "=" in words[0] and not words[0].startswith("/"):
            words = words[1:]
    return bool(words) and os.path.basename(words[0]) in LAUNCHER_NAMES


def _is_job_shell(env, argv: list[str]) -> bool:
    task = variable(env, "PBS_TASKNUM")
    return str(task) == "1" if task is not None else not argv


def begin(pbs, e, settings: dict) -> None:
    """execjob_begin: the job's and this host's directories."""
    job = e.job
    uid, gid = job_user(job)
    run_helper(settings, "begin", settings["job_storage_root"], job_dir_name(job.id),
               pbs.get_local_nodename(), str(uid), str(gid))


def read_node_file(path: str | None, job_id: str) -> list[str]:
    """The job's node file (one line per mpiproc). The hook runs as root and a task's environment
    can be the user's: only PBS's own file is read -- ``<PBS_HOME>/aux/<job id>``, root-owned, not
    a symlink -- anything else counts as no node file."""
    if not path or os.path.basename(path) != str(job_id) or \
            os.path.basename(os.path.dirname(path)) != "aux":
        return []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    with os.fdopen(fd) as fh:
        st = os.fstat(fh.fileno())
        if st.st_uid != 0 or not stat.S_ISREG(st.st_mode):
            return []
        return [line.strip() for line in fh.read(1 << 20).splitlines() if line.strip()]


def _rank_values(env, hosts: list[str], host: str, node_rank: int, job_id: str) -> dict[str, str]:
    """RANK/LOCAL_RANK/WORLD_SIZE/LOCAL_WORLD_SIZE of a TM task. pbsdsh gives each task its line
    of the node file (PBS_VNODENUM): that line is the rank. Otherwise the seed's layout applies:
    one task (container) per host, the host's index is the rank."""
    vnode = variable(env, "PBS_VNODENUM")
    lines = read_node_file(pbs_env_plain(variable(env, "PBS_NODEFILE")), job_id)
    if vnode is not None and str(vnode).isdigit() and lines:
        rank = int(str(vnode))
        if rank < len(lines):
            here = [i for i, name in enumerate(lines) if short_host(name) == short_host(lines[rank])]
            return {"RANK": str(rank), "LOCAL_RANK": str(here.index(rank)), "WORLD_SIZE": str(len(lines)),
                    "LOCAL_WORLD_SIZE": str(len(here))}
    return {"RANK": str(node_rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(len(hosts)),
            "LOCAL_WORLD_SIZE": "1"}


def launch(pbs, e, settings: dict) -> None:
    """execjob_launch: the rank environment; for TM tasks per-rank directories and the container."""
    job = e.job
    env = e.env
    host = pbs.get_local_nodename()
    hosts = job_hosts(job.exec_host) or [host]
    short = [short_host(h) for h in hosts]
    node_rank = short.index(short_host(host)) if short_host(host) in short else 0
    job_dir = os.path.join(settings["job_storage_root"], job_dir_name(job.id))
    values = {"TETHER_JOB_DIR": job_dir, "TETHER_NNODES": str(len(hosts)), "NODE_RANK": str(node_rank),
              "MASTER_ADDR": hosts[0], "MASTER_PORT": str(master_port(job.id))}
    for opt in PBS_RESOURCES:                          # TETHER_JOB_* as in the Slurm contract
        value = resource(job.Resource_List, opt.pbs_resource)
        if value is not None:
            values[opt.job_env] = str(value)
    argv = [str(a) for a in (e.argv or [])]
    if not _is_job_shell(env, argv):
        uid, gid = job_user(job)
        task = str(variable(env, "PBS_TASKNUM") or "0")
        if not task.isdigit():
            raise HookFailure(f"tether: PBS_TASKNUM={task!r} is not a task number")
        values.update(_rank_values(env, hosts, host, node_rank, str(job.id)))
        rank_dir = run_helper(settings, "task", settings["job_storage_root"], job_dir_name(job.id), host,
                              task, values["RANK"], str(uid), str(gid))
        values.update(TETHER_STEP_DIR=os.path.dirname(rank_dir), TETHER_RANK_DIR=rank_dir,
                      TETHER_WORK_DIR=os.path.join(rank_dir, RANK_WORK))
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
            values["TETHER_RUN_SUBREAPER"] = "0"     # the launcher makes itself a child subreaper
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
    hosts = job_hosts(job.exec_host)
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
