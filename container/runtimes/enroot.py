"""Enroot: per-user ``import``/``create`` with job-scoped names, ``start``, ``remove`` at the end.

Enroot clears the environment; the contract's host variables enter through an ``--conf`` script
whose ``environ()`` prints them (values in a private file, not on a command line; one enroot call
however many there are -- each ``--env NAME`` costs enroot an ``awk`` process), tether's own as
``--env NAME=VALUE``. It starts in $HOME (tether changes to the work directory with a
``/bin/sh`` prologue), keeps the root filesystem read-only unless ``--rw``, and always uses a user
namespace. A registry image is imported once per user per node into the user's store
(``container.enroot.store``, a squashfs file renamed into place only when complete, under a lock
the user's ranks and jobs on the node share); the container root lives under the step's directory
(``ENROOT_DATA_PATH``), so whatever a killed rank leaves goes with the step, one per node that the
step's ranks there share (as pyxis's tasks share theirs); ``--container-name`` keeps one container
per node for all steps of the job, under the job's node directory.
"""

from __future__ import annotations

import os
import stat
TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

from ...hooks.imageref import ImageRefError, parse_image
from ...hooks.layout import STEP_ENROOT, USER_STORE_ROOT, user_run_dir
from ..launch import progress, start_thread
from ..spec import (CONTAINER_BATCH_SCRIPT, CONTAINER_WORKDIR, LaunchError, Mount, named_enroot_marker,
                    no_named_container, refuse_existing, sha256_hex)
from ..environment import entrypoint_split
from . import (LATER_FILE, LATER_PART, Launch, Runtime, checked_marker, env_name, existing_store, later_values,
               mark_checked, own_directory, pmi_fd, registry_unchecked, store_directory, write_private)

DEFAULT_STORE = f"{USER_STORE_ROOT}/{{uid}}/enroot"     # container.enroot.store's default

if TYPE_CHECKING:
    from typing import Mapping, Sequence

    from ..spec import LaunchSpec

# the working directory (--container-workdir, or the rank's own): a missing one refused in pyxis's
# words and with the launcher's exit code (enroot's /bin/sh says only "can't cd to /x")
CD_PROLOGUE = ('cd "$1" 2>/dev/null || { if [ -d "$1" ]; then w="Permission denied"; elif [ -e "$1" ]; then '
               'w="Not a directory"; else w="No such file or directory"; fi; echo "tether: --container-workdir: '
               'couldn\'t chdir to $1: $w" >&2; exit 125; }; shift; exec "$@"')
# Values enroot's environment file cannot carry (a line break, quotes around the whole value), as
# pyxis 0.24 delivers them: one file each in the rank's work directory, read inside the container
# by the command's own shell (cat, then the x that keeps trailing line breaks) after enroot's
# environment is in place -- so they win as environ()'s values do -- and removed at once.
VALUES_DIR = ".tether-values"
# The command's shell says it started (a file in the rank's work directory: STARTED_PROLOGUE): an
# enroot that exits 1 without it failed itself -- enroot-switchroot, a hook -- before the command.
STARTED_FILE = ".tether-started"
STARTED_PROLOGUE = f': > "{CONTAINER_WORKDIR}/{STARTED_FILE}" 2>/dev/null; '
VALUES_PART = ('if [ -d "$1" ]; then for _tether_f in "$1"/*; do [ -f "$_tether_f" ] || continue; '
               '_tether_v=$(cat "$_tether_f"; echo x); export "${_tether_f##*/}=${_tether_v%x}"; done; '
               'unset _tether_f _tether_v; rm -rf "$1"; else echo "tether: $1 is not in the container '
               '(a mount covers it): variables with a line break or quotes around their value were not '
               'passed" >&2; fi; shift; ')
VALUES_PROLOGUE = VALUES_PART + CD_PROLOGUE
# PMI-2 (srun --mpi=pmi2) hands each task its connection as a descriptor (PMI_FD), which `enroot
# start` closes (enroot-switchroot: closefrom(3)); the launcher serves it over a Unix socket in the
# rank's work directory to tether-fd-receive (a static program installed next to tether-run), which
# the container runs first: it puts the descriptor back at PMI_FD's number and execs the command.
FD_HELPER = "tether-fd-receive"
PMI_SOCKET = ".tether-pmi-fd"
# enroot create (unsquashfs of the image into the step's root) is told only when it takes longer:
# a small image's ~0.1 s, in every step on every node, is not news (pyxis says nothing of it)
CREATE_QUIET_SECONDS = 2.0
# the last enroot release without start's --net/--ipc/--uts (NVIDIA/enroot, after v4.1.2)
UNSHARE_BEFORE = (4, 1, 2)


def enroot_uri(image: str) -> str:
    """A registry image in enroot's spelling: ``docker://[USER@][REGISTRY#]IMAGE[:TAG]``."""
    try:
        return parse_image(image).enroot_uri()
    except ImageRefError as exc:
        raise LaunchError(str(exc)) from None


