"""The image service: the only writer of the cluster image store (container/imagestore.py).

It runs as the store's account (``container.cluster_store.account``, never root, never a job user),
one per node: systemd starts ``tether images serve`` for each connection to its socket
(tether-images.socket, Accept=yes), or ``tether images serve --listen`` accepts them itself. A
rank's launcher (the job user) connects and asks for a reference; the service answers at once
from the store when the reference was resolved within ``resolve_every``, else takes the
reference's lock on the shared filesystem -- one publisher for the whole cluster -- and fetches it
with its own rootless podman **without credentials**, so it only ever publishes what anyone may
fetch (podman checks each blob against the manifest's digest as it pulls); the container's files
(``podman export``, owners and modes as in the image, podman's mount targets added) become a
squashfs (``tar2sqfs``) in the store's staging directory and are published by a rename (with
``apptainer_form``, a gzip squashfs Apptainer starts too, made from the first). A
reference that needs credentials is a private image: the service says so and the rank pulls it
into the user's own store as without a cluster store (private images never enter it).

The protocol: one JSON line each way, then the service's progress lines::

    -> {"reference": "docker.io/library/ubuntu:22.04"}
    <- {"say": "..."}*  then one of
       {"published": {"path": ..., "image_id": ..., "manifest": ...}}
       {"wait": "<host> pid <pid>"}         another node's service is fetching it: poll the store
       {"private": "<why>"}                 not without credentials: the user's own pull
       {"limit": "<why>"}                   the asker's fetches_per_hour is used up: their own pull
       {"error": "<why>"}
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import posixpath
import socket
import struct
import subprocess
import tarfile
import tempfile
import threading
import time
from typing import Callable, Mapping, Sequence

from .imagestore import ImageStore, StoreError, valid_id

# what a registry says when an image needs credentials (podman 4.3's messages: docker's registry
# answers 401 to a pull without them; one that hides private repositories answers "not found")
PRIVATE_WORDS = ("unauthorized", "authentication required", "access to the resource is denied",
                 "401 Unauthorized", "denied:")
TARGET_DIRS = ("proc", "sys", "dev", "run", "tmp", "var/tmp")
# podman's mount targets a read-only root must have (its errors without them, podman 4.3: "mkdir
# .../proc: function not implemented", "open .../etc/hosts: read-only file system", "creating
# /etc/mtab symlink: function not implemented"); /run/.containerenv for a run without --read-only
TARGET_FILES = ("etc/passwd", "etc/group", "etc/hosts", "etc/hostname", "etc/resolv.conf", "run/.containerenv")
TARGET_LINKS = (("etc/mtab", "/proc/mounts"),)
MAX_REQUEST = 8192


class FetchError(Exception):
    """The registry or podman failed; the message says why."""


class NeedsCredentials(FetchError):
    """The image cannot be fetched without credentials."""


class PodmanFetcher:
    """The account's rootless podman: a store of its own on this node, used by one fetch at a time
    and empty before and after each (``session``), an empty credentials file (nothing it pulls
    needs one).

    Why empty: podman 4.3 names a pulled image by its config's digest and, when its store has an
    image of that id already, takes that image's layers without checking them against the config
    (containers/image checks diff_ids only since late 2024) -- an image someone pushed with a
    popular image's config and layers of their own would be what the popular one's pull found. In
    an empty store every layer of a pull is the pull's own, each checked against the manifest's
    digest."""

    def __init__(self, binary: str, scratch: str, env: Mapping[str, str], args: Sequence[str] = (), *,
                 apptainer_form: bool = False):
        self.scratch = scratch
        self.apptainer_form = apptainer_form    # also write each image's Apptainer form (cluster_store's)
        self.env = dict(env)
        self.podman = [binary, *args, "--root", os.path.join(scratch, "storage"),
                       "--runroot", os.path.join(self.env.get("XDG_RUNTIME_DIR", scratch), "tether-images")]
        self.authfile = os.path.join(scratch, "no-credentials.json")
        self._configs: dict[str, str] = {}      # image id -> its config as podman shows it (pull)

    def _run(self, *args: str, timeout: float = 3600, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
        return subprocess.run([*self.podman, *args], env=self.env, stdout=stdout, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, timeout=timeout)

    @contextlib.contextmanager
    def session(self):
        """One fetch at a time on this node (a lock file in the scratch directory: the threads of
        --listen and the processes of systemd's per-connection services alike), with the scratch
        store emptied before and after."""
        import fcntl

        os.makedirs(self.scratch, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(self.scratch, ".fetch-lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            with _THREADS:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    self.empty()
                    yield self
                finally:
                    self.empty()
        finally:
            os.close(fd)

    def empty(self) -> None:
        """Nothing left in the scratch store: containers, then images."""
        self._run("rm", "--all", "--force", timeout=600)
        self._run("rmi", "--all", "--force", timeout=600)

    def pull(self, reference: str) -> tuple[str, str]:
        """(the manifest digest, the image id) of ``reference`` as the registry has it now, pulled
        without credentials into the empty scratch store (``session``)."""
        if not os.path.exists(self.authfile):
            with open(self.authfile, "w") as f:
                f.write('{"auths": {}}\n')
        # docker:// always: a reference is never read as another transport (oci:, dir:, ...)
        out = self._run("pull", "--quiet", "--authfile", self.authfile, f"docker://{reference}")
        if out.returncode != 0:
            said = out.stderr.decode(errors="replace").strip()
            last = (said.splitlines() or ["podman pull failed"])[-1]
            if any(word.lower() in said.lower() for word in PRIVATE_WORDS):
                raise NeedsCredentials(f"{reference} needs credentials: {last}")
            raise FetchError(f"pulling {reference} failed: {last}")
        image_id = out.stdout.decode().strip().splitlines()[-1]
        # one inspect: the manifest's digest, and the config ``config`` gives
        shown = self._run("image", "inspect", "--format", "{{.Digest}}\n{{json .Config}}", image_id,
                          timeout=120).stdout.decode()
        digest, _, self._configs[image_id] = shown.partition("\n")
        return digest.strip(), image_id

    def config(self, image_id: str) -> dict:
        """What a container of the image starts with beyond its files (its ENV, ENTRYPOINT, CMD,
        WORKDIR): podman's --rootfs knows none of it."""
        try:
            config = json.loads(self._configs.get(image_id) or "{}") or {}
        except ValueError:
            config = {}
        return {"env": [e for e in config.get("Env") or () if isinstance(e, str)],
                "entrypoint": list(config.get("Entrypoint") or ()), "cmd": list(config.get("Cmd") or ()),
                "workdir": str(config.get("WorkingDir") or "")}

    def squashfs(self, image_id: str, target: str) -> None:
        """The image's files as a squashfs at ``target``: ``podman export`` of a container made
        for it (never started), podman's mount targets added where the image lacks them (a
        read-only root needs them), through ``tar2sqfs`` -- owners and modes as in the image."""
        name = f"tether-images-{os.getpid()}-{threading.get_ident()}"
        made = self._run("create", "--name", name, image_id, "true", timeout=600)
        if made.returncode != 0:
            raise FetchError(f"podman create for the export failed: {made.stderr.decode(errors='replace').strip()}")
        # the two programs' stderr into files, read at the end: a pipe read only then could fill
        # (tar2sqfs says a line per entry it cannot take) and block both for good
        try:
            with tempfile.TemporaryFile() as export_err, tempfile.TemporaryFile() as write_err:
                export = subprocess.Popen([*self.podman, "export", name], env=self.env, stdout=subprocess.PIPE,
                                          stderr=export_err, stdin=subprocess.DEVNULL)
                # zstd at level 3 on every CPU: for 1 GiB here tar2sqfs's default (xz, one thread)
                # took 56 s, zstd's default level 13.5 s, level 3 2.6 s (squashfuse reads all of them)
                write = subprocess.Popen(["tar2sqfs", "--quiet", "--force", "--compressor", "zstd", "--comp-extra",
                                          "level=3", "--num-jobs", str(os.cpu_count() or 1), "--defaults",
                                          "mode=0755", target],
                                         env=self.env, stdin=subprocess.PIPE, stderr=write_err,
                                         stdout=subprocess.DEVNULL)
                broken = None
                try:
                    add_mount_targets(export.stdout, write.stdin)
                except BrokenPipeError:
                    pass                 # tar2sqfs ended early (a full disk): its words below
                except (tarfile.TarError, OSError, EOFError) as exc:
                    broken = exc         # podman's stream cut or not a tar: never a squashfs of part of it
                    write.kill()
                finally:
                    written = _close_pipe(export, write)
                    # podman export keeps writing into a pipe nobody reads without ever getting
                    # EPIPE (seen: it holds the pipe's other end itself): ended here whenever
                    # tar2sqfs is done, or the fetch -- and the reference's lock, kept fresh
                    # meanwhile -- would hang for good
                    killed = False
                    if written == 0 and broken is None:
                        try:             # its stream ended: its status says whether it was whole
                            export.wait(timeout=120)
                        except subprocess.TimeoutExpired:
                            broken = "podman export did not end after its stream"
                    if export.poll() is None:
                        export.kill()
                        killed = True
                    exported = export.wait()
                export_err.seek(0)
                write_err.seek(0)
                if exported != 0 and not killed:
                    raise FetchError(f"podman export failed: {export_err.read(8192).decode(errors='replace').strip()}")
                if broken is not None:
                    raise FetchError(f"podman export's stream could not be read: {broken}")
                if written != 0:
                    raise FetchError(f"tar2sqfs failed: {write_err.read(8192).decode(errors='replace').strip()}"
                                     f"{_space_left(target)}")
        finally:
            self._run("rm", "--force", name, timeout=600)

    def forget(self, image_id: str) -> None:
        """Remove the image from the scratch store (``session`` empties it whatever happened)."""
        self._run("rmi", "--force", image_id, timeout=600)


_THREADS = threading.Lock()     # one fetch per process (flock is per open file, not per thread)


@contextlib.contextmanager
def _copied_tar(source, sink):
    """The tar stream ``source`` copied member by member to a PAX stream on ``sink``: yields that
    stream, open for more members, and the paths it has (no leading ./ or trailing /)."""
    seen = set()
    with tarfile.open(fileobj=source, mode="r|") as tin, tarfile.open(fileobj=sink, mode="w|",
                                                                      format=tarfile.PAX_FORMAT) as tout:
        for member in tin:
            seen.add(posixpath.normpath(member.name).lstrip("/"))    # ./a/, /a, a: "a"
            tout.addfile(member, tin.extractfile(member) if member.isreg() else None)
        yield tout, seen


def add_mount_targets(source, sink) -> None:
    """Copy the tar stream ``source`` to ``sink``, adding podman's mount targets (empty files and
    directories, root's) that it lacks -- a read-only root without them cannot start."""
    with _copied_tar(source, sink) as (tout, seen):
        for path in TARGET_DIRS:
            for part in _parents(path):
                if part not in seen:
                    info = tarfile.TarInfo(part)
                    info.type, info.mode = tarfile.DIRTYPE, 0o1777 if part in ("tmp", "var/tmp") else 0o755
                    tout.addfile(info)
                    seen.add(part)
        for path in TARGET_FILES:
            for part in _parents(os.path.dirname(path)):
                if part not in seen:
                    info = tarfile.TarInfo(part)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tout.addfile(info)
                    seen.add(part)
            if path not in seen:
                info = tarfile.TarInfo(path)
                info.mode = 0o644
                tout.addfile(info)
                seen.add(path)
        for path, target in TARGET_LINKS:
            if path not in seen:
                info = tarfile.TarInfo(path)
                info.type, info.linkname = tarfile.SYMTYPE, target
                tout.addfile(info)


# Apptainer's docker conversion (internal/pkg/build/sources/conveyorPacker_oci.go, insertEnv):
# the image's ENV in this file, PATH set, every other variable only where the environment has none
APPTAINER_ENV_SCRIPT = ".singularity.d/env/10-docker2singularity.sh"
# Apptainer's action script (1.1.9, internal/pkg/util/fs/files/action_script.sh) puts the job's
# variables (APPTAINERENV_*) in right after sourcing the image's 99-base.sh, and never when an image
# with /.singularity.d/env has none (seen by hand: the image's ENV won); what its build writes
# there: its libraries' directory on the library path (--nv puts the driver's there), its prompt
APPTAINER_BASE_SCRIPT = (".singularity.d/env/99-base.sh",
                         '#!/bin/sh\nLD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/.singularity.d/libs"\n'
                         'PS1="${PS1:-Apptainer> }"\nexport LD_LIBRARY_PATH PS1\n')
APPTAINER_DIRS = (".singularity.d", ".singularity.d/env", ".singularity.d/libs")


def apptainer_environment(env: Sequence[str]) -> str:
    """The image config's ``Env`` as Apptainer's env script for it (see APPTAINER_ENV_SCRIPT); a
    name that is not a shell word is left out (the config is anyone's to write)."""
    from .runtimes import env_name

    lines = ["#!/bin/sh"]
    for item in env:
        name, eq, value = item.partition("=")
        if not eq or not env_name(name):
            continue
        quoted = "".join("\\" + c if c in '\\"$`' else c for c in value)
        # Apptainer writes NAME="${NAME:-value}"; the same test, with the value outside the
        # expansion (a '}' in it would end the expansion there)
        lines.append(f'export {name}="{quoted}"' if name == "PATH" else
                     f'if [ -z "${{{name}:-}}" ]; then {name}="{quoted}"; fi; export {name}')
    return "\n".join(lines) + "\n"


def add_apptainer_files(source, sink, env: Sequence[str]) -> None:
    """Copy the tar stream ``source`` (the store's squashfs as sqfs2tar gives it) to ``sink``, with
    Apptainer's /.singularity.d and the image's ENV in its env script, where the image has none."""
    with _copied_tar(source, sink) as (tout, seen):
        for path in APPTAINER_DIRS:
            if path not in seen:
                info = tarfile.TarInfo(path)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tout.addfile(info)
        for path, text in ((APPTAINER_ENV_SCRIPT, apptainer_environment(env)), APPTAINER_BASE_SCRIPT):
            if path not in seen:
                data = text.encode()
                info = tarfile.TarInfo(path)
                info.mode, info.size, info.mtime = 0o755, len(data), int(time.time())
                tout.addfile(info, io.BytesIO(data))


def write_apptainer_form(squashfs: str, target: str, env: Sequence[str], *, environ: Mapping[str, str]) -> None:
    """The store's squashfs ``squashfs`` again as a gzip squashfs at ``target`` with Apptainer's
    files (add_apptainer_files): ``sqfs2tar`` through ``tar2sqfs``, owners and modes kept."""
    with tempfile.TemporaryFile() as read_err, tempfile.TemporaryFile() as write_err:
        read = subprocess.Popen(["sqfs2tar", "--root-becomes", ".", squashfs], env=environ, stdout=subprocess.PIPE,
                                stderr=read_err, stdin=subprocess.DEVNULL)
        write = subprocess.Popen(["tar2sqfs", "--quiet", "--force", "--compressor", "gzip", "--num-jobs",
                                  str(os.cpu_count() or 1), "--defaults", "mode=0755", target],
                                 env=environ, stdin=subprocess.PIPE, stderr=write_err, stdout=subprocess.DEVNULL)
        broken = None
        try:
            add_apptainer_files(read.stdout, write.stdin, env)
        except BrokenPipeError:
            pass                         # tar2sqfs ended early (a full disk): its words below
        except (tarfile.TarError, OSError, EOFError) as exc:
            broken = exc
            write.kill()
        finally:
            written = _close_pipe(read, write)
            if read.poll() is None and (written != 0 or broken is not None):
                read.kill()
            got = read.wait()
        read_err.seek(0)
        write_err.seek(0)
        if broken is not None or (got != 0 and written == 0):
            raise FetchError(f"sqfs2tar of {squashfs} failed: "
                             f"{broken or read_err.read(8192).decode(errors='replace').strip()}")
        if written != 0:
            raise FetchError(f"tar2sqfs of the Apptainer image failed: "
                             f"{write_err.read(8192).decode(errors='replace').strip()}{_space_left(target)}")


def _close_pipe(reader: subprocess.Popen, writer: subprocess.Popen) -> int:
    """Close both ends tether held of a ``reader | tether | writer`` pipe; the writer's status."""
    try:
        writer.stdin.close()
    except BrokenPipeError:
        pass
    reader.stdout.close()
    return writer.wait()


def _space_left(target: str) -> str:
    """"; N MiB free in <dir>" for ``target``'s directory (tar2sqfs says only "I/O error" when the
    disk is full), or nothing."""
    where = os.path.dirname(target)
    try:
        st = os.statvfs(where)
    except OSError:
        return ""
    return f"; {st.f_bavail * st.f_frsize // (1 << 20)} MiB free in {where}"


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)] if path else []


