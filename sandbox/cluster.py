"""A real local Slurm cluster for tests and demos: slurmctld + N slurmd (three by default) on localhost.

Everything it starts has its own config directory (``SLURM_CONF``), ports, state, spool, logs,
pid files and munge socket under one root directory, so it never collides with another Slurm
(or another sandbox) on the machine. It is stopped by PID, after checking that each PID is still
the daemon this sandbox started. Root only: it installs Debian packages and starts daemons.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable

import jinja2
import yaml

from ..container.runtimes.podman import BOOT_MARKER, Podman, repair_stale_state
from ..hooks.configfile import DEFAULT_CONFIG_PATH as PACKAGED_CONFIG, load_config
from ..hooks.errors import TetherError
from ..system.files import set_conf_line
from ..system.proc import CommandError, run_command
from ..system.toolchain import PACKAGED_BUILD_STAMP, packaged_stamp, system_plugin_dir
from . import slurmroot
from .packages import ensure_packages
from .slurmroot import SlurmRoot

DEFAULT_ROOT = "/var/lib/tether/sandbox"
ROOT_ENV = "TETHER_SANDBOX_DIR"
DEFAULT_PORT_BASE = 17000
DEFAULT_USER = "tether-demo"
NODE_COUNT = 3          # nodes of a new sandbox, unless `up --nodes N` says otherwise (kept across restarts)
MAX_NODES = 64          # each slurmd is small, but they share this machine's cores
SLURMD_OFFSET = 10      # slurmd ports: base+10, base+11, ... (below them the registries, slurmdbd, MariaDB)
PORT_BLOCK = 100        # a sandbox's ports span base .. base+SLURMD_OFFSET+MAX_NODES; the next free block
# node names: n1..n3 on the host's Slurm; a sandbox on another release names its nodes after it
# (r2411n1..r2411n3), because Slurm puts each node's cgroups under /slurm_<node name> (CgroupPrepend is
# fixed there when several slurmd share a host): two sandboxes with the same names would share them
HOST_NODE_PREFIX = "n"
GPUS_PER_NODE = 4
# fake GPUs /dev/tether-fakegpu0..3 and their CDI spec (see write_fake_gpus)
FAKE_GPU_PREFIX = "/dev/tether-fakegpu"
FAKE_GPU_CDI_KIND = "sandbox.tether/gpu"
# Their device numbers: char major 60 is "LOCAL/EXPERIMENTAL USE" (the kernel's devices.txt), never
# given to a driver, so opening one fails with ENXIO -- unless the devices cgroup denies it first
# (EPERM): ConstrainDevices shows as EPERM versus ENXIO. Distinct numbers per GPU, because the
# devices cgroup tells them apart by number (twins of /dev/null made Slurm deny /dev/null itself).
FAKE_GPU_MAJOR = 60
FAKE_GPU_CDI_SPEC = Path("/etc/cdi/tether-sandbox.yaml")
CPUS_PER_NODE = 8
MEMORY_MB = 4000
# podman on this machine type: the sandbox lacks CAP_SYS_RESOURCE, so no default ulimits.
CONTAINERS_CONF = "[containers]\ndefault_ulimits = []\n"
# Each node is its own host (issue 46): slurmd n<i> starts in a mount and UTS namespace of its own,
# with its own hostname (the node name), its own loopback address (NodeAddr 127.0.0.<i+1>; 127.0.0.1
# is the login and controller host's) and its own /tmp, /var/tmp, /run and /dev/shm, plus a node-local
# directory at <root>/local (the image stores), bound from <root>/nodes/<node>/... Its slurmstepd and
# tasks inherit them. Shared, as on a site: /home, the job storage root and the rest of <root>.
# (path inside the node, mode, emptied when the node boots -- a sandbox start -- as Debian does)
NODE_DIRS = (("tmp", 0o1777, True), ("var/tmp", 0o1777, False), ("run", 0o755, True),
             ("dev/shm", 0o1777, True), ("local", 0o755, False))
# run by sh in the node's new namespaces: $1 node name, $2 its directory, $3 the hosts file, $4 the
# sandbox's node-local mount point, then the command (slurmd)
NODE_ENTER = """set -e
node=$1 dir=$2 hosts=$3 local=$4; shift 4
for path in /tmp /var/tmp /run /dev/shm; do mount --bind "$dir$path" "$path"; done
# POSIX message queues at /dev/mqueue, as systemd mounts them on a compute node (podman's --ipc=host
# binds it); the directory is made on the host's /dev once when missing
if [ -d /dev/mqueue ] && ! mountpoint -q /dev/mqueue; then mount -t mqueue mqueue /dev/mqueue; fi
mount --bind "$dir/local" "$local"
mount --bind "$hosts" /etc/hosts
mount --bind "$dir/ld.so.preload" /etc/ld.so.preload
hostname "$node"
exec "$@"
"""
# each node's programs get sandbox/node_source.c (its /etc/ld.so.preload): their loopback
# connections leave from the node's address, which this file in the node's own /run names
NODE_ADDRESS_FILE = "run/tether-sandbox-node-address"
# rootless podman run by hand (the tests' and benchmarks' baseline) keeps its store on the node, as
# a site's storage.conf would: in the user's home (shared by every node) one database would be
# used from every node's own run state and locks
BY_HAND_STORAGE_CONF = '[storage]\ndriver = "vfs"\nrootless_storage_path = "/var/tmp/podman-by-hand-$UID/storage"\n'

# What a fresh Debian 12 machine needs for the sandbox and the plugins built against it.
APT_PACKAGES = ("slurm-wlm", "slurmctld", "slurmd", "slurm-client", "libslurm-dev", "munge",
                "podman", "runc", "conmon", "uidmap", "fuse-overlayfs", "slirp4netns", "catatonit",
                "busybox-static", "python3-dev", "gcc", "docker-registry", "openmpi-bin", "libopenmpi-dev",
                "libpmi2-0-dev", "slurmdbd", "mariadb-server", "mariadb-client", "sudo",
                # squashfs images on podman (sqfs2tar), --container-save=x.sqsh (tar2sqfs); the tests'
                # images (mksquashfs); the cluster image store's images mounted (squashfuse)
                "squashfs-tools-ng", "squashfs-tools", "squashfuse")
# The cluster image store's account (container.cluster_store.account): its service on each node
IMAGE_SERVICE_USER = "tether-images"
IMAGE_SERVICE_SOCKET = "/run/tether-images/images.sock"     # in each node's own /run
# The launcher's service account and the group of users it may act for (sudo policy: tether.launcher)
LAUNCHER_USER, LAUNCHER_GROUP = "tether-launcher", "tether-users"
SUDOERS_DIR = Path("/etc/sudoers.d")
# The accounting database (MariaDB, own data directory and socket, loopback port base + 7) and
# slurmdbd (port base + 6), as sites run them; `tether sandbox up --quick` runs without both and
# without cgroups.
DBD_OFFSET, MARIADB_OFFSET = 6, 7
CGROUP_CONF = """\
# tether sandbox: cgroup v1 (this machine's hierarchy), as sites constrain steps. Three slurmd on
# one host keep apart because Slurm built for multiple slurmd puts each node's cgroups under
# /slurm_<node> (CgroupPrepend's default there, src/plugins/cgroup/v1).
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainRAMSpace=yes
ConstrainSwapSpace=yes
AllowedSwapSpace=0
ConstrainCores=yes
ConstrainDevices=yes
"""
# The sandbox's image registry (Debian's docker-registry, 2.8): on 127.0.0.1 at port base + 5, its
# own config and storage; the images the tests pull are pushed into it by the sandbox.
REGISTRY_OFFSET = 5
REGISTRY_CONFIG = """\
# tether sandbox: the image registry (docker-registry), loopback only
version: 0.1
log:
  level: warn
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {data}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""
# A second registry that asks for a login (htpasswd, bcrypt): private-registry credentials are
# tested against it. Its user's password is made at the first `up` and kept root-only in etc/.
PRIVATE_REGISTRY_OFFSET = 8
PRIVATE_REGISTRY_AUTH = """\
auth:
  htpasswd:
    realm: tether-sandbox
    path: {htpasswd}
"""
PRIVATE_REGISTRY_USER = "tether"
BUSYBOX_REPOSITORY, BUSYBOX_TAG = "tether/busybox", "1"
ENTRYPOINT_REPOSITORY = "tether/entrypoint-env"     # the same files with an ENTRYPOINT and an ENV


# what scontrol calls a job that has ended (IS_JOB_FINISHED; COMPLETING is shown until the epilog is done)
JOB_ENDED_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                              "DEADLINE", "OUT_OF_MEMORY"})


def job_ended(records: list[dict[str, str]]) -> bool:
    """Whether every component of a job (its ``scontrol -o show job`` records) has ended."""
    return bool(records) and all(r.get("JobState") in JOB_ENDED_STATES for r in records)


class SandboxError(TetherError):
    """The sandbox could not be started, checked or stopped; the message says why."""


