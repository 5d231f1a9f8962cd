"""Gateway nodes (docs/requirements.md, "Gateway nodes") on the run side: their daemons, started
before the batch script runs.

A heterogeneous job asks for gateway nodes with a component of its own (``--gateways=N``); the
job_submit plugin gives that component the config's gateway partition (and feature), N nodes and
one task per node. When the job starts, the SPANK plugin hands the batch script to the launcher
with ``TETHER_RUN_GATEWAYS=<component>``, and the launcher (``start_gateways``):

1. finds the component's nodes (``SLURM_JOB_NODELIST_HET_GROUP_<k>``, which slurmctld puts into
   the batch environment) and their addresses (``scontrol show node``: ``NodeAddr``);
2. starts the configured daemon on them as **one job step of the gateway component**
   (``srun --het-group=<k> --ntasks-per-node=1``), so Slurm accounts it, limits it and ends it
   with the job like any step -- no process of it outlives the allocation;
3. waits until the step's task on every gateway node reports its daemon ready
   (``gateways.ready_timeout``). The task decides that on its node, where the kernel names the
   owner of every listening socket (``exec_daemon``): it refuses a port another process already
   listens on, then reports ready once the daemon (or a process it started) holds a socket
   listening on the port and no other process does. "Something accepts TCP" is not readiness:
   another user listening on the port first would receive the job's traffic;
4. puts ``TETHER_GATEWAYS`` (``ADDR:PORT,...``), ``TETHER_GATEWAY_NODES`` and
   ``TETHER_GATEWAY_COMPONENT`` into the batch script's environment, which every ``srun`` of the
   script passes on to all its ranks, in every component.

A daemon that exits or does not listen in time, or a port another process holds, fails the
batch script (exit 1, the reason in its error output); the node stays in service. The step's
``srun`` is watched by a small process of its own (double-forked: not a child of the batch
script, whose ``wait`` must not wait for it), which is in the batch step's cgroup and ends with it.
In ``salloc``, ``tether gateway start`` does the same.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Mapping, NoReturn

from ..hooks.errors import TetherError
from ..hooks.surface import GATEWAY_PORT_BASE, GATEWAY_PORT_JOBS, PLUGIN
from ..system.proc import CommandError, run_command
from .launch import _descendants

# Automatic ports: 28672..32767, above MASTER_PORT's and below Linux's ephemeral ports
# (surface.py). Inside the ephemeral range an outgoing connection of the gateway node (slurmd's, a
# rank's) can hold the port when the daemon binds: seen on the sandbox as "Address already in use"
# in about one job of seven with the earlier base of 52000.
PORT_BASE, PORT_JOBS = GATEWAY_PORT_BASE, GATEWAY_PORT_JOBS
DAEMON_VAR = "TETHER_GATEWAY_DAEMON"      # the daemon's argv (JSON), for the gateway step's tasks
PORTS_VAR = "TETHER_GATEWAY_PORTS"        # each gateway's port, by the task's SLURM_PROCID
PORT_VAR = "TETHER_GATEWAY_PORT"          # the daemon's own port, in its environment
EXIT_DAEMON_MISSING = 127
EXIT_PORT_IN_USE = 98                     # EADDRINUSE
REPORT_TAG = "tether-gateway"             # the task's readiness reports on the step's stdout
_TCP_LISTEN = "0A"                        # the state column of /proc/net/tcp


class GatewayError(TetherError):
    """The gateway nodes could not be set up: the job fails with this message."""


def gateway_ports(job_id: int, count: int, port: int | None) -> list[int]:
    """Each gateway node's port: ``port + n``, or with no fixed port
    ``28672 + (job id mod 256) * 16 + n`` (jobs with neighbouring ids get different ones)."""
    first = port if port is not None else PORT_BASE + (job_id % PORT_JOBS) * 16
    return [first + n for n in range(count)]


def daemon_argv(template: list[str], *, port: int, node: str, index: int, job: str) -> list[str]:
    """The daemon's command with ``{port}``, ``{node}``, ``{index}`` and ``{job}`` replaced (other
    braces stay as they are: the command is not a format string)."""
    values = {"{port}": str(port), "{node}": node, "{index}": str(index), "{job}": job}
    return [re.sub(r"\{(port|node|index|job)\}", lambda m: values[m.group(0)], arg) for arg in template]


def gateway_component(env: Mapping[str, str], partition: str | None) -> int | None:
    """The index of the heterogeneous job's component in the gateway partition, from the job's
    environment (``SLURM_HET_SIZE``, ``SLURM_JOB_PARTITION_HET_GROUP_<k>``), or None."""
    if not partition:
        return None
    try:
        size = int(env.get("SLURM_HET_SIZE", "0"))
    except ValueError:
        return None
    for k in range(1, size):
        if env.get(f"SLURM_JOB_PARTITION_HET_GROUP_{k}") == partition:
            return k
    return None


def expand_nodes(nodelist: str) -> list[str]:
    """A Slurm hostlist (``n[1-3],g1``) as node names, expanded by Slurm itself."""
    out = run_command(["scontrol", "show", "hostnames", nodelist], timeout=30).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def node_addresses(names: list[str]) -> dict[str, str]:
    """Each node's ``NodeAddr`` (what ranks connect to; the name when Slurm has no address)."""
    out = run_command(["scontrol", "-o", "show", "node", ",".join(names)], timeout=30).stdout
    found = {}
    for line in out.splitlines():
        name, addr = re.search(r"\bNodeName=(\S+)", line), re.search(r"\bNodeAddr=(\S+)", line)
        if name and addr:
            found[name.group(1)] = addr.group(1)
    return {n: found.get(n, n) for n in names}


