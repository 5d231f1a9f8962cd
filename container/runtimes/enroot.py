"""Enroot: per-user ``import``/``create`` with job-scoped names, ``start``, ``remove`` at the end.

Enroot clears the environment; the contract's host variables enter through an ``--conf`` script
whose ``environ()`` prints them (values in a private file, not on a command line; one enroot call
however many there are -- each ``--env NAME`` costs enroot an ``awk`` process), tether's own as
``--env NAME=VALUE``. It starts in $HOME (tether changes to the work directory with a
``/bin/sh`` prologue), keeps the root filesystem read-only unless ``--rw``, and always uses a user
namespace. A registry image is imported once per user per node into the user's store
(``container.enroot.store``, a squashfs file renamed into place only when complete, under a lock
the user's ranks and jobs on the node share); the container root lives under the step's directory
(``ENROOT_DATA_PATH``), so whatever a killed rank leaves goes with the step; ``--container-name``
keeps one container per node for all steps of the job, under the job's node directory.
"""

from __future__ import annotations

import hashlib
import os
TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

from ...hooks.imageref import ImageRefError, parse_image
from ..launch import progress
from ..spec import LaunchError
from . import Launch, Runtime
from .podman import store_directory

DEFAULT_STORE = "/var/tmp/tether-enroot-{uid}"     # container.enroot.store's default

if TYPE_CHECKING:
    from typing import Mapping

    from ..spec import LaunchSpec

CD_PROLOGUE = 'cd "$1" || exit 125; shift; exec "$@"'


def enroot_uri(image: str) -> str:
    """A registry image in enroot's spelling: ``docker://[USER@][REGISTRY#]IMAGE[:TAG]``."""
    try:
        return parse_image(image).enroot_uri()
    except ImageRefError as exc:
        raise LaunchError(str(exc)) from None


END_OF_ENVIRONMENT = "TETHER_END_OF_ENVIRONMENT"


def carried(value: str) -> bool:
    """Can enroot's environment file carry ``value`` unchanged? It is one ``NAME=VALUE`` per line
    (enroot-switchroot's load_environment), and enroot's ``common::envfmt`` (run twice: before and
    after the hooks) strips a pair of quotes around a whole value."""
    if "\n" in value or "\r" in value:
        return False
    stripped = value.rstrip(" \t\v\f")
    return not (len(stripped) >= 2 and stripped[0] in "\"'" and stripped[-1] in "\"'")


def write_environ_conf(path: str | None, values: Mapping[str, str]) -> str:
    """An ``enroot start --conf`` script whose ``environ()`` prints the variables (enroot appends
    its output to the container's environment file after the image's /etc/environment, so these
    win over the image's). The values are in the file -- mode 0600, in the user's own step
    directory -- never on a command line; a quoted here-document: bash expands nothing in them.
    Values the environment file cannot carry are left out, and the user is told which."""
    lines, dropped = [], []
    for name in sorted(values):
        (lines if carried(values[name]) else dropped).append(name)
    if dropped:
        shown = ", ".join(dropped[:5]) + (f" and {len(dropped) - 5} more" if len(dropped) > 5 else "")
        progress(f"not passed into the enroot container: {shown} (a line break, or quotes around the whole "
                 f"value: enroot's environment file cannot carry them)")
    text = ("# tether: the job's environment for this container (see tether.container.environment)\n"
            "environ() {\n"
            f"cat <<'{END_OF_ENVIRONMENT}'\n"
            + "".join(f"{name}={values[name]}\n" for name in lines)
            + f"{END_OF_ENVIRONMENT}\n}}\n")
    try:
        if path is None:
            import tempfile                   # only by hand: it costs a rank milliseconds

            fd, path = tempfile.mkstemp(prefix="tether-enroot-", suffix=".conf")
        else:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(text)
    except OSError as exc:            # something else where the file belongs (a symlink: ELOOP)
        raise LaunchError(f"cannot write enroot's environment script {path}: {exc.strerror}") from None
    return path


class Enroot(Runtime):
    name = "enroot"

    def __init__(self, settings: Mapping, **kw):
        super().__init__(settings, **kw)
        self.store_template = settings.get("store", DEFAULT_STORE) or ""

    def launch(self, spec: LaunchSpec, host_env: Mapping[str, str]) -> Launch:
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
            # (enroot 4.1, enroot.in). All three live under the step's (or the job's node)
            # directory, the runtime path per step even for a named container; its temp path is
            # ${TMPDIR}, the rank's own tmp directory.
            env.setdefault("ENROOT_DATA_PATH", os.path.join(node_dir, "enroot", "data"))
            env.setdefault("ENROOT_CACHE_PATH", os.path.join(node_dir, "enroot", "cache"))
            env.setdefault("ENROOT_RUNTIME_PATH", os.path.join(step_dir, "enroot", "run"))
        before, lock = [], None
        if self.is_remote(spec.image):
            uri = enroot_uri(spec.image)
            store = store_directory(self.store_template, os.getuid()) if self.store_template else None
            if store is None:
                store = os.path.join(node_dir or env.get("TMPDIR", "/tmp"), "enroot")
            sqsh = os.path.join(store, hashlib.sha256(uri.encode()).hexdigest()[:24] + ".sqsh")
            # into a file of this rank's own, renamed into place once complete: a killed import
            # never leaves a half-written image where the next job would take it for done
            partial = f"{sqsh[:-5]}.{os.getpid()}.partial"
            before += [([self.binary, "import", "--output", partial, uri], sqsh, f"importing {spec.image} (enroot)"),
                       (["mv", "-f", partial, sqsh], sqsh)]
            lock = os.path.join(store, ".import-lock")
        else:
            sqsh = self.local_image(spec.image)
            if os.path.isdir(sqsh):
                raise LaunchError(f"--container-image={spec.image}: enroot runs a squashfs file or a "
                                  f"docker:// image, not a directory")
        name = spec.instance
        data = env.get("ENROOT_DATA_PATH") or os.path.join(
            env.get("XDG_DATA_HOME") or os.path.join(env.get("HOME", "/"), ".local/share"), "enroot")
        before.append(([self.binary, "create", "--name", name, sqsh], os.path.join(data, name),
                       f"unpacking the container root of {spec.image} (enroot create)"))
        passed, own = self.container_env(spec, host_env)
        argv = [self.binary, "start", *self.args]
        if spec.writable:
            argv.append("--rw")
        after = []
        if passed:
            conf = os.path.join(step_dir, "enroot", f"environ-{spec.rank}.conf") if step_dir else None
            conf = write_environ_conf(conf, passed)
            argv += ["--conf", conf]
            if not step_dir:                  # tether run by hand: nothing removes it with a step
                after.append(["rm", "-f", conf])
        argv += self.own_env_args(own)
        if self.gpu_kind(spec) == "cuda":
            argv += ["--env", "NVIDIA_VISIBLE_DEVICES=all"]
        for mount in spec.rank_mounts():
            argv += ["--mount", f"{mount.source}:{mount.target}:none:x-create=dir,bind"]
        for mount in spec.mounts:
            argv += ["--mount", f"{mount.source}:{mount.target}:none:x-create=auto,rbind"
                     + (",ro" if mount.readonly else "")]
        argv += [name, "/bin/sh", "-c", CD_PROLOGUE, "sh", spec.workdir, *spec.command]
        if not spec.name:
            after.insert(0, [self.binary, "remove", "--force", name])
        if lock is None and node_dir:
            lock = os.path.join(node_dir, "enroot", ".lock")
        return Launch(argv=argv, env=env, supervise=True, before=before, lock=lock, after=after, runtime=self)


ADAPTER = Enroot