@dataclass(frozen=True)
class Daemon:
    """A daemon of the sandbox: its name, pid file and the words its command line must contain."""

    name: str
    pid_file: Path
    marker: str  # a string its /proc/PID/cmdline contains (our config or socket path)
    # its /proc/PID/comm when it can run under a PID its pid file does not name: slurmctld 24.11+
    # re-executes itself on `scontrol reconfigure` (a child takes over and rewrites the pid file
    # after telling the parent; under load CI saw the file keep a gone PID, so a restart left the
    # live one running and the new one died on its port). Such a daemon is also stopped by that.
    program: str = ""

    def pid(self) -> int | None:
        """The PID if the pid file names a live process that is this daemon, else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return None
        if self.marker not in cmdline or state == "Z":
            return None
        return pid

    def strays(self) -> list[int]:
        """Live processes of this daemon's ``program`` with its marker on their command line whose
        PID the pid file does not name (none unless ``program`` is set)."""
        if not self.program:
            return []
        named, found = self.pid(), []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == named:
                continue
            try:
                comm = Path(entry.path, "comm").read_text().strip()
                cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if comm == self.program and self.marker in cmdline and state != "Z":
                found.append(int(entry.name))
        return found


class Sandbox:
    """One sandbox cluster rooted at ``root`` (default /var/lib/tether/sandbox)."""

    def __init__(self, root: str | os.PathLike | None = None, port_base: int | None = None,
                 user: str = DEFAULT_USER, slurm: str | None = None, node_prefix: str | None = None,
                 nodes: int | None = None, separate_nodes: bool | None = None,
                 package: str | os.PathLike | None = None):
        self.root = Path(root or os.environ.get(ROOT_ENV) or DEFAULT_ROOT).absolute()
        self._package = Path(package).absolute() if package else None
        if self._package and not (self._package.is_file() and self._package.suffix == ".deb"):
            raise SandboxError(f"--package {package}: not a .deb file (tools/deb.py --slurm-release builds one)")
        self.user = user
        if nodes is not None and not 1 <= nodes <= MAX_NODES:
            raise SandboxError(f"--nodes {nodes}: a sandbox has 1 to {MAX_NODES} nodes (each is a slurmd on this "
                               f"machine)")
        self._nodes = nodes
        self._separate_nodes = separate_nodes
        self._port_base = port_base
        self._slurm = slurm
        self._node_prefix = node_prefix

    # ---- the Slurm release --------------------------------------------------------------------
    def release(self) -> str | None:
        """The Slurm release the sandbox runs in a Debian root of its own ("24.11"), or None for the
        host's Slurm (kept across restarts)."""
        return self._slurm if self._slurm is not None else self._settings().get("slurm") or None

    @property
    def package(self) -> Path | None:
        """tether's Debian package a Slurm root's sandbox installs (``dpkg -i``, the README's admin
        steps), or None: a Slurm root then gets a copy of the running tether (install_tether)."""
        if not self.release():
            return None
        if self._package:
            return self._package
        saved = self._settings().get("package")
        return Path(saved) if saved and Path(saved).is_file() else None

    @property
    def packaged(self) -> bool:
        """tether is (to be) in the sandbox's Slurm root from its Debian package: :attr:`package`,
        or the package another sandbox of the same root installed there."""
        return bool(self.release() and (self.package or self.host_path(PACKAGED_BUILD_STAMP).is_file()))

    @property
    def slurm_root(self) -> SlurmRoot | None:
        release = self.release()
        return SlurmRoot(release, str(self.root)) if release else None

    def wrap(self, argv: list[str], cwd: str | None = None) -> list[str]:
        """``argv`` as it runs against this sandbox's Slurm (inside its root, if it has one)."""
        root = self.slurm_root
        return root.wrap(list(argv), cwd) if root else list(argv)

    def slurm(self, argv: list[str], **kwargs):
        """Run one of Slurm's commands against the sandbox (run_command's keywords)."""
        return run_command(self.wrap(argv, kwargs.get("cwd")), env=self.command_env(), **kwargs)

    def job_records(self, job_id: str) -> list[dict[str, str]]:
        """``scontrol -o show job JOB``: one mapping per line (a heterogeneous job: per component)."""
        out = self.slurm(["scontrol", "-o", "show", "job", str(job_id)], timeout=60).stdout
        return [dict(word.split("=", 1) for word in line.split() if "=" in word)
                for line in out.splitlines() if line.strip()]

    def poll_job(self, job_id: str, timeout: float = 300) -> list[dict[str, str]]:
        """The job's records (``job_records``) once every component has ended (completing included:
        its epilog is done), or the last ones seen when ``timeout`` seconds passed first. Looks
        every 0.2 s."""
        deadline = time.monotonic() + timeout
        while True:
            records = self.job_records(job_id)
            if job_ended(records) or time.monotonic() > deadline:
                return records
            time.sleep(0.2)

    def wait_for_job(self, job_id: str, timeout: float = 300) -> int:
        """Wait until every component of the job has ended (completing included); its exit status as
        ``sbatch --wait`` gives it: the highest over the components, 1 for one a signal ended
        (sbatch.c _job_wait). Looks every 0.2 s: ``sbatch --wait`` sleeps 2 s, then four times as
        long up to 32 s (here: MinJobAge 3600), so it sees a job that took 3 s after 10 s, one
        that took 11 s after 42."""
        records = self.poll_job(job_id, timeout)
        if not job_ended(records):
            states = ", ".join(r.get("JobState", "?") for r in records)
            raise SandboxError(f"job {job_id} has not ended after {timeout:g} s ({states or 'no record'})")
        codes = []
        for record in records:
            status, _, signum = record.get("ExitCode", "0:0").partition(":")
            codes.append(1 if signum not in ("", "0") else int(status))
        return max(codes)

    @property
    def node_prefix(self) -> str:
        """What the node names start with: ``n`` on the host's Slurm, ``r2411n`` on Slurm 24.11, unless
        the sandbox was made with another (kept across restarts)."""
        chosen = self._node_prefix or self._settings().get("node_prefix")
        if chosen:
            return chosen
        release = self.release()
        return f"r{release.replace('.', '')}n" if release else HOST_NODE_PREFIX

    @property
    def node_count(self) -> int:
        """How many nodes: as ``--nodes`` asked, else as the sandbox last ran, else NODE_COUNT."""
        return self._nodes or int(self._settings().get("nodes") or NODE_COUNT)

    @property
    def nodes(self) -> tuple[str, ...]:
        """The node names, in order (``("n1", "n2", "n3")`` on the host's Slurm)."""
        return tuple(f"{self.node_prefix}{i}" for i in range(1, self.node_count + 1))

    @property
    def separate_nodes(self) -> bool:
        """Each node its own host (NODE_DIRS): on unless the sandbox was made without (kept across
        restarts; ``up --shared-nodes``: one host for all, as before issue 46)."""
        if self._separate_nodes is not None:
            return self._separate_nodes
        return bool(self._settings().get("separate_nodes", True))

    def node_address(self, node: str) -> str:
        """The node's NodeAddr: 127.0.0.<i+1> for the i-th node (127.0.0.1, the login and controller
        host's, with shared nodes). Every node resolves every node's name to it (its /etc/hosts),
        and its programs' loopback connections leave from it (NODE_SOURCE), as from a real host."""
        return f"127.0.0.{self.nodes.index(node) + 2}" if self.separate_nodes else "127.0.0.1"

    def node_dir(self, node: str) -> Path:
        """Where the node's own /tmp, /var/tmp, /run, /dev/shm and local directory are on this host."""
        return self.root / "nodes" / node

    @property
    def local_dir(self) -> Path:
        """The node-local directory (each node's own at this path: NODE_DIRS): the image stores."""
        return self.root / "local"

    def hosts_file(self, node: str) -> Path:
        """The node's /etc/hosts (NODE_ENTER binds it): the host's (or the Slurm root's) plus each
        node's name and address."""
        return self.node_dir(node) / "hosts"

    def node_path(self, node: str | None, path: str | os.PathLike) -> Path:
        """Where ``path`` as the node's jobs see it is on this host: in the node's own directory
        for its /tmp, /var/tmp, /run, /dev/shm and local directory, else as :meth:`host_path`.
        ``node`` None: the first node."""
        node = node or self.nodes[0]
        path = Path(path)
        if self.separate_nodes:
            for sub, _, _ in NODE_DIRS:
                inside = self.local_dir if sub == "local" else Path("/", sub)
                if path == inside or inside in path.parents:
                    return self.node_dir(node) / sub / path.relative_to(inside)
        return self.host_path(path)

    def on_node(self, node: str | None, argv: list[str], cwd: str = "/") -> list[str]:
        """``argv`` run on ``node`` (None: the first): in its slurmd's mount and UTS namespaces
        (its own /tmp, /run, ... and hostname; in a Slurm root: that root), in ``cwd`` there. Runs
        as it is, or through :meth:`wrap` (nsenter leaves the root's namespace for the node's)."""
        node = node or self.nodes[0]
        pid = self._pid_of(f"slurmd-{node}")
        if pid is None:
            raise SandboxError(f"node {node} is not running (no slurmd): start the sandbox first")
        if not _is_roots_slurmd(pid):
            # a pid file left by a dead slurmd may name a user's process by now: root must never
            # enter namespaces a user made (its binds would give root the user's programs)
            raise SandboxError(f"node {node}: pid {pid} is not root's slurmd in this user namespace; "
                               f"restart the sandbox")
        # --root: the node's root (in a Slurm root, the root slurmd pivoted into); the directory
        # changed to in there (nsenter's --wd=DIR opens DIR before it enters: the host's view)
        return ["nsenter", "--target", str(pid), "--mount", "--uts", "--root", "--", "env", "-C", cwd, *argv]

    def host_path(self, path: str | os.PathLike) -> Path:
        """Where ``path`` as the sandbox's jobs see it is on this host: the same, except in a Slurm
        root outside the sandbox directory (the root's own /tmp, /var/tmp, /home)."""
        path = Path(path)
        root = self.slurm_root
        if root is None or path == self.root or self.root in path.parents:
            return path
        return root.path / path.relative_to("/")

    @property
    def python(self) -> str:
        """The Python that has tether where the sandbox's jobs run: this one, or the root's."""
        return slurmroot.PYTHON if self.release() else sys.executable

    @property
    def tether(self) -> list[str]:
        """tether's command where the sandbox's jobs run (run it through ``wrap``): this Python's
        ``tether``, or the one install_tether put in the root."""
        if self.packaged:
            return [slurmroot.PACKAGED_TETHER]
        return [slurmroot.TETHER_PROGRAM if self.release() else str(Path(sys.executable).with_name("tether"))]

    # ---- layout -------------------------------------------------------------------------
    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def plugstack_conf(self) -> Path:
        return self.etc / "plugstack.conf"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def plugin_dir(self) -> Path:
        """Where tether's plugins for this sandbox go (searched after the system PluginDir)."""
        return self.root / "plugins"

    @property
    def work_dir(self) -> Path:
        """A world-writable (sticky) directory for job scripts and output of the demo/test user."""
        return self.root / "work"

    @property
    def tether_conf(self) -> Path:
        """The tether config the sandbox's daemons read (their $TETHER_CONFIG)."""
        return self.etc / "tether.yaml"

    @property
    def mariadb_dir(self) -> Path:
        return self.root / "mariadb"

    @property
    def slurmdbd_conf(self) -> Path:
        """Where slurmdbd finds its config: beside slurm.conf (it reads $SLURM_CONF's directory)."""
        return self.etc / "slurmdbd.conf"

    def quick(self) -> bool:
        """A quick sandbox: no accounting database, no cgroups (kept across restarts)."""
        return bool(self._settings().get("quick", False))

    @property
    def registry_conf(self) -> Path:
        return self.etc / "registry.yml"

    @property
    def registry_address(self) -> str:
        """``127.0.0.1:PORT`` of the sandbox's registry."""
        return f"127.0.0.1:{self.port_base() + REGISTRY_OFFSET}"

    @property
    def build_dir(self) -> Path:
        return self.root / "build"

    @property
    def settings_file(self) -> Path:
        return self.root / "sandbox.json"

    def env(self) -> dict[str, str]:
        """Variables that point Slurm's commands, and tether's (``tether config check``, ``tether
        plan``, ``tether run``), at this sandbox's configuration."""
        return {"SLURM_CONF": str(self.slurm_conf), "TETHER_CONFIG": str(self.tether_conf)}

    def command_env(self) -> dict[str, str]:
        """os.environ plus :meth:`env`, for running Slurm commands against the sandbox."""
        return {**os.environ, **self.env()}

    def daemon_env(self) -> dict[str, str]:
        """The daemons' environment: the sandbox's Slurm config and tether config."""
        return {**self.command_env(), "TETHER_CONFIG": str(self.tether_conf)}

    # ---- tether's plugins -------------------------------------------------------------------
    def admin_commands(self) -> list[list[str]]:
        """The README's "The Slurm plugins" commands as this sandbox runs them: ``tether slurm
        build`` and ``tether slurm install --write``, pointed at its own build directory,
        slurm.conf and PluginDir (tests/unit/test_readme.py holds the two together). With tether's
        Debian package (:meth:`package_command` ran first): the package section's ``tether config
        check`` and ``tether slurm install --write``, which writes the lines for the package's plugins."""
        if self.packaged:
            return [["tether", "config", "check"],
                    ["tether", "slurm", "install", "--slurm-conf", str(self.slurm_conf), "--write"]]
        out = str(self.plugin_build_dir)
        return [["tether", "slurm", "build", "--out", out],
                ["tether", "slurm", "install", "--build-dir", out, "--slurm-conf", str(self.slurm_conf),
                 "--plugin-dir", str(self.plugin_dir), "--write"]]

    def package_command(self, deb_in_root: str) -> list[str]:
        """The README's install of the package on a host: ``dpkg -i`` (all it depends on is in the root)."""
        return ["dpkg", "-i", deb_in_root]

    def install_package(self) -> None:
        """tether's Debian package into the sandbox's Slurm root, the way an admin installs it
        (:meth:`package_command`), over whatever an earlier sandbox put there."""
        root, deb = self.slurm_root, self.package
        root.remove_copied_tether()
        # in root's own home in the root (0700): the root's /var/tmp is its job users' too
        inside = f"/root/tether-package-{os.getpid()}/{deb.name}"
        staged = root.path / inside.lstrip("/")
        shutil.rmtree(staged.parent, ignore_errors=True)
        staged.parent.mkdir(mode=0o700)
        shutil.copy(deb, staged)
        try:
            root.run(self.package_command(inside), timeout=600)
        except CommandError as exc:
            raise SandboxError(f"installing tether's package {deb.name} in the Slurm {self.release()} root: {exc}") \
                from None
        finally:
            shutil.rmtree(staged.parent, ignore_errors=True)

    def claim_package_config(self) -> None:
        """The sandbox's tether.yaml where tether's package reads it in the root, as its admin puts
        it (``/etc/tether/tether.yaml``: the packaged launcher was built for that path and ignores
        a ``$TETHER_CONFIG``, which a job could set): a link to the sandbox's file, which the tests
        change. A root is one host with one config: a second sandbox started on the same root
        takes the link over (``up`` runs this), and the first claims it back after (and
        :meth:`install_plugins` again: the launcher in the root is baked for one config file)."""
        target = self.host_path(PACKAGED_CONFIG)
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to(self.tether_conf)

    def loaded_plugin_dir(self) -> Path:
        """Where the plugins this sandbox's Slurm loads are, as a path on this host: the package's
        directory in the root, or the sandbox's own plugin directory."""
        if self.packaged:
            stamp = packaged_stamp(str(self.host_path(PACKAGED_BUILD_STAMP)))
            if stamp:
                return self.host_path(stamp["plugin_dir"])
        return self.plugin_dir

    def install_plugins(self, *, log=print) -> None:
        """Build and install tether's plugins into this sandbox the way an admin does: the
        :meth:`admin_commands`, with the ``tether`` an admin installed (in a Slurm root, the
        root's; on this host, the one beside the running Python: ``make install``'s)."""
        # with tether's package the config is where its admin puts it (claim_package_config), and
        # the launcher `tether slurm install --write` builds is baked for that path
        env = {**self.env(), "TETHER_CONFIG": ""} if self.packaged else self.env()
        for argv in self.admin_commands():
            try:
                if self.slurm_root:
                    self.slurm_root.run(argv, env=env, timeout=600)
                else:
                    program = Path(sys.executable).parent / "tether"
                    run_command([str(program) if program.exists() else "tether", *argv[1:]],
                                env=self.command_env(), timeout=600)
            except CommandError as exc:
                raise SandboxError(f"installing tether's plugins: {exc}") from None

    @property
    def plugin_build_dir(self) -> Path:
        """Where the plugins for this sandbox's Slurm are built (``tether slurm build --out``)."""
        release = self.release()
        return self.build_dir / f"slurm-{release}" if release else self.build_dir

    def tether_settings(self) -> dict:
        """The sandbox's tether config: its own job storage root and image cache; podman as the
        container runtime, with the settings this machine needs (runc; no default ulimits)."""
        return {
            "job_storage_root": str(self.root / "jobs"),
            "container": {
                "runtime": "podman",
                "apptainer_image_root": str(self.root / "images"),
                # the stores in the sandbox's own directory (never the paths real jobs use), in
                # the default's form: <root>/users/<uid>, made by root (the SPANK plugin) for the user
                "podman": {"args": ["--runtime", "runc"], "cdi_kind": FAKE_GPU_CDI_KIND,
                           "store": str(self.store_base / "{uid}" / "podman"),
                           "env": {"CONTAINERS_CONF": str(self.etc / "containers.conf"),
                                   "CONTAINERS_REGISTRIES_CONF": str(self.etc / "registries.conf")}},
                "enroot": {"store": str(self.store_base / "{uid}" / "enroot")},
            },
            "gateways": {"partition": "gateway",
                         "daemon": [self.python, "-m", "tether.sandbox.gateway_daemon", "--port", "{port}",
                                    "--node", "{node}"]},
            "launcher": {"agent": str(self.root / "bin" / "tether-agent"),
                         "state_root": str(self.root / "launcher-state"), "service_user": LAUNCHER_USER,
                         "users_group": LAUNCHER_GROUP, "socket": str(self.launcher_socket)},
        }

    @property
    def store_base(self) -> Path:
        """Where the users' image stores are: node-local (each node its own), in the sandbox's
        own directory (never the paths real jobs use)."""
        return (self.local_dir if self.separate_nodes else self.root) / "users"

    @property
    def launcher_socket(self) -> Path:
        """``tether serve``'s socket in the sandbox (a directory only the service account enters)."""
        return self.root / "run" / "launcher" / "launcher.sock"

    @property
    def launcher_sudoers(self) -> Path:
        """This sandbox's sudo policy file (one per sandbox: each names its own agent; sudoers.d
        skips names with a '.')."""
        return SUDOERS_DIR / ("tether-" + "".join(c if c.isalnum() or c in "_-" else "_" for c in self.root.name))

    def install_launcher(self, *, log=print) -> None:
        """The launcher as an admin sets it up, once its accounts exist (``_launcher_accounts``, which
        ``up`` runs before a Slurm root copies the host's accounts): ``tether launcher install --apply``
        (the agent, the sudo policy, the job root, the state directory), in the root if there is
        one, and a directory for its socket."""
        from ..launcher.install import apply

        (self.root / "bin").mkdir(mode=0o755, exist_ok=True)
        if self.slurm_root:        # in the root, with its Python and sudo (the accounts were copied in)
            self.slurm_root.run(["python3", "-c", "import sys; from tether.hooks.configfile import load_config; "
                                 "from tether.launcher.install import apply; "
                                 "apply(load_config(sys.argv[1]), sudoers=sys.argv[2])",
                                 str(self.tether_conf), str(self.launcher_sudoers)], timeout=120)
        else:
            apply(load_config(str(self.tether_conf)), sudoers=str(self.launcher_sudoers))
        service = pwd.getpwnam(LAUNCHER_USER)
        self.launcher_socket.parent.mkdir(parents=True, exist_ok=True)
        os.chown(self.launcher_socket.parent, service.pw_uid, service.pw_gid)
        os.chmod(self.launcher_socket.parent, 0o700)

    def _launcher_accounts(self, *, log=print) -> None:
        """The launcher's service account and the group of users it may act for (the job user)."""
        ensure_user(LAUNCHER_USER, log=log)
        try:
            grp.getgrnam(LAUNCHER_GROUP)
        except KeyError:
            run_command(["groupadd", LAUNCHER_GROUP], timeout=60)
        if self.user not in grp.getgrnam(LAUNCHER_GROUP).gr_mem:
            run_command(["usermod", "-a", "-G", LAUNCHER_GROUP, self.user], timeout=60)

    # ---- the cluster image store (container.cluster_store) ------------------------------------
    def cluster_store_settings(self) -> dict:
        """container.cluster_store for this sandbox: the store in its shared directory, the
        service's scratch store on each node's own disk."""
        return {"root": str(self.root / "cluster-store"), "account": IMAGE_SERVICE_USER,
                "socket": IMAGE_SERVICE_SOCKET, "scratch": str(self.local_dir / "image-service")}

    def start_image_services(self, config: str | os.PathLike, *, log=print) -> list[int]:
        """The image service on every node as an admin runs it (tether images setup, then tether
        images serve as the store's account, here with --listen: the nodes have no systemd), with
        ``config`` (one whose container.cluster_store is cluster_store_settings). FUSE opened to
        users as udev does on a node (/dev/fuse 0666). Their pids (stop_image_services)."""
        ensure_user(IMAGE_SERVICE_USER, log=log)
        if self.slurm_root:
            self.slurm_root.copy_accounts()
        account = pwd.getpwnam(IMAGE_SERVICE_USER)
        os.chmod("/dev/fuse", 0o666)
        store = Path(self.cluster_store_settings()["root"])
        if not store.exists():
            store.mkdir(mode=0o755)
            os.chown(store, account.pw_uid, account.pw_gid)
        run_command(self.wrap([*self.tether, "images", "setup", "--config", str(config)]), timeout=120)
        pids = []
        for node in self.nodes:
            for path in (self.node_path(node, os.path.dirname(IMAGE_SERVICE_SOCKET)),
                         self.node_path(node, self.cluster_store_settings()["scratch"])):
                path.mkdir(mode=0o755, parents=True, exist_ok=True)
                os.chown(path, account.pw_uid, account.pw_gid)
            log_file = open(self.log_dir / f"image-service-{node}.log", "ab")
            proc = subprocess.Popen(self.on_node(node, ["runuser", "-u", IMAGE_SERVICE_USER, "--", *self.tether,
                                                        "images", "serve", "--listen", IMAGE_SERVICE_SOCKET,
                                                        "--config", str(config)]),
                                    stdout=log_file, stderr=log_file, stdin=subprocess.DEVNULL, start_new_session=True)
            log_file.close()
            pids.append(proc.pid)
            (self.run_dir / f"image-service-{node}.pid").write_text(f"{proc.pid}\n")
        for node in self.nodes:
            sock = self.node_path(node, IMAGE_SERVICE_SOCKET)
            deadline = time.monotonic() + 30
            while not sock.exists():
                if time.monotonic() > deadline:
                    raise SandboxError(f"the image service on {node} did not start: see "
                                       f"{self.log_dir / f'image-service-{node}.log'}")
                time.sleep(0.1)
        return pids

    @contextlib.contextmanager
    def cluster_store_on(self):
        """The sandbox's config with container.cluster_store (cluster_store_settings) and the
        nodes' image services, for the time of a ``with``; then the config as it was, the services
        stopped and the store emptied. Yields the store's root."""
        conf = self.tether_conf
        original = conf.read_text()
        settings = yaml.safe_load(original)
        settings["container"]["cluster_store"] = self.cluster_store_settings()
        conf.write_text(yaml.safe_dump(settings))
        try:
            self.start_image_services(conf, log=lambda *_: None)
            yield self.cluster_store_settings()["root"]
        finally:
            self.stop_image_services()
            conf.write_text(original)
            _remove_tree(Path(self.cluster_store_settings()["root"]))

    def stop_image_services(self) -> None:
        """End the nodes' image services (by the pids start_image_services recorded)."""
        for node in self.nodes:
            record = self.run_dir / f"image-service-{node}.pid"
            try:
                pid = int(record.read_text())
            except (OSError, ValueError):
                continue
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            for _ in range(50):
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.1)
            record.unlink(missing_ok=True)
        # and the pause process the services' podman made on each node (the account's own run
        # directory: fetcher_for), which outlives them: nothing of theirs stays on a node
        run = os.path.join(os.path.dirname(IMAGE_SERVICE_SOCKET), "podman")
        for root in self._node_roots():
            slurmroot.end_pause_processes(root, (IMAGE_SERVICE_USER,), run_dirs=(run,))

    def user_podman(self, node: str | None = None) -> list[str]:
        """The job user's podman as jobs run it on ``node`` (None: the first): the sandbox's podman
        env and args and the user's tether store there (container.podman.store), through
        ``runuser``, in the node's namespaces (:meth:`on_node`; run it directly, or through
        Cluster.run, whose :meth:`wrap` it tolerates)."""
        settings = self.tether_settings()["container"]["podman"]
        uid = pwd.getpwnam(self.user).pw_uid
        return self.on_node(node, ["runuser", "-u", self.user, "--", "env", *self.podman_env(node), "podman",
                                   *Podman(settings).global_args({}, uid=uid)])

    def podman_env(self, node: str | None = None) -> list[str]:
        """``NAME=VALUE`` of podman's environment as tether's launcher gives the job user's podman
        on ``node`` (None: any node -- podman by hand under srun): the config's, podman's run
        directory (Podman.run_dir, made as root would make it there: on every node for None) and
        the by-hand store's storage.conf. Any podman of that user on the node -- by hand too --
        runs with it: one run state (libpod resets the user's shared locks when it meets a second
        one), which tether's repair keeps working."""
        settings = self.tether_settings()["container"]["podman"]
        account = pwd.getpwnam(self.user)
        for each in ([node] if node else self.nodes):
            self.user_dirs(account.pw_uid, account.pw_gid, each)
        return [*(f"{k}={v}" for k, v in settings["env"].items()),
                f"CONTAINERS_STORAGE_CONF={self.etc / 'storage-by-hand.conf'}",
                f"XDG_RUNTIME_DIR={Podman(settings).run_dir(account.pw_uid)}"]

    def user_dirs(self, uid: int, gid: int, node: str | None = None) -> None:
        """The user's own directories on ``node`` (None: the first), as the SPANK plugin makes
        them as root at a container step (jobdirs.c tether_ensure_user_dirs): for podman run by
        hand as the user with the store and run directory jobs use."""
        for base in self._user_dir_bases():
            os.makedirs(self.node_path(node, base), mode=0o755, exist_ok=True)
            mine = self.node_path(node, base) / str(uid)
            if not mine.exists():
                mine.mkdir(mode=0o700)
                os.chown(mine, uid, gid)

    def add_job_user(self, name: str) -> int:
        """A job user who never ran anything (issue 46: a new user's first job on cold nodes):
        created with useradd (home, shell, subordinate ids, as Debian's useradd gives them), known
        in the Slurm root too; nothing of theirs on any node. Their uid."""
        ensure_user(name, log=lambda *_: None)
        if self.slurm_root:
            self.slurm_root.copy_accounts()
            self.slurm_root.make_home(name)
        return pwd.getpwnam(name).pw_uid

    def _user_dir_bases(self) -> list[str]:
        """Where root makes each user's own directory on a node (the config's user_dir_bases)."""
        return load_config(str(self.tether_conf)).user_dir_bases() if self.tether_conf.exists() else []

    def remove_job_user(self, name: str) -> None:
        """Undo :meth:`add_job_user` once their jobs ended: their pause processes, what the nodes
        keep for their uid (the stores, the run directories: a later user given the same uid must
        find nothing), then the account and its home."""
        uid = pwd.getpwnam(name).pw_uid
        for root in self._node_roots():
            slurmroot.end_pause_processes(root, (name,))
        bases = self._user_dir_bases()
        for node in self.nodes:
            # theirs under tether's bases, and podman's own run directories in the node's /tmp
            for mine in [self.node_path(node, base) / str(uid) for base in bases] + \
                    list(self.node_path(node, "/tmp").glob(f"*-run-{uid}")):
                _remove_tree(mine)
        if self.slurm_root:
            _remove_tree(self.slurm_root.path / pwd.getpwnam(name).pw_dir.lstrip("/"))
        gone = run_command(["userdel", "--remove", name], timeout=60, check=False)
        if gone.returncode not in (0, 12):        # 12: the home could not be removed (only that)
            raise SandboxError(f"userdel {name}: {gone.stderr.strip() or f'exit {gone.returncode}'}")
        if self.slurm_root:
            self.slurm_root.copy_accounts()

    def bare_busybox_image(self) -> str:
        """busybox and nothing else (no /etc, no mount targets): a rootfs as users download them,
        root-owned and read-only to users. Built once."""
        root = self.root / "images" / "bare-busybox"
        if not (root / "bin" / "mkdir").exists():
            tmp = root.with_name(f".{root.name}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)
            (tmp / "bin").mkdir(parents=True)
            shutil.copy2("/bin/busybox", tmp / "bin" / "busybox")
            for applet in ("sh", "ls", "cat", "id", "echo", "touch", "test", "true", "mkdir"):
                (tmp / "bin" / applet).symlink_to("busybox")
            for path in (tmp.parent, tmp, tmp / "bin"):
                os.chmod(path, 0o755)
            tmp.rename(root)
        return str(root)

    def busybox_image(self) -> str:
        """A busybox root filesystem under ``<root>/images``: root-owned and read-only to users, as
        an admin's shared image directory is (podman runs it through an overlay). Built once."""
        root = self.root / "images" / "busybox-rootfs"
        if not (root / "mnt").is_dir():
            build_busybox_rootfs(root)
        return str(root)

    def mpi_image(self) -> str:
        """The busybox image plus OpenMPI and libpmi2 (from the host's packages), ``tether-mpi-ping``
        and ``tether-pmi2-ping``: the image MPI tests run in. Built once."""
        root = self.root / "images" / "mpi-rootfs"
        if not all((root / p.lstrip("/")).exists() for p in (MPI_PING, PMI2_PING, "/usr/share/openmpi")):
            build_busybox_rootfs(root, extra=add_mpi)
        return str(root)

    def restart_slurmctld(self, timeout: float = 60.0) -> None:
        """Restart slurmctld keeping its state (jobs, nodes): how a changed plugin .so gets loaded."""
        _stop(next(d for d in self.daemons() if d.name == "slurmctld"))
        self._start(["slurmctld", "-f", str(self.slurm_conf)], "slurmctld")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.slurm(["scontrol", "ping"], check=False, timeout=15).stdout.count("UP"):
                self.wait_idle(max(1.0, deadline - time.monotonic()), busy_ok=True)
                return
            time.sleep(0.2)
        raise SandboxError(f"slurmctld did not answer within {timeout:g} s after a restart\n"
                           f"{self.log_tails()}")

    def set_job_submit_plugins(self, plugins: str | None) -> None:
        """Switch slurm.conf's JobSubmitPlugins (None: none) and make slurmctld reload it."""
        line = f"JobSubmitPlugins={plugins}" if plugins else None
        set_conf_line(self.slurm_conf, r"JobSubmitPlugins\s*=", line)
        self.slurm(["scontrol", "reconfigure"], timeout=60)

    def daemons(self) -> list[Daemon]:
        """The sandbox's daemons in start order (registry, munged, slurmctld, slurmd n1..n3)."""
        conf = str(self.slurm_conf)
        accounting = [] if self.quick() else [
            Daemon("mariadb", self.mariadb_dir / "mariadb.pid", str(self.mariadb_dir / "data")),
            # slurmdbd takes no config path (it reads $SLURM_CONF's directory): its pid file is ours
            Daemon("slurmdbd", self.run_dir / "slurmdbd.pid", "slurmdbd")]
        return ([Daemon("registry", self.run_dir / "registry.pid", str(self.registry_conf)),
                 Daemon("private-registry", self.run_dir / "private-registry.pid", str(self.private_registry_conf)),
                 Daemon("munged", self.munge_dir / "munged.pid", str(self.munge_socket)),
                 *accounting,
                 Daemon("slurmctld", self.run_dir / "slurmctld.pid", conf, program="slurmctld")]
                + [Daemon(f"slurmd-{n}", self.run_dir / f"slurmd-{n}.pid", conf) for n in self.nodes])

    # ---- settings -----------------------------------------------------------------------
    def _settings(self) -> dict:
        try:
            return json.loads(self.settings_file.read_text())
        except (OSError, ValueError):
            return {}

    def port_base(self) -> int:
        """Ports: slurmctld at base, the registry +5, slurmdbd +6, MariaDB +7, the private registry +8,
        slurmd n1, n2, ... from base+10 on (kept across restarts)."""
        if self._port_base is not None:
            return self._port_base
        return int(self._settings().get("port_base", DEFAULT_PORT_BASE))

    # ---- lifecycle ----------------------------------------------------------------------
    def install(self, *, log=print) -> None:
        """Install the Debian packages the sandbox needs and create its job user (no daemons)."""
        _require_root()
        ensure_packages(APT_PACKAGES, log=log)
        ensure_user(self.user, log=log)

    def up(self, *, install: bool = True, plugins: bool = True, timeout: float = 90.0,
           quick: bool | None = None, log=print) -> None:
        """Install what is missing, write the configs, build and install tether's plugins the way
        an admin does (``tether slurm build`` / ``tether slurm install --write``), start the
        daemons and wait for idle nodes. ``quick``: without the accounting database and cgroups
        (None: as the sandbox was last started; a new one has both)."""
        if install:
            self.install(log=log)
        _require_root()
        if quick is not None and quick != self.quick() and self.running():
            log(f"restarting the sandbox at {self.root} {'without' if quick else 'with'} accounting and cgroups")
            self.down(log=log)
        if self._nodes is not None and self._nodes != int(self._settings().get("nodes") or NODE_COUNT) \
                and self.running():
            log(f"restarting the sandbox at {self.root} with {self._nodes} nodes")
            self.down(log=log)
        if self.running():
            log(f"sandbox already running at {self.root}")
            if self.packaged:          # the root's config is this sandbox's (another may have had it)
                self.claim_package_config()
            self.wait_idle(timeout)
            return
        self.stop_daemons(log=lambda *_: None)  # leftovers of a half-started sandbox
        if quick is None:
            quick = self.quick()
        elif quick != self.quick() and self.settings_file.exists():
            # accounting switched on or off: slurmctld's state names the cluster id it last ran
            # with, the database another (or none); the state is this sandbox's alone, so its
            # record goes, as slurmctld's own fatal message advises ("CLUSTER ID MISMATCH")
            (self.root / "state" / "clustername").unlink(missing_ok=True)
        release = self.release()
        port_base = self._choose_ports()
        ensure_user(self.user, log=log)
        self._make_layout()
        separate = self.separate_nodes
        self.settings_file.write_text(json.dumps({"port_base": port_base, "user": self.user, "quick": quick,
                                                  "slurm": release, "node_prefix": self.node_prefix,
                                                  "nodes": self.node_count, "separate_nodes": separate,
                                                  "package": str(self.package) if self.package else None}) + "\n")
        self._launcher_accounts(log=log)
        if self.slurm_root:
            self.slurm_root.ensure(log=log)
            # the node names resolve, as on a real cluster (the job's tools -- srun -w, hostname
            # lists, MPI -- use them; MASTER_ADDR is the first node's NodeAddr)
            self.slurm_root.prepare(hosts=self._node_hosts(), users=(self.user,))
            self.slurm_root.end_user_namespaces((self.user,))
            # the fake GPUs' CDI spec where the root's podman looks (the devices: its /dev is the host's)
            cdi = self.slurm_root.path / FAKE_GPU_CDI_SPEC.relative_to("/")
            cdi.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            shutil.copy(FAKE_GPU_CDI_SPEC, cdi)
            if self.package:
                self.install_package()
            elif self.packaged:
                log(f"tether's package is installed in the Slurm {release} root already")
            else:
                log(f"no --package: tether copied into the Slurm {release} root (an admin installs its package: "
                    f"tools/deb.py --slurm-release {release})")
                self.slurm_root.install_tether()
        self._write_configs(port_base)
        if self.packaged:
            self.claim_package_config()
        elif self.slurm_root and self.host_path(PACKAGED_CONFIG).is_symlink():
            self.host_path(PACKAGED_CONFIG).unlink()      # an earlier packaged sandbox's link
        self.install_launcher(log=log)
        self._boot_nodes()
        if plugins:
            self.install_plugins(log=log)
        try:
            self._start_registry()
            self._start_munged()
            if not quick:
                self._start_mariadb(port_base + MARIADB_OFFSET)
                self._start_slurmdbd(port_base + DBD_OFFSET)
            self._start(["slurmctld", "-f", str(self.slurm_conf)], "slurmctld")
            for node in self.nodes:
                (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
                self._start(self.node_wrap(node, ["slurmd", "-f", str(self.slurm_conf), "-N", node]),
                            f"slurmd-{node}", wrapped=True)
            # jobs of an earlier life whose processes were killed outright (a crash, a machine
            # restored from a snapshot) stay "running" in slurmctld's saved state and keep their
            # nodes busy for minutes: a sandbox starting afresh cancels them
            self._cancel_all_jobs(log=log)
            self.wait_idle(timeout)
        except SandboxError as exc:
            tails = self.log_tails()
            self.stop_daemons(log=lambda *_: None)
            raise SandboxError(f"{exc}\n{tails}") from None
        extra = ("quick: no accounting, no cgroups" if quick else
                 f"slurmdbd {port_base + DBD_OFFSET}, MariaDB {port_base + MARIADB_OFFSET}, cgroups")
        log(f"sandbox up: {self.root} (slurmctld port {port_base}, slurmd ports "
            f"{port_base + SLURMD_OFFSET}-{port_base + SLURMD_OFFSET + self.node_count - 1}, registry {self.registry_address}, {extra}); "
            f"{self.export_line()}")

    def down(self, *, purge: bool = False, log=print) -> list[str]:
        """Cancel the sandbox's jobs, stop its daemons by PID; ``purge`` removes the directory."""
        _require_root()
        if self.root.exists() and self._pid_of("slurmctld"):
            self._cancel_all_jobs()
        stopped = self.stop_daemons(log=log)
        if self.slurm_root and self.slurm_root.path.exists():
            self.slurm_root.end_user_namespaces((self.user,))
            # the fake GPUs' CDI spec where the root's podman looks (the devices: its /dev is the host's)
            cdi = self.slurm_root.path / FAKE_GPU_CDI_SPEC.relative_to("/")
            cdi.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            shutil.copy(FAKE_GPU_CDI_SPEC, cdi)
        if self.root.exists():
            self.cool_nodes()      # a pause process would keep a node's namespace (and mounts) alive
        if purge and self.root.exists():
            shutil.rmtree(self.root)
            self.launcher_sudoers.unlink(missing_ok=True)
            log(f"removed {self.root}")
        return stopped

    def running(self) -> bool:
        """True if every daemon of the sandbox is alive."""
        return self.root.exists() and all(d.pid() for d in self.daemons())

    def status(self) -> dict:
        """Daemons (pid or None), ports and node states, as a mapping."""
        info = {"root": str(self.root), "slurm_conf": str(self.slurm_conf),
                "port_base": self.port_base(),
                "daemons": {d.name: d.pid() for d in self.daemons()}, "nodes": {}}
        if info["daemons"]["slurmctld"]:
            info["nodes"] = self.node_states()
        return info

    def node_states(self) -> dict[str, str]:
        """``{node: "idle"|"alloc"|...}`` from sinfo (empty if slurmctld does not answer)."""
        try:
            out = self.slurm(["sinfo", "-h", "-N", "-o", "%N %T %G"], timeout=15).stdout
        except CommandError:
            return {}
        states = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 2:
                states[parts[0]] = parts[1] + (f" {parts[2]}" if len(parts) > 2 else "")
        return states

    def wait_idle(self, timeout: float = 90.0, *, busy_ok: bool = False) -> None:
        """Wait until all nodes are idle (or, with ``busy_ok``, up and running jobs); fail early on
        a drained or invalid node."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        usable = ("idle", "alloc", "mixed", "completing") if busy_ok else ("idle",)
        nodes = self.nodes
        while time.monotonic() < deadline:
            states = self.node_states()
            plain = {n: s.split()[0].rstrip("*~#$@+-") for n, s in states.items()}
            if set(plain) >= set(nodes) and all(plain[n] in usable for n in nodes):
                return
            bad = {n: s for n, s in plain.items() if s.startswith(("drain", "inval", "fail"))}
            if bad:
                reasons = self.slurm(["sinfo", "-R", "-h"], check=False, timeout=15).stdout.strip()
                raise SandboxError(f"sandbox nodes not usable: {bad}; reasons: {reasons}")
            time.sleep(0.3)
        raise SandboxError(f"sandbox nodes did not become idle within {timeout:g} s: {states}")

    def stop_daemons(self, *, log=print) -> list[str]:
        """SIGTERM each live daemon (slurmd first, munged last), SIGKILL after 15 s."""
        stopped = []
        for daemon in reversed(self.daemons()):
            pid = _stop(daemon)
            daemon.pid_file.unlink(missing_ok=True)
            if pid is None:
                continue
            stopped.append(f"{daemon.name} (pid {pid})")
            log(f"stopped {daemon.name} (pid {pid})")
        return stopped

    def log_tails(self, lines: int = 30) -> str:
        """The last lines of every daemon log, for failure reports."""
        out = []
        for path in sorted(self.log_dir.glob("*.log")) + [self.munge_dir / "munged.log"]:
            try:
                text = [line for line in path.read_text(errors="replace").splitlines()
                        if " Info: " not in line][-lines:]   # munged's per-credential chatter
            except OSError:
                continue
            out.append(f"----- {path} (last {len(text)} lines) -----\n" + "\n".join(text))
        return "\n".join(out)

    def export_line(self) -> str:
        """The sandbox's variables as one line of shell (``eval "$(tether sandbox env)"``)."""
        return "; ".join(f"export {k}={shlex.quote(v)}" for k, v in self.env().items())

    # ---- internals ----------------------------------------------------------------------
    def _pid_of(self, name: str) -> int | None:
        return next((d.pid() for d in self.daemons() if d.name == name), None)

    def _choose_ports(self) -> int:
        wanted = self.port_base()
        count = self.node_count
        if _ports_free(wanted, count, self.separate_nodes):
            return wanted
        if self._port_base is not None:
            raise SandboxError(f"ports {wanted}-{wanted + SLURMD_OFFSET + count - 1} on loopback are in use; "
                               f"choose another --port-base")
        for base in range(wanted + PORT_BLOCK, wanted + 20 * PORT_BLOCK, PORT_BLOCK):
            if _ports_free(base, count, self.separate_nodes):
                return base
        raise SandboxError(f"no free ports near {wanted} on loopback")

    def _make_layout(self) -> None:
        for sub in ("etc", "state", "spool", "log", "run", "plugins", "dev", "jobs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
            os.chmod(self.root / sub, 0o755)
        os.chmod(self.root, 0o755)
        for parent in self.root.parents:
            if parent.exists() and stat.S_IMODE(parent.stat().st_mode) & 0o005 != 0o005:
                raise SandboxError(f"{parent} is not readable by other users; munge and job users "
                                   f"need to reach {self.root}")
        self.work_dir.mkdir(exist_ok=True)
        os.chmod(self.work_dir, 0o1777)
        write_fake_gpus()
        munge = pwd.getpwnam("munge")
        self.munge_dir.mkdir(exist_ok=True)
        os.chown(self.munge_dir, munge.pw_uid, munge.pw_gid)
        os.chmod(self.munge_dir, 0o755)
        key = self.munge_dir / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as fh:
                fh.write(os.urandom(1024))
            os.chown(key, munge.pw_uid, munge.pw_gid)

    def _node_hosts(self) -> str:
        """/etc/hosts lines naming each node at its address."""
        return "".join(f"{self.node_address(node)} {node}\n" for node in self.nodes)

    def node_wrap(self, node: str, argv: list[str]) -> list[str]:
        """``argv`` (slurmd) started as ``node``: in a mount and UTS namespace of its own whose
        /tmp, /var/tmp, /run, /dev/shm and local directory are the node's (NODE_ENTER), in the
        sandbox's Slurm root if it has one."""
        if not self.separate_nodes:
            return self.wrap(argv)
        inner = ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", NODE_ENTER, "tether-node",
                 node, str(self.node_dir(node)), str(self.hosts_file(node)), str(self.local_dir), *argv]
        return self.wrap(inner)

    def _boot_nodes(self) -> None:
        """Each node's own directories (NODE_DIRS), root-owned, as a node has them after boot: its
        /tmp, /run and /dev/shm emptied, its /var/tmp and local directory (the stores) kept. A
        pause process left in an earlier life of the node is ended first."""
        if not self.separate_nodes:
            return
        self.local_dir.mkdir(mode=0o755, exist_ok=True)
        self.cool_nodes()
        for mqueue in {Path("/dev/mqueue"), self.host_path("/dev/mqueue")}:   # where NODE_ENTER mounts one
            try:
                mqueue.mkdir(mode=0o755, exist_ok=True)
            except OSError as exc:
                raise SandboxError(f"cannot make {mqueue} for the nodes' message queues: {exc.strerror}") from None
        base = self.host_path("/etc/hosts")       # the Slurm root's (prepare wrote it), or the host's
        base_text = base.read_text() if base.exists() else ""
        # without the lines that name a node already (a Slurm root's, from prepare): a resolver with
        # "multi on" (Debian 13's host.conf) would give a name twice
        names = set(self.nodes)
        base_text = "".join(line for line in base_text.splitlines(keepends=True)
                            if not names & set(line.split("#", 1)[0].split()[1:]))
        preload = self.host_path("/etc/ld.so.preload")     # the mount point of each node's own
        if not preload.exists():
            preload.touch(mode=0o644)                  # empty: loads nothing
        preload_text = "".join(line + "\n" for line in preload.read_text().splitlines() if line.strip())
        shim = self._node_source()
        for node in self.nodes:
            make_node_dirs(self.node_dir(node))
            # its own name first (the first line that names it wins): the host's file may name it too
            self.hosts_file(node).write_text(self._node_hosts() + base_text)
            (self.node_dir(node) / NODE_ADDRESS_FILE).write_text(self.node_address(node) + "\n")
            (self.node_dir(node) / "ld.so.preload").write_text(preload_text + f"{shim}\n")

    def _write_configs(self, port_base: int) -> None:
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True)
        values = {
            "cluster_name": "tether-sandbox", "ctld_port": port_base,
            "slurmd_ports": [port_base + SLURMD_OFFSET + i for i in range(self.node_count)],
            "munge_socket": self.munge_socket, "state_dir": self.root / "state",
            "spool_dir": self.root / "spool", "run_dir": self.run_dir, "log_dir": self.log_dir,
            "node_addresses": [self.node_address(node) for node in self.nodes],
            "node_hostnames": list(self.nodes) if self.separate_nodes else ["localhost"] * self.node_count,
            "plugin_dir": f"{system_plugin_dir()}:{self.plugin_dir}",
            "plugstack_conf": self.plugstack_conf,
            "nodes": self.node_count, "node_prefix": self.node_prefix, "cpus": CPUS_PER_NODE, "memory_mb": MEMORY_MB,
            "gpus": GPUS_PER_NODE, "gpu_prefix": FAKE_GPU_PREFIX,
            "cgroups": not self.quick(), "accounting": not self.quick(), "dbd_port": port_base + DBD_OFFSET,
            "first_job_id": first_job_id(port_base),
        }
        for name in ("slurm.conf", "gres.conf"):
            template = resources.files("tether.sandbox").joinpath(f"{name}.j2").read_text()
            (self.etc / name).write_text(env.from_string(template).render(**values))
        self.plugstack_conf.write_text("# tether sandbox: SPANK plugins (see `tether slurm install`)\n")
        (self.etc / "containers.conf").write_text(CONTAINERS_CONF)
        (self.etc / "storage-by-hand.conf").write_text(BY_HAND_STORAGE_CONF)
        cgroup_conf = self.etc / "cgroup.conf"
        if self.quick():
            cgroup_conf.unlink(missing_ok=True)
        else:
            cgroup_conf.write_text(CGROUP_CONF)
        registry = f"127.0.0.1:{port_base + REGISTRY_OFFSET}"
        private = f"127.0.0.1:{port_base + PRIVATE_REGISTRY_OFFSET}"
        (self.root / "registry").mkdir(exist_ok=True)
        (self.root / "private-registry").mkdir(exist_ok=True)
        self.registry_conf.write_text(REGISTRY_CONFIG.format(data=self.root / "registry", port=port_base + REGISTRY_OFFSET))
        htpasswd = self.etc / "private-registry.htpasswd"
        if not htpasswd.exists() or not self._private_password_file.exists():
            self._make_private_password(htpasswd)
        self.private_registry_conf.write_text(
            REGISTRY_CONFIG.format(data=self.root / "private-registry", port=port_base + PRIVATE_REGISTRY_OFFSET)
            + PRIVATE_REGISTRY_AUTH.format(htpasswd=htpasswd))
        # the sandbox registries speak plain http on loopback: podman must be told so
        (self.etc / "registries.conf").write_text("".join(f'[[registry]]\nlocation = "{r}"\ninsecure = true\n\n'
                                                          for r in (registry, private)))
        self.tether_conf.write_text("# tether configuration of the sandbox cluster (generated)\n"
                                    + yaml.safe_dump(self.tether_settings(), sort_keys=False))

    def repair_podman(self, podman: list[str], *, node: str | None = None, tell=lambda m: None) -> bool | None:
        """repair_stale_state for the job user's ``podman`` on ``node`` (a command from
        :meth:`user_podman` for that node, or the user's podman by hand there), as their launcher repairs it
        -- removing podman's boot marker, as the user, when `podman system migrate` cannot (podman 5
        on a cold node)."""
        settings = self.tether_settings()["container"]["podman"]
        marker = os.path.join(Podman(settings).run_dir(pwd.getpwnam(self.user).pw_uid), BOOT_MARKER)
        reset_argv = self.on_node(node, ["runuser", "-u", self.user, "--", "rm", "-f", marker])
        return repair_stale_state(podman, tell=tell, cwd="/",
                                  reset=lambda: run_command(reset_argv, timeout=60, cwd="/", check=False))

    def cool_nodes(self) -> list[int]:
        """Leave the nodes cold for the job user, as a compute node is between jobs: no rootless
        podman pause process of theirs (a test's or a benchmark's podman by hand outside Slurm
        made one; each step's end kills the one its own podman made). The pids ended."""
        return [pid for root in self._node_roots() for pid in slurmroot.end_pause_processes(root, (self.user,))]

    def wait_for_ended_jobs(self, timeout: float = 60) -> list[str]:
        """Wait until no step of a job that has ended still runs on the nodes: a job ends (and
        the next one may start on its nodes: Slurm's CompleteWait is 0) while a cancelled step's
        slurmstepd still waits for its task -- tether's launcher removing a container whose
        conmon the cancel killed, repairing podman's state if it must. A compute node between
        one user's jobs has none left; a test that starts in that window meets the earlier
        test's repair (a podman command of the same user exits 1 while the state is stale).
        A node's live steps are its slurmstepd sockets in its spool directory
        (``<node>_<job>.<step>``: this sandbox's alone). The steps (``node:JOB.STEP``) still
        there after ``timeout`` seconds; [] when none."""
        deadline = time.monotonic() + timeout
        lingering: list[str] = []
        while True:
            try:
                result = self.slurm(["squeue", "-h", "-t", "RUNNING", "-o", "%A"], check=False, timeout=15)
                running = set(result.stdout.split()) if result.returncode == 0 else None
            except CommandError:
                running = None                    # slurmctld busy: ask again until the deadline
            if running is not None:
                lingering = []
                for node in self.nodes:
                    spool = self.root / "spool" / node
                    try:
                        entries = list(os.scandir(spool))
                    except OSError:
                        continue
                    for entry in entries:
                        step = entry.name[len(node) + 1:] if entry.name.startswith(f"{node}_") else ""
                        try:
                            socket_file = stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode)
                        except OSError:
                            continue
                        if socket_file and step and step.split(".")[0] not in running:
                            lingering.append(f"{node}:{step}")
                if not lingering:
                    return []
            if time.monotonic() >= deadline:
                return sorted(lingering) or ["(squeue did not answer)"]
            time.sleep(0.2)

    def _node_roots(self) -> list[Path]:
        """Where each node's own /tmp, /run, ... are on this host (one for all: the host's root)."""
        return [self.node_dir(node) for node in self.nodes] if self.separate_nodes else [self.host_path("/")]

    @contextlib.contextmanager
    def registry_gone(self):
        """The (public) registry killed (SIGKILL, as a crashed or unplugged one) for the time of a
        ``with``, then started again on the same storage: the fault tests' registry that
        disappears mid-pull."""
        daemon = Daemon("registry", self.run_dir / "registry.pid", str(self.registry_conf))
        pid = daemon.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 15.0)
        daemon.pid_file.unlink(missing_ok=True)
        try:
            yield
        finally:
            self._start_registry(only="registry")

    def _start_registry(self, only: str | None = None) -> None:
        """docker-registry runs in the foreground; ready when its port answers. Both registries
        (``only``: the one of that name)."""
        for name, conf, address in (("registry", self.registry_conf, self.registry_address),
                                    ("private-registry", self.private_registry_conf, self.private_registry_address)):
            if only and name != only:
                continue
            host, port = address.split(":")

            def answers(host=host, port=port) -> bool:
                with socket.socket() as sock:
                    return sock.connect_ex((host, int(port))) == 0

            self._start_foreground(["docker-registry", "serve", str(conf)], name, self.log_dir / f"{name}.log",
                                   answers, timeout=15, pid_file=self.run_dir / f"{name}.pid")

    @property
    def _private_password_file(self) -> Path:
        return self.etc / "private-registry.password"

    def _make_private_password(self, htpasswd: Path) -> None:
        """A random password for the private registry's user: bcrypt in its htpasswd file (what
        docker-registry reads), the clear text root-only beside it (what the tests log in with)."""
        import secrets
        import warnings

        with warnings.catch_warnings():        # deprecated (gone in Python 3.13); Debian 12 has 3.11
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt                       # glibc's (libxcrypt) bcrypt; docker-registry takes $2b$

        password = secrets.token_urlsafe(18)
        hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
        if not hashed or not hashed.startswith("$2"):
            raise SandboxError("this Python's crypt cannot make a bcrypt hash for the private registry")
        fd = os.open(self._private_password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(password + "\n")
        htpasswd.write_text(f"{PRIVATE_REGISTRY_USER}:{hashed}\n")

    @property
    def private_registry_conf(self) -> Path:
        return self.etc / "private-registry.yml"

    @property
    def private_registry_address(self) -> str:
        """``127.0.0.1:PORT`` of the sandbox's registry that asks for a login."""
        return f"127.0.0.1:{self.port_base() + PRIVATE_REGISTRY_OFFSET}"

    def private_registry_credentials(self) -> tuple[str, str]:
        """(user, password) of the private registry."""
        return PRIVATE_REGISTRY_USER, self._private_password_file.read_text().strip()

    def private_registry_image(self, *, log=print) -> str:
        """The busybox image in the registry that asks for a login (pushed once, by root, with an
        auth file -- the password never on a command line); its reference as a user writes it."""
        ref = f"{self.private_registry_address}/{BUSYBOX_REPOSITORY}:{BUSYBOX_TAG}"
        user, password = self.private_registry_credentials()
        if self._registry_has(BUSYBOX_REPOSITORY, BUSYBOX_TAG, address=self.private_registry_address,
                              login=(user, password)):
            return ref
        public = self.registry_image(log=log)
        auth = self.root / "podman" / "private-auth.json"
        auth.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(auth, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(registry_auth(self.private_registry_address, user, password), fh)
        env = {**os.environ, "CONTAINERS_CONF": str(self.etc / "containers.conf"),
               "CONTAINERS_REGISTRIES_CONF": str(self.etc / "registries.conf")}
        store = ["--root", str(self.root / "podman" / "root"), "--runroot", str(self.root / "podman" / "run"),
                 "--storage-driver", "vfs"]
        try:
            # registry to registry, through root's own store of the sandbox
            run_command(["podman", *store, "pull", "--quiet", "--tls-verify=false", public], env=env, timeout=300)
            run_command(["podman", *store, "push", "--quiet", "--tls-verify=false", "--format", "v2s2",
                         "--authfile", str(auth), public, f"docker://{ref}"], env=env, timeout=300)
        except CommandError as exc:
            raise SandboxError(f"could not push the test image to the private registry: {exc}") from None
        finally:
            auth.unlink(missing_ok=True)
        log(f"pushed {ref} into the sandbox's private registry")
        return ref

    def _start_foreground(self, argv: list[str], name: str, log_path: Path, ready, *, timeout: float,
                          pid_file: Path | None = None, env: dict[str, str] | None = None) -> None:
        """Start a daemon that stays in the foreground, in a session of its own with its output in
        ``log_path``; record its PID in ``pid_file`` (None: it writes its own); wait until
        ``ready()`` -- a SandboxError if it exits first or ``timeout`` passes."""
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                    start_new_session=True)
        if pid_file is not None:
            pid_file.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SandboxError(f"{name} exited ({proc.returncode}); see {log_path}")
            if ready():
                return
            time.sleep(0.2)
        raise SandboxError(f"{name} did not become ready within {timeout:g} s; see {log_path}")

    def entrypoint_image(self, *, log=print) -> str:
        """The busybox image with an ENTRYPOINT that says it ran (and PROBE's value when it has
        one) and then runs its arguments, and an ENV of its own (--container-entrypoint,
        --container-save); its reference."""
        return self.registry_image(log=log, repository=ENTRYPOINT_REPOSITORY, changes=(
            'ENTRYPOINT ["/bin/sh", "-c", "echo entrypoint ran${PROBE:+ with PROBE=$PROBE}; exec \\"$@\\"", '
            '"entrypoint"]',
            'CMD ["/bin/sh"]', "ENV TETHER_IMAGE_ENV=from-the-image", "ENV IMAGE_GREETING=hello-from-the-image"))

    def large_image(self, gib: float = 1.0) -> str:
        """The busybox root filesystem plus ``gib`` GiB of generated files (64 MiB each, random:
        as incompressible as a model's weights; a tenth of them owned by uid 1000), for the
        benchmarks of images at a site's size. Built once per size."""
        root = self.root / "images" / f"large-{gib:g}g"
        count = max(1, round(gib * 1024 / 64))
        data = root / "data"
        if not (data / f"f{count - 1:04d}").exists():
            _remove_tree(root)
            build_busybox_rootfs(root)
            data.mkdir(mode=0o755)
            for n in range(count):
                path = data / f"f{n:04d}"
                with open(path, "wb") as f:
                    for _ in range(64):
                        f.write(os.urandom(1 << 20))
                if n % 10 == 0:
                    os.chown(path, 1000, 1000)
        return str(root)

    def registry_image(self, *, log=print, repository: str = BUSYBOX_REPOSITORY,
                       changes: tuple[str, ...] = ("CMD /bin/sh",), replace: bool = False,
                       rootfs: str | None = None) -> str:
        """The busybox image in the sandbox's registry (pushed there once, by root, with a podman
        store of the sandbox's own); its reference as a user writes it. ``repository`` and
        ``changes`` (podman import --change): another image of the same files; ``replace``: pushed
        even when the registry has the tag (it then names the new image: a moved tag); ``rootfs``:
        another root filesystem's files (large_image)."""
        ref = f"{self.registry_address}/{repository}:{BUSYBOX_TAG}"
        if not replace and self._registry_has(repository, BUSYBOX_TAG):
            return ref
        rootfs = Path(rootfs or self.busybox_image())
        store = ["--root", str(self.root / "podman" / "root"), "--runroot", str(self.root / "podman" / "run"),
                 "--storage-driver", "vfs"]
        env = {**os.environ, "CONTAINERS_CONF": str(self.etc / "containers.conf"),
               "CONTAINERS_REGISTRIES_CONF": str(self.etc / "registries.conf")}
        tar = self.root / "podman" / "busybox.tar"
        tar.parent.mkdir(parents=True, exist_ok=True)
        try:
            run_command(["tar", "-C", str(rootfs), "-cf", str(tar), "."], timeout=600)
            local = f"localhost/{repository}:{BUSYBOX_TAG}"
            run_command(["podman", *store, "import", *(a for c in changes for a in ("--change", c)), str(tar), local],
                        env=env, timeout=900)
            # Docker v2s2: enroot's importer gets 404 on the OCI manifest (docs/requirements.md, "Facts
            # verified against real programs")
            run_command(["podman", *store, "push", "--tls-verify=false", "--format", "v2s2", local, f"docker://{ref}"],
                        env=env, timeout=900)
            if rootfs != Path(self.busybox_image()):        # a large one: not kept in root's store too
                run_command(["podman", *store, "rmi", "--force", local], env=env, timeout=300, check=False)
        except CommandError as exc:
            raise SandboxError(f"could not push the test image to the sandbox registry: {exc}") from None
        finally:
            tar.unlink(missing_ok=True)
        log(f"pushed {ref} into the sandbox registry")
        return ref

    def _registry_has(self, repository: str, tag: str, *, address: str | None = None,
                      login: tuple[str, str] | None = None) -> bool:
        import base64
        import urllib.error
        import urllib.request

        headers = {"Accept": "application/vnd.docker.distribution.manifest.v2+json"}
        if login:
            headers["Authorization"] = "Basic " + base64.b64encode(":".join(login).encode()).decode()
        request = urllib.request.Request(f"http://{address or self.registry_address}/v2/{repository}/manifests/{tag}",
                                         method="HEAD", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def registry_access_log(self) -> list[str]:
        """The registry's access log lines so far (one per HTTP request)."""
        path = self.log_dir / "registry.log"
        return [line for line in path.read_text(errors="replace").splitlines() if '"GET /v2/' in line
                or '"HEAD /v2/' in line] if path.exists() else []

    # ---- accounting: MariaDB and slurmdbd ---------------------------------------------------
    def _mariadb(self, sql: str) -> str:
        """Run SQL as MariaDB's root (unix-socket authentication: this process is root). The SQL
        goes in on stdin, never on the command line: it may hold slurmdbd's password, and `ps`
        shows every user the command lines of this machine."""
        return run_command(["mariadb", "--no-defaults", f"--socket={self.mariadb_dir / 'mysqld.sock'}", "-u",
                            "root", "-N", "-B"], input=sql + ";\n", timeout=60).stdout

    def _start_mariadb(self, port: int) -> None:
        """MariaDB with its own data directory, socket and pid file, on 127.0.0.1:``port``; the
        database and user slurmdbd needs (its password generated once, kept in slurmdbd.conf)."""
        mysql = pwd.getpwnam("mysql")
        base, data = self.mariadb_dir, self.mariadb_dir / "data"
        base.mkdir(exist_ok=True)
        os.chown(base, mysql.pw_uid, mysql.pw_gid)
        os.chmod(base, 0o750)
        if not (data / "mysql").is_dir():
            shutil.rmtree(data, ignore_errors=True)
            try:
                run_command(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=mysql",
                             "--auth-root-authentication-method=socket", "--skip-test-db"], timeout=300)
            except CommandError as exc:
                raise SandboxError(f"mariadb-install-db failed: {exc}") from None
        (base / "mysqld.sock").unlink(missing_ok=True)

        def answers() -> bool:
            try:
                self._mariadb("SELECT 1")
                return True
            except CommandError:
                return False

        self._start_foreground(
            ["mariadbd", "--no-defaults", f"--datadir={data}", "--user=mysql", f"--socket={base / 'mysqld.sock'}",
             f"--pid-file={base / 'mariadb.pid'}", f"--port={port}", "--bind-address=127.0.0.1",
             "--skip-name-resolve", "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M",
             "--performance-schema=OFF"], "mariadbd", self.log_dir / "mariadb.log", answers, timeout=60)
        password = self._dbd_password()
        self._mariadb("CREATE DATABASE IF NOT EXISTS slurm_acct_db; "
                      f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
                      f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
                      "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES")

    def _dbd_password(self) -> str:
        """slurmdbd's database password: made once, kept in a root-only file (hex: safe in SQL)."""
        path = self.mariadb_dir / "slurm.password"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            password = os.urandom(16).hex()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(password + "\n")
            return password

    def _start_slurmdbd(self, port: int) -> None:
        """slurmdbd on 127.0.0.1:``port`` (foreground, its PID recorded), then the sandbox's
        cluster, account and users in it (sacctmgr), as an admin sets them up."""
        text = (f"# tether sandbox: slurmdbd (generated)\nAuthType=auth/munge\nAuthInfo=socket={self.munge_socket}\n"
                f"DbdHost=localhost\nDbdAddr=127.0.0.1\nDbdPort={port}\nSlurmUser=root\n"
                f"PidFile={self.run_dir / 'slurmdbd.pid'}\nLogFile={self.log_dir / 'slurmdbd.log'}\nDebugLevel=info\n"
                f"StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\n"
                f"StoragePort={port - DBD_OFFSET + MARIADB_OFFSET}\nStorageUser=slurm\n"
                f"StoragePass={self._dbd_password()}\nStorageLoc=slurm_acct_db\n")
        fd = os.open(self.slurmdbd_conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:     # slurmdbd refuses a config others can read
            fh.write(text)
        os.chmod(self.slurmdbd_conf, 0o600)
        def sacctmgr(*args: str, check: bool = True):
            return self.slurm(["sacctmgr", *args], check=check, timeout=30)

        def answers() -> bool:
            return sacctmgr("-n", "-P", "show", "cluster", "format=cluster", check=False).returncode == 0

        # Slurm 24.11's slurmdbd listens on every address (no NoInAddrAny for it): loopback only here
        env = {**self.daemon_env(), "LD_PRELOAD": str(self._loopback_bind())}
        self._start_foreground(self.wrap(["slurmdbd", "-D"]), "slurmdbd", self.log_dir / "slurmdbd.start", answers, timeout=60,
                               pid_file=self.run_dir / "slurmdbd.pid", env=env)
        # each is refused ("Nothing new added") once it exists: run them all, every start
        sacctmgr("-i", "add", "cluster", "tether-sandbox", check=False)
        sacctmgr("-i", "add", "account", "tether", "cluster=tether-sandbox", "description=tether sandbox",
                 "organization=tether", check=False)
        for user in ("root", self.user):
            sacctmgr("-i", "add", "user", user, "account=tether", "cluster=tether-sandbox", check=False)
        if "tether-sandbox" not in sacctmgr("-n", "-P", "show", "cluster", "format=cluster").stdout.split():
            raise SandboxError("slurmdbd does not list the cluster tether-sandbox after `sacctmgr add cluster`")

    def _node_source(self) -> Path:
        """sandbox/node_source.c built (:meth:`_preload`), for each node's /etc/ld.so.preload."""
        return self._preload("node_source.c", "tether-sandbox-node-source.so")

    def _loopback_bind(self) -> Path:
        """sandbox/loopback_bind.c built (:meth:`_preload`): a wildcard bind() becomes a loopback one."""
        return self._preload("loopback_bind.c", "tether-sandbox-loopback-bind.so")

    def _preload(self, source_name: str, library: str) -> Path:
        """The sandbox's C ``source_name`` built into ``library`` in its plugin directory (seen at
        the same path inside a Slurm root), readable by every user: once, not at every start --
        again only when tether's copy of the source is newer."""
        target = self.plugin_dir / library
        with resources.as_file(resources.files("tether.sandbox").joinpath(source_name)) as source:
            if not target.exists() or target.stat().st_mtime < source.stat().st_mtime:
                run_command(["gcc", "-O2", "-shared", "-fPIC", "-o", str(target), str(source), "-ldl"], timeout=120)
                os.chmod(target, 0o755)
        return target

    def _start_munged(self) -> None:
        d = self.munge_dir
        self.munge_socket.unlink(missing_ok=True)
        self._start(["runuser", "-u", "munge", "--", "munged", f"--socket={self.munge_socket}",
                     f"--key-file={d / 'munge.key'}", f"--pid-file={d / 'munged.pid'}",
                     f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}"], "munged")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            probe = subprocess.run(["munge", "-S", str(self.munge_socket), "-n"],
                                   capture_output=True)
            if probe.returncode == 0:
                return
            time.sleep(0.1)
        raise SandboxError(f"munged did not answer on {self.munge_socket}")

    def _start(self, argv: list[str], name: str, *, wrapped: bool = False) -> None:
        """Start a daemonizing command; its early output goes to log/<name>.start."""
        start_log = self.log_dir / f"{name}.start"
        if name.startswith("slurm") and not wrapped:  # slurmctld, slurmdbd: the sandbox's release
            argv = self.wrap(argv)
        with open(start_log, "wb") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    env=self.daemon_env(), start_new_session=True)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise SandboxError(f"{name} did not daemonize within 30 s") from None
        if rc != 0:
            text = start_log.read_text(errors="replace").strip()
            raise SandboxError(f"{name} failed to start (exit {rc}): {text}")
        daemon = next(d for d in self.daemons() if d.name == name)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if daemon.pid():
                return
            time.sleep(0.05)
        try:        # its own log's last lines: "fatal: _open_ports: ..." says more than a directory
            tail = "".join(f"\n  {line}" for line in
                           (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-3:])
        except OSError:
            tail = ""
        raise SandboxError(f"{name} exited right after starting; see {self.log_dir}{tail}")

    def _cancel_all_jobs(self, *, log=None, within: float = 60.0) -> None:
        """Cancel every job slurmctld knows and wait (``within`` seconds in all) until none is left.
        A slurmctld that does not answer in time is said (with ``log``) and left: the daemons are
        stopped by PID after this anyway, and ``up`` then waits for idle nodes with its own error."""
        deadline = time.monotonic() + within

        def ask(argv: list[str]) -> subprocess.CompletedProcess | None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                return self.slurm(argv, check=False, timeout=min(15.0, max(left, 1.0)))
            except CommandError as exc:      # a slurmctld slow to answer (a loaded machine): not fatal here
                if log:
                    log(f"{argv[0]}: {exc.reason}")
                return None

        out = None
        while out is None and time.monotonic() < deadline:  # slurmctld may take a moment after its start
            result = ask(["squeue", "-h", "-o", "%A"])
            if result is not None and result.returncode == 0:
                out = result.stdout
            else:
                time.sleep(0.2)
        jobs = (out or "").split()
        if not jobs:
            if out is None and log:
                log("slurmctld did not list its jobs in time; none cancelled")
            return
        if log:
            log(f"cancelling {len(jobs)} job(s) left from the sandbox's previous run: {' '.join(jobs)}")
        ask(["scancel", *jobs])
        while time.monotonic() < deadline:
            left = ask(["squeue", "-h", "-o", "%A %T"])
            if left is not None and left.returncode == 0 and not left.stdout.strip():
                return
            time.sleep(0.3)


def _is_roots_slurmd(pid: int) -> bool:
    """Whether ``pid`` is a slurmd run by root (every uid 0) in this process's user namespace."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        same_userns = os.stat(f"/proc/{pid}/ns/user").st_ino == os.stat("/proc/self/ns/user").st_ino
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False
    uids = next((line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")), [])
    # Debian's slurmd is an alternatives link to /usr/sbin/slurmd-wlm
    return same_userns and uids == ["0"] * 4 and exe in ("slurmd", "slurmd-wlm")


def make_node_dirs(node_dir: Path) -> None:
    """A node's own directories (NODE_DIRS) under ``node_dir``, root-owned with their modes (/tmp's
    1777, /run's 0755, ...), those a boot empties emptied. Root never follows what a user may have
    put there: an existing entry on the way that is not root's own plain directory is refused, and
    emptying removes entries without following links."""
    wanted = {node_dir.parent: 0o755, node_dir: 0o755}
    for sub, mode, _ in NODE_DIRS:
        parts = Path(sub).parts
        for i in range(1, len(parts)):
            wanted.setdefault(node_dir.joinpath(*parts[:i]), 0o755)
        wanted[node_dir / sub] = mode
    for path in sorted(wanted, key=lambda p: len(p.parts)):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
            raise SandboxError(f"{path} exists and is not a root-owned directory; remove it")
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, wanted[path])
        finally:
            os.close(fd)
    for sub, mode, emptied in NODE_DIRS:
        if emptied and any(os.scandir(node_dir / sub)):
            # moved aside first (its parent is root's: nobody else can touch the name), then removed
            old = node_dir / sub
            aside = old.with_name(f".{old.name}.boot-{os.getpid()}")
            os.rename(old, aside)
            os.mkdir(old, 0o700)
            os.chmod(old, mode)
            _remove_tree(aside)


def _remove_tree(path: Path) -> None:
    """Remove a directory tree as root, never past a symlink at ``path`` itself: rm opens what it
    walks with O_NOFOLLOW|O_DIRECTORY and stays on one filesystem, so a user's FIFO or a
    directory swapped for a link while it walks never hangs or misleads root."""
    if path.is_dir() and not path.is_symlink():
        run_command(["rm", "-rf", "--one-file-system", "--", str(path)], timeout=300)


def write_fake_gpus() -> None:
    """The sandbox's fake GPUs: character devices FAKE_GPU_MAJOR:N, under /dev because rootless
    podman bind-mounts a CDI device from the same path on the host (see DESIGN, CDI), and the CDI
    spec that names them (kind FAKE_GPU_CDI_KIND, not a vendor's: no real GPU tooling mistakes
    them). Shared by every sandbox on this machine; written whole, left in place."""
    devices = []
    for i in range(GPUS_PER_NODE):
        dev = Path(f"{FAKE_GPU_PREFIX}{i}")
        number = os.makedev(FAKE_GPU_MAJOR, i)
        try:
            st = os.lstat(dev)
            if not stat.S_ISCHR(st.st_mode) or st.st_rdev != number:
                dev.unlink()            # an older sandbox's (they were /dev/null's twins)
        except FileNotFoundError:
            pass
        if not dev.exists():
            os.mknod(dev, 0o666 | stat.S_IFCHR, number)
        os.chmod(dev, 0o666)
        devices.append({"name": str(i), "containerEdits": {"deviceNodes": [{"path": str(dev)}]}})
    spec = {"cdiVersion": "0.5.0", "kind": FAKE_GPU_CDI_KIND, "devices": devices}
    FAKE_GPU_CDI_SPEC.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    tmp = FAKE_GPU_CDI_SPEC.with_name(f".{FAKE_GPU_CDI_SPEC.name}.{os.getpid()}")
    tmp.write_text(yaml.safe_dump(spec, sort_keys=False))
    os.chmod(tmp, 0o644)
    os.replace(tmp, FAKE_GPU_CDI_SPEC)


def ensure_user(name: str, *, log=print) -> None:
    """Create the unprivileged job user (with a home directory) if it does not exist."""
    try:
        pwd.getpwnam(name)
        return
    except KeyError:
        pass
    log(f"creating user {name}")
    try:
        run_command(["useradd", "--create-home", "--shell", "/bin/bash", name], timeout=60)
    except CommandError as exc:
        raise SandboxError(f"could not create user {name}: {exc}") from None


def _require_root() -> None:
    if os.geteuid() != 0:
        raise SandboxError("the sandbox installs packages and starts Slurm daemons: run it as root")


def first_job_id(port_base: int) -> int:
    """The first job id of a sandbox on these ports: 1 on the default ones, a thousand further for
    each port past them (modulo 66 million, below Slurm's MaxJobId: distinct for every port base,
    and sandboxes whose ports do not overlap are 75 ports and so 75,000 ids apart at least).
    Sandboxes of one release on one machine share node names, and so each node's cgroups
    (/slurm_<node>/uid_<uid>/job_<id>): two jobs of the same id on the same node name met in
    cpuset.cpus ("Device or resource busy") and drained the node."""
    return 1 + ((port_base - DEFAULT_PORT_BASE) * 1000) % 66_000_000


def _ports_free(base: int, nodes: int, separate: bool = True) -> bool:
    """Whether slurmctld's, the registries', slurmdbd's, MariaDB's and ``nodes`` slurmd's ports from
    ``base`` on are free on 127.0.0.1, and each slurmd's on its node's address (``separate``)."""
    wanted = [("127.0.0.1", port) for port in (base, base + REGISTRY_OFFSET, base + DBD_OFFSET, base + MARIADB_OFFSET,
                                               base + PRIVATE_REGISTRY_OFFSET, *range(base + SLURMD_OFFSET,
                                                                                     base + SLURMD_OFFSET + nodes))]
    if separate:
        wanted += [(f"127.0.0.{i + 2}", base + SLURMD_OFFSET + i) for i in range(nodes)]
    for address in wanted:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError:
                return False
    return True


def _stop(daemon: Daemon) -> int | None:
    """SIGTERM the daemon if it is alive, SIGKILL after 15 s; returns the PID it had (or None).
    A process of the daemon that its pid file does not name (Daemon.strays) is stopped too, by its
    PID, and its PID returned when the file named none."""
    pid = daemon.pid()
    strays = daemon.strays()
    for each in ([pid] if pid is not None else []) + strays:
        try:
            os.kill(each, signal.SIGTERM)
        except ProcessLookupError:
            continue
        if not _wait_gone(each, 15.0):
            os.kill(each, signal.SIGKILL)
            _wait_gone(each, 5.0)
    return pid if pid is not None else (strays[0] if strays else None)


def _wait_gone(pid: int, timeout: float) -> bool:
    """Wait until process ``pid`` has exited (gone, or a zombie). The process itself, not its pid
    file: mariadbd and slurmdbd remove theirs while still shutting down, with their port still bound
    and, for mariadbd, its data directory still locked."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def build_busybox_rootfs(root: Path, *, extra=None) -> None:
    """A complete small image: busybox-static with every applet, the /etc files and mount targets
    runtimes expect; ``extra(tmp)`` adds more. Built beside ``root`` and renamed into place."""
    tmp = root.with_name(f".{root.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    for sub in ("bin", "etc", "tmp", "proc", "sys", "dev", "run", "var/tmp", "mnt"):
        (tmp / sub).mkdir(parents=True)
    shutil.copy2("/bin/busybox", tmp / "bin" / "busybox")
    applets = run_command([str(tmp / "bin" / "busybox"), "--list"]).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (tmp / "bin" / applet).symlink_to("busybox")
    (tmp / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (tmp / "etc" / "group").write_text("root:x:0:\n")
    for target in ("hosts", "hostname", "resolv.conf"):          # podman's mount targets
        (tmp / "etc" / target).write_text("")
    (tmp / "etc" / "mtab").symlink_to("/proc/mounts")
    os.chmod(tmp / "tmp", 0o1777)
    os.chmod(tmp / "var" / "tmp", 0o1777)
    if extra is not None:
        extra(tmp)
    for path in (tmp.parent, tmp):
        os.chmod(path, 0o755)
    tmp.rename(root)


# Debian packages whose files, with everything they depend on, make the MPI image's runtime
MPI_IMAGE_PACKAGES = ("libopenmpi3", "openmpi-common", "libpmi2-0")
MPI_PING = "/usr/local/bin/tether-mpi-ping"        # OpenMPI (srun --mpi=pmix)
PMI2_PING = "/usr/local/bin/tether-pmi2-ping"      # Slurm's libpmi2 (srun --mpi=pmi2)
_SKIPPED_SHARE = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/locale/", "/usr/share/info/",
                  "/usr/share/lintian/", "/usr/share/bug/")


def installed_closure(packages: Iterable[str]) -> list[str]:
    """The installed Debian packages ``packages`` need (Depends and Pre-Depends, recursively; of
    alternatives the first one installed), themselves included."""
    listing = run_command(["dpkg-query", "-W", "-f", "${Package} ${Status}\n"]).stdout
    installed = {line.split(" ", 1)[0] for line in listing.splitlines() if line.endswith("install ok installed")}
    seen: set[str] = set()
    todo = list(packages)
    while todo:
        package = todo.pop()
        if package in seen:
            continue
        seen.add(package)
        fields = run_command(["dpkg-query", "-W", "-f", "${Depends},${Pre-Depends}", package]).stdout
        for group in filter(None, (g.strip() for g in fields.split(","))):
            names = [alt.strip().split(" ")[0].split(":")[0] for alt in group.split("|")]
            todo += [n for n in names if n in installed][:1]
    return sorted(seen)


def add_mpi(tmp: Path) -> None:
    """OpenMPI's runtime, copied from the host's Debian packages (the same OpenMPI as the host's:
    srun's PMIx is the host's) and Slurm's libpmi2, and the ping programs (sandbox/mpi_ping.c with
    mpicc, sandbox/pmi2_ping.c with libpmi2)."""
    for package in installed_closure(MPI_IMAGE_PACKAGES):
        for path in run_command(["dpkg", "-L", package]).stdout.splitlines():
            if not path.startswith("/") or path.startswith(_SKIPPED_SHARE) or path in ("/.", "/"):
                continue
            source = Path(path)
            if source.is_dir():          # directories (and Debian's merged-/usr links) come below
                continue
            # under the directory's real path: /lib/x86_64-linux-gnu/libc.so.6 lands in /usr/lib/...
            target = tmp / os.path.realpath(source.parent).lstrip("/") / source.name
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_symlink():
                if not target.is_symlink() and not target.exists():
                    target.symlink_to(os.readlink(source))
            elif source.is_file():
                shutil.copy2(source, target)
    for link in ("lib", "lib64"):        # merged /usr, as on the host
        if (tmp / "usr" / link).is_dir() and not os.path.lexists(tmp / link):
            (tmp / link).symlink_to(f"usr/{link}")
    for name, program, compiler in (("mpi_ping.c", MPI_PING, ["mpicc"]), ("pmi2_ping.c", PMI2_PING, ["gcc"])):
        target = tmp / program.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        with resources.as_file(resources.files("tether.sandbox").joinpath(name)) as path:
            libs = ["-lpmi2"] if name.startswith("pmi2") else []
            run_command([*compiler, "-O2", "-o", str(target), str(path), *libs], timeout=120)


def registry_auth(address: str, user: str, password: str) -> dict:
    """An ``auth.json`` (containers-auth.json(5), Docker's config.json) holding one login."""
    import base64

    return {"auths": {address: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}}}