def publish_reference(store: ImageStore, fetcher, reference: str, *, resolve_every: float, user: int | None,
                      say: Callable[[str], None] = lambda text: None, fetches_per_hour: int = 0) -> dict:
    """The service's answer for ``reference`` (see the module docstring)."""
    found = store.lookup(reference, max_age=resolve_every)
    if found:
        return {"published": _answer(found)}
    private = store.private(reference, resolve_every)
    if private:
        return {"private": private}
    lock = store.lock(reference)
    if not lock.try_acquire():
        return {"wait": store.publisher(reference) or "another node"}
    try:
        found = store.lookup(reference, max_age=resolve_every)      # published while we took the lock
        if found:
            return {"published": _answer(found)}
        over = store.charge_fetch(user, fetches_per_hour)
        if over is not None:
            return {"limit": f"you asked the cluster image store to fetch {over} images within the last hour "
                             f"(its limit per user, fetches_per_hour, is {fetches_per_hour})"}
        say(f"fetching {reference} into the cluster image store (once for the whole cluster)")
        try:
            with fetcher.session():
                return {"published": _answer(_fetch_and_publish(store, fetcher, reference, user, say))}
        except NeedsCredentials as exc:
            store.record_private(reference, str(exc))
            return {"private": str(exc)}
        except (FetchError, StoreError, OSError, subprocess.TimeoutExpired) as exc:
            store.record_failure(reference, str(exc))
            return {"error": str(exc)}
    finally:
        lock.release()