def carried(value: str) -> bool:
    """Can enroot's environment file carry ``value`` unchanged? It is one ``NAME=VALUE`` per line
    (enroot-switchroot's load_environment), and enroot's ``common::envfmt`` (run twice: before and
    after the hooks) strips a pair of quotes around a whole value."""
    if "\n" in value or "\r" in value:
        return False
    stripped = value.rstrip(" \t\v\f")
    return not (len(stripped) >= 2 and stripped[0] in "\"'" and stripped[-1] in "\"'")


def conf_line(text: str) -> str:
    """One line the --conf script's functions print: a printf of ``text`` in single quotes (bash
    takes every byte in them as it is; a quote is ended, escaped and begun again) -- a builtin,
    where a here-document costs enroot start a ``cat`` process."""
    return "printf '%s\\n' '" + text.replace("'", "'\\''") + "'\n"


# --no-container-entrypoint: the --conf script's rc(), which enroot start writes as the container's
# command script for this start only (runtime::_do_rc) instead of the image's /etc/rc, which runs
# the entrypoint with the command as its arguments (enroot's docker::configure). --rc FILE would
# do the same with two processes more (a realpath and a cp); rc() costs one (sed).
RC_FUNCTION = 'rc() {\n    exec "$@"\n}\n'


def fstab_escape(path: str) -> str:
    """A path as one field of an fstab line (getmntent's octal escapes, as pyxis writes them)."""
    return "".join({" ": "\\040", "\t": "\\011", "\n": "\\012", "\\": "\\134"}.get(c, c) for c in path)


FSTAB_LINE_MAX = 4096      # enroot-mount's line buffer (getmntent_r); a line must stay below it


def fstab_line(mount: Mount, *, rank: bool = False) -> str:
    """One ``mounts()`` line, as enroot-mount reads it: ``SRC DST TYPE OPTIONS``. A bind is
    recursive, its target made as its source is (x-create=auto, or the user's x-create=); a tmpfs
    gets its directory and options; ``umount`` unmounts (x-detach) -- pyxis's own entries. The
    rank's directories (``rank``): plain binds onto directories."""
    dst = fstab_escape(mount.target)
    flags = ("ro",) * mount.readonly + tuple(mount.flags)
    if mount.kind == "umount":
        line = f"umount {dst} none x-detach"
    elif mount.kind == "tmpfs":
        line = f"tmpfs {dst} tmpfs " + ",".join(("x-create=dir", *flags, *mount.options))
    else:
        first = ("x-create=dir", "bind") if rank else (f"x-create={mount.create}", "rbind")
        line = f"{fstab_escape(mount.source)} {dst} none " + ",".join((*first, *flags))
    if len(line.encode()) >= FSTAB_LINE_MAX:
        # getmntent (enroot-mount's reader) cuts a longer line: its flags would go silently
        raise LaunchError(f"--container-mounts: the mount of {mount.target[:60]}... for enroot would be a line of "
                          f"{len(line.encode())} bytes (escaped), more than enroot reads ({FSTAB_LINE_MAX - 1})")
    return line


def write_values(directory: str, values: Mapping[str, str]) -> None:
    """Each value enroot's environment file cannot carry in a file of its own (named after its
    variable, mode 0600, never through a symlink) in ``directory``, made 0700 (VALUES_PART)."""
    for name, value in values.items():
        write_private(os.path.join(directory, name), value, "", "values file")


def write_environ_conf(path: str | None, values: Mapping[str, str], mount_lines: Sequence[str] = (),
                       own: Mapping[str, str] | None = None, rc: bool = False) -> str:
    """An ``enroot start --conf`` script whose ``environ()`` prints the variables (enroot appends
    its output to the container's environment file after the image's /etc/environment, so these
    win over the image's), then tether's own ``own`` (last: they win over the job's, as enroot's
    ``--env`` would make them, without its awk process per variable: ~2.3 ms each), and whose ``mounts()``
    prints the mounts (``mount_lines``, fstab lines: unlike ``--mount``, which refuses blanks, a
    path with spaces passes; enroot mounts them after its hooks, in this order), and with ``rc``
    RC_FUNCTION. The values are in the file -- mode 0600, in the user's own step directory --
    never on a command line; single-quoted (conf_line): bash expands nothing in them. Values the
    environment file cannot carry are left out, and the user is told which."""
    lines, dropped = [], []
    for name in sorted(values):
        if not env_name(name):                 # never into the shell script (a name is a shell word)
            raise LaunchError(f"{name!r} is not a variable name enroot's environment script can carry")
        (lines if carried(values[name]) else dropped).append(name)
    if dropped:
        shown = ", ".join(dropped[:5]) + (f" and {len(dropped) - 5} more" if len(dropped) > 5 else "")
        progress(f"not passed into the enroot container: {shown} (a line break, or quotes around the whole "
                 f"value: enroot's environment file cannot carry them)")
    for name, value in (own or {}).items():
        if not env_name(name) or not carried(value):
            raise LaunchError(f"tether's own {name!r} cannot be carried by enroot's environment script")
    printed = [*(f"{name}={values[name]}" for name in lines), *(f"{name}={value}" for name, value in (own or {}).items())]
    text = ("# tether: the job's environment and mounts for this container (see tether.container.environment)\n"
            "environ() {\n" + ("".join(conf_line(line) for line in printed) or ":\n") + "}\n")
    if mount_lines:
        text += "mounts() {\n" + "".join(conf_line(line) for line in mount_lines) + "}\n"
    if rc:
        text += RC_FUNCTION
    return write_private(path, text, ".conf", "enroot's environment script")