# srun's output options from the environment: the step's stdout carries the tasks' readiness
# reports, which must reach wait_ready as they are written (not in a file, not labelled)
_STEP_OUTPUT = frozenset({"SLURM_STDOUTMODE", "SLURM_STDERRMODE", "SLURM_LABELIO"})


def step_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The gateway step's srun environment: the job's, without tether's options (the batch
    script's container options and the options Slurm re-applies from the environment would make
    the daemon's step a container step of the first component's image) and without srun's output
    options (the readiness reports are the step's stdout)."""
    option = f"SLURM_SPANK__SLURM_SPANK_OPTION_{PLUGIN}_"
    return {k: v for k, v in env.items() if not k.startswith(("TETHER_", option)) and k not in _STEP_OUTPUT}


def _report_lines(data: bytes) -> list[tuple[str, int, str]]:
    """The readiness reports in ``data`` (whole lines of the step's output) as ``(kind, index,
    message)``; other lines as ``("", -1, line)``."""
    found = []
    for raw in data.split(b"\n"):
        line = raw.decode(errors="replace")
        tag, _, rest = line.partition(" ")
        kind, _, rest = rest.partition(" ")
        index, _, message = rest.partition(" ")
        if tag == REPORT_TAG and kind in ("ready", "error") and index.isdigit():
            found.append((kind, int(index), message))
        elif line:
            found.append(("", -1, line))
    return found


def wait_ready(targets: list[tuple[str, int]], proc: subprocess.Popen, timeout: float) -> None:
    """Return once the gateway step's task on every node has reported its own daemon listening on
    its port (``exec_daemon`` decides it on the node, from the kernel's socket owners; whether
    something accepts a TCP connection says nothing about whose it is). ``proc``'s stdout carries
    the reports. GatewayError with the task's reason when a port is someone else's, when the step
    ends first or when ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    ready: set[int] = set()
    pending, reading = b"", True
    while True:
        if reading and select.select([fd], [], [], 0.2)[0]:
            data = os.read(fd, 65536)
            reading = bool(data)
            lines, _, pending = (pending + data).rpartition(b"\n")
            if not data and pending:
                lines, pending = lines + b"\n" + pending, b""
            for kind, index, message in _report_lines(lines):
                if kind == "error":
                    raise GatewayError(message[:1000])
                if kind == "ready":
                    ready.add(index)
                else:
                    print(message, file=sys.stderr, flush=True)
            if ready.issuperset(range(len(targets))):
                return
            continue
        if not reading:
            time.sleep(0.2)
        waiting = ", ".join(f"{a}:{p}" for i, (a, p) in enumerate(targets) if i not in ready)
        rc = proc.poll()
        if rc is not None:
            if reading and select.select([fd], [], [], 0)[0]:
                continue            # what the step wrote before it ended comes first
            raise GatewayError(f"the gateway step ended (srun exit {rc}) before its daemon listened on "
                               f"{waiting}; its output is above")
        if time.monotonic() >= deadline:
            raise GatewayError(f"the gateway daemon did not listen on {waiting} within {timeout:g} s "
                               f"(gateways.ready_timeout)")


def _subreaper(on: bool | None = None) -> bool:
    """Read (and with ``on``, set) this process's PR_SET_CHILD_SUBREAPER flag."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    value = ctypes.c_int(0)
    libc.prctl(37, ctypes.byref(value), 0, 0, 0)         # PR_GET_CHILD_SUBREAPER
    if on is not None:
        libc.prctl(36, int(on), 0, 0, 0)                 # PR_SET_CHILD_SUBREAPER
    return bool(value.value)


def start_gateways(env: Mapping[str, str], component: int, settings: Mapping, *,
                   python: str | None = None) -> dict[str, str]:
    """Start the gateway daemons of ``component`` and wait for them (see the module docstring);
    return the variables for the job's environment. Raises GatewayError."""
    if not settings.get("daemon"):
        raise GatewayError("this cluster's gateways.daemon is empty: no gateway daemon to start")
    job = env.get("SLURM_JOB_ID", "")
    nodelist = env.get(f"SLURM_JOB_NODELIST_HET_GROUP_{component}")
    if not job.isdigit() or not nodelist:
        raise GatewayError(f"the job's environment has no SLURM_JOB_ID or SLURM_JOB_NODELIST_HET_GROUP_{component}")
    try:
        names = expand_nodes(nodelist)
        addresses = node_addresses(names)
    except CommandError as exc:
        raise GatewayError(f"cannot read the gateway nodes {nodelist}: {exc}") from None
    ports = gateway_ports(int(job), len(names), settings.get("port"))
    targets = [(addresses[n], p) for n, p in zip(names, ports)]
    step_env = step_environment(env)
    step_env.update({DAEMON_VAR: json.dumps(list(settings["daemon"])), PORTS_VAR: ",".join(map(str, ports))})
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    wrapper = [python or sys.executable, "-c",
               f"import sys; sys.path[:0] = [{here!r}]; from tether.container.gateways import exec_daemon; "
               f"exec_daemon()"]
    argv = ["srun", f"--het-group={component}", f"--nodes={len(names)}", f"--ntasks={len(names)}",
            "--ntasks-per-node=1", "--job-name=tether-gateway", "--kill-on-bad-exit=0", "--quiet", "--", *wrapper]
    result = _run_monitor(argv, step_env, targets, float(settings.get("ready_timeout") or 60))
    if not result.get("ok"):
        raise GatewayError(result.get("error") or "the gateway monitor ended without an answer")
    return {"TETHER_GATEWAYS": ",".join(f"{a}:{p}" for a, p in targets),
            "TETHER_GATEWAY_NODES": ",".join(names), "TETHER_GATEWAY_COMPONENT": str(component)}


def _run_monitor(argv: list[str], env: dict[str, str], targets: list[tuple[str, int]], timeout: float) -> dict:
    """Fork the monitor (see the module docstring), which starts the step, waits for the daemons
    and answers on a pipe; return its answer. The monitor keeps watching the step afterwards."""
    was_subreaper = _subreaper()
    if was_subreaper:               # the orphaned monitor must not become this process's child
        _subreaper(False)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                              # the intermediate
        try:
            os.close(r)
            os.setsid()
            # not the caller's stdout: `eval "$(tether gateway start)"` reads it to its end
            os.dup2(2, 1)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            if os.fork() == 0:
                _monitor(argv, env, targets, timeout, w)       # never returns
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    if was_subreaper:
        _subreaper(True)
    with os.fdopen(r, "rb") as answer:
        data = answer.read(65536)
    try:
        return json.loads(data.decode() or "{}")
    except ValueError:
        return {"ok": False, "error": f"the gateway monitor answered {data[:200]!r}"}


def _monitor(argv: list[str], env: dict[str, str], targets: list[tuple[str, int]], timeout: float,
             answer_fd: int) -> NoReturn:
    def answer(value: dict) -> None:
        os.write(answer_fd, json.dumps(value).encode())
        os.close(answer_fd)

    try:
        # the step's stdout carries only its tasks' readiness reports (wait_ready); the daemon's
        # own output goes to the job's error stream (exec_daemon), not into the user's output
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, close_fds=True)
    except OSError as exc:
        answer({"ok": False, "error": f"cannot run srun for the gateway step: {exc.strerror}"})
        os._exit(1)
    try:
        wait_ready(targets, proc, timeout)
    except GatewayError as exc:
        _stop(proc)
        answer({"ok": False, "error": str(exc)})
        os._exit(1)
    answer({"ok": True})
    while os.read(proc.stdout.fileno(), 65536):     # read to its end: a full pipe would stall srun
        pass
    rc = proc.wait()
    if rc not in (0, -signal.SIGTERM, -signal.SIGKILL):
        print(f"tether: the gateway step ended (srun exit {rc}) while the job runs", file=sys.stderr, flush=True)
    os._exit(0)