def _fetch_and_publish(store: ImageStore, fetcher, reference: str, user: int | None, say):
    """In a fetch session: pull ``reference``, and publish it under its manifest's digest -- what the
    registry named for it, and what names every layer's digest, each checked as podman pulled it --
    unless the store has that manifest's image already (the tag did not move)."""
    manifest, podman_id = fetcher.pull(reference)
    staging = None
    try:
        algorithm, _, key = manifest.partition(":")
        if algorithm != "sha256" or not valid_id(key):
            raise FetchError(f"{reference}: podman gave no manifest digest for it ({manifest[:80]!r})")
        known = store.lookup(reference, max_age=None)
        config = fetcher.config(podman_id)
        if not (known and known.image_id == key) and not store.has_image(key):
            staging = store.staging_path(key)
            say(f"making the squashfs of {reference} ({key[:12]})")
            fetcher.squashfs(podman_id, staging)
            # in place before its Apptainer form is made of it (no reference names it yet, so no
            # rank sees it): a finished file left in staging that long would be gc's as a killed
            # publisher's
            store.place_image(key, staging, reference)
            staging = None
        if getattr(fetcher, "apptainer_form", False):
            _add_apptainer_form(store, key, reference, config, fetcher.env, say)
        if known and known.image_id == key:
            store.refresh(reference)                                # the tag still names it
            return store.lookup(reference, max_age=None)
        return store.publish(reference, manifest, key, None, user, config=config)
    finally:
        if staging and os.path.exists(staging):
            os.unlink(staging)
        fetcher.forget(podman_id)


