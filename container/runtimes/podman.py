"""Podman: ``podman run``, supervised so the container stays inside the step.

conmon double-forks away from its caller; tether's wrapper is a child subreaper (see
tether.container.launch), so conmon and the container's processes stay descendants of the rank --
Slurm's process tracking, accounting and kill reach them. Host network and host PID namespace
(signals and process visibility as on the host, like Apptainer and Enroot); ``--userns=keep-id``
when not root, so files in the per-rank directories and mounts keep the user's ownership; a
rootfs directory runs read-only as it is (``--read-only --rootfs DIR``: a shared image is never
written), or with --container-writable, for a rootfs the user owns, through an overlay whose
changes are discarded (``--rootfs DIR:O``). Environment (tether.container.environment): the
contract's host variables are named in an ``--env-file`` (a memfd) from which podman copies their
values out of its own environment -- values never appear on a command line, however many there
are; ``--env NAME=VALUE`` sets tether's own.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

from ...hooks.layout import CLEANUP_MARKER, NODE_STEP_PREFIX, POD_MARKER, USER_STORE_ROOT, user_run_dir
from ..launch import cgroup_paths, progress, reap_zombies, remove_file, report, report_admin
from ..environment import entrypoint_split
from ..spec import (CONTAINER_BATCH_SCRIPT, CONTAINER_WORKDIR, NAMED_MADE_BY, PROPAGATION, LaunchError, Mount,
                    effective_mounts, mount_refusal, named_podman_home, no_named_container, podman_tmpfs,
                    read_regular, refuse_existing, sha256_hex)
from . import (LATER_FILE, LATER_PART, Launch, Runtime, checked_marker, env_name, existing_store, later_values,
               mark_checked, own_directory, pmi_fd, registry_unchecked, store_directory)

if TYPE_CHECKING:
    from typing import Mapping, Sequence

    from ..spec import LaunchSpec


# Mount targets podman needs in a rootfs; it creates them itself only where the user may write
# (a shared rootfs without them is imported into the user's store: Podman.image_plan).
ROOTFS_TARGETS = ("etc/passwd", "etc/group", "etc/hosts", "etc/hostname", "etc/resolv.conf", "etc/mtab",
                  "proc", "sys", "dev", "run", "tmp", "var/tmp")


# Where podman mounts a tmpfs in a --read-only container: mount targets below them can be created.
TMPFS_DIRS = ("/tmp/", "/run/", "/var/tmp/", "/dev/")
# between tries of a removal podman answered but did not do (Podman.remove): 0, 1, 2, 3 times this
REMOVE_BACKOFF = 0.5


def stdio_is_terminal() -> bool:
    """Is any of this process's stdin, stdout, stderr a terminal?"""
    return any(os.isatty(fd) for fd in (0, 1, 2))


# podman 4.3 (cmd/podman/root.go -> pkg/domain/infra/abi/system.go SetupRootless): no process it
# could join the user namespace of -- "could not find any running process" (all gone) or "cannot
# re-exec process to join the existing user namespace" (only a dead, unreaped one left) -- exit 1
STALE_STATE = "invalid internal status, try resetting the pause process"   # podman 4.3's words
# podman 4.3 and 5 when the pause process its pid file names is a zombie nobody reaped (a node whose
# PID 1 does not reap: slurmd in a container without an init, this machine): every later podman of
# the user on the node fails so (exit 125) until the zombie is reaped -- on such a node, never
JOIN_FAILED = "cannot re-exec process to join the existing user namespace"


BOOT_MARKER = "libpod/tmp/alive"     # in podman's run directory: its absence says "a new boot"


def repair_stale_state(podman: Sequence[str], *, env: Mapping[str, str] | None = None, output: str | None = None,
                       tell=progress, cwd: str | None = None, reset=None, lock: str | None = None,
                       new_session: bool = True) -> bool | None:
    """Rootless podman joins the user namespace of its pause process, or else of a container it
    believes running. When every such process is gone -- killed with the step that started it
    (SIGKILL at a time limit, the OOM killer, a node's processes killed) while its run state
    stayed (its run directory, ``Podman.run_dir``, outlives them) -- every podman
    command of that user on this node fails with "invalid internal status, try resetting the pause
    process with "podman system migrate": ..." (exit 1). Since no process of that state lives, no
    running container is harmed by doing what it says. ``podman``: the command that runs podman as
    that user; ``output``: a failed command's stderr (None: ask podman). True when it repaired (or
    found it repaired), False when it could not, None when the state was not stale.

    Podman 5 (Slurm 24.11's root here) may fail to migrate such a state: it stops the container it
    believes running and cannot unmount that container's /dev/shm outside the user namespace,
    which died with its processes ("operation not permitted"). Then ``reset`` (a callable: remove
    podman's boot marker, ``BOOT_MARKER``, as that user) makes the next podman command take the
    node for freshly booted, as it is for podman's purposes: no process of its state lives, every
    mount went with the namespace. That command makes a new user namespace and marks every
    container stopped (libpod's refresh), as after a reboot.

    Both are safe only while the state is stale (no podman command of the user succeeds, so none
    runs a container they could stop or forget), and another rank of the user may repair it and
    start containers meanwhile: the repair holds ``lock`` (a file in the user's run directory: every
    rank, job and cleanup of the user on the node takes it) and asks podman again under it before
    each remedy -- never acting on an answer from before the lock. ``new_session``: podman's own
    commands in a session of their own (run_command), or in the caller's (the cleanup, whose
    watcher kills its session at a bound)."""
    from ...system.proc import CommandError, run_command

    def stale() -> bool:    # ask podman again, cheaply
        try:
            run_command([*podman, "container", "exists", "tether-probe"], env=env, timeout=30, cwd=cwd,
                        new_session=new_session)
            return False
        except CommandError as exc:
            return STALE_STATE in (exc.stderr or "")

    if not (stale() if output is None else STALE_STATE in output):
        return None
    lock_fd = None
    if lock:
        try:
            lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        except OSError as exc:
            tell(f"cannot take the repair lock {lock}: {exc.strerror}; repairing without it")
    try:
        if not stale():                  # another rank repaired it while this one waited
            return True
        tell("podman's run state on this node is stale (the processes it names are gone): "
             "`podman system migrate`, then trying again")
        said = ""
        for attempt in range(2):
            # exits 125 when it cannot stop a container recorded as running whose processes are
            # gone ("container not running"), mostly leaving the state usable: what counts is the
            # probe. Once in the suite the state was still stale after it: a second pass is cheap.
            if attempt:
                time.sleep(1)
            try:
                run_command([*podman, "system", "migrate"], env=env, timeout=120, cwd=cwd, new_session=new_session)
            except CommandError as exc:
                lines = (exc.stderr or exc.reason or "").strip().splitlines()
                said = f" (it said: {lines[-1]})" if lines else ""
            if not stale():
                return True
            if reset is not None and attempt == 0:
                tell("podman's run state is still stale after `podman system migrate`: starting it afresh, "
                     "as after a reboot (none of its processes lives)")
                reset()
                if not stale():      # the probe's podman wrote the marker again, under the lock
                    return True
        tell(f"podman's run state is still stale after `podman system migrate` twice{said} (see "
             f"\"podman's run state is stale\" in tether's README, troubleshooting)")
        return False
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


REPAIR_LOCK = "tether-podman-repair.lock"     # in podman's run directory (the user's own)


def remove_boot_marker(run_dir: str) -> None:
    """Remove podman's boot marker in ``run_dir`` (see repair_stale_state), as the user who owns
    it: unlink never follows the last component, and the directories are the user's own."""
    try:
        os.unlink(os.path.join(run_dir, BOOT_MARKER))
    except FileNotFoundError:
        pass
    except OSError as exc:
        progress(f"could not remove podman's boot marker in {run_dir}: {exc.strerror}")


def names_list(text: str, name: str) -> bool:
    """Does containers/storage's ``images.json`` (compact JSON, as Go writes it) list ``name`` in an
    image's ``"names"`` array? Read as text, not parsed: json imports re and enum, milliseconds of
    every rank's start. An image name holds no ``"``, ``\\`` or ``]``, so its array ends at the
    first ``]`` (``"names-history"`` is another key); a file written otherwise reads as no, and
    podman is asked."""
    if not name or any(c in name for c in '"\\]'):
        return False
    quoted, start = f'"{name}"', 0
    while True:
        at = text.find('"names":[', start)
        end = text.find("]", at) if at >= 0 else -1
        if end < 0:
            return False
        if quoted in text[at + 9:end].split(","):
            return True
        start = end


def spec_has_kind(directory: str, kind: str) -> bool:
    """Does a CDI spec (``*.yaml``/``*.json``) in ``directory`` declare ``kind``?"""
    import re      # here: a rank's start-up does not import re (it pulls in enum, milliseconds per rank)

    pattern = re.compile(r'^\s*"?kind"?\s*:\s*["\']?' + re.escape(kind) + r'["\']?\s*,?\s*$', re.M)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return False
    for name in names:
        text = read_regular(os.path.join(directory, name)) if name.endswith((".yaml", ".yml", ".json")) else None
        if text is not None and pattern.search(text):
            return True
    return False


_GPU_ID_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_GPU_ID_CHARS = _GPU_ID_FIRST | frozenset("_.:-")


def gpu_id_ok(value: str) -> bool:
    """A GPU id as CDI names them: 3, GPU-<uuid>, MIG-<uuid> (letters, digits, ``_.:-``, at most 80)."""
    return 0 < len(value) <= 80 and value[0] in _GPU_ID_FIRST and all(c in _GPU_ID_CHARS for c in value)


def gpu_device_ids(local: Sequence[str], host_env: Mapping[str, str]) -> list[str]:
    """The node's device indices of a rank's GPUs -- the names ``nvidia-ctk cdi generate`` gives them.
    Slurm binds a task with CUDA_VISIBLE_DEVICES (``local``) and lists the step's GPUs by their
    gres.conf device index in SLURM_STEP_GPUS (the batch step: SLURM_JOB_GPUS). Without device
    confinement the two agree; with ConstrainDevices the local ids count from 0 over the step's
    GPUs, so local id k is the k-th of the step's (gres_common.c: common_gres_set_env)."""
    step = [g for g in (host_env.get("SLURM_STEP_GPUS") or host_env.get("SLURM_JOB_GPUS") or "").split(",") if g]
    if not step or sorted(local) == sorted(step) or (set(local) <= set(step) and not _devices_confined()):
        return list(local)
    if all(k.isascii() and k.isdigit() and len(k) < 6 for k in local) and all(int(k) < len(step) for k in local):
        return [step[int(k)] for k in local]
    return list(local)


PMIX_SERVER_DIR = "/run/tether/pmix"     # where a step's PMIx server directory appears inside


def mpi_pass_through(host_env: Mapping[str, str], passed: dict[str, str],
                     own: dict[str, str]) -> tuple[dict[int, int] | None, list[str]]:
    """What an MPI rank needs from the step into its container (adjusts ``passed``/``own``):
    PMI-2 (srun --mpi=pmi2): the socket slurmstepd gave the task as PMI_FD, moved to fd 3 and
    passed with --preserve-fds=1 (podman passes fds 3..2+N and refuses a closed one), PMI_FD=3
    inside. PMIx (srun --mpi=pmix): the PMIx server's directory (its shared-memory stores,
    PMIX_SERVER_TMPDIR) at PMIX_SERVER_DIR; the server itself is reached over TCP
    (PMIX_SERVER_URI*, the container shares the host's network); the PMIX_* variables pass as
    MPI variables do."""
    fds, args = None, []
    fd = pmi_fd(host_env)
    if fd is not None:
        fds = {fd: 3}
        passed.pop("PMI_FD", None)
        own["PMI_FD"] = "3"
        args.append("--preserve-fds=1")
    server = host_env.get("PMIX_SERVER_TMPDIR", "").rstrip("/")
    if server.startswith("/") and ":" not in server and "," not in server and os.path.isdir(server):
        # mounted under /run (podman's tmpfs in a --read-only container, so the target can be made
        # in any image) and the variables that name it rewritten: PMIX_SERVER_TMPDIR and the
        # shared-memory stores' PMIX_DSTORE_*_BASE_PATH
        args += ["--volume", f"{server}:{PMIX_SERVER_DIR}"]
        for name in sorted(passed):
            value = passed[name]
            if name.startswith("PMIX_") and (value == server or value.startswith(server + "/")):
                own[name] = PMIX_SERVER_DIR + value[len(server):]
                del passed[name]
        client = pmix_client_dir(host_env)
        if client:   # named to the client through PMIx itself (pmix.tmpdir): the same path inside
            args += ["--volume", f"{client}:{client}"]
        # what enroot's PMIx hook (50-slurm-pmi.sh) adds: the MCA names of the modules Slurm's
        # server chose, unless the job set them (pyxis's mpi.bats checks them)
        for module, mca in (("PMIX_PTL_MODULE", "PMIX_MCA_ptl"), ("PMIX_SECURITY_MODE", "PMIX_MCA_psec"),
                            ("PMIX_GDS_MODULE", "PMIX_MCA_gds")):
            if host_env.get(module) and not host_env.get(mca) and "\n" not in host_env[module]:
                own[mca] = host_env[module]
    return fds, args