def _stop(proc: subprocess.Popen) -> None:
    """End the gateway step's srun (srun cancels the step on SIGTERM) and wait for it."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def port_listeners(port: int, proc_net: str = "/proc/net") -> list[tuple[int, int]]:
    """The TCP sockets listening on ``port`` in this network namespace, on any address, IPv4 and
    IPv6, as ``(uid, inode)``: the kernel's record, which names each socket's owner."""
    found = []
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc_net, name)) as table:
                rows = table.read().splitlines()[1:]
        except FileNotFoundError:                   # a kernel without IPv6
            continue
        for row in rows:
            fields = row.split()
            try:
                if fields[3] == _TCP_LISTEN and int(fields[1].rpartition(":")[2], 16) == port:
                    found.append((int(fields[7]), int(fields[9])))
            except (IndexError, ValueError):
                continue
    return found


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or None once it has ended (a zombie
    included): with the pid, it names one process, not a later one that reuses the pid."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _socket_inodes(pids: set[int]) -> set[int]:
    """The inodes of the sockets the processes ``pids`` hold open (those this user may read)."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target.endswith("]"):
                inodes.add(int(target[8:-1]))
    return inodes


def _uids(holders: list[tuple[int, int]]) -> str:
    uids = sorted({uid for uid, _ in holders})
    return ("uid " if len(uids) == 1 else "uids ") + ", ".join(map(str, uids))