def _add_apptainer_form(store: ImageStore, image_id: str, reference: str, config: Mapping,
                        environ: Mapping[str, str], say) -> None:
    """The image's Apptainer form, made of the store's squashfs (when the store has none yet): the
    image is published without it when it cannot be made (said; Apptainer ranks convert the image
    themselves, and the next resolve tries again), never held back for it."""
    if os.path.exists(store.form_path(image_id)):
        return
    form = store.staging_path(f"{image_id}.apptainer")
    say(f"making the Apptainer image of {reference} ({image_id[:12]})")
    try:
        write_apptainer_form(store.image_path(image_id), form, config.get("env", []), environ=environ)
        store.place_form(image_id, form)
    except (FetchError, StoreError, OSError, subprocess.SubprocessError) as exc:
        say(f"the Apptainer image of {reference} could not be made ({str(exc)[:500]}): Apptainer ranks convert "
            f"it themselves")
    finally:
        if os.path.exists(form):
            os.unlink(form)


def _answer(found) -> dict:
    return {"path": found.path, "image_id": found.image_id, "manifest": found.manifest}


def peer_uid(conn: socket.socket) -> int:
    """The connecting process's uid, as the kernel says (SO_PEERCRED)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


DEFAULT_FETCHES_PER_HOUR = 30   # fetches one uid may make the store do in an hour (0: no limit)
REQUEST_SECONDS = 10.0      # a client that has not sent its request by then is dropped
MAX_CONNECTIONS = 256       # --listen: more at once are answered "busy" at once


def serve_connection(conn: socket.socket, store: ImageStore, fetcher, *, resolve_every: float,
                     fetches_per_hour: int = 0) -> None:
    """Answer one rank on ``conn``."""
    uid = peer_uid(conn)
    conn.settimeout(REQUEST_SECONDS)
    rfile = conn.makefile("rb")
    wfile = conn.makefile("wb", buffering=0)

    def send(obj: dict) -> None:
        try:
            wfile.write(json.dumps(obj).encode() + b"\n")
        except OSError:
            pass                    # the rank went away: the publish goes on for the others

    try:
        line = rfile.readline(MAX_REQUEST)
    except OSError:                 # too slow, or gone
        return
    conn.settimeout(None)           # the answer may take a whole fetch; a rank that left is fine
    try:
        request = json.loads(line)
        reference = request["reference"]
        if not isinstance(reference, str) or not reference or len(reference) > 1024:
            raise ValueError
    except (ValueError, KeyError, TypeError):
        send({"error": "the image service expects one JSON line {\"reference\": \"...\"}"})
        return
    from ..hooks.imageref import ImageRefError, parse_image

    try:
        ref = parse_image(reference)
    except ImageRefError as exc:
        send({"error": str(exc)})
        return
    if ref.kind != "registry":
        send({"error": f"{reference}: the cluster image store holds registry images only"})
        return
    send(publish_reference(store, fetcher, ref.qualified(), resolve_every=resolve_every, user=uid,
                           say=lambda text: send({"say": text}), fetches_per_hour=fetches_per_hour))


def ask(socket_path: str, reference: str, *, say: Callable[[str], None], timeout: float,
        service_uid: int | None = None) -> dict:
    """A rank's question to its node's image service (the final answer; progress goes to ``say``).
    ``service_uid``: the store's account -- a socket another user listens on is not asked."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(socket_path)
        if service_uid is not None and peer_uid(conn) != service_uid:
            raise ValueError(f"{socket_path} is not the image service's (another user listens on it)")
        conn.sendall(json.dumps({"reference": reference}).encode() + b"\n")
        for line in conn.makefile("rb"):
            answer = json.loads(line)
            if "say" in answer:
                say("".join(c for c in str(answer["say"])[:500] if c.isprintable()))
                continue
            return answer
    return {"error": "the image service closed the connection without an answer"}