def pmix_client_dir(host_env: Mapping[str, str]) -> str | None:
    """The step's PMIx client directory on this node, which Slurm's PMIx plugin (22.05,
    pmixp_info.c) makes at ``<base>/spmix_appdir_<uid>_<job>.<step>``, base = SLURM_PMIX_TMPDIR of
    the job, else slurm.conf's TmpFS (``%n``: the node's name), else /tmp. Open MPI puts its session
    directory there (pmix.tmpdir). None when it is not there or not usable as a mount."""
    job, step = host_env.get("SLURM_JOB_ID", ""), host_env.get("SLURM_STEP_ID", "")
    if not (job.isdigit() and step.isdigit()):
        return None
    base = host_env.get("SLURM_PMIX_TMPDIR") or _slurm_tmpfs(host_env) or "/tmp"
    for name in (f"spmix_appdir_{os.getuid()}_{job}.{step}", f"spmix_appdir_{job}.{step}"):
        path = os.path.join(base, name)
        if path.startswith("/") and ":" not in path and "," not in path and os.path.isdir(path):
            return path
    return None


def _slurm_tmpfs(host_env: Mapping[str, str]) -> str | None:
    """slurm.conf's TmpFS for this node (``%n`` and ``%h`` expanded), or None."""
    text = read_regular(host_env.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    for line in (text or "").splitlines():
        key, eq, value = line.split("#", 1)[0].strip().partition("=")
        if eq and key.strip().lower() == "tmpfs" and value.strip():
            node = host_env.get("SLURMD_NODENAME") or os.uname().nodename
            return value.strip().replace("%n", node).replace("%h", os.uname().nodename)
    return None


def env_names_fd(names) -> int:
    """A memfd holding ``names`` one per line, at fd 10 or above (below are the rank's and the fds
    passed into the container: PMI_FD goes to 3), inheritable where the launch execs podman."""
    fd = os.memfd_create("tether-env-names")
    try:
        data = "".join(f"{name}\n" for name in sorted(names)).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    finally:
        os.close(fd)
    return high


def slurm_controllers(text: str | None = None) -> set[str]:
    """The cgroup v1 controllers in which this process sits under a Slurm step (paths below
    ``/slurm``, ``/slurm_<node>``), from ``/proc/self/cgroup`` (or ``text``)."""
    if text is None:
        try:
            with open("/proc/self/cgroup", encoding="ascii", errors="replace") as fh:
                text = fh.read()
        except OSError:
            return set()
    return {controller for controller, path in cgroup_paths(text).items() if "/slurm" in path}


def in_slurm_cgroup(text: str | None = None) -> bool:
    """Is this process in a step cgroup Slurm tracks (cgroup v1: freezer or memory under /slurm...)?"""
    return bool(slurm_controllers(text) & {"freezer", "memory"})


def _devices_confined() -> bool:
    """Does this process sit in a Slurm devices cgroup (cgroup v1: ConstrainDevices=yes)?"""
    return "devices" in slurm_controllers()


DEFAULT_STORE = f"{USER_STORE_ROOT}/{{uid}}/podman"     # container.podman.store's default

# Rootless podman's pause process: made by the first podman command of a user that finds none (on
# a compute node, in every step: the step's end kills the one the step made), it holds the user
# namespace every later podman command of that user joins. podman 4.3 forks it from itself
# ("podman" until it execs), and it execs catatonit -P, or names itself "podman pause" when there is
# no catatonit (pkg/rootless/rootless_linux.c create_pause_process, do_pause); its pid is recorded
# in podman's run directory. Ranks of a node race to make one: the record is renamed into place
# without replacing, and a podman that lost kills its own at once (SIGKILL, still "podman"). It
# is podman's, not the rank's: the launcher never waits for it (the one its podman made, it ends as
# the step's end would), and one killed is no process of the rank's killed (Launch.runtime_own).
PAUSE_NAMES = ("catatonit", "podman pause", "podman")
PAUSE_PID_FILE = "libpod/tmp/pause.pid"          # in podman's run directory (its XDG_RUNTIME_DIR)


def pause_pid_file(run_dir: str) -> str:
    """Where podman records its pause process's pid, for the run directory (XDG_RUNTIME_DIR) it
    was given."""
    return os.path.join(run_dir, PAUSE_PID_FILE)


class Podman(Runtime):
    name = "podman"

    def __init__(self, settings: Mapping, **kw):
        super().__init__(settings, **kw)
        self.cdi_kind = settings.get("cdi_kind") or "nvidia.com/gpu"
        self.cdi_spec_dirs = list(settings.get("cdi_spec_dirs") or ("/etc/cdi", "/var/run/cdi"))
        self.store_template = settings.get("store", DEFAULT_STORE) or ""
        self.image_env: list[str] | None = None     # the image's ENV, when podman runs it as a --rootfs
        self.store_mount: str | None = None         # where a cluster store image is mounted for the run
        self.store_image: str | None = None         # and that image's squashfs

    def run_dir(self, uid: int | None = None) -> str:
        """Where rootless podman keeps its run state for this user on this node (its
        XDG_RUNTIME_DIR): the config's ``container.podman.env.XDG_RUNTIME_DIR``, else the user's run
        directory that root made (hooks.layout.user_run_dir) -- never the job's XDG_RUNTIME_DIR, which
        a login node set (its /run/user/<uid> is not this node's, and podman's records name the run
        directory they were made with: every later command with another one fails)."""
        uid = os.getuid() if uid is None else uid
        return self.runtime_env.get("XDG_RUNTIME_DIR") or user_run_dir(uid)

    def base_env(self, host_env: Mapping[str, str]) -> dict[str, str]:
        """The host's environment and the configured one, with podman's run directory (``run_dir``)."""
        env = super().base_env(host_env)
        if os.getuid() == 0 and "XDG_RUNTIME_DIR" not in self.runtime_env:
            env.pop("XDG_RUNTIME_DIR", None)          # root's podman: its own /run
        else:
            env["XDG_RUNTIME_DIR"] = self.run_dir()
        return env

    def store_args(self, env: Mapping[str, str], *, create: bool = False, uid: int | None = None) -> list[str]:
        """podman's global options for this user's store on this node (container.podman.store):
        the images in ``<store>/storage``, the storage's run state in podman's run directory (a
        tmpfs, emptied at boot, as podman expects) -- nothing when the store is podman's default.
        ``create``: make and check the store directory (the launch does, as the user); else the
        store is only checked, when it exists (root's ``tether images ls`` never works inside a
        directory another user made). ``uid``: another user's (root's tools that run podman as
        that user)."""
        paths = self.store_paths(create=create, uid=uid)
        if not paths:
            return []
        store, run = paths
        # Not --tmpdir: libpod's state there (the boot marker whose absence makes podman reset
        # its records, the pause process) goes with the per-user SHM lock segment, which every
        # store of the user shares. A second tmpdir made podman reset -- free every lock of --
        # the other store's records, and ranks hung on libpod locks (seen here).
        # The storage driver stays podman's choice (storage.conf; here: vfs). Forcing rootless
        # overlay wedged the store here once processes were SIGKILLed mid-creation: an incomplete
        # layer whose mount stayed busy, and every later podman command of the user hung on it.
        return ["--root", f"{store}/storage", "--runroot", f"{run}/tether-podman/storage"]

    def store_paths(self, *, create: bool = False, uid: int | None = None) -> tuple[str, str] | None:
        """(the user's store directory, podman's run directory) for ``store_args``; None: podman's
        default store."""
        if not self.store_template:
            return None
        uid = os.getuid() if uid is None else uid
        run = self.run_dir(uid)
        if create:
            store = store_directory(self.store_template, uid)
            if uid != 0:
                try:
                    own_directory(run, uid, "podman's run directory", private=False)
                except LaunchError as exc:
                    if os.path.lexists(run):
                        raise
                    raise LaunchError(f"podman's run directory {run} does not exist: root makes it for you when "
                                      f"your first container step starts on this node (tether's SPANK plugin, "
                                      f"plugstack.conf user_dirs=; on PBS the MoM hook)") from exc
        else:
            store = existing_store(self.store_template, uid) or self.store_template.replace("{uid}", str(uid)).rstrip("/")
        return store, run

    def pull(self, image: str, env: Mapping[str, str]) -> str:
        """``tether images pull``: a registry image into this user's store on this node, under the
        store's lock, as the first rank of a job would -- pulled even when the store has it (a tag
        moved since: the new image)."""
        from ..launch import run_before

        if self.reference(image).kind != "registry":
            raise LaunchError(f"tether images pull: {image} is not a registry image (a rootfs directory is "
                              f"imported, when needed, by its first container)")
        env = self.base_env(env)
        self.store_args(env, create=True)
        glob = self.global_args(env)
        _, steps = self.image_plan(_ImageOnly(image), glob)
        steps = [(argv, None, *rest) for argv, _, *rest in steps]    # asked for: pulled, present or not
        store_dir = self.store_path()
        run_before(Launch(argv=[], env=env, runtime=self, before=steps,
                          lock=os.path.join(store_dir, ".pull-lock") if store_dir else None))
        name = self.reference(image).qualified()
        self.mark_used(name)
        return name

    def stored(self, env: Mapping[str, str]) -> list:
        """``podman images`` of this user's store on this node."""
        import json

        from ...system.proc import CommandError, run_command
        from . import StoredImage

        env = self.base_env(env)
        glob = self.global_args(env)    # a store that is there is checked (store_args: existing_store)
        if self.store_template and not os.path.lexists(self.store_path()):
            return []                   # nothing stored here (and podman would make the store)
        try:
            out = run_command([self.binary, *glob, "images", "--format", "json"], env=env,
                              timeout=120).stdout
        except CommandError as exc:
            raise LaunchError(f"podman images: {exc}") from None
        images, seen = [], set()
        for entry in json.loads(out or "[]"):
            for name in entry.get("Names") or [entry.get("Id", "?")[:12]]:
                if name in seen:
                    continue
                seen.add(name)
                used = self.last_use(name)
                images.append(StoredImage(name=name, size=int(entry.get("Size") or 0),
                                          last_used=used if used is not None else float(entry.get("Created") or 0),
                                          where=self.store_path() or "podman's default store"))
        return images

    def _use_marker(self, name: str) -> str | None:
        store = self.store_path()
        return os.path.join(store, ".used", sha256_hex(name)[:32]) if store else None

    def mark_used(self, name: str) -> None:
        """Record that a container of image ``name`` starts now (podman keeps no last use: prune
        goes by this). Best effort: the store's own ``.used`` directory, never followed links."""
        marker = self._use_marker(name)
        if marker is None:
            return
        try:
            os.makedirs(os.path.dirname(marker), mode=0o700, exist_ok=True)
            # non-blocking: a FIFO planted there fails at once (ENXIO) instead of hanging the rank
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
            try:
                os.utime(fd)
            finally:
                os.close(fd)
        except OSError:
            pass

    def last_use(self, name: str) -> float | None:
        marker = self._use_marker(name)
        try:
            st = os.lstat(marker) if marker else None
        except OSError:
            return None
        return st.st_mtime if st is not None and stat.S_ISREG(st.st_mode) else None

    def prune(self, older_than_days: float, env: Mapping[str, str]) -> list[str]:
        """Remove the images of this user's store not used for ``older_than_days`` (the last start
        of a container of it tether recorded, else when it was made), each with ``podman rmi``
        without --force -- podman never removes an image a container uses -- then the dangling
        layers; the store's lock keeps a pull or import of this user on this node from racing it."""
        from ...system.proc import CommandError, run_command
        from . import check_days

        check_days(older_than_days)
        env = self.base_env(env)
        glob = self.global_args(env, create=True)
        lock_fd = None
        if self.store_path():
            lock_fd = os.open(os.path.join(self.store_path(), ".pull-lock"),
                              os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        removed = []
        try:
            now = time.time()
            for image in self.stored(env):
                if now - image.last_used < older_than_days * 86400:
                    continue
                try:      # no --force: podman refuses an image a container (running or not) uses
                    run_command([self.binary, *glob, "rmi", image.name], env=env, timeout=300)
                except CommandError as exc:
                    progress(f"kept {image.name}: {exc.stderr.strip().splitlines()[-1] if exc.stderr else exc}")
                    continue
                removed.append(image.name)
                marker = self._use_marker(image.name)
                if marker:
                    remove_file(marker)
            run_command([self.binary, *glob, "image", "prune", "--force"], env=env, timeout=300, check=False)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        return removed

    def store_has(self, name: str) -> bool:
        """Does this user's store already list image ``name``? A look at containers/storage's own
        index (``<store>/storage/<driver>-images/images.json``: one podman process less per rank,
        ~0.1-0.3 s here). Only a yes counts: no, unknown or unreadable asks podman."""
        return any(names_list(text, name) for text in self._store_indexes())

    def _store_indexes(self):
        """The text of each of containers/storage's image indexes in this user's store."""
        store = self.store_path()
        if not store:
            return
        base = os.path.join(store, "storage")
        try:
            drivers = [d for d in os.listdir(base) if d.endswith("-images")]
        except OSError:
            return
        for directory in drivers:
            text = read_regular(os.path.join(base, directory, "images.json"), limit=64 << 20)
            if text:
                yield text

    def check_registry(self, pull: tuple, name: str, image: str, marker: str, env: Mapping[str, str]) -> None:
        """A tagged image already in the store, checked against the registry for this job: pulled
        again (``podman pull`` fetches the manifest, and layers only when it changed), said when
        it changed; a registry that cannot be reached leaves the store's copy, said so. ``pull``:
        the pull step (its command, and the command that says the store has the image)."""
        from ...system.proc import CommandError, run_command
        from ..launch import run_recovering

        before = self.image_id(name)
        try:
            after = run_recovering(self, pull[0], env).stdout.strip()
        except CommandError as exc:
            if before is None:
                try:
                    run_command(pull[1][1], env=env, timeout=120)          # podman image exists
                except CommandError:                                      # nothing to fall back on
                    raise LaunchError(f"failed to import docker image: {image}: {exc}") from None
            registry_unchecked(image, next((line.strip() for line in (exc.stderr or "").splitlines() if line.strip()),
                                           str(exc)))
        else:
            if before and after and after.splitlines()[-1] != before:
                progress(f"{image} has changed in its registry since your store's copy: pulled the new one")
        mark_checked(marker)

    def image_id(self, name: str) -> str | None:
        """The id of image ``name`` in this user's store (containers/storage's images.json), or None."""
        import json

        for text in self._store_indexes():
            try:
                images = json.loads(text)
            except ValueError:
                continue
            for entry in images if isinstance(images, list) else []:
                if isinstance(entry, dict) and name in (entry.get("names") or []):
                    return entry.get("id")
        return None

    def store_path(self) -> str | None:
        """This user's store directory on this node, or None (podman's default store)."""
        return self.store_template.replace("{uid}", str(os.getuid())).rstrip("/") if self.store_template else None

    # What ``launch`` asks of this process and node, one method each: the C launcher's argv
    # templates are this ``launch`` run with the answers of its common case and placeholders for
    # the rank's values (container/rank_launcher.py: RankTemplate), so the two cannot drift apart.
    @staticmethod
    def as_root() -> bool:
        return os.getuid() == 0

    @staticmethod
    def terminal() -> bool:
        return stdio_is_terminal()

    @staticmethod
    def node_mqueue() -> bool:
        return node_has_mqueue()

    @staticmethod
    def names_fd(names) -> int:
        return env_names_fd(names)

    def launch(self, spec: LaunchSpec, host_env: Mapping[str, str]) -> Launch:
        if self.as_root() and in_slurm_cgroup():
            # seen on the cgroup sandbox: memory/freezer/devices:/libpod_parent/libpod-<id>; a
            # --cgroup-parent under the task's cgroup fails under ConstrainDevices (runc cannot
            # write "c *:* m" to devices.allow) -- never silently loose: refused
            raise LaunchError("podman as root moves the container into a cgroup of its own (/libpod_parent), out "
                              "of the step's: Slurm would neither account, limit nor stop it. Run container "
                              "steps as a regular user (rootless podman stays in the step)")
        env = self.base_env(host_env)
        if "TMPDIR" not in self.runtime_env:
            # rootless podman keeps its run state under $TMPDIR when XDG_RUNTIME_DIR is unset (as in
            # a Slurm task): not in the rank's own /tmp, which the container sees
            env.pop("TMPDIR", None)
        passed, own = self.container_env(spec, host_env)
        gpu = self.gpu_kind(spec)
        devices = self.cdi_devices(spec, host_env) if gpu == "cuda" else []
        if devices:   # inside, only the rank's GPUs exist: CUDA counts them from 0
            passed.pop("CUDA_VISIBLE_DEVICES", None)
            own["CUDA_VISIBLE_DEVICES"] = ",".join(str(n) for n in range(len(devices) // 2))
        fds, mpi_args = mpi_pass_through(host_env, passed, own)
        if spec.name and spec.name_attach != "never" and spec.rank_dir:
            attached = self.attach(spec, env, host_env, passed, own, bool(fds or mpi_args), devices)
            if attached:
                return attached
        # --container-entrypoint: the entrypoint starts without the job's other variables, which
        # a shell between it and the command sets where it left them unset (LATER_PART), as pyxis
        # (a rootfs directory has no entrypoint: nothing to start without them); the file is
        # written last, once nothing refuses the launch
        passed, later = (entrypoint_split(passed, spec) if spec.rank_dir and not os.path.isdir(spec.image)
                         else (passed, {}))
        command = (["/bin/sh", "-c", LATER_PART + 'exec "$@"', "sh", f"{CONTAINER_WORKDIR}/{LATER_FILE}",
                    *spec.command] if later else list(spec.command))
        name = spec.rank_instance      # one podman container per rank, --container-name or not
        # podman writes the container's id here once it exists (see Launch.created): in the rank's
        # own directory, which nothing else of tether's changes while podman runs (system.dirstamp)
        created = os.path.join(spec.rank_dir, ".cid") if spec.rank_dir else None
        store = self.store_args(env, create=True)       # made and checked here, as the user
        glob = self.global_args(env)
        # --container-save needs the container after it ended: removed once saved (``after``)
        # --container-unshare: the step's ranks on this node share the namespaces asked for, as
        # pyxis's tasks share its one container per node -- a pod per step and node
        pod = step_pod(spec) if spec.unshare and spec.rank_dir else None
        argv = [self.binary, "run", *self.args, *store, "--log-level=fatal", *(["--rm"] * (not spec.save)),
                "--name", name,
                *(["--cidfile", created] if created else []),
                "--label", f"tether.job={spec.job_id}", "--label", f"tether.step={spec.job_id}.{spec.step_id}",
                *(["--pod", pod] if pod else []),
                *unshare_args(spec.unshare, pod=bool(pod), mqueue=self.node_mqueue()), "--pid=host"]
        if not self.terminal():
            # the container gets the rank's own stdin/stdout/stderr, as a host rank does: no attach
            # through conmon (which lost a short rank's output once here, and does not pass stdin)
            # and no copy of all output in a log file under the user's home. podman refuses it on
            # a terminal (srun --pty): there the default attach stays.
            argv.append("--log-driver=passthrough")
        else:
            # srun --pty: attached, with stdin (podman run passes none without --interactive: an
            # interactive shell read end-of-file and ended at once) and, on a terminal, a terminal
            # inside too (job control, line editing, `tty`), as a host rank has
            argv += ["--interactive", *(["--tty"] if os.isatty(0) and os.isatty(1) else [])]
        if not self.as_root() and not spec.remap_root:
            # yourself inside (files on mounts keep your ownership); --container-remap-root:
            # rootless podman's own default, root inside a user namespace (still you on the host).
            # In a pod, the pod's (a container there cannot have one of its own)
            argv += ["--userns=keep-id"] * (not pod)
        elif not self.as_root():
            # root's capabilities over the container's own namespaces, as enroot's remapped root
            # has them (mount a tmpfs, chown, chroot: what apt and pyxis's tests do as root);
            # nothing on the host -- the user namespace is the user's -- and seccomp stays on
            argv.append("--cap-add=all")
        if not spec.entrypoint:
            argv.append("--entrypoint=")      # the command itself, not the image's ENTRYPOINT (as pyxis)
        if not spec.writable:
            argv.append("--read-only")
        argv += mpi_args
        if passed:
            # the names in a file podman reads (--env-file, a memfd: nothing on disk, nothing on the
            # command line); a name without '=' makes podman copy the value from its own
            # environment (pkg/env ParseFile/parseEnv), so any value -- newlines too -- arrives as is
            names_fd = self.names_fd(passed)
            fds = {**(fds or {}), names_fd: names_fd}
            argv += ["--env-file", f"/dev/fd/{names_fd}"]
        argv += self.own_env_args(own)
        refusal = mount_refusal(spec.mounts, self.name)
        if refusal:
            raise LaunchError(refusal)
        # the home first, as enroot's hook mounts it before the user's mounts: a user's mount at
        # the same target wins, and umount:DST takes either away (podman takes one mount a target)
        mounts = effective_mounts((*self.home_mounts(spec, host_env), *spec.mounts), self.name)
        if spec.batch_script:                # --container-batch: the script at its own path, read-only
            mounts += (Mount(spec.batch_script, CONTAINER_BATCH_SCRIPT, True),)
        for mount in (*spec.rank_mounts(), *mounts):
            # a tmpfs: --tmpfs DST[:size=,mode=,ro,...] (podman 4.3 and 5 alike); a bind: --volume
            # SRC:DST[:ro,nosuid,unbindable,...], recursive as pyxis's
            argv += mount_args(mount)
        argv += ["--workdir", spec.workdir]
        argv += devices
        if gpu == "rocm":
            argv += ["--device", "/dev/kfd", "--device", "/dev/dri"]
        # --container-name alone: the job's container of that name on this node, made by an
        # earlier step with an image (named_container)
        image_argv, before = self.image_plan(spec, glob, mounts) if spec.image else ([], [])
        if image_argv[:1] == ["--pull=never"]:
            self.mark_used(image_argv[1])
        prepare = None
        if spec.name:
            image_argv, before, prepare = self.named_container(spec, image_argv, before, glob)
        elif spec.image and spec.rank_dir and not self.as_root() and (
                (spec.writable and not spec.remap_root and image_argv[:1] == ["--pull=never"])
                # your own rootfs through a discarded overlay: podman exports nothing of it to save
                or (spec.save and image_argv[:1] == ["--rootfs"] and image_argv[1].endswith(":O"))):
            if image_argv[:1] == ["--rootfs"]:
                image_argv = ["--rootfs", image_argv[1].removesuffix(":O")]
            elif image_argv[1].startswith(ROOTFS_IMAGE):
                # a shared rootfs: copied as it is (podman makes the targets it lacks in the copy, the
                # user's own), not imported into the store first
                image_argv, before = ["--rootfs", self.local_image(spec.image)], []
            image_argv, before, prepare = self.step_root(spec, image_argv, before, glob)
        elif image_argv[1:2] and image_argv[1].startswith(SQUASHFS_IMAGE) and spec.rank_dir:
            # an enroot-made squashfs keeps its image's ENV in /etc/environment, not in a config
            # podman reads: given as the image's, before the job's (podman: a later --env-file wins)
            image_env_file(spec.rank_dir, argv, squashfs_environment(self.local_image(spec.image)))
        elif self.image_env and spec.rank_dir:
            # a cluster store image runs as a --rootfs: its ENV from what the service recorded
            image_env_file(spec.rank_dir, argv, self.image_env)
        if prepare and later:           # the entrypoint goes before the shell that sets ``later``
            command_prepare = prepare
            prepare = lambda argv: command_prepare(argv, len(command))    # noqa: E731
        if prepare:
            # the image's ENV first: podman lets a later --env-file win, and the job's values win
            at = argv.index("--env-file") if "--env-file" in argv else len(argv)
            argv[at:at] = image_argv[:2]
            image_argv = image_argv[2:]
        argv += image_argv
        argv += command
        # After an abnormal end (a signal, the step cancelled) --rm may not have run: remove it. If
        # the step's end kills that too, slurmstepd runs it once the step is over (see ``marker``).
        marker = os.path.join(os.path.dirname(spec.rank_dir), f"{CLEANUP_MARKER}{spec.rank}") if spec.rank_dir else None
        # the name too: a later step of the job attaches to it while it runs (running_container)
        data = {"runtime": self.name, "container": name, **({"name": spec.name} if spec.name else {}),
                **({"mount": self.store_mount} if self.store_mount else {})}
        lock = None
        if before:
            # one pull or import per user per node: the ranks (and jobs) of a user on a node share
            # the lock in their store (podman's default store: the ranks of this job's node)
            store_dir = self.store_path()
            step_dir = os.path.dirname(spec.rank_dir) if spec.rank_dir else None
            if store_dir:
                lock = os.path.join(store_dir, ".pull-lock")
            elif step_dir:
                lock = os.path.join(os.path.dirname(step_dir), "podman", ".pull-lock")
        finish, after = None, []
        if spec.save:
            partial = f"{spec.save}.{os.uname().nodename}.{os.getpid()}.partial"
            # a squashfs file (pyxis's and enroot's format) when the name says so, else an OCI archive
            save = save_squashfs if spec.save.endswith(SQUASHFS_SUFFIXES) else save_oci_archive
            # a container of a root directory: podman exports nothing of it, so its directory is
            # saved (a root tether unpacked as the user: its files become root's, as enroot's export)
            root = image_argv[image_argv.index("--rootfs") + 1] if "--rootfs" in image_argv else None
            source = (root, bool(prepare)) if root and not root.endswith(":O") else None
            finish = ([lambda env: save([self.binary, *glob], name, partial, env, source=source)], partial, spec.save)
            after = [[self.binary, *glob, "rm", "--force", "--ignore", "--volumes", name]]
        if pod:
            step_dir = os.path.dirname(spec.rank_dir)
            podman = [self.binary, *glob]
            create = ["--log-level=error", "--replace", "--name", pod,
                      *(["--userns=keep-id"] * (not self.as_root() and not spec.remap_root)), *pod_args(spec.unshare)]
            rank = str(spec.rank)
            before = [*before, (lambda env: join_pod(podman, create, pod, step_dir, rank, env), None)]
            after = [*after, lambda env: self.leave_pod(pod, step_dir, rank, env)]
        if self.store_mount:
            mnt, podman = self.store_mount, [self.binary, *glob]
            argv = store_run_argv(podman, self.store_image, mnt, argv)
            after = [*after, lambda env: unmount_store_image(podman, mnt, env)]
        # root's podman keeps no pause process (no XDG_RUNTIME_DIR: see base_env)
        kept = ((pause_pid_file(env["XDG_RUNTIME_DIR"]), PAUSE_NAMES),) if env.get("XDG_RUNTIME_DIR") else ()
        if later:
            later_values(spec.rank_dir, later)
        return Launch(argv=argv, env=env, supervise=True, runtime=self, container=name, monitor="conmon",
                      marker=marker, marker_data=data, before=before, lock=lock, created=created,
                      fds=fds, finish=finish, after=after, prepare=prepare, runtime_own=kept,
                      failures=os.path.dirname(spec.rank_dir) if spec.rank_dir else None)

    def running_container(self, spec: LaunchSpec, env: Mapping[str, str]) -> str | None:
        """The running container of the job on this node that ``--container-name=NAME`` attaches
        to (pyxis's: another step runs it), "" when none runs yet but another step is starting one
        (its marker is there, or it unpacks the named container), else None. Found by the cleanup
        markers of the job's other steps here (each container a launcher started until it is
        removed says its name): the earliest step's lowest rank's that podman says is running.
        ``NAME`` ``JOB.STEP`` of this job: that step's containers, named or not (pyxis's name for a
        step's unnamed container)."""
        import json

        step_dir = os.path.dirname(spec.rank_dir)
        node_dir, own_step = os.path.dirname(step_dir), os.path.basename(step_dir)
        job, dot, step = (spec.name or "").partition(".")
        of_step = f"{NODE_STEP_PREFIX}{step}" if dot and job == spec.job_id and step.isdigit() else None
        found = []
        try:
            steps = [e.name for e in os.scandir(node_dir) if e.name.startswith(NODE_STEP_PREFIX) and e.name != own_step
                     and e.is_dir(follow_symlinks=False)]
        except OSError:
            return None
        for each in steps:
            try:
                markers = [m for m in os.listdir(os.path.join(node_dir, each)) if m.startswith(CLEANUP_MARKER)
                           and m[len(CLEANUP_MARKER):].isascii() and m[len(CLEANUP_MARKER):].isdigit()]
            except OSError:
                continue
            for marker in markers:
                try:
                    data = json.loads(read_regular(os.path.join(node_dir, each, marker), 4096) or "null")
                except ValueError:
                    continue
                if not isinstance(data, dict) or data.get("runtime") != self.name:
                    continue
                container = data.get("container")
                if isinstance(container, str) and container.startswith(f"tether-{spec.job_id}-") and (
                        data.get("name") == spec.name or each == of_step):
                    number = each[len(NODE_STEP_PREFIX):]
                    found.append((not number.isdigit(), int(number) if number.isdigit() else 0,
                                  int(marker[len(CLEANUP_MARKER):]), container))
        from ...system.proc import run_command

        # another step unpacks it now: the named container, or the step's own writable root
        starting = (spec.name is not None and _unpacking(named_podman_home(spec))) or (
            of_step is not None and _unpacking(os.path.join(node_dir, of_step, "podman-rootfs")))
        for *_, container in sorted(found):
            state = run_command([self.binary, *self.global_args(env), "container", "inspect", "--format",
                                 "{{.State.Status}} {{.State.Pid}}", container], env=env, timeout=60, check=False)
            words = state.stdout.split()
            # a launcher that wrote its marker starts its container next: not there yet, or coming up
            starting = starting or state.returncode != 0 or words[:1] in (["created"], ["configured"],
                                                                           ["initialized"])
            if state.returncode == 0 and words[:1] == ["running"]:
                # its namespaces as the kernel shows them (podman 4.3 calls the node's IPC namespace
                # "shareable" as it does a private one)
                missing = [ns for ns in ("net", "ipc", "uts")
                           if ns in spec.unshare and not _own_namespace(words[1] if len(words) > 1 else "", ns)]
                if missing:     # pyxis's words
                    kind = {"net": "network", "ipc": "IPC", "uts": "UTS"}[missing[0]]
                    raise LaunchError(f"--container-unshare={missing[0]} requested but the container is not in a "
                                      f"separate {kind} namespace (--container-name={spec.name} runs in another "
                                      f"step without it)")
                return container
        return "" if starting else None

    def attach(self, spec: LaunchSpec, env: dict[str, str], host_env: Mapping[str, str], passed: dict[str, str],
               own: dict[str, str], mpi: bool, devices: list[str]) -> Launch | None:
        """``--container-name=NAME`` while another step of the job runs that container on this node:
        this rank runs in it (``podman exec``: its mounts, its files, what its processes mounted),
        as pyxis attaches to a running container's namespaces; still this step's process, in this
        step's cgroup (rootless podman moves nothing). --container-mounts is ignored, as pyxis
        does; the working directory is / unless --container-workdir says otherwise. None: nothing
        to attach to (``:exec``: an error)."""
        if devices or mpi:
            # a running container gets no new devices, file descriptors or mounts
            if spec.name_attach == "exec":
                raise LaunchError(f"--container-name={spec.name}:exec: a running container cannot be given this "
                                  f"step's {'GPUs' if devices else 'MPI connection (PMI_FD, PMIx)'}; without ':exec' "
                                  f"the step runs in a container of its own over its files")
            return None
        # a step that is starting the container (its marker is there, or it unpacks the named
        # container now) gets it in a moment: waited for, as pyxis finds enroot's started at once
        deadline, pause = time.monotonic() + ATTACH_WAIT_SECONDS, 0.25
        running = self.running_container(spec, env)
        while running == "" and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 2.0)          # a node of many waiting ranks: few podman calls each
            running = self.running_container(spec, env)
        if not running:
            if spec.name_attach == "exec":
                raise LaunchError(f"--container-name={spec.name}:exec: no step of this job runs that container on "
                                  f"this node; without ':exec' this step runs in it, made when missing")
            return None
        if (host_env.get("TETHER_CONTAINER_MOUNTS") or "").strip():
            progress("ignoring --container-mounts when attaching to a running container")
        argv = [self.binary, *self.global_args(env), "exec", "--interactive"]
        if stdio_is_terminal() and os.isatty(0) and os.isatty(1):
            argv.append("--tty")
        fds = None
        if passed:
            names_fd = env_names_fd(passed)
            fds = {names_fd: names_fd}
            argv += ["--env-file", f"/dev/fd/{names_fd}"]
        own = {k: v for k, v in own.items() if k not in ("TMPDIR", "TETHER_WORK_DIR")}    # the container's own
        argv += self.own_env_args(own)
        argv += ["--workdir", "/" if spec.workdir == CONTAINER_WORKDIR else spec.workdir, running, *spec.command]
        return Launch(argv=argv, env=env, supervise=False, runtime=self, fds=fds)

    def named_container(self, spec: LaunchSpec, image_argv: list[str], before: list[tuple],
                        glob: list[str]) -> tuple[list[str], list[tuple], object]:
        """--container-name: the container's root as a directory of the job's on this node
        (``<node>/podman-named/<name>/rootfs``: the user's own, so podman runs it as it is and a
        --container-writable step's changes stay for the job's next steps, like enroot's named
        containers), unpacked once per node from the image (:meth:`own_root`). Removed with the
        job's directories."""
        if not spec.rank_dir:
            raise LaunchError("--container-name needs the job's directories on the node (run it under srun or "
                              "pbs_tmrsh, not by hand)")
        home = named_podman_home(spec)
        config = os.path.join(home, "config.json")
        refuse_existing(spec, os.path.exists(config), os.path.join(home, NAMED_MADE_BY))   # NAME:create, there already
        if not spec.image and not os.path.exists(config):      # no image: the container must be there (as pyxis)
            raise LaunchError(no_named_container(spec))
        step = os.path.basename(os.path.dirname(spec.rank_dir))
        return self.own_root(spec, image_argv, before, glob, home, made_by=step,
                             label=f"unpacking {spec.image} for --container-name={spec.name} (podman; once per node)")

    def step_root(self, spec: LaunchSpec, image_argv: list[str], before: list[tuple],
                  glob: list[str]) -> tuple[list[str], list[tuple], object]:
        """A writable container without --container-remap-root: as pyxis's (enroot unpacks the
        image as the user), the container's root is the user's own -- ``touch /newfile`` and
        ``apt-get`` work as yourself --, unpacked once per node for the step into the step's
        directory (``<step>/podman-rootfs``), shared by the step's ranks on the node as pyxis's
        one container per node is, and gone with the step. (Rootless podman's own writable layer
        keeps the image's owners: only root inside could write it.)"""
        home = os.path.join(os.path.dirname(spec.rank_dir), "podman-rootfs")
        return self.own_root(spec, image_argv, before, glob, home,
                             label=f"unpacking {spec.image} as your writable container (podman; once per "
                                   f"node for the step)")

    def own_root(self, spec: LaunchSpec, image_argv: list[str], before: list[tuple], glob: list[str], home: str,
                 *, label: str, made_by: str | None = None) -> tuple[list[str], list[tuple], object]:
        """A container root the user owns, in ``home`` (``rootfs``, the image's configuration
        beside it: ``image.env``, its ENV, losing to the job's values as with any image;
        ``config.json``, its ENTRYPOINT for --container-entrypoint), unpacked from ``image_argv``
        by the first rank that needs it (``unpack_named``). (podman's run arguments, the steps
        before the run, what adds the entrypoint to the command.)"""
        rootfs, config = os.path.join(home, "rootfs"), os.path.join(home, "config.json")
        run_image = ["--env-file", os.path.join(home, "image.env"), "--rootfs", rootfs]
        if spec.image:
            unpack = (lambda env: unpack_named(image_argv, [self.binary, *glob], home, env, made_by=made_by),
                      config, label)
            before = [*before, unpack]
        # the step's mount targets the root lacks, made before any rank's container starts (under
        # the launch's lock): the ranks sharing this root would make them at once, and runc's
        # mkdir of a parent another rank's runc just made fails ("file exists"; podman 5's runc)
        mounts = [m for m in (*spec.rank_mounts(), *spec.mounts) if m.kind in ("tmpfs", "bind")]
        targets = [m.target for m in mounts if m.kind == "tmpfs" or os.path.isdir(m.source)]
        before = [*before, (lambda env: make_targets(rootfs, targets), None)]

        def prepare(argv: list[str], command_length: int = len(spec.command)) -> list[str]:
            """The image's ENTRYPOINT before the command (its last ``command_length`` words: known
            once the container is unpacked);
            a --container-workdir the root lacks refused in pyxis's words (podman's own names a
            container id the user never saw)."""
            if spec.workdir != CONTAINER_WORKDIR and not any(
                    spec.workdir == m.target or spec.workdir.startswith(m.target.rstrip("/") + "/") for m in mounts):
                missing = missing_directory(rootfs, spec.workdir)
                if missing:
                    raise LaunchError(f"--container-workdir: couldn't chdir to {spec.workdir}: No such file or "
                                      f"directory ({missing} is not in the container; pyxis refuses it too)")
            if not spec.entrypoint:
                return argv
            import json

            text = read_regular(config)       # never waits on a FIFO the user put there
            if text is None:
                raise LaunchError(f"{config} is not the regular file tether unpacked there"
                                  + (f"; use another name (or remove {home})" if spec.name else ""))
            entrypoint = [str(a) for a in (json.loads(text).get("Entrypoint") or []) if a]
            at = len(argv) - command_length
            return argv[:at] + entrypoint + argv[at:]

        return run_image, before, prepare

    def cdi_devices(self, spec: LaunchSpec, host_env: Mapping[str, str]) -> list[str]:
        """``--device KIND=ID`` for exactly the rank's GPUs (not ``=all``: the node's other GPUs
        belong to other jobs). Refused with the fix when no CDI spec of that kind is on this node."""
        kind = self.cdi_kind
        if not any(spec_has_kind(d, kind) for d in self.cdi_spec_dirs):
            raise LaunchError(f"GPU slots in a podman container need a CDI spec for {kind} on this node "
                              f"(none in {', '.join(self.cdi_spec_dirs)}): an admin runs `nvidia-ctk cdi "
                              f"generate --output=/etc/cdi/nvidia.yaml` (see tether's README, GPUs)")
        ids = gpu_device_ids(spec.gpus, host_env)
        bad = [i for i in ids if not gpu_id_ok(i)]
        if bad:   # CUDA_VISIBLE_DEVICES is the job's to set where Slurm did not
            raise LaunchError(f"GPU {bad[0][:40]!r} (CUDA_VISIBLE_DEVICES) is not a GPU index or UUID")
        return [a for i in ids for a in ("--device", f"{kind}={i}")]

    def forget_unreaped_pause_process(self, env: Mapping[str, str]) -> bool:
        """The pause process podman's pid file names has ended, but nothing reaped it (JOIN_FAILED):
        remove the pid file (the user's own, in the user's run directory) so the next podman joins
        a running container's namespace or makes a new one, as it does when the pause process is
        gone. Only a zombie of this user counts (a live process is left alone), looked at again
        under the repair lock (another rank may have put a new pause process's pid there
        meanwhile); True if removed. A zombie's pid is not reused while it stays one."""
        run_dir = env.get("XDG_RUNTIME_DIR")
        if not run_dir:
            return False
        pid_file = pause_pid_file(run_dir)

        def zombie() -> int | None:
            text = read_regular(pid_file, limit=32)         # a FIFO there never hangs the rank
            try:
                pid = int((text or "").strip())
                with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                    state = fh.read().rsplit(")", 1)[1].split()[0]
                owner = os.stat(f"/proc/{pid}").st_uid
            except (OSError, ValueError, IndexError):
                return None
            return pid if state == "Z" and owner == os.getuid() else None

        if zombie() is None:
            return False
        lock_fd = None
        try:
            lock_fd = os.open(os.path.join(run_dir, REPAIR_LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                              0o600)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        except OSError as exc:
            progress(f"cannot take the repair lock in {run_dir}: {exc.strerror}; leaving podman's pause pid file")
            if lock_fd is not None:
                os.close(lock_fd)
            return False
        try:
            pid = zombie()
            if pid is None:                  # another rank dealt with it: podman may simply try again
                return True
            try:
                os.unlink(pid_file)
            except FileNotFoundError:
                pass
            except OSError as exc:
                progress(f"cannot remove podman's pause pid file {pid_file}: {exc.strerror}")
                return False
        finally:
            os.close(lock_fd)
        progress(f"podman's pause process (pid {pid}) has ended but nothing reaped it (this node's init does "
                 f"not reap orphans): podman starts a new one")
        return True

    def recover_state(self, env: Mapping[str, str], output: str | None = None, *, new_session: bool = True) -> bool:
        """See repair_stale_state: this user's podman on this node, telling the rank's stderr. After
        a run that ended before it created the container (``output`` None: its message went to the
        rank), one more try also when the state is not stale: rebuilding its state after the
        processes it named were killed, podman 4.3 sometimes exits 1 without a word, and the next
        run works (seen in the stale-state test, about 1 in 2 on this machine)."""
        if (output is None or JOIN_FAILED in output) and self.forget_unreaped_pause_process(env):
            return True
        # root's podman has no run directory of a user's (base_env), nor such a state
        run_dir = self.run_dir() if env.get("XDG_RUNTIME_DIR") else None
        reset = (lambda: remove_boot_marker(run_dir)) if run_dir else None
        lock = os.path.join(run_dir, REPAIR_LOCK) if run_dir and os.path.isdir(run_dir) else None
        repaired = repair_stale_state([self.binary, *self.global_args(env)], env=env, output=output, reset=reset,
                                      lock=lock, new_session=new_session)
        if repaired is None and output is None:
            progress("podman exited before it created the container, and its state checks out now: trying "
                     "once more (nothing of this rank ran yet)")
            return True
        return bool(repaired)

    def leave_pod(self, pod: str, step_dir: str, rank: str, env: Mapping[str, str]) -> bool:
        """This rank leaves its step's pod (join_pod); the last one removes it, and its marker.
        False when the pod could not be removed (the marker stays for the step's cleanup)."""
        fd = _pod_lock(step_dir)
        try:
            members = _pod_members(step_dir)
            try:
                os.unlink(os.path.join(members, rank))
            except FileNotFoundError:
                pass
            if os.listdir(members):
                return True
            if not self.remove_pod(pod, env):
                return False
            remove_file(os.path.join(step_dir, POD_MARKER))
            return True
        finally:
            os.close(fd)

    def remove_pod(self, pod: str, env: Mapping[str, str], *, new_session: bool = True) -> bool:
        """``podman pod rm --force`` (its infra container and any container left in it). When the
        step's end killed the infra container's conmon, the first ``pod rm`` only marks it stopped
        ("could not be stopped: timed out waiting for file …"), as ``rm`` does a container's: a
        second one removes the pod; a stale state is repaired in between (see remove). The OCI
        runtime's own state of the infra container, which podman leaves in that case, goes too."""
        from ...system.proc import CommandError, run_command

        glob = self.global_args(env)

        def podman(*args: str) -> str:
            return run_command([self.binary, *glob, *args], env=env, timeout=60, new_session=new_session).stdout

        infra, failure = "", None
        for attempt in range(3):
            try:
                infra = infra or podman("pod", "inspect", "--format", "{{.InfraContainerID}}", pod).strip()
            except CommandError:
                pass                          # no such pod (exit 125), or a stale state: rm says which
            try:
                podman("pod", "rm", "--force", "--ignore", pod)
                failure = None
                break
            except CommandError as exc:
                failure = exc
                if STALE_STATE in (exc.stderr or "") and not self.recover_state(env, exc.stderr,
                                                                                 new_session=new_session):
                    break
        if infra and all(c in "0123456789abcdef" for c in infra):
            for runtime, root in self.oci_state_roots(env):
                if os.path.isdir(os.path.join(root, infra)):
                    try:
                        run_command([runtime, "--root", root, "delete", "--force", infra], env=env, timeout=30,
                                    new_session=new_session)
                    except CommandError:
                        pass
        if failure is not None:
            progress(f"could not remove the step's pod {pod}: {failure}")
        return failure is None

    def remove(self, name: str, env: Mapping[str, str], *, new_session: bool = True, reap: bool = False) -> bool:
        """``podman rm --force`` (twice: the first rm of a container whose conmon was killed only
        marks it stopped), then the OCI runtime's own state of it, which podman 4.3 leaves behind in
        that case (``<root>/<container id>/state.json``; seen after every scancel of a step).
        ``reap``: while ``rm`` runs, reap this process's other ended children (reap_zombies) --
        the launcher's, whose killed container's processes are its zombies, which podman 5's rm
        waits for in vain."""
        import time

        from ...system.proc import CommandError, run_command

        def run(argv: list[str], reaping: bool = False) -> str | None:
            for _ in range(2):
                try:
                    return run_command(argv, env=env, timeout=30, new_session=new_session,
                                       while_waiting=reap_zombies if reaping else None).stdout
                except CommandError as exc:
                    # the step's end killed the processes podman's state names (a cold node: no
                    # pause process of the user's outlives the step): repaired once, asked again
                    if repaired or (STALE_STATE not in (exc.stderr or "") and JOIN_FAILED not in (exc.stderr or "")):
                        failures.append(exc)
                        return None
                    repaired.append(self.recover_state(env, exc.stderr, new_session=new_session))
                    if not repaired[0]:
                        failures.append(exc)
                        return None
            return None

        def gone() -> bool:
            # `podman container exists`: 0 it exists, 1 it does not (anything else, and a stale
            # state's exit 1: unknown)
            try:
                run_command([self.binary, "container", "exists", *glob, name], env=env, timeout=30,
                            new_session=new_session)
            except CommandError as exc:
                return exc.returncode == 1 and STALE_STATE not in (exc.stderr or "")
            return False

        failures: list[CommandError] = []
        repaired: list[bool] = []
        glob = self.global_args(env)
        cid = (run([self.binary, "inspect", *glob, "--format", "{{.Id}}", name]) or "").strip()
        removed = False
        # `rm` can answer 0 and leave a stopped container behind when it races podman run's own
        # --rm cleanup at a time limit (seen once in 100 jobs: the record stayed, the marker went):
        # only a container podman no longer knows counts as removed
        for attempt in range(4):
            time.sleep(REMOVE_BACKOFF * attempt)         # 0, 0.5, 1, 1.5 s: 3 s at most
            # --volumes: its anonymous ones too (a tmpfs with options: mount_args)
            run([self.binary, "rm", *glob, "--force", "--ignore", "--volumes", "--time", "0", name], reaping=reap)
            if gone():
                removed = True
                break
        if cid and all(c in "0123456789abcdef" for c in cid):
            for runtime, root in self.oci_state_roots(env):
                if os.path.isdir(os.path.join(root, cid)):
                    run([runtime, "--root", root, "delete", "--force", cid])
        if not removed:
            report(f"could not remove the container {name}: {failures[-1] if failures else 'it is still there'}")
        return removed

    def oci_state_roots(self, env: Mapping[str, str]) -> list[tuple[str, str]]:
        """(OCI runtime, its state root) pairs where podman keeps a container's state: in its run
        directory (``run_dir``: root's is ``/run``), ``<run dir>/<runtime>``."""
        args = list(self.args)
        chosen = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--runtime"]
        chosen += [a.split("=", 1)[1] for a in args if a.startswith("--runtime=")]
        runtimes = chosen or ["crun", "runc"]
        return [(rt, os.path.join(self.run_dir(), os.path.basename(rt))) for rt in runtimes]

    def global_args(self, env: Mapping[str, str] | None = None, *, create: bool = False,
                    uid: int | None = None) -> list[str]:
        """podman's global options for every command of this user: the configured args that are
        global options (e.g. --runtime runc) and the store's (``store_args``)."""
        out, args = [], list(self.args)
        while args:
            arg = args.pop(0)
            if arg in ("--runtime", "--root", "--runroot", "--storage-driver", "--cgroup-manager") and args:
                out += [arg, args.pop(0)]
            elif arg.split("=", 1)[0] in ("--runtime", "--root", "--runroot", "--storage-driver",
                                           "--cgroup-manager"):
                out.append(arg)
        return out + self.store_args(os.environ if env is None else env, create=create, uid=uid)

    def cluster_image(self, name: str, spec: LaunchSpec):
        """The cluster image store's image of registry image ``name`` for this rank (Runtime.cluster_store_image),
        None when the rank needs what a --rootfs cannot give (the image's entrypoint, a named, saved
        or writable container) or runs as root."""
        # --container-writable: the user's own copy of the image, theirs to write anywhere in (the
        # store's files keep their owners: root's / is not the user's)
        if self.as_root() or spec.entrypoint or spec.name or spec.save or spec.writable:
            return None
        return self.cluster_store_image(name)

    def unmount_leftover(self, mnt: str, env: Mapping[str, str]) -> bool:
        """The cleanup's: a killed rank's cluster store image mount (a marker's "mount"), only when
        it is one of this user's (``<run dir>/tether-images/<name>``)."""
        base = os.path.join(self.run_dir(), STORE_MOUNTS)
        if os.path.dirname(mnt) != base or os.path.basename(mnt) in ("", ".", ".."):
            report_admin(f"cleanup: ignoring the mount {mnt!r}: not one tether makes")
            return False
        return unmount_store_image([self.binary, *self.global_args(env)], mnt, env)

    @staticmethod
    def rootfs_argv(path: str, writable: bool) -> list[str]:
        """podman run's image arguments for a rootfs directory run as it is: read-only, or writable
        through an overlay whose changes are discarded."""
        return ["--rootfs", f"{path}:O" if writable else path]

    def image_plan(self, spec: LaunchSpec, glob: list[str], mounts=None) -> tuple[list[str], list[tuple]]:
        """(podman run's image arguments, the steps before the run: a pull or an import).

        A registry image is pulled once per user per node into the store, then run with
        ``--pull=never``. A rootfs directory runs as it is (``--rootfs``, nothing copied) when it
        can: read-only and holding every mount target (podman's and --container-mounts'), or one
        the user owns (podman makes targets itself; writable through a discarded overlay). Any
        other -- a shared rootfs without /etc/hosts, /data or /run, or --container-writable on a
        shared one -- is imported once per user per node into the store as an image, so mount
        targets and writes go into the container's own layer, as with a registry image."""
        image = spec.image
        ref = self.reference(image)
        if ref.kind == "registry":
            name = ref.qualified()                          # as podman's store names it
            rank_dir = getattr(spec, "rank_dir", None)
            stored = self.cluster_image(name, spec) if rank_dir else None
            if stored:
                # the cluster image store's squashfs, mounted in the user's namespace for this rank
                # (squashfuse: nothing unpacked, nothing copied into the user's store)
                self.store_mount = os.path.join(self.run_dir(), STORE_MOUNTS, f"{spec.job_id}.{spec.step_id}.{spec.rank}")
                self.image_env = [e for e in stored.config.get("env", ()) if isinstance(e, str) and "=" in e
                                  and "\n" not in e and env_name(e.split("=", 1)[0])]
                mnt, podman = self.store_mount, [self.binary, *glob]
                # a mount onto a target the image lacks (a --container-mounts one, the home, the
                # batch script) needs somewhere to make it: podman's overlay over the image
                # (discarded with the container), the container still --read-only
                targets = bool(spec.mounts) or bool(spec.mount_home) or bool(spec.batch_script)
                self.store_image = stored.path
                return (self.rootfs_argv(mnt, targets), [(lambda env: store_mount_point(podman, mnt, env), None)])
            pull = ([self.binary, *glob, "pull", "--quiet", name],
                    (lambda: self.store_has(name), [self.binary, *glob, "image", "exists", name]),
                    f"pulling {image} (podman)", f"failed to import docker image: {image}")
            if ref.digest or not rank_dir:
                return ["--pull=never", name], [pull]       # by digest: what it names never changes
            # by tag: checked against the registry once per job on each node (pyxis imports it
            # anew every step), so a tag moved since the store's copy was pulled runs the new image;
            # the job's later steps, and its other ranks, run what that check found
            marker = checked_marker(rank_dir, "podman", name)
            # in the store (or podman's own default store, whose index tether does not read): a
            # check, which pulls it when podman has it not
            if self.store_has(name) or not self.store_path():
                return ["--pull=never", name], [(lambda env: self.check_registry(pull, name, image, marker, env),
                                                 marker)]
            return ["--pull=never", name], [pull, (lambda env: mark_checked(marker), marker)]
        if ref.kind == "uri" and image.startswith(ARCHIVES):
            # an image archive (--container-save writes OCI archives): loaded once per user per node
            # under a name its file's identity decides, as a rootfs directory is imported
            path = self.local_image(image.split(":", 1)[1])
            name = archive_image_name(path)
            return (["--pull=never", name],
                    [(lambda env: load_archive(image.split(":", 1)[0], path, [self.binary, *glob], name, env),
                      (lambda: self.store_has(name), [self.binary, *glob, "image", "exists", name]),
                      f"loading the image archive {path} into your podman store on this node")])
        if ref.kind == "uri":
            raise LaunchError(f"--container-image={image}: podman runs a registry image, an image archive "
                              f"(oci-archive:PATH, docker-archive:PATH) or a rootfs directory; "
                              f"{image.split(':', 1)[0]} images are for Apptainer/Singularity")
        path = self.local_image(image)
        if is_squashfs(path):
            # a squashfs image (enroot's and pyxis's format): unpacked and imported once per user per
            # node under a name its file's identity decides, as a rootfs directory is imported
            name = squashfs_image_name(path)
            return (["--pull=never", name],
                    [(lambda env: import_squashfs(path, [self.binary, *glob], name, env),
                      (lambda: self.store_has(name), [self.binary, *glob, "image", "exists", name]),
                      f"unpacking the squashfs image {path} into your podman store on this node")])
        if not os.path.isdir(path):
            other = (" (a SIF image is Apptainer's or Singularity's: --container-runtime=apptainer)"
                     if path.endswith(".sif") else "")
            raise LaunchError(f"--container-image={image}: podman runs a rootfs directory, a squashfs image "
                              f"(.sqsh), an image archive (oci-archive:PATH) or a registry image "
                              f"(ubuntu:22.04, docker://...); {path} is none of them{other}")
        if os.access(path, os.W_OK):
            # the user's own rootfs: read-only as it is, or writable through an overlay whose
            # changes are discarded (podman 4.3 leaves the overlay's empty work directories behind)
            return self.rootfs_argv(path, bool(spec.writable)), []
        missing = missing_targets(path, spec.mounts if mounts is None else mounts)
        if not spec.writable and not missing:
            return self.rootfs_argv(path, False), []   # a shared image, never written, nothing copied
        name = rootfs_image_name(path)
        why = ("writable: --container-writable, or the admin's container.writable" if spec.writable
               else f"no {', '.join(missing[:3])} in it")
        return (["--pull=never", name],
                [(lambda env: import_rootfs(path, [self.binary, *glob], name, env),
                  (lambda: self.store_has(name), [self.binary, *glob, "image", "exists", name]),
                  f"importing the rootfs {path} into your podman store on this node ({why})")])


class _ImageOnly:
    """What ``image_plan`` reads of a launch spec, for pulling an image without a container."""

    def __init__(self, image: str):
        self.image, self.writable, self.mounts = image, False, ()


STORE_MOUNTS = "tether-images"     # in podman's run directory: a rank's mount of a cluster store image


# The rank's podman run, started in the user's podman namespace (podman unshare) right after the
# store's squashfs is mounted there: the mount is in the namespace the container is made in, which
# this process keeps alive -- a mount made by a command of its own was lost when another rank of
# the user ended the namespace's pause process before this rank's podman run (seen in CI: "exec:
# sh: executable file not found", an empty root). squashfuse as the namespace's root: allow_other
# lets the container's users in, default_permissions makes the image's modes hold.
STORE_RUN = ('squashfuse -o ro,allow_other,default_permissions "$1" "$2" || { echo "tether: could not mount the '
             'cluster store image $1 (is /dev/fuse open to users? tether doctor)" >&2; exit 125; }; shift 2; '
             'exec "$@"')


def store_run_argv(podman: Sequence[str], image: str, mnt: str, argv: Sequence[str]) -> list[str]:
    """``argv`` (podman run ...) run in the user's podman namespace once ``image`` is mounted at
    ``mnt`` there (STORE_RUN); the podman inside stays in that namespace."""
    return [*podman, "unshare", "sh", "-c", STORE_RUN, "sh", image, mnt, *argv]


def store_mount_point(podman: Sequence[str], mnt: str, env: Mapping[str, str]) -> None:
    """The rank's empty mount point for its cluster store image (a mount an earlier rank of the same
    name left there taken away first)."""
    os.makedirs(os.path.dirname(mnt), mode=0o700, exist_ok=True)
    unmount_store_image(podman, mnt, env, quiet=True)
    os.mkdir(mnt, 0o700)


def unmount_store_image(podman: Sequence[str], mnt: str, env: Mapping[str, str], *, quiet: bool = False) -> bool:
    """Take a rank's cluster store image mount away (in the user's podman namespace, where it was
    made) and its directory. True when nothing is left."""
    import subprocess

    if not os.path.lexists(mnt):
        return True
    try:
        subprocess.run([*podman, "unshare", "umount", "-l", mnt], env=dict(env), capture_output=True,
                       stdin=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        os.rmdir(mnt)
    except OSError as exc:
        if not quiet:
            report_admin(f"could not remove {mnt}: {exc}")
        return False
    return True


def image_env_file(rank_dir: str, argv: list[str], lines: Sequence[str]) -> None:
    """The image's ``NAME=VALUE`` lines (a --rootfs run, where podman knows no image config) in
    the rank's ``.image-env``, given to podman before the job's variables (a later --env-file
    wins: the job's values win, as over an image's ENV)."""
    if not lines:
        return
    from ...system.files import write_atomic

    image_env = os.path.join(rank_dir, ".image-env")
    write_atomic(image_env, "".join(f"{line}\n" for line in lines), 0o600)
    at = argv.index("--env-file") if "--env-file" in argv else len(argv)
    argv[at:at] = ["--env-file", image_env]


def mount_args(mount: Mount) -> list[str]:
    """podman's arguments for one mount: a bind, ``--volume SRC:DST[:ro,nosuid,unbindable,...]``
    (recursive, as pyxis's); a tmpfs, ``--tmpfs DST[:size=,mode=,ro,...]`` -- or, with an option
    --tmpfs refuses (podman 4.3 and 5 take only size= and mode=: "unknown mount option"), an
    anonymous volume of the local driver's tmpfs (``--mount type=volume,...,volume-opt=o=...``),
    which podman mounts with mount(8) and every tmpfs option, in the user's namespace, for this
    container only, and removes with it (run --rm; rm --volumes)."""
    if mount.kind != "tmpfs":
        return ["--volume", str(mount)]
    if podman_tmpfs(mount):
        return ["--tmpfs", str(mount)]
    import csv
    import io

    # the mount flags on the volume's own mount (runc binds the tmpfs podman mounted: a flag only on
    # the tmpfs, noexec, cannot be cleared by that bind -- EPERM); no propagation flag (mount_refusal)
    flags = [*("ro",) * mount.readonly, *(f for f in mount.flags if f not in PROPAGATION)]
    line = io.StringIO()         # --mount is one CSV record: a field with ',' or '"' is quoted
    csv.writer(line, lineterminator="").writerow(
        ["type=volume", f"dst={mount.target}", *flags, "volume-opt=type=tmpfs", "volume-opt=device=tmpfs",
         f"volume-opt=o={','.join(mount.options)}"])
    return ["--mount", line.getvalue()]


def missing_targets(path: str, mounts=()) -> list[str]:
    """What a shared rootfs lacks of podman's mount targets and of the --container-mounts targets
    (those on one of podman's tmpfs in the container excepted)."""
    missing = ["/" + t for t in ROOTFS_TARGETS if not os.path.lexists(os.path.join(path, t))]
    missing += [m.target for m in mounts
                if m.kind != "umount" and not m.target.startswith(TMPFS_DIRS) and not os.path.lexists(path + m.target)]
    return missing


ROOTFS_IMAGE = "localhost/tether-rootfs:"
# how long a step attaching to a named container waits for another step that is starting it
ATTACH_WAIT_SECONDS = 60


def rootfs_image_name(path: str) -> str:
    """The store's name for an imported rootfs directory: its path and identity (device, inode,
    change time), so a directory replaced or changed in place is imported anew."""
    import hashlib

    st = os.stat(path)
    key = hashlib.sha256(f"{path}\0{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}:{st.st_ctime_ns}".encode()).hexdigest()
    return f"{ROOTFS_IMAGE}{key[:24]}"


def image_config(podman: Sequence[str], image: str, env: Mapping[str, str] | None = None, *,
                 check: bool = True) -> dict:
    """An image's configuration (ENV, ENTRYPOINT, CMD, WORKDIR, ...) as ``podman image inspect``
    gives it; ``check=False``: {} when podman cannot say."""
    import json

    from ...system.proc import run_command

    done = run_command([*podman, "image", "inspect", "--format", "{{json .Config}}", image], env=env,
                       timeout=120, check=check)
    return (json.loads(done.stdout or "null") or {}) if done.returncode == 0 else {}


def _unpacking(home: str) -> bool:
    """Is a live process unpacking a container root into ``home`` now (unpack_named's partial
    ``.rootfs.<pid>``, removed when it fails)? A home an earlier try left incomplete is not."""
    try:
        entries = os.listdir(home)
    except OSError:
        return False
    if "config.json" in entries:
        return False
    for entry in entries:
        pid = entry[len(".rootfs."):] if entry.startswith(".rootfs.") else ""
        if pid.isascii() and pid.isdigit():
            try:
                os.kill(int(pid), 0)
                return True
            except (ProcessLookupError, OverflowError):
                continue
            except PermissionError:
                return True
    return False


def _own_namespace(pid: str, ns: str) -> bool:
    """Is process ``pid`` (a container's) in a ``ns`` namespace other than this process's? False
    when that cannot be seen."""
    if not (pid.isascii() and pid.isdigit() and int(pid) > 0):
        return False
    try:
        return os.readlink(f"/proc/{int(pid)}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
    except OSError:
        return False


def node_has_mqueue() -> bool:
    """Is a POSIX message queue filesystem mounted at /dev/mqueue (what ``--ipc=host`` binds)?"""
    try:
        return os.stat("/dev/mqueue").st_dev != os.stat("/dev").st_dev
    except OSError:
        return False


def unshare_args(namespaces: Sequence[str], *, pod: bool = False, mqueue: bool | None = None) -> list[str]:
    """podman's namespace options for ``--container-unshare``: the node's network, IPC and UTS
    namespaces, as pyxis's containers have them (SysV shared memory and /dev/shm between ranks and
    with the host, the node's host name), unless asked: ``net``, a network namespace with only a
    loopback interface, as enroot's; ``ipc`` and ``uts``, podman's private ones. A namespace of the
    container's own keeps the node's host name (pyxis: at first the node's), where podman would
    give it the container's id. ``pod``: the container is in its step's pod (step_pod), which
    holds the namespaces asked for: only the node's are named here. ``mqueue``: node_has_mqueue(),
    when the caller asked already."""
    mqueue = node_has_mqueue() if mqueue is None else mqueue
    if pod:
        shared = pod_namespaces(namespaces)
        return ([] if "net" in shared else ["--network=host"]) + \
            ([] if "ipc" in shared or not mqueue else ["--ipc=host"]) + \
            ([] if "uts" in shared else ["--uts=host"])
    argv = ["--network=none" if "net" in namespaces else "--network=host"]
    # the node's IPC namespace needs its /dev/mqueue (podman mounts it): a node without one (no
    # systemd mounted it) keeps podman's private IPC namespace rather than failing every rank
    argv += [f"--ipc={'private' if 'ipc' in namespaces else 'host'}"] * (mqueue or "ipc" in namespaces)
    argv.append(f"--uts={'private' if 'uts' in namespaces else 'host'}")
    if "uts" in namespaces:         # the node's UTS namespace has its name already (podman refuses one there)
        argv.append(f"--hostname={os.uname().nodename}")
    return argv


POD_NAMESPACES = ("ipc", "uts", "net")     # what a step's ranks on a node share in its pod
POD_RANKS = ".pod-ranks"                   # in the step's directory: one file per rank in the pod
POD_LOCK = ".pod-lock"


def pod_namespaces(namespaces: Sequence[str]) -> list[str]:
    return [ns for ns in POD_NAMESPACES if ns in namespaces]


def step_pod(spec: LaunchSpec) -> str | None:
    """The pod of the step's ranks on this node (``tether-<job>-<step>-pod``), when
    --container-unshare asks for a namespace they share: pyxis runs a step's tasks on a node in
    one container, so they share its IPC namespace (SysV shared memory, /dev/shm: what MPI's
    shared-memory transport needs), its network namespace (the loopback between ranks) and its
    host name."""
    if not pod_namespaces(spec.unshare):
        return None
    return f"tether-{spec.job_id}-{spec.step_id}-pod"


def pod_args(namespaces: Sequence[str]) -> list[str]:
    """``podman pod create``'s namespace options: the namespaces asked for, shared by the pod's
    containers (a network namespace with only a loopback interface, a host name that is the
    node's, as unshare_args gives one container); the node's network otherwise (a rootless pod
    would have slirp4netns's)."""
    shared = pod_namespaces(namespaces)
    return [f"--share={','.join(shared)}", "--network=none" if "net" in shared else "--network=host",
            *([f"--hostname={os.uname().nodename}"] if "uts" in shared else [])]


def _pod_lock(step_dir: str) -> int:
    fd = os.open(os.path.join(step_dir, POD_LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _pod_members(step_dir: str) -> str:
    members = os.path.join(step_dir, POD_RANKS)
    os.makedirs(members, mode=0o700, exist_ok=True)
    if os.path.islink(members) or not os.path.isdir(members):
        raise LaunchError(f"{members} is not a directory")
    return members


def join_pod(podman: Sequence[str], create: Sequence[str], pod: str, step_dir: str, rank: str,
             env: Mapping[str, str]) -> None:
    """This rank joins its step's pod on this node (step_pod), making it when no rank of the step
    is in it: each rank a file in ``<step>/.pod-ranks`` (idempotent: a retried join counts once),
    under the step's pod lock, which the last rank to leave (Podman.leave_pod) holds while it
    removes the pod. The pod's cleanup marker (``.cleanup-pod``) is written before the pod is made:
    if the step's end kills the ranks first, the step's cleanup removes the pod."""
    from ...system.proc import CommandError, run_command
    from ..launch import run_outside_rank, write_marker

    fd = _pod_lock(step_dir)
    try:
        members = _pod_members(step_dir)
        if not os.listdir(members):
            write_marker(os.path.join(step_dir, POD_MARKER), {"runtime": "podman", "container": pod, "pod": "1"})
            try:
                run_command([*podman, "pod", "create", *create], env=env, timeout=120)
                # its infra container started now, outside this rank: the step's processes, not
                # this rank's to wait for at its end (the first rank may end before the others)
                run_outside_rank([*podman, "pod", "start", pod], env, timeout=120)
            except CommandError as exc:
                said = exc.stderr or ""
                raise LaunchError(f"could not make the step's pod {pod} for --container-unshare: {exc}",
                                  said if STALE_STATE in said or JOIN_FAILED in said else None) from None
        with open(os.path.join(members, rank), "w", opener=_private_opener):
            pass
    finally:
        os.close(fd)


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _walk_inside(root: str, path: str, *, make: bool = False) -> str | None:
    """Go down ``path`` (absolute, inside the container) in ``root``, the user's own unpacked
    root, one component at a time, never through a link of the image's and never out of ``root``
    (``..`` stops it); ``make``: a missing directory is made on the way. The first component
    that is not there ("/a/b"), or None: all there, or stopped at a link, a file or ``..`` (the
    runtime's to judge, inside the container), or no root."""
    try:
        fd = os.open(root, _DIRECTORY)
    except OSError:
        return None                  # no root (yet): the runtime says why
    seen = ""
    try:
        for part in [p for p in path.split("/") if p not in ("", ".")]:
            if part == "..":
                return None
            seen += "/" + part
            if make:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError:
                    return None
            try:
                below = os.open(part, _DIRECTORY, dir_fd=fd)
            except FileNotFoundError:
                return seen
            except OSError:
                return None          # a link or a file there
            os.close(fd)
            fd = below
        return None
    finally:
        os.close(fd)


def missing_directory(root: str, path: str) -> str | None:
    """The first component of ``path`` that is not in the user's own unpacked ``root``, or None
    (see _walk_inside)."""
    return _walk_inside(root, path)


def make_targets(root: str, targets: Sequence[str]) -> None:
    """Make the directories ``targets`` (absolute, inside the container) in ``root``, the user's
    own unpacked root, one component at a time: never through a link of the image's (a target
    below one is left to the runtime), nothing made outside ``root``."""
    for target in targets:
        _walk_inside(root, target, make=True)


def unpack_named(image_argv: Sequence[str], podman: Sequence[str], home: str,
                 env: Mapping[str, str] | None = None, *, made_by: str | None = None) -> None:
    """Unpack the image a --container-name container starts from into ``<home>/rootfs``, and its
    configuration beside it: a registry, archive or imported image through ``podman create`` +
    ``podman export``; a rootfs directory (``--rootfs DIR``) copied as it is. Written under a
    name of this process's own and renamed into place once whole (``config.json`` last: the step
    that is done when it exists)."""
    import json
    import shutil

    from ...system.files import write_atomic
    from ...system.proc import CommandError

    os.makedirs(home, mode=0o700, exist_ok=True)
    partial = os.path.join(home, f".rootfs.{os.getpid()}")
    shutil.rmtree(os.path.join(home, "rootfs"), ignore_errors=True)       # a half-done earlier try
    os.mkdir(partial, 0o700)
    config: dict = {}
    try:
        if image_argv[0] == "--rootfs":
            source = image_argv[1].removesuffix(":O")
            # the image's modes as they are (-p: not the user's umask); what the user cannot read
            # is not in the copy -- nor readable in the container -- and is counted, as an import
            code, said, written, write_said = _stream(
                ["tar", "-C", source, "--one-file-system", "-cf", "-", "."],
                ["tar", "-C", partial, "-xpf", "-", "--no-same-owner"])
            if written != 0:
                raise LaunchError(f"could not copy {source} for the container: "
                                  f"{(write_said.strip().splitlines() or ['tar failed'])[-1]}")
            _tar_read(source, code, said, "container")
        else:
            copy_image_root(podman, image_argv[1], partial, env)
            config = image_config(podman, image_argv[1], env)
        os.chmod(partial, 0o755)          # an image's / (made 0700 while it was being filled)
        os.rename(partial, os.path.join(home, "rootfs"))
    except CommandError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        # podman's words go to the repair only when they are its state's (recover_state: without
        # them, a failed unpack is tried once more when the state checks out)
        said = exc.stderr or ""
        raise LaunchError(f"could not unpack {image_argv[-1]} for the named container: {exc}",
                          said if STALE_STATE in said or JOIN_FAILED in said else None) from None
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    # podman --env-file: NAME=VALUE per line; a value with a line break cannot be one
    lines = [e for e in (config.get("Env") or []) if isinstance(e, str) and "=" in e and "\n" not in e]
    if image_argv[1].startswith(SQUASHFS_IMAGE):
        # an enroot-made squashfs keeps its ENV in /etc/environment (the import has no config):
        # read from the copy, the user's own (not through a link the image holds: the file and
        # its directory are the image's own)
        etc = os.path.join(home, "rootfs", "etc")
        if not os.path.islink(etc):
            lines += environment_lines(_read_no_follow(os.path.join(etc, "environment")))
    write_atomic(os.path.join(home, "image.env"), "".join(f"{line}\n" for line in lines), 0o600)
    if made_by:               # the step that made it (NAME:create), before config.json says it is done
        write_atomic(os.path.join(home, NAMED_MADE_BY), made_by + "\n", 0o600)
    write_atomic(os.path.join(home, "config.json"), json.dumps(config) + "\n", 0o600)


# The image's files copied from podman's own mount of it (in podman's user namespace, where the
# user is root and reads every file of the image), written as the user's own (--no-same-owner).
_COPY_IMAGE_ROOT = """set -e
root=$("$@" --log-level=error image mount "$TETHER_UNPACK_IMAGE")
status=0
tar -C "$root" --one-file-system -cf - . | tar -C "$TETHER_UNPACK_INTO" -xpf - --no-same-owner || status=$?
"$@" image unmount "$TETHER_UNPACK_IMAGE" >/dev/null || :
exit $status
"""


def copy_image_root(podman: Sequence[str], image: str, into: str, env: Mapping[str, str] | None = None) -> None:
    """The files of ``image`` (in the user's store) into the directory ``into``, as the user's
    own: from podman's mount of the image (``podman unshare`` + ``image mount``), one copy. (A
    container made to be exported costs a second copy of the image on the vfs driver, podman
    create's own, and a third through the exported tar: 29.6 s against 8.4 s for a 237 MB image
    on a node here.)"""
    from ...system.proc import run_command

    script = ["sh", "-c", _COPY_IMAGE_ROOT, "sh", *podman]
    # root's podman mounts images itself; a user's only inside its user namespace (podman unshare)
    argv = script if os.getuid() == 0 else [*podman, "unshare", *script]
    run_command(argv, env={**(os.environ if env is None else env), "TETHER_UNPACK_IMAGE": image,
                           "TETHER_UNPACK_INTO": into}, timeout=3600)


ARCHIVES = ("oci-archive:", "docker-archive:")


def archive_image_name(path: str) -> str:
    """The store's name for a loaded image archive: its path and identity (see rootfs_image_name)."""
    return rootfs_image_name(path).replace("/tether-rootfs:", "/tether-archive:")


def load_archive(transport: str, path: str, podman: Sequence[str], name: str,
                 env: Mapping[str, str] | None = None) -> None:
    """``podman pull TRANSPORT:PATH``, then the image gets ``name`` (and only that name: an
    archive may carry the name of the image it was saved from, which is not this user's to reuse)."""
    from ...system.proc import CommandError, run_command

    try:
        out = run_command([*podman, "pull", "--quiet", f"{transport}:{path}"], env=env, timeout=3600).stdout
        image_id = out.strip().splitlines()[-1] if out.strip() else ""
        if not image_id or any(c not in "0123456789abcdef" for c in image_id.removeprefix("sha256:")):
            raise LaunchError(f"podman pull {transport}:{path} named no image (it said {out.strip()[:200]!r})")
        run_command([*podman, "tag", image_id, name], env=env, timeout=120)
    except CommandError as exc:
        raise LaunchError(f"could not load the image archive {path}: {exc}") from None


def save_oci_archive(podman: Sequence[str], container: str, path: str, env: Mapping[str, str] | None = None, *,
                     source: tuple[str, bool] | None = None) -> None:
    """--container-save: the container's filesystem (``podman export``) as the one layer of an OCI
    image archive whose configuration is the image's own (entrypoint, command, environment,
    working directory, user, labels). Not ``podman commit``: that records the run's overrides --
    the job's whole environment, tether's empty entrypoint -- into the saved image."""
    import hashlib
    import io
    import json
    import tarfile

    from ...system.proc import CommandError, run_command

    layer = f"{path}.layer"
    try:
        image = run_command([*podman, "container", "inspect", "--format", "{{.Image}}", container], env=env,
                            timeout=120).stdout.strip()
        # a --rootfs container has no image: a root tether unpacked keeps the image's beside it
        config = image_config(podman, image, env, check=False) if image else {}
        if not image and source and source[1]:
            config = _unpacked_config(os.path.join(os.path.dirname(source[0]), "config.json"))
        run_command(export_argv(podman, container, source, layer), env=env, timeout=3600)
    except CommandError as exc:
        raise LaunchError(str(exc)) from None
    try:
        digest = hashlib.sha256()
        with open(layer, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        layer_digest, layer_size = f"sha256:{digest.hexdigest()}", os.path.getsize(layer)
        blob = {"architecture": _oci_arch(), "os": "linux", "config": config,
                "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "history": [{"created_by": f"tether --container-save of {container}"}]}
        config_bytes = json.dumps(blob, sort_keys=True).encode()
        config_digest = f"sha256:{hashlib.sha256(config_bytes).hexdigest()}"
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                       "size": len(config_bytes)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                        "size": layer_size}]}, sort_keys=True).encode()
        manifest_digest = f"sha256:{hashlib.sha256(manifest).hexdigest()}"
        index = json.dumps({"schemaVersion": 2, "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
             "size": len(manifest)}]}).encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            def add(name: str, data: bytes | None = None, source: str | None = None) -> None:
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = (len(data) if data is not None else layer_size), 0o644, time.time()
                with (io.BytesIO(data) if data is not None else open(source, "rb")) as fh:
                    tar.addfile(info, fh)

            add("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
            add("index.json", index)
            add("blobs/sha256/" + manifest_digest[7:], manifest)
            add("blobs/sha256/" + config_digest[7:], config_bytes)
            add("blobs/sha256/" + layer_digest[7:], source=layer)
    finally:
        remove_file(layer)


def _unpacked_config(path: str) -> dict:
    """The image configuration ``unpack_named`` kept beside a root it unpacked ({} when unreadable)."""
    import json

    text = read_regular(path)
    try:
        config = json.loads(text) if text else {}
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def _oci_arch() -> str:
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}.get(machine, machine)


def _stream(producer: Sequence[str], consumer: Sequence[str], env: Mapping[str, str] | None = None,
            consumer_env: Mapping[str, str] | None = None) -> tuple[int, list[str], int, str]:
    """``producer | consumer``: (the producer's exit code, its stderr lines, the consumer's exit
    code, the consumer's stderr). Nothing of the stream touches the disk."""
    import subprocess
    import tempfile

    with tempfile.TemporaryFile() as errors:
        source = subprocess.Popen(list(producer), stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL,
                                  env=env)
        try:
            sink = subprocess.run(list(consumer), stdin=source.stdout, capture_output=True, env=consumer_env,
                                  timeout=3600)
        finally:
            source.stdout.close()
            code = source.wait()
        errors.seek(0)
        said = errors.read().decode(errors="replace").splitlines()
    return code, said, sink.returncode, sink.stderr.decode(errors="replace")


def import_rootfs(path: str, podman: Sequence[str], name: str, env: Mapping[str, str] | None = None) -> None:
    """``tar -C PATH -c . | podman import - NAME`` (as the user: what the user cannot read is not
    in the image -- they could not read it in the container either -- and is counted)."""
    tar_code, said, imported, imp_said = _stream(
        ["tar", "-C", path, "--one-file-system", "--numeric-owner", "-cf", "-", "."],
        [*podman, "import", "--quiet", "--message", f"tether: rootfs {path}", "-", name], consumer_env=env)
    if imported != 0:
        said_last = (imp_said.strip().splitlines() or ["no message"])[-1]
        raise LaunchError(f"could not import the rootfs {path} into podman's store: {said_last}")
    _tar_read(path, tar_code, said, "image")


def _tar_read(path: str, code: int, said: list[str], into: str) -> None:
    """How tar, as the user, read the rootfs ``path``: exit 2 with only "Cannot open" lines is
    files the user cannot read -- not in the copy, nor readable in the container: counted and
    told --; anything else a LaunchError."""
    unreadable = [line for line in said if not line.startswith("tar: Exiting with failure status")]  # tar's summary
    if code not in (0, 2) or (code == 2 and not unreadable):
        raise LaunchError(f"could not read the rootfs {path} (tar exited {code})")
    if unreadable:
        progress(f"{len(unreadable)} file(s) of {path} are not readable by you and are not in the {into} "
                 f"(first: {unreadable[0]})")


# squashfs images: a file that starts with squashfs's magic is one; --container-save writes one to a
# name with one of these suffixes (pyxis's and enroot's format), else an OCI archive
SQUASHFS_MAGIC = b"hsqs"
SQUASHFS_SUFFIXES = (".sqsh", ".squashfs", ".sqfs")


def is_squashfs(path: str) -> bool:
    """Is ``path`` a regular file that begins like a squashfs filesystem? (Never waits on a FIFO.)"""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 4) == SQUASHFS_MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def squashfs_image_name(path: str) -> str:
    """The store's name for an imported squashfs image: its path and identity (see rootfs_image_name)."""
    return SQUASHFS_IMAGE + rootfs_image_name(path)[len(ROOTFS_IMAGE):]


SQUASHFS_IMAGE = "localhost/tether-squashfs:"


def _squashfs_tool(name: str, why: str) -> str:
    import shutil

    found = shutil.which(name)
    if found is None:
        raise LaunchError(f"{why} needs {name} (Debian: squashfs-tools-ng), which is not on this node's PATH")
    return found


def squashfs_environment(path: str) -> list[str]:
    """The ``NAME=VALUE`` lines of a squashfs image's ``/etc/environment`` -- where enroot keeps an
    image's ENV (docker::configure) and reads it at every start (runtime::_do_environ) -- as enroot
    formats them (common::envfmt: comments, blank and ill-formed lines and ENROOT_* go; a pair of
    quotes around a whole value goes). A line naming a host variable (``${NAME}``, which enroot
    fills from the job's environment) is left out: podman's value would be fixed. [] when the image
    has no such file."""
    import subprocess

    try:
        shown = subprocess.run([_squashfs_tool("rdsquashfs", f"podman with the squashfs image {path}"), "-c",
                                "/etc/environment", path], capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if shown.returncode != 0:
        return []
    return environment_lines(shown.stdout.decode("utf-8", "replace"))


def _read_no_follow(path: str, limit: int = 1 << 20) -> str:
    """``path``'s text when it is a regular file reached without a symbolic link as its last
    component, else ''."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        return os.read(fd, limit).decode("utf-8", "replace") if stat.S_ISREG(os.fstat(fd).st_mode) else ""
    except OSError:
        return ""
    finally:
        os.close(fd)


def environment_lines(text: str) -> list[str]:
    """An enroot image's ``/etc/environment`` as podman --env-file lines (see squashfs_environment)."""
    import re

    lines = []
    for line in text.split("\n"):      # enroot's lines: \n alone ends one
        line = line.lstrip(" \t\v\f\r")
        if not re.match(r"[A-Za-z_][A-Za-z0-9_]*=", line) or line.startswith("ENROOT_") or "${" in line:
            continue
        lines.append(re.sub(r"^([A-Za-z_][A-Za-z0-9_]*)=[\"'](.*)[\"'][ \t\v\f\r]*$", r"\1=\2", line))
    return lines


def import_squashfs(path: str, podman: Sequence[str], name: str, env: Mapping[str, str] | None = None) -> None:
    """``sqfs2tar IMAGE | podman import - NAME``, as the user: the image's files, modes and owners
    (its root's are the container's root's) straight into the store, never unpacked on disk."""
    sqfs2tar = _squashfs_tool("sqfs2tar", f"podman with the squashfs image {path}")
    code, said, imported, imp_said = _stream(
        [sqfs2tar, "--no-xattr", "--root-becomes", ".", path],
        [*podman, "import", "--quiet", "--message", f"tether: squashfs {path}", "-", name], consumer_env=env)
    if code != 0:
        raise LaunchError(f"could not read the squashfs image {path}: {(said or ['no message'])[-1]}")
    if imported != 0:
        raise LaunchError(f"could not import the squashfs image {path} into podman's store: "
                          f"{(imp_said.strip().splitlines() or ['no message'])[-1]}")


def export_argv(podman: Sequence[str], container: str, source: tuple[str, bool] | None,
                output: str = "-") -> list[str]:
    """What writes the container's files as a tar stream: ``podman export CONTAINER``, or for a
    container of a root directory (``source``: the directory, and whether tether unpacked it as
    the user) that directory -- podman exports nothing of such a container. A root of the user's
    own is read in the user's namespace, where the user's files are root's, as enroot's export
    makes them (mksquashfs -all-root)."""
    if source is None:
        return [*podman, "export", *(["--output", output] if output != "-" else []), container]
    root, own = source
    if own:
        # in the user's own user namespace (podman unshare): the files as the container saw them --
        # the user's are root's, those the image's users made (apt's _apt: subordinate ids) theirs,
        # and readable even at mode 0700, where tar as the user could not read them
        return [*podman, "unshare", "tar", "-C", root, "--one-file-system", "--numeric-owner", "-cf", output, "."]
    return ["tar", "-C", root, "--one-file-system", "--numeric-owner", "-cf", output, "."]


def save_squashfs(podman: Sequence[str], container: str, path: str, env: Mapping[str, str] | None = None, *,
                  source: tuple[str, bool] | None = None) -> None:
    """--container-save to a .sqsh name: ``podman export CONTAINER | tar2sqfs PATH`` -- the
    container's files with their modes and owners as the container sees them, for enroot, pyxis,
    Apptainer or tether's podman (import_squashfs) to run; nothing unpacked on disk. ``source``:
    see ``export_argv``."""
    tar2sqfs = _squashfs_tool("tar2sqfs", f"--container-save={path}")
    code, said, written, write_said = _stream(export_argv(podman, container, source),
                                              [tar2sqfs, "--quiet", "--defaults", "mode=0755", path], env=env)
    if code != 0:
        raise LaunchError(f"saving {container} failed: {(said or ['no message'])[-1]}")
    if written != 0:
        raise LaunchError(f"could not write the squashfs {path}: "
                          f"{(write_said.strip().splitlines() or ['no message'])[-1]}")


ADAPTER = Podman