def image_environment(config: Mapping) -> dict[str, str]:
    """An image config's ``Env`` (the store's record of it) as the variables enroot import writes
    into the image's /etc/environment; a value the environment file cannot carry is left out."""
    out = {}
    for item in config.get("env", ()) if isinstance(config, dict) else ():
        if isinstance(item, str) and "=" in item:
            name, value = item.split("=", 1)
            # a name is a shell word or nothing: the script enroot sources is shell (a registry
            # image's config is anyone's to write)
            if env_name(name) and carried(value) and not name.startswith("ENROOT_"):
                out[name] = value
    return out


class CreateWhole:
    """``enroot create`` of container ``name`` in ``data``, whole or not at all: enroot unsquashes
    straight into ``data/NAME`` (a killed or failed create leaves half a root there, which the next
    rank would take for the container), so it creates under a name of this process's own and
    renames it into place once complete. A named container's maker is written first (read for
    NAME:create). Called with the runtime's environment (a step of ``Launch.before``); tether-run
    runs the same commands (``argv``, ``remove_argv``) ahead of the Python launcher in the common
    case (rank_launcher.py: ahead_plan)."""

    TIMEOUT = 3600          # seconds: the unpacking of a large image
    REMOVE_TIMEOUT = 600
    rank_launcher_runs = True       # tether-run runs it itself in the common case (launch.execute)

    def __init__(self, binary: str, name: str, sqsh: str, data: str, marker: str | None = None, step: str = ""):
        self.binary, self.name, self.sqsh, self.data, self.marker, self.step = binary, name, sqsh, data, marker, step

    def partial(self, pid: int | str) -> str:
        """The name the create makes before the rename: the creating process's own."""
        return f"{self.name}.partial-{pid}"

    def argv(self, partial: str) -> list[str]:
        return [self.binary, "create", "--name", partial, self.sqsh]

    def remove_argv(self, partial: str) -> list[str]:
        """enroot's own removal (it makes unwritable directories writable first)."""
        return [self.binary, "remove", "--force", partial]

    def __call__(self, env: Mapping[str, str]) -> None:
        from ...system.proc import CommandError, run_quick

        if self.marker:
            write_private(self.marker, self.step + "\n", "", "enroot's marker of the container's step")
        partial = self.partial(os.getpid())
        try:
            run_quick(self.argv(partial), env=env, timeout=self.TIMEOUT)
            os.rename(os.path.join(self.data, partial), os.path.join(self.data, self.name))
        except (CommandError, OSError) as exc:
            try:
                run_quick(self.remove_argv(partial), env=env, timeout=self.REMOVE_TIMEOUT)
            except CommandError:
                pass      # nothing made, or the step's directory takes it away
            if isinstance(exc, OSError):
                raise LaunchError(f"cannot put the container root in place at {self.data}/{self.name}: "
                                  f"{exc.strerror}") from None
            raise


def fd_helper() -> str | None:
    """tether-fd-receive next to this launcher (tether-run-py, where `tether slurm install` put
    both), or None (tether run by hand, an install without it)."""
    import sys

    path = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0] or ".")), FD_HELPER)
    return path if os.access(path, os.X_OK) else None


def serve_fd(path: str, fd: int) -> None:
    """Listen on the Unix socket ``path`` and hand descriptor ``fd`` to the first process of this
    user that connects (tether-fd-receive in the rank's container), then stop listening. A
    thread: the launcher's own process keeps supervising the rank meanwhile."""
    import socket
    import struct

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        # a socket's path is at most 107 bytes: a deep job storage root is reached through the
        # directory's descriptor
        directory = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            server.bind(f"/proc/self/fd/{directory}/{os.path.basename(path)}" if len(path) > 100 else path)
        finally:
            os.close(directory)
        server.listen(1)
    except OSError as exc:
        server.close()
        raise LaunchError(f"PMI_FD (srun --mpi=pmi2): cannot listen on {path} to hand it into the container: "
                          f"{exc.strerror}") from None

    def serve() -> None:
        try:
            while True:
                conn, _ = server.accept()
                with conn:
                    uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
                    if uid == os.getuid():
                        socket.send_fds(conn, [b"p"], [fd])
                        return
        except OSError:
            pass
        finally:
            server.close()
            try:
                os.unlink(path)          # nothing of it left in the rank's work directory
            except OSError:
                pass

    start_thread(serve)                         # a daemon: the launcher's exit ends it