def fetcher_for(settings: Mapping, socket_path: str) -> PodmanFetcher:
    """The account's podman on this node, as the config's container.podman says (binary, global
    args, env), its scratch store in ``cluster_store.scratch`` and its run directory beside the
    socket (the account's own: systemd's RuntimeDirectory)."""
    conf = settings.get("cluster_store") or {}
    podman = settings.get("podman") or {}
    run = os.path.join(os.path.dirname(socket_path), "podman")
    os.makedirs(run, mode=0o700, exist_ok=True)
    scratch = conf.get("scratch") or DEFAULT_SCRATCH
    # HOME in the scratch directory: podman's per-user files there, whether the account has a home
    # directory on the node or not (a system account often has none)
    env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": scratch,
           "USER": os.environ.get("USER", ""), **{str(k): str(v) for k, v in (podman.get("env") or {}).items()},
           "XDG_RUNTIME_DIR": run}
    args = [a for a in podman.get("args") or () if a.split("=", 1)[0] in ("--runtime", "--storage-driver")
            or a in ("runc", "crun")]
    return PodmanFetcher(str(podman.get("binary") or "podman"), scratch, env, args,
                         apptainer_form=bool(conf.get("apptainer_form", True)))


DEFAULT_SCRATCH = "/var/lib/tether/image-service"