def _report(index: int, kind: str, message: str = "") -> None:
    """One readiness report on this task's stdout (srun's output, read by wait_ready)."""
    os.write(1, f"{REPORT_TAG} {kind} {index} {' '.join(message.split())}\n".encode())


def _watch(daemon: int, started: str, port: int, index: int, node: str) -> None:
    """Report the daemon ready once a socket listening on ``port`` is one of the daemon's (or its
    descendants'), and every listener on the port is; report an error when another process
    listens there. Ends quietly when the daemon ends (the step reports that)."""
    foreign_before = False
    while _start_time(daemon) == started:
        holders = port_listeners(port)
        if holders:
            ours = _socket_inodes({daemon, *_descendants(daemon)})
            foreign = [h for h in holders if h[1] not in ours]
            if not foreign:
                _report(index, "ready")
                return
            if foreign_before:      # seen twice: not a socket the daemon was just handing on
                _report(index, "error", f"port {port} on {node} is held by {_uids(foreign)}, not by the gateway "
                        f"daemon (another process bound it as the daemon started); the job does not run with it "
                        f"(resubmit: automatic ports follow the job id; a fixed gateways.port needs an "
                        f"administrator to free it)")
                return
            foreign_before = True
            time.sleep(0.05)
            continue
        foreign_before = False
        time.sleep(0.1)


def _start_watcher(port: int, index: int, node: str) -> None:
    """Fork the process that watches this task's daemon (``_watch``; double-forked: not a child
    of the daemon, which would never reap it). It keeps this task's stdout; it stays in the
    step's cgroup, so it ends with the step at the latest."""
    daemon = os.getpid()
    started = _start_time(daemon) or ""
    pid = os.fork()
    if pid == 0:
        try:
            if os.fork() == 0:
                try:
                    _watch(daemon, started, port, index, node)
                except Exception as exc:            # never a traceback in the job's output
                    _report(index, "error", f"cannot watch the gateway daemon's port {port} on {node}: {exc}")
                os._exit(0)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def exec_daemon() -> NoReturn:
    """In each task of the gateway step: refuse a port another process already listens on, start
    the watcher that reports the daemon ready (``_watch``), then exec the configured daemon with
    this node's port."""
    env = dict(os.environ)
    try:
        template = json.loads(env.pop(DAEMON_VAR))
        ports = env.pop(PORTS_VAR).split(",")
        index = int(env.get("SLURM_PROCID", "0"))
        port = int(ports[index])
    except (KeyError, ValueError, IndexError) as exc:
        print(f"tether: the gateway step's task has no daemon or port ({exc})", file=sys.stderr)
        os._exit(EXIT_DAEMON_MISSING)
    node = env.get("SLURMD_NODENAME", "") or socket.gethostname()
    holders = port_listeners(port)
    if holders:
        _report(index, "error", f"port {port} on {node} is already in use by {_uids(holders)}; the gateway daemon "
                f"cannot use it (resubmit: automatic ports follow the job id; a fixed gateways.port needs an "
                f"administrator to free it)")
        os._exit(EXIT_PORT_IN_USE)
    argv = daemon_argv(template, port=port, node=node, index=index, job=env.get("SLURM_JOB_ID", ""))
    env[PORT_VAR] = str(port)
    _start_watcher(port, index, node)
    os.dup2(2, 1)               # the daemon's output goes to the job's error stream; stdout is the watcher's
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        print(f"tether: cannot start the gateway daemon {argv[0]}: {exc.strerror}", file=sys.stderr)
        os._exit(EXIT_DAEMON_MISSING)