class StartTurn:
    """A preparation step (``Launch.before``): this rank's turn to start the container root the
    step's ranks share (``take_start_turn``); its ``lock`` and ``started`` file are what tether-run
    takes and watches in the common case (rank_launcher.py: start_plan)."""

    rank_launcher_runs = True       # tether-run takes it itself in the common case (launch.execute)
    # taken after the node's lock is let go (launch.run_before): a rank waiting for its turn must
    # not keep the node's other ranks from seeing the root made (tether-run's wait for the lock
    # is short: held through a turn, it sent ranks to this launcher, told "takes a while")
    outside_lock = True

    def __init__(self, lock: str, started: str):
        self.lock, self.started = lock, started

    def __call__(self, env: Mapping[str, str]) -> None:
        take_start_turn(self.lock, self.started)


def take_start_turn(lock: str, started: str) -> None:
    """Wait for this rank's turn to start a container root the step's ranks share, and hold it
    until the command in the container has started (``started`` appears) or this launcher ends.
    ``enroot start`` holds the root's own lock through the config, mounts and hooks, but gives up
    after 30 s ("Could not acquire rootfs lock", src/runtime.sh): many ranks on a node, or slow
    hooks, would fail there. Taken in turn here, with no time limit, they never meet it."""
    import fcntl
    import time

    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        raise LaunchError(f"cannot take the container's start lock {lock}: {exc.strerror}") from None

    def release() -> None:
        deadline = time.monotonic() + 3600
        try:
            while time.monotonic() < deadline and not os.path.exists(started):
                time.sleep(0.02)
        finally:
            os.close(fd)

    start_thread(release)


def finish_import(partial: str, sqsh: str, source: str, digest: str | None = None) -> None:
    """Put a complete import in place, with what it was imported from (and the registry's digest
    of it, read before the import) beside it."""
    import json

    from ...system.files import write_atomic

    # the image first: killed in between, the old metadata's digest says "changed" and the next
    # check imports again (the other way round, a new digest beside the old image would hide it)
    os.rename(partial, sqsh)
    write_atomic(sqsh[:-5] + ".json", json.dumps({"source": source, **({"digest": digest} if digest else {})}) + "\n",
                 0o600)


