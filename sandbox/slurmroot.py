"""Another Slurm release beside the host's: a cached Debian root that the sandbox's daemons and
commands run in, for ``tether sandbox up --slurm 24.11|26.05``.

Debian 12 ships Slurm 22.05; Debian 13 (trixie) ships 24.11, Debian testing (forky) 26.05.
``debootstrap --variant=minbase`` plus Slurm, munge, gcc, Python with cffi/yaml/jinja2 and podman
takes under a minute here and is kept in
``/var/cache/tether/slurm-roots/<release>`` (rebuilt when the package list changes). At each ``up``
the root gets the host's users (``/etc/passwd``, ``/etc/group``: one set of uids on both sides),
``/etc/hosts`` and ``/etc/subuid``/``subgid`` (rootless podman). Every command runs in a mount
namespace of its own (``unshare --mount``) whose root is the Debian root (``pivot_root``), with
``/proc``, ``/sys`` (cgroups), ``/dev`` and the sandbox directory bound at the
same paths, so every path in the sandbox's configs means the same inside and out (``/tmp``,
``/var/tmp`` and ``/home`` are the root's own: rootless podman keeps per-user state there); nothing is
mounted on the host, nothing is left to unmount. Neither chroot nor bubblewrap: the kernel refuses
a chrooted process a user namespace (rootless podman: ``cannot clone: Operation not permitted``),
and bwrap sets no_new_privs, which keeps setuid ``newuidmap`` from mapping the user's ids.
The daemons use the host's munged through the sandbox's socket. tether itself is installed into
the root's Python from the running tether's own files, and its plugins are built there, against
that release's headers, the way an admin builds them (``tether slurm build``).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..container.runtimes.podman import PAUSE_NAMES, PAUSE_PID_FILE
from ..container.spec import read_regular
from ..hooks.errors import TetherError
from ..hooks.layout import USER_RUN_ROOT
from ..system.proc import CommandError, run_command
from .packages import ensure_packages

CACHE = Path("/var/cache/tether/slurm-roots")
MIRROR = "http://deb.debian.org/debian"
# release -> (Debian suite that ships it, debootstrap's script for it). Checked: trixie has 24.11.5;
# forky (testing, a moving target: 26.05.5 on 2026-11-24) has no script in Debian 12's debootstrap,
# sid's bootstraps it.
RELEASES = {"24.11": ("trixie", "trixie"), "26.05": ("forky", "sid")}
# this machine's archive is a snapshot: a testing suite's Release file is past its Valid-Until
APT_OPTIONS = ("-o", "Acquire::Check-Valid-Until=false")
PACKAGES = ("slurm-wlm", "slurmctld", "slurmd", "slurm-client", "slurmdbd", "libslurm-dev", "munge", "gcc", "libc6-dev",
            "python3", "python3-dev", "python3-cffi", "python3-yaml", "python3-jinja2", "python3-setuptools",
            "python3-pip", "procps", "util-linux",
            # building tether's package for this release (tools/deb.py --slurm-release)
            "dpkg-dev", "binutils",
            # the REST launcher (its service runs `tether serve` with sudo to the job user), busybox for tests
            "sudo", "python3-aiohttp", "busybox-static",
            # the container runtime of the sandbox's jobs (podman 5.4 here, beside the host's 4.3)
            "podman", "runc", "conmon", "uidmap", "fuse-overlayfs", "slirp4netns", "catatonit", "squashfs-tools-ng",
            # the cluster image store: its images mounted in each user's namespace; enroot starts
            # an image file only where unsquashfs can read it (runtime.sh)
            "squashfuse", "squashfs-tools")
# bound into every command's view of the root (recursively), at the same paths. Not /tmp, /var/tmp
# or /home: rootless podman keeps per-user state there (its pause process's pid, which every later
# podman joins, its run root, and in ~/.local/share/containers a store whose database and network
# backend a newer podman converts: tried, and the host's podman 4.3 then wanted netavark).
BINDS = ("/proc", "/sys", "/dev")
OLD_ROOT = ".tether-old-root"
# the root's Python (Debian's, with tether copied into it) and the tether command install_tether writes
PYTHON, TETHER_PROGRAM = "/usr/bin/python3", "/usr/local/bin/tether"
# the tether command of tether's Debian package (tools/deb.py)
PACKAGED_TETHER = "/usr/bin/tether"
# run by the host's sh in the new mount namespace: $1 the root, $2 the directory to start in, $3 the
# binds (newline-separated), then the command
ENTER = f"""set -e
root=$1 cwd=$2 binds=$3; shift 3
mount --rbind "$root" "$root"
printf '%s\\n' "$binds" | while IFS= read -r path; do mount --rbind "$path" "$root$path"; done
cd "$root"
pivot_root . {OLD_ROOT}
umount -l /{OLD_ROOT}
cd "$cwd"
exec "$@"
"""


# a pause process's name once it runs as one: "podman" (before it execs catatonit) is also the
# name of every other podman command
PAUSE_RUNNING_NAMES = tuple(name for name in PAUSE_NAMES if name != "podman")


def end_pause_processes(root: Path, users: Iterable[str], run_dirs: Iterable[str] = ()) -> list[int]:
    """End each user's rootless podman pause process below ``root`` (``/`` for the host; the pids
    it killed): the one recorded in podman's own run directory (``/tmp/*-run-<uid>``), in
    tether's (hooks.layout.user_run_dir) and in ``run_dirs`` (a service account's own). A compute node between jobs has none -- each step's end
    kills the one its podman made -- so the sandbox leaves none behind either (issue 46: a node
    the sandbox warmed hid the cost of every cold step). The pid file is the user's: only a
    regular file is read (a FIFO must not hang root), only a process /proc says is that user's
    pause process is killed, and the file is left to podman."""
    killed = []
    for user in users:
        uid = pwd.getpwnam(user).pw_uid
        files = [*root.glob(f"tmp/*-run-{uid}/{PAUSE_PID_FILE}"),
                 *root.glob(f"{USER_RUN_ROOT.lstrip('/')}/{uid}/{PAUSE_PID_FILE}"),
                 *(root / d.lstrip("/") / PAUSE_PID_FILE for d in run_dirs)]
        for pid_file in files:
            text = read_regular(str(pid_file), limit=32)
            try:
                pid = int((text or "").strip())
                status = Path(f"/proc/{pid}/status").read_text()
            except (OSError, ValueError):
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if (fields.get("Name", "").strip() in PAUSE_RUNNING_NAMES
                    and fields.get("Uid", "").split()[:1] == [str(uid)]):
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
    return killed


class SlurmRootError(TetherError):
    """The root for another Slurm release could not be built or used; the message says why."""


@dataclass(frozen=True)
class SlurmRoot:
    """The cached Debian root of one Slurm release (``release``: "24.11")."""

    release: str
    sandbox: str | None = None          # the sandbox directory, bound at the same path

    def __post_init__(self) -> None:
        if self.release not in RELEASES:
            raise SlurmRootError(f"no Debian root known for Slurm {self.release}; known: {', '.join(RELEASES)}")

    @property
    def path(self) -> Path:
        return CACHE / self.release / "root"

    @property
    def stamp(self) -> Path:
        return CACHE / self.release / "ready"

    def _wanted(self) -> str:
        return hashlib.sha256(" ".join((*RELEASES[self.release], *PACKAGES)).encode()).hexdigest()

    def version(self) -> str:
        """The Slurm version its headers declare ("24.11.5")."""
        text = (self.path / "usr/include/slurm/slurm_version.h").read_text()
        match = re.search(r"#define\s+SLURM_VERSION_NUMBER\s+(0x[0-9a-fA-F]+)", text)
        if not match:
            raise SlurmRootError(f"no SLURM_VERSION_NUMBER in {self.path}/usr/include/slurm/slurm_version.h")
        number = int(match.group(1), 16)
        return f"{number >> 16:02d}.{(number >> 8) & 0xff:02d}.{number & 0xff}"

    # ---- building --------------------------------------------------------------------------------
    def ensure(self, *, log=print) -> None:
        """Build the root unless a complete one with this package list is cached."""
        try:
            if self.stamp.read_text().strip() == self._wanted():
                return
        except OSError:
            pass
        suite, script = RELEASES[self.release]
        log(f"building a Debian {suite} root for Slurm {self.release} in {self.path} (about a minute)")
        if shutil.which("debootstrap") is None:
            ensure_packages(["debootstrap"], log=log)
        shutil.rmtree(self.path.parent, ignore_errors=True)
        self.path.parent.mkdir(parents=True)
        try:
            run_command(["debootstrap", "--variant=minbase", suite, str(self.path), MIRROR,
                         f"/usr/share/debootstrap/scripts/{script}"], timeout=900)
            # no daemon starts while packages install (munge's postinst would)
            policy = self.path / "usr/sbin/policy-rc.d"
            policy.write_text("#!/bin/sh\nexit 101\n")
            policy.chmod(0o755)
            shutil.copy("/etc/resolv.conf", self.path / "etc/resolv.conf")
            (self.path / OLD_ROOT).mkdir(mode=0o700)
            bare = SlurmRoot(self.release)          # no sandbox to bind yet
            bare.run(["apt-get", *APT_OPTIONS, "update", "-q"], timeout=600)
            bare.run(["apt-get", *APT_OPTIONS, "install", "-y", "-q", "--no-install-recommends", *PACKAGES],
                     timeout=1800)
        except CommandError as exc:
            raise SlurmRootError(f"could not build the Slurm {self.release} root: {exc}") from None
        self.stamp.write_text(self._wanted() + "\n")
        log(f"Slurm {self.version()} root ready in {self.path}")

    def _site_dir(self) -> Path:
        """The root Python's site directory for a copied tether (/usr/local/...: before Debian's)."""
        site = self.run(["python3", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
        return self.path / site.lstrip("/")

    def install_tether(self) -> None:
        """Install the running tether's files into the root's Python (no dependencies: Debian's)."""
        src = self.path / "opt/tether-src"
        shutil.rmtree(src, ignore_errors=True)
        package = Path(__file__).resolve().parents[1]       # the installed tether/ (a namespace package)
        shutil.copytree(package, src / "tether", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        target = self._site_dir() / "tether"
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(str(src / "tether"), str(target))
        shutil.rmtree(src, ignore_errors=True)
        program = self.path / TETHER_PROGRAM.lstrip("/")
        program.parent.mkdir(parents=True, exist_ok=True)
        program.write_text(f"#!{PYTHON}\nfrom tether.cli.main import main\nraise SystemExit(main())\n")
        program.chmod(0o755)

    def remove_copied_tether(self) -> None:
        """Remove what :meth:`install_tether` put into the root (its copy of tether comes first on
        sys.path, its command first on PATH): before tether's package is installed there."""
        shutil.rmtree(self._site_dir() / "tether", ignore_errors=True)
        (self.path / TETHER_PROGRAM.lstrip("/")).unlink(missing_ok=True)

    # ---- using -----------------------------------------------------------------------------------
    def prepare(self, hosts: str = "", users: tuple[str, ...] = ()) -> None:
        """The host's users, hosts and subordinate ids, copied in before the sandbox starts;
        ``hosts``: lines added to the root's /etc/hosts; ``users``: whose home directory the root
        gets (its own, empty: see BINDS)."""
        if Path("/etc/hosts").exists():
            shutil.copy("/etc/hosts", self.path / "etc" / "hosts")
        self.copy_accounts()
        if hosts:
            with open(self.path / "etc/hosts", "a", encoding="utf-8") as fh:
                fh.write(hosts)
        for user in users:
            self.make_home(user)
        if self.sandbox:     # its mount point, reachable by the job users
            inside = self.path / self.sandbox.lstrip("/")
            inside.mkdir(parents=True, exist_ok=True)
            for part in (inside, *inside.parents):
                if part == self.path:
                    break
                os.chmod(part, 0o755)

    def make_home(self, user: str) -> Path:
        """The user's home directory in the root (its own, empty: see BINDS)."""
        entry = pwd.getpwnam(user)
        home = self.path / entry.pw_dir.lstrip("/")
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.lchown(home, entry.pw_uid, entry.pw_gid)
        return home

    def copy_accounts(self) -> None:
        """The host's users, groups and subordinate ids, copied in (again after the host gained a
        user: the root's programs look accounts up in its own /etc)."""
        for name in ("passwd", "group", "subuid", "subgid"):
            if Path("/etc", name).exists():
                shutil.copy(f"/etc/{name}", self.path / "etc" / name)
        # every account a shadow entry without a password (PAM's account check, which sudo runs,
        # fails an account that has none: "account validation failure"); never the host's hashes
        shadow = "".join(f"{entry.pw_name}:*:19000:0:99999:7:::\n" for entry in pwd.getpwall())
        target = self.path / "etc/shadow"
        target.write_text(shadow)
        os.chmod(target, 0o640)

    def end_user_namespaces(self, users: tuple[str, ...]) -> list[int]:
        """Stop each user's rootless podman pause process of this root (the pids it killed).
        Every later podman of the user joins that process's namespaces, and so the mount namespace
        of the command that first started podman: a sandbox directory made again since (``down
        --purge``) or another sandbox's is not in it. So each ``up`` and ``down`` ends them."""
        return end_pause_processes(self.path, users)

    def wrap(self, argv: list[str], cwd: str | None = None) -> list[str]:
        """``argv`` run inside the root (in ``cwd``: paths are the same on both sides)."""
        binds = "\n".join((*BINDS, *((self.sandbox,) if self.sandbox else ())))
        return ["unshare", "--mount", "--propagation", "slave", "sh", "-c", ENTER, "tether-slurm-root",
                str(self.path), cwd or "/", binds, *argv]

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/local/sbin:/usr/local/bin:"
               "/usr/sbin:/usr/bin:/sbin:/bin"}
        return run_command(self.wrap(argv, kwargs.get("cwd")), env={**env, **kwargs.pop("env", {})}, **kwargs)