def serve(store: ImageStore, settings: Mapping, *, listen: str | None) -> int:
    """``tether images serve``: one connection on fd 0 (systemd, Accept=yes), or accept them on
    ``listen`` until SIGTERM (a thread each; one publisher per reference still, by the store's
    lock)."""
    import signal

    conf = settings.get("cluster_store") or {}
    socket_path = listen or conf.get("socket") or "/run/tether-images/images.sock"
    fetcher = fetcher_for(settings, socket_path)
    resolve_every = float(conf.get("resolve_every", 900))
    per_hour = int(conf.get("fetches_per_hour", DEFAULT_FETCHES_PER_HOUR))
    if listen is None:
        with socket.socket(fileno=0) as conn:
            serve_connection(conn, store, fetcher, resolve_every=resolve_every, fetches_per_hour=per_hour)
        return 0
    try:
        if os.path.exists(listen) and os.lstat(listen).st_uid == os.getuid():
            os.unlink(listen)
    except OSError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(listen)
    os.chmod(listen, 0o666)                 # any local user may ask; the kernel says who asks
    server.listen(64)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def one(conn: socket.socket) -> None:
        with conn:
            try:
                serve_connection(conn, store, fetcher, resolve_every=resolve_every, fetches_per_hour=per_hour)
            except Exception as exc:        # noqa: BLE001 -- one rank's question never ends the service
                try:
                    conn.sendall(json.dumps({"error": f"the image service failed: {exc}"}).encode() + b"\n")
                except OSError:
                    pass
            finally:
                slots.release()

    while True:
        try:
            conn, _ = server.accept()
        except OSError:                     # out of descriptors, for now: the others go on
            time.sleep(0.1)
            continue
        if not slots.acquire(blocking=False):
            with conn:
                try:
                    conn.sendall(json.dumps({"busy": "the image service has too many clients"}).encode() + b"\n")
                except OSError:
                    pass
            continue
        threading.Thread(target=one, args=(conn,), daemon=True).start()