class Enroot(Runtime):
    name = "enroot"

    def __init__(self, settings: Mapping, **kw):
        super().__init__(settings, **kw)
        self.store_template = settings.get("store", DEFAULT_STORE) or ""

    def base_env(self, host_env: Mapping[str, str]) -> dict[str, str]:
        """The runtime's environment, with the directory of an absolute ``container.enroot.binary``
        first on its PATH: enroot runs its helpers (enroot-nsenter, enroot-switchroot,
        enroot-mount), installed beside it, by name -- without, every rank of an enroot outside the
        job's PATH exits 127 (``exec: enroot-nsenter: not found``; seen with enroot 4.1.2 under
        /opt). A link's directory and its target's both go first (moved there if on PATH later).
        Only enroot's own processes get it: the container's variables are passed apart."""
        env = super().base_env(host_env)
        if not os.path.isabs(self.binary):
            return env
        # the link's directory and the real one's (a link in /usr/local/bin to /opt/enroot/bin/enroot)
        first = list(dict.fromkeys((os.path.dirname(self.binary), os.path.dirname(os.path.realpath(self.binary)))))
        path = [d for d in (env.get("PATH") or os.defpath).split(":") if d not in first]
        env["PATH"] = ":".join(first + path)
        return env

    @staticmethod
    def own_run_dir() -> str | None:
        """The user's run directory on this node (hooks.layout.user_run_dir: made by root, the
        SPANK plugin, for every container step) when it is a directory of the user's, else None
        (root's is /run itself: its ranks keep the step directory's, as before)."""
        if os.getuid() == 0:
            return None
        path = user_run_dir(os.getuid())
        try:
            own_directory(path, os.getuid(), "run directory", private=False)   # tether_run.c's own_directory too
        except LaunchError:
            return None
        return path

    @staticmethod
    def runtime_path(step_dir: str, run_dir: str | None) -> str:
        """ENROOT_RUNTIME_PATH: ``run_dir``/enroot (the user's run directory: own_run_dir), else the
        step directory's. Shallow on purpose: enroot start looks for the mount point above it and
        above the root with one `mountpoint` process per path component (common::mountpoint),
        each ~2.5 ms -- 9 of them below a step directory, 4 below /run/tether/<uid>: 17 ms less per
        start (median of 12, enroot 4.1.2 by hand). Nothing of enroot's is left there on the
        host: start mounts a tmpfs of its own over it in the container's mount namespace."""
        return os.path.join(run_dir, "enroot") if run_dir else os.path.join(step_dir, STEP_ENROOT, "run")

    def store_dir(self, *, create: bool = True) -> str | None:
        """This user's store on this node (container.enroot.store), None when it is per step."""
        if not self.store_template:
            return None
        if create:
            return store_directory(self.store_template, os.getuid(), "enroot store")
        return existing_store(self.store_template, os.getuid(), "enroot store")   # checked, never made

    def import_steps(self, image: str, store: str, *, rank_dir: str | None = None,
                     force: bool = False) -> tuple[str, list[tuple], str]:
        """(the squashfs file, the steps that import it, their lock) for a registry image. The
        import writes a file of this process's own, renamed into place with its metadata once
        complete: a killed import never leaves a half-written image the next job takes for done.
        A present image counts as used now (prune goes by that). By tag, in a job (``rank_dir``):
        the registry's digest of the tag is kept with the import, and a present image is checked
        against it once per job on the node (pyxis imports anew every step), imported again when
        the tag has moved. ``force`` (tether images pull): imported, present or not."""
        uri = enroot_uri(image)
        sqsh = os.path.join(store, sha256_hex(uri)[:24] + ".sqsh")
        partial = f"{sqsh[:-5]}.{os.getpid()}.partial"
        try:
            os.utime(sqsh, follow_symlinks=False)
        except OSError:
            pass
        lock = os.path.join(store, ".import-lock")
        done = None if force else sqsh
        pinned = "@sha256:" in uri             # by digest: what it names never changes
        seen: dict[str, str | None] = {}
        importing = [self.binary, "import", "--output", partial, uri]
        steps = [(importing, done, f"importing {image} (enroot)", f"failed to import docker image: {image}"),
                 (lambda env: finish_import(partial, sqsh, uri, seen.get("digest")), done)]
        if not pinned:       # the tag's digest, read before the import: a tag moved meanwhile is seen next job
            steps.insert(0, (lambda env: seen.update(digest=self.registry_digest(uri, env)[0]), done))
        if pinned or force or not rank_dir:
            return sqsh, steps, lock
        marker = checked_marker(rank_dir, "enroot", uri)
        if os.path.exists(sqsh):
            return sqsh, [(lambda env: self.check_registry(image, uri, sqsh, importing, partial, marker, env),
                                  marker)], lock
        return sqsh, [*steps, (lambda env: mark_checked(marker), marker)], lock

    def registry_digest(self, uri: str, env: Mapping[str, str]) -> tuple[str | None, str]:
        """(the registry's digest of ``uri``'s manifest, ``enroot digest``; None when it cannot
        say, with enroot's words why)."""
        from ...system.proc import CommandError, run_quick

        try:
            out = run_quick([self.binary, "digest", uri], env=env, timeout=60).stdout.strip()
        except CommandError as exc:
            lines = [line.strip() for line in (exc.stderr or "").splitlines() if line.strip()]
            return None, next((line for line in lines if "[ERROR]" in line), lines[-1] if lines else str(exc))
        ok = out.startswith("sha256:") and len(out) == 71 and all(c in "0123456789abcdef" for c in out[7:])
        return (out, "") if ok else (None, f"enroot digest printed {out[:80]!r}")

    def check_registry(self, image: str, uri: str, sqsh: str, importing: list[str], partial: str, marker: str,
                       env: Mapping[str, str]) -> None:
        """A tagged image in the store, checked against its registry for this job: imported again
        (``importing``: the import step's command, into ``partial``) when the tag's digest is
        not the one imported (said), the store's copy run (said) when the registry cannot say."""
        import time

        from ...system.proc import CommandError, run_quick
        from ..images import read_metadata

        current, why = self.registry_digest(uri, env)
        recorded = read_metadata(sqsh[:-5] + ".json").get("digest")
        if current is None:
            registry_unchecked(image, why)
        elif current != recorded:
            label = (f"{image} has changed in its registry since your store's copy: importing it again (enroot)"
                     if recorded else f"importing {image} (enroot) again: your store's copy has no digest to "
                                      f"compare with its registry's")
            progress(f"{label} ...")
            started = time.monotonic()
            try:
                run_quick(importing, env=env, timeout=3600)
                finish_import(partial, sqsh, uri, current)
            except (CommandError, OSError) as exc:
                try:
                    os.unlink(partial)
                except OSError:
                    pass
                progress(f"could not import {image} again ({str(exc).splitlines()[-1][:300]}); running the copy "
                         f"in your store on this node")
            else:
                progress(f"{label}: done in {time.monotonic() - started:.1f} s")
        mark_checked(marker)

    def pull(self, image: str, env: Mapping[str, str]) -> str:
        """``tether images pull``: import a registry image into this user's store on this node."""
        from ..launch import run_before

        store = self.store_dir()
        if not self.is_remote(image) or store is None:
            raise LaunchError(f"tether images pull: {image} is not a registry image, or container.enroot.store "
                              f"is empty (images are then imported per step)")
        sqsh, steps, lock = self.import_steps(image, store, force=True)
        run_before(Launch(argv=[], env=self.base_env(env), runtime=self, before=steps, lock=lock))
        return sqsh

    def stored(self, env: Mapping[str, str]) -> list:
        from ..images import read_metadata
        from . import StoredImage

        return [StoredImage(name=str(read_metadata(path[:-5] + ".json").get("source", "?")), size=st.st_size,
                            last_used=st.st_mtime, where=path) for path, st in self._images()]

    def _images(self):
        store = self.store_dir(create=False)
        try:
            names = sorted(os.listdir(store)) if store else []
        except OSError:
            names = []
        for name in names:
            path = os.path.join(store, name)
            if name.endswith(".sqsh") and not name.startswith("."):
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                    yield path, st

    def prune(self, older_than_days: float, env: Mapping[str, str]) -> list[str]:
        """Images of this user's store not used for ``older_than_days`` (and imports left
        half-done), while no import of theirs on this node runs (the store's lock)."""
        import fcntl
        import time

        from ..launch import remove_file
        from . import check_days

        check_days(older_than_days)
        store = self.store_dir(create=False)
        if not store or not os.path.isdir(store) or os.path.islink(store):
            return []
        store_directory(self.store_template, os.getuid(), "enroot store")   # the user's own, or refused
        lock_fd = os.open(os.path.join(store, ".import-lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                          0o600)
        removed = []
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            now = time.time()
            for path, st in list(self._images()):
                if now - st.st_mtime >= older_than_days * 86400:
                    remove_file(path)
                    remove_file(path[:-5] + ".json")
                    removed.append(path)
            for name in os.listdir(store):
                if name.endswith(".partial"):            # nobody imports now: the lock is ours
                    remove_file(os.path.join(store, name))
                    removed.append(os.path.join(store, name))
        finally:
            os.close(lock_fd)
        return removed

    def launch(self, spec: LaunchSpec, host_env: Mapping[str, str]) -> Launch:
        if spec.name and spec.name_attach == "exec":
            # enroot exec (the PID's namespaces) is not among the behaviours recorded of real
            # enroot here: not attached to on enroot yet, and said so rather than run apart
            raise LaunchError(f"--container-name={spec.name}:exec: tether attaches to a running container on "
                              f"podman (--container-runtime=podman); on enroot each step runs in a container of "
                              f"its own over the named container's files: drop ':exec'")
        env = self.base_env(host_env)
        # Where the import and the container root live: the step's directory (removed when the
        # step ends, however it ends), or -- for a --container-name kept across the job's steps --
        # the job's node directory (removed with the job).
        step_dir = os.path.dirname(spec.rank_dir) if spec.rank_dir else None
        node_dir = (os.path.dirname(step_dir) if spec.name else step_dir) if step_dir else None
        if node_dir:
            # every enroot command first runs `mkdir -p` on its cache, data and runtime paths, and
            # the runtime path defaults to /run/enroot when XDG_RUNTIME_DIR is unset (as in a Slurm
            # task): "mkdir: cannot create directory '/run/enroot': Permission denied" in every rank
            # (enroot 4.1, enroot.in). The data and cache paths live under the step's (or the
            # job's node) directory; the runtime path in the user's run directory on the node
            # (runtime_path); its temp path is ${TMPDIR}, the rank's own tmp directory.
            env.setdefault("ENROOT_DATA_PATH", os.path.join(node_dir, STEP_ENROOT, "data"))
            env.setdefault("ENROOT_CACHE_PATH", os.path.join(node_dir, STEP_ENROOT, "cache"))
            env.setdefault("ENROOT_RUNTIME_PATH", self.runtime_path(step_dir, self.own_run_dir()))
        if spec.mount_home is not None:       # enroot's 10-home.sh hook (ENROOT_MOUNT_HOME): y or n
            env["ENROOT_MOUNT_HOME"] = "y" if spec.mount_home else "n"
        if spec.remap_root is not None:       # enroot start's --root (ENROOT_REMAP_ROOT): y or n, as pyxis
            env["ENROOT_REMAP_ROOT"] = "y" if spec.remap_root else "n"
        if spec.writable is not None:         # --rw's setting (ENROOT_ROOTFS_WRITABLE): read-only enforced too
            env["ENROOT_ROOTFS_WRITABLE"] = "y" if spec.writable else "n"
        before, lock, sqsh, stored = [], None, None, None
        if spec.image and self.is_remote(spec.image) and spec.rank_dir:
            stored = self.cluster_image(spec)
        if not spec.image:
            pass                  # --container-name alone: the job's container of that name (below)
        elif stored:
            # the cluster image store's squashfs, started as it is (enroot start IMAGE: squashfuse
            # under a discarded overlay, in the rank's own namespaces): nothing imported, nothing
            # unpacked, nothing in the user's store
            sqsh = stored.path
        elif self.is_remote(spec.image):
            store = self.store_dir() or os.path.join(node_dir or env.get("TMPDIR", "/tmp"), STEP_ENROOT)
            # the user's store is checked against the registry once per job; a per-step import is new
            sqsh, before, lock = self.import_steps(spec.image, store,
                                                   rank_dir=spec.rank_dir if self.store_template else None)
        else:
            sqsh = self.local_image(spec.image)
            if os.path.isdir(sqsh):
                raise LaunchError(f"--container-image={spec.image}: enroot runs a squashfs file or a "
                                  f"docker:// image, not a directory")
        # the step's ranks on a node share one container root, as pyxis's tasks do (one create per
        # node, not per rank: an image of 12 GiB unpacked once); by hand, or with --container-save
        # (each rank saves what it ran), a rank has its own
        shared = (bool(step_dir) and not spec.name and not spec.save and not stored
                  and env.get("ENROOT_DATA_PATH") == os.path.join(step_dir, STEP_ENROOT, "data"))
        name = sqsh if stored else spec.step_instance if shared else spec.instance
        data = env.get("ENROOT_DATA_PATH") or os.path.join(
            env.get("XDG_DATA_HOME") or os.path.join(env.get("HOME", "/"), ".local/share"), "enroot")
        # a named container's maker (NAME:create), beside enroot's data: the data path is enroot's own
        marker = named_enroot_marker(spec) if spec.name and node_dir else None
        if spec.name:
            refuse_existing(spec, os.path.isdir(os.path.join(data, name)), marker)
        if stored:
            pass                  # started from the file itself (no container to create or remove)
        elif sqsh is not None:
            create = CreateWhole(self.binary, name, sqsh, data, marker, os.path.basename(step_dir or ""))
            before.append((create, os.path.join(data, name),
                           f"unpacking the container root of {spec.image} (enroot create)",
                           f"failed to unpack the container root of {spec.image} (enroot create)",
                           CREATE_QUIET_SECONDS))
        elif not os.path.isdir(os.path.join(data, name)):     # where enroot create put it
            raise LaunchError(no_named_container(spec))
        passed, own = self.container_env(spec, host_env)
        # --container-entrypoint: the entrypoint starts without the job's other variables, which
        # the command's shell sets after it where it left them unset (LATER_PART), as pyxis
        passed, later = entrypoint_split(passed, spec) if spec.rank_dir else (passed, {})
        if stored:
            # the image's ENV, which enroot import keeps in the image's /etc/environment (the store's
            # squashfs is the image's files only): first, so the job's values win over it as there
            passed = {**image_environment(stored.config), **passed}
        argv = [self.binary, "start", *self.args]
        if spec.writable:
            argv.append("--rw")
        if spec.unshare:    # enroot start's --net, --ipc, --uts (ENROOT_UNSHARE_*), as pyxis 0.24 asks
            self.require_unshare(spec.unshare, env)
            argv += [f"--{ns}" for ns in spec.unshare]
        after = []
        # every mount in the --conf script's mounts(), in this order: the rank's directories, then
        # the user's (the admin's first) over them, as pyxis lists them (tmpfs, umount: enroot's own)
        batch = [Mount(spec.batch_script, CONTAINER_BATCH_SCRIPT, True)] if spec.batch_script else []
        mount_lines = [*(fstab_line(m, rank=True) for m in spec.rank_mounts()),
                       *(fstab_line(m) for m in (*spec.mounts, *batch))]
        relay = []
        fd, helper = (pmi_fd(host_env), fd_helper()) if spec.rank_dir and "PMI_FD" in host_env else (None, None)
        if fd is not None and helper:
            # PMI_FD into the container (see FD_HELPER): the program on a file bind in the rank's
            # work directory, the socket there too; served once the container root is in place
            inside = f"/run/tether/{FD_HELPER}"       # beside the work directory's mount, not in it
            mount_lines.insert(len(spec.rank_mounts()), f"{fstab_escape(helper)} {inside} none "
                                                        f"x-create=file,bind,ro,nosuid,nodev")
            before.append((lambda env: serve_fd(os.path.join(spec.rank_dir, "work", PMI_SOCKET), fd), None))
            relay = [inside, f"{CONTAINER_WORKDIR}/{PMI_SOCKET}", str(fd)]
        elif fd is not None and host_env.get("SLURM_LOCALID", spec.rank) == "0":    # once per node
            from ..launch import report

            report("PMI_FD (srun --mpi=pmi2) cannot reach the container: enroot start closes every descriptor "
                   "above 2 and tether-fd-receive is not installed next to tether-run (`tether slurm install` "
                   "builds it); an MPI rank of this step will not start its PMI-2 client")
        # values the environment file cannot carry: in files the command's shell reads inside
        # (by hand, without the rank's directories: left out with a word, by write_environ_conf)
        uncarried = {n: v for n, v in passed.items() if not carried(v)} if spec.rank_dir else {}
        if uncarried:
            write_values(os.path.join(spec.rank_dir, "work", VALUES_DIR), uncarried)
            passed = {n: v for n, v in passed.items() if n not in uncarried}
        # tether's own values last in environ(): they win, as --env would make them (one awk
        # process per --env in enroot start); so does NVIDIA_VISIBLE_DEVICES, which enroot's
        # nvidia hook reads from the environment file the same
        if self.gpu_kind(spec) == "cuda":
            own = {**own, "NVIDIA_VISIBLE_DEVICES": "all"}
        conf = os.path.join(step_dir, STEP_ENROOT, f"environ-{spec.rank}.conf") if step_dir else None
        # --no-container-entrypoint: the command itself, not the image's /etc/rc (RC_FUNCTION; pyxis
        # writes /etc/rc.local into the container instead, which stays in a named container)
        conf = write_environ_conf(conf, passed, mount_lines, own, rc=not spec.entrypoint)
        argv += ["--conf", conf]
        if not step_dir:                      # tether run by hand: nothing removes it with a step
            after.append(["rm", "-f", conf])
        script, values = (VALUES_PART, [f"{CONTAINER_WORKDIR}/{VALUES_DIR}"]) if uncarried else ("", [])
        if later:
            script, values = script + LATER_PART, [*values, f"{CONTAINER_WORKDIR}/{LATER_FILE}"]
        argv += [name, *relay, "/bin/sh", "-c", (STARTED_PROLOGUE if spec.rank_dir else "") + script + CD_PROLOGUE,
                 "sh", *values, spec.workdir, *spec.command]
        if not spec.name and not shared and not stored:     # a shared root goes with the step's directory
            after.insert(0, [self.binary, "remove", "--force", name])
        if (shared or spec.name) and spec.rank_dir:
            # the ranks sharing a root start it in turn (see take_start_turn): the last step before
            # the start, held until this rank's command runs
            before.append((StartTurn(os.path.join(os.path.dirname(data), f"start-{name}.lock"),
                                     os.path.join(spec.rank_dir, "work", STARTED_FILE)), None))
        if lock is None and node_dir:
            lock = os.path.join(node_dir, STEP_ENROOT, ".lock")
        finish = None
        if spec.save:        # enroot export: the container root as a squashfs, as pyxis saves it
            partial = f"{spec.save}.{os.uname().nodename}.{os.getpid()}.partial"
            finish = ([[self.binary, "export", "--output", partial, name]], partial, spec.save)
        if later:                 # last: once nothing refuses the launch
            later_values(spec.rank_dir, later)
        return Launch(argv=argv, env=env, supervise=True, before=before, lock=lock, after=after, runtime=self,
                      finish=finish, failures=os.path.dirname(spec.rank_dir) if spec.rank_dir else None,
                      created=os.path.join(spec.rank_dir, "work", STARTED_FILE) if spec.rank_dir else None)

    def cluster_image(self, spec: LaunchSpec):
        """The cluster image store's image of the rank's registry image (Runtime.cluster_store_image), None
        when the rank needs a container of its own (--container-name, --container-save, and
        --container-writable: a root on disk its node's ranks share, as pyxis's, not a per-rank
        overlay in memory) or the image's entrypoint (enroot import keeps it in the image's
        /etc/rc, which the store's files lack): those import it into the user's store, as without
        the store."""
        ref = self.reference(spec.image)
        if ref.kind != "registry" or ref.user or spec.entrypoint or spec.name or spec.save or spec.writable:
            return None
        return self.cluster_store_image(ref.qualified())

    def not_started(self, code: int) -> str:
        return (f"enroot exited {code} before the command in the container started: enroot itself failed (its "
                f"message is above; e.g. an image without /root under --container-remap-root, or a failing hook)")

    def require_unshare(self, namespaces: tuple[str, ...], env: Mapping[str, str]) -> None:
        """Refuse ``--container-unshare`` with an enroot that cannot (asked only then: one more
        process per rank). enroot 4.1.2 has no --net/--ipc/--uts and ignores ENROOT_UNSHARE_*,
        the variables pyxis 0.24 sets: its container would silently share the host's namespaces."""
        from ...system.proc import CommandError, run_quick

        try:
            text = run_quick([self.binary, "version"], env=dict(env), timeout=20).stdout.strip()
        except CommandError as exc:
            raise LaunchError(f"cannot ask {self.binary} for its version: {exc}") from None
        numbers = tuple(int(n) for n in text.split("-")[0].split(".")[:3] if n.isdigit())
        if numbers <= UNSHARE_BEFORE:
            raise LaunchError(f"--container-unshare={','.join(namespaces)}: enroot {text or '(unknown version)'} "
                              f"cannot give a container namespaces of its own (enroot start's --net, --ipc "
                              f"and --uts came after {'.'.join(map(str, UNSHARE_BEFORE))}); use a newer enroot "
                              f"or --container-runtime=podman")


ADAPTER = Enroot
