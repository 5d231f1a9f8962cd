"""The launch spec: everything a runtime adapter needs to start one rank's (or one node's) container.

It is built from the same ``TETHER_CONTAINER_*`` variables the SPANK plugin sets in each task (and
that ``qsub -v`` / ``tether run`` options provide), plus the rank environment and the per-rank
directories. Only the standard library is imported here: this runs once per rank.
"""

from __future__ import annotations

import os

from ..hooks.imageref import LOCAL_PREFIXES, ImageRefError, parse_image
from ..hooks.layout import CONTAINER_BATCH_SCRIPT, CONTAINER_TMP, CONTAINER_WORKDIR, RESERVED, reserved_target
from ..hooks.records import dataclass
from ..hooks.surface import FLAG_VALUES as _OPTION_FLAGS
from ..hooks.surface import (BATCH_VAR, BY_NAME, CONTAINER_NAME_FLAGS, MAX_TEXT, RUNTIMES, UNSHARE_NAMESPACES,
                             has_control, is_env_name, unknown_namespace)

TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

if TYPE_CHECKING:
    from typing import Mapping, Sequence

# Plain string checks, not regular expressions: this runs once per rank, and `re` costs milliseconds.
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_NAME_CHARS = _ALNUM | frozenset("_.-")


def _is_name(name: str) -> bool:
    """[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"""
    return 0 < len(name) <= 63 and name[0] in _ALNUM and set(name) <= _NAME_CHARS


def _path_bad(value: str) -> bool:
    return any(c in " ,:" or ord(c) < 32 or ord(c) == 127 or c.isspace() for c in value)


# A flag's values, as the SPANK plugin accepts them (spank/options.c, hooks/surface.py): anything
# else is refused.
FLAG_VALUES = {value: normalized == "1" for value, normalized in _OPTION_FLAGS.items()}


def parse_flag(value: str | None, what: str) -> bool:
    if value is None:
        return False
    if value not in FLAG_VALUES:
        raise LaunchError(f"{what}={value[:40]!r}: expected 1/0, true/false or yes/no")
    return FLAG_VALUES[value]


def _text(env: Mapping[str, str], name: str, what: str) -> str:
    """A TETHER_CONTAINER_* value: one line of printable text, at most MAX_TEXT bytes."""
    value = env.get(name, "")
    if not value:
        return value
    if len(value.encode("utf-8", "surrogateescape")) > MAX_TEXT or has_control(value):
        raise LaunchError(f"{what}: expected printable text of at most {MAX_TEXT} characters")
    return value.strip()


class LaunchError(Exception):
    """A launch tether cannot perform; ``str()`` is the message for the user. ``output``: what
    the runtime command that failed wrote to stderr, when one did (its state's repair reads it)."""

    def __init__(self, message: str = "", output: str | None = None):
        super().__init__(message)
        self.output = output


try:        # the builtin module hashlib falls back to: no OpenSSL to load, ~3 ms of each rank's start
    from _sha256 import sha256 as _sha256
except ImportError:                        # pragma: no cover -- Python 3.12 merged it into _sha2
    try:
        from _sha2 import sha256 as _sha256
    except ImportError:
        from hashlib import sha256 as _sha256


def sha256_hex(text: str) -> str:
    """SHA-256 of ``text`` (UTF-8) in hex, as hashlib gives it, for the names the rank launcher
    derives (stores, markers, records) without importing hashlib."""
    return _sha256(text.encode()).hexdigest()


def value_hash(self) -> int:
    """A value class's hash by its fields (mutable, as these are, yet hashable: kept in sets)."""
    return hash(tuple(getattr(self, n) for n in self.__match_args__))


# --container-mounts, pyxis 0.24's grammar: SRC[:DST[:FLAGS]] joined with ',', FLAGS with '+'. SRC
# is an absolute path, a relative one (starting with '.': to the step's working directory on the
# node, as pyxis's enroot resolves it), ``tmpfs`` or ``umount`` (unmount DST); DST an absolute path or
# one relative to the container's root (starting with '.'). Flags as mount(8) and enroot spell them.
# The flags a bind mount passes on (podman's --volume takes each; Apptainer: none, only ro)
MOUNT_FLAGS = ("nosuid", "suid", "nodev", "dev", "noexec", "exec", "private", "rprivate", "slave", "rslave",
               "shared", "rshared", "unbindable", "runbindable")
PROPAGATION = ("private", "rprivate", "slave", "rslave", "shared", "rshared", "unbindable", "runbindable")
# accepted and changing nothing: a bind is recursive whatever it says, as pyxis's (its own flags
# always include rbind, which enroot then applies); x-create: what enroot makes for a missing target
BIND_ONLY = ("bind", "rbind")
CREATE = ("auto", "dir", "file")
# a tmpfs mount's options with a value (tmpfs(5)); podman's --tmpfs takes only size= and mode=
# (a tmpfs with others is an anonymous volume there: podman.mount_args)
TMPFS_OPTIONS = ("size", "nr_blocks", "nr_inodes", "mode", "uid", "gid", "huge")
PODMAN_TMPFS_OPTIONS = ("size", "mode")
# a tmpfs mount's huge= (the kernel's shmem_parse_huge for a mount; deny and force are only for
# /sys/kernel/mm/transparent_hugepage/shmem_enabled, and a mount refuses them: EINVAL)
HUGE = ("never", "always", "within_size", "advise")
# flags of opposite meaning: both in one mount is refused (podman refuses them too)
_OPPOSITE = (("ro", "rw"), ("nosuid", "suid"), ("nodev", "dev"), ("noexec", "exec"))
_SIZE_SUFFIXES = "kKmMgGtTpPeE"
MOUNT_SOURCES = "an absolute path, a relative path (starting with '.'), 'tmpfs' or 'umount'"


@dataclass
class Mount:
    """One entry of --container-mounts: a bind mount from the host (``source`` a path), a tmpfs
    (``source`` 'tmpfs', ``options`` its size=/mode=/...), or ``umount`` of ``target``."""

    source: str = ""
    target: str = ""
    readonly: bool = False
    flags: tuple[str, ...] = ()      # of MOUNT_FLAGS
    options: tuple[str, ...] = ()    # a tmpfs's NAME=VALUE options (TMPFS_OPTIONS)
    create: str = "auto"             # enroot's x-create for a missing target: auto, dir or file
    __hash__ = value_hash

    @property
    def kind(self) -> str:
        """'bind', 'tmpfs' or 'umount' (a path never is one of the two words: it starts with / or .)."""
        return self.source if self.source in ("tmpfs", "umount") else "bind"

    def __str__(self) -> str:
        """``SRC:DST[:ro[,FLAG...]]``: podman's --volume spelling (Apptainer's where no flag is set);
        for a tmpfs podman's --tmpfs one, ``DST[:OPTIONS]``."""
        options = ("ro",) * self.readonly + tuple(self.flags)
        if self.kind == "tmpfs":
            options += tuple(self.options)
            return self.target + (f":{','.join(options)}" if options else "")
        return f"{self.source}:{self.target}" + (f":{','.join(options)}" if options else "")


@dataclass
class LaunchSpec:
    """One container launch (see the module docstring)."""

    image: str = ""
    runtime: str = ""
    command: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    workdir: str = CONTAINER_WORKDIR
    env_names: tuple[str, ...] = ()      # --container-env: host variables that win over the image's
    writable: bool | None = None         # --container-writable/-readonly; None: the runtime's own default
    name: str | None = None              # --container-name: one container reused by the job's steps
    name_create: bool = False            # --container-name=NAME:create: this step makes it (pyxis's flag)
    # --container-name=NAME[:FLAG]: attach to the job's container NAME when another step runs it
    # on the node: "auto" (pyxis's default), "exec" (it must be running), "never" (no_exec, create)
    name_attach: str = "auto"
    rank_dir: str | None = None          # host path holding the rank's tmp/ and work/
    job_id: str = "0"
    step_id: str = "0"
    rank: str = "0"
    gpus: tuple[str, ...] = ()           # the rank's GPU ids as the resource manager bound them
    slot_type: str = "cuda"
    mount_home: bool | None = None       # --[no-]container-mount-home; None: the runtime's own default
    remap_root: bool | None = None       # --[no-]container-remap-root; None: the runtime's own default
    entrypoint: bool = False             # --[no-]container-entrypoint: run the image's entrypoint first
    save: str | None = None              # --container-save: where this rank saves its container (an absolute path)
    batch_script: str | None = None      # the batch script's path, when the batch script runs in the container
    unshare: tuple[str, ...] = ()        # --container-unshare: namespaces of the container's own (of UNSHARE_NAMESPACES)
    __hash__ = value_hash

    @property
    def instance(self) -> str:
        """A container name unique to this launch: tether-<job>-<step>-<rank> (or the job's name)."""
        if self.name:
            return f"tether-{self.job_id}-{self.name}"
        return self.rank_instance

    @property
    def rank_instance(self) -> str:
        """This rank's own container name, tether-<job>-<step>-<rank> (with --container-name too)."""
        return f"tether-{self.job_id}-{self.step_id}-{self.rank}"

    @property
    def step_instance(self) -> str:
        """The step's container on this node, shared by its ranks there: tether-<job>.<step>."""
        return f"tether-{self.job_id}.{self.step_id}"

    def rank_mounts(self) -> tuple[Mount, ...]:
        """The per-rank directories as mounts: <rank>/tmp -> /tmp, <rank>/work -> the work dir."""
        if not self.rank_dir:
            return ()
        return (Mount(os.path.join(self.rank_dir, "tmp"), CONTAINER_TMP),
                Mount(os.path.join(self.rank_dir, "work"), CONTAINER_WORKDIR))


def _check_path(value: str, what: str) -> str:
    if not value.startswith("/") or _path_bad(value) or "/../" in value + "/":
        raise LaunchError(f"{what} {value!r} must be an absolute path without spaces, commas, colons "
                          f"or '..'")
    return value.rstrip("/") or "/"


def container_path(value: str, what: str, *, clamp: bool = False) -> str:
    """A path inside the container, absolute and without '.' or '..', from an absolute one or one
    relative to the container's root (as pyxis: ``./data`` is ``/data``). A '..' above the root is
    refused (enroot: "cross-device link"), or with ``clamp`` stays at the root (a working
    directory: pyxis's chdir("../") from the root is the root)."""
    parts: list[str] = []
    for part in value.split("/"):
        if part in ("", "."):
            continue
        if part != "..":
            parts.append(part)
        elif parts:
            parts.pop()
        elif not clamp:
            raise LaunchError(f"{what} {value!r} leads out of the container's root ('..' above '/'; pyxis's enroot "
                              f"says: Invalid cross-device link)")
    return "/" + "/".join(parts)


def _tmpfs_value_ok(name: str, value: str) -> bool:
    """A tmpfs option's value as tmpfs(5) takes it (checked here: enroot hands it to mount(2))."""
    if name == "huge":
        return value in HUGE
    if name == "mode":
        return 0 < len(value) <= 4 and all(c in "01234567" for c in value)
    if name in ("uid", "gid"):
        return 0 < len(value) <= 10 and value.isascii() and value.isdigit()
    number = value[:-1] if value[-1:] in _SIZE_SUFFIXES or (name == "size" and value.endswith("%")) else value
    return 0 < len(number) <= 18 and number.isascii() and number.isdigit()


def _flags_help() -> str:
    return ("FLAGS are joined with '+': ro, rw, [no]suid, [no]dev, [no]exec, [r]private, [r]slave, [r]shared, "
            "[r]unbindable, [r]bind, x-create=auto|dir|file; a tmpfs also size=, nr_blocks=, nr_inodes=, mode=, "
            "uid=, gid=, huge=")


def _mount(item: str, source: str, target: str, flags: list[str]) -> Mount:
    """One parsed entry: its flags checked for its kind (pyxis passes them to enroot unchecked)."""
    kind = source if source in ("tmpfs", "umount") else "bind"
    extra: list[str] = []
    options: dict[str, str] = {}
    create = "dir" if kind == "tmpfs" else "auto"
    readonly = False
    for flag in flags:
        name, eq, value = flag.partition("=")
        if flag in ("ro", "rw"):
            readonly = readonly or flag == "ro"
        elif flag in MOUNT_FLAGS:
            extra.append(flag)
        elif flag in BIND_ONLY and kind != "tmpfs":
            pass                        # recursive either way, as pyxis's binds are
        elif name == "x-create" and value in (CREATE if kind != "tmpfs" else ("dir",)):
            create = value
        elif kind == "tmpfs" and eq and name in TMPFS_OPTIONS:
            if not _tmpfs_value_ok(name, value):
                raise LaunchError(f"--container-mounts: {item!r}: {flag!r} is not a value tmpfs takes"
                                  + (f" (huge= is one of {', '.join(HUGE)})" if name == "huge" else ""))
            if name in options and options[name] != value:
                raise LaunchError(f"--container-mounts: {item!r} gives {name}= twice")
            options[name] = value
        else:
            raise LaunchError(f"--container-mounts: {item!r}: unknown flag {flag!r}"
                              f"{' for a tmpfs' if kind == 'tmpfs' else ''} ({_flags_help()})")
    given = set(flags)
    for a, b in _OPPOSITE:
        if a in given and b in given:
            raise LaunchError(f"--container-mounts: {item!r} asks for both {a} and {b}")
    propagation = list(dict.fromkeys(f for f in extra if f in PROPAGATION))
    if len(propagation) > 1:
        raise LaunchError(f"--container-mounts: {item!r} asks for {' and '.join(propagation)}: give one propagation "
                          f"(podman takes one; enroot would apply them in its own order, not yours)")
    if kind == "umount":              # flags change nothing in an unmount (pyxis hands them to enroot, which ignores them)
        return Mount("umount", target)
    return Mount(source, target, readonly, tuple(dict.fromkeys(extra)),
                 tuple(f"{k}={v}" for k, v in options.items()), create)


def parse_mounts(text: str | None) -> tuple[Mount, ...]:
    """``--container-mounts`` (pyxis 0.24's grammar, see MOUNT_FLAGS) into mounts; a clear error
    otherwise. A relative source stays relative here (see resolve_sources: only the launcher, as
    the user on the node, resolves it); a target becomes absolute (relative: to the root)."""
    mounts = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        source, colon, rest = item.partition(":")
        target, _, flagtext = rest.partition(":") if colon else (source, "", "")
        if not source or not target:
            raise LaunchError(f"--container-mounts: {item!r} is not SRC, SRC:DST or SRC:DST:FLAGS")
        if not (source.startswith(("/", ".")) or source in ("tmpfs", "umount")):
            raise LaunchError(f"--container-mounts: {item!r}: the source must be {MOUNT_SOURCES}"
                              + (f" (./{source} for a path relative to the working directory)"
                                 if "/" in source or source[:1].isalnum() else ""))
        if not target.startswith(("/", ".")):
            raise LaunchError(f"--container-mounts: {item!r}: the target must be an absolute path or a path "
                              f"relative to the container's root starting with '.' (./{target})")
        dst = container_path(target, "--container-mounts target")
        own = reserved_target(dst)
        if own == dst:
            raise LaunchError(f"--container-mounts: {dst} is tether's own mount point ({RESERVED[own]}); mount "
                              f"somewhere else")
        if own:
            raise LaunchError(f"--container-mounts: {dst} holds tether's own mount point {own} ({RESERVED[own]}), "
                              f"which a mount there would hide; mount somewhere else")
        # empty flags (SRC:DST:, ro+) are nothing, as enroot skips empty options
        mounts.append(_mount(item, source, dst, [f for f in flagtext.split("+") if f]))
    return tuple(mounts)


def resolve_image(image: str, cwd: str | None = None) -> str:
    """A relative local image (``./ubuntu.sqsh``, pyxis's) as an absolute path: against the
    working directory, the step's on the node, by the launcher only (the user: whatever it
    follows, the user could). Refused in a working directory others can write, as a relative
    mount source is (another user may have put ./ubuntu.sqsh there first)."""
    return resolve_relative(image, f"--container-image={image}", "image", cwd)


def resolve_relative(path: str, what: str, kind: str, cwd: str | None = None) -> str:
    """``path`` against the working directory (``cwd``, else this process's), symlinks followed;
    a LaunchError starting with ``what`` when that directory is gone, or -- for a relative
    ``path`` -- is one others can write (slurmstepd starts a step in /tmp when it cannot enter the
    job's directory on the node, and there another user may have made the file first)."""
    try:
        base = cwd or os.getcwd()
        shared = not path.startswith("/") and os.stat(base).st_mode & 0o002
    except OSError as exc:
        raise LaunchError(f"{what}: the working directory is gone ({exc.strerror}); give an absolute "
                          f"{'path' if kind == 'image' else 'source'}") from None
    if shared:
        raise LaunchError(f"{what}: a relative {kind} in {base}, a directory others can write (did the step start "
                          f"there because the job's directory is missing on this node?), is refused: give an "
                          f"absolute path")
    return os.path.realpath(os.path.join(base, path))


def resolve_sources(mounts: Sequence[Mount], cwd: str | None = None, runtime: str = "") -> tuple[Mount, ...]:
    """Bind sources as absolute paths: a relative one (``./data``, ``../x``) against the working
    directory -- the step's, on the node, as pyxis's enroot resolves it --, one with '.' or '..'
    in it as the kernel would (symlinks followed). Run by the launcher only: it is the user, so
    whatever it follows, the user could; never at submit (slurmctld is root). Refused: a relative
    source in a working directory others can write (slurmstepd starts a step in /tmp when it
    cannot enter the job's directory on the node, and there another user may have made ./data
    first), and, for a runtime whose mount syntax splits on them (all but enroot), a resolved
    source holding ':' or ','."""
    out = []
    for mount in mounts:
        source = mount.source
        if mount.kind == "bind" and (not source.startswith("/") or any(
                p in (".", "..") for p in source.split("/"))):
            source = resolve_relative(source, f"--container-mounts: {source}", "source", cwd)
            if runtime != "enroot" and (":" in source or "," in source):
                raise LaunchError(f"--container-mounts: {mount.source} resolves to {source}, whose ':' or ',' "
                                  f"{runtime or 'the runtime'} would read as a separator: give another path")
            mount = Mount(source, mount.target, mount.readonly, mount.flags, mount.options, mount.create)
        out.append(mount)
    return tuple(out)


def effective_mounts(mounts: Sequence[Mount], runtime: str) -> tuple[Mount, ...]:
    """What a runtime that cannot stack mounts (podman: one mount per target; Apptainer likewise)
    mounts: a later entry at a target replaces an earlier one (it would hide it), and
    ``umount:DST`` takes away what an earlier entry -- the admin's, --container-mount-home's or
    the user's -- put there. An unmount of anything else is refused: the runtime's own mounts
    (/proc, /dev, /etc/hosts) stay, where enroot would unmount any."""
    out: dict[str, Mount] = {}
    for mount in mounts:
        if mount.kind == "umount":
            if out.pop(mount.target, None) is None:
                raise LaunchError(f"--container-mounts: umount:{mount.target}: nothing is mounted there by your "
                                  f"options, the home mount or the admin's container.mounts; with {runtime} "
                                  f"tether unmounts only those (the runtime's own, such as /proc, /dev and "
                                  f"/etc/hosts, stay; pyxis's enroot unmounts any)")
            continue
        out.pop(mount.target, None)
        out[mount.target] = mount
    return tuple(out.values())


def mount_refusal(mounts: Sequence[Mount], runtime: str) -> str | None:
    """Why ``runtime`` cannot do one of ``mounts`` as asked (a message), or None: checked at
    submit and again by the launcher."""
    for mount in mounts:
        if runtime in ("apptainer", "singularity") and mount.kind != "bind":
            return (f"--container-mounts: {mount.source}:{mount.target}: tether does no {mount.kind} mounts with "
                    f"{runtime} (podman and enroot do)")
        if runtime == "podman" and mount.kind == "tmpfs" and not podman_tmpfs(mount):
            propagation = [f for f in mount.flags if f in PROPAGATION]
            if propagation:
                return (f"--container-mounts: tmpfs:{mount.target}: podman mounts a tmpfs with options beyond size= "
                        f"and mode= as a volume, which takes no propagation flag ({propagation[0]}); a new tmpfs "
                        f"has nothing mounted below it to propagate: leave the flag out")
    return None


def podman_tmpfs(mount: Mount) -> bool:
    """Can podman's ``--tmpfs`` take this tmpfs's options (size= and mode= only)?"""
    return all(o.split("=", 1)[0] in PODMAN_TMPFS_OPTIONS for o in mount.options)


def check_mount_sources(mounts: Sequence[Mount], admin: Sequence[str] = ()) -> None:
    """Every mount's source exists on this node and the user can reach it (the launcher runs as
    the user): a clear error before the runtime starts, instead of the runtime's own after it did
    (podman 4.3: "Error: statfs SRC: no such file or directory", then once more on the retry it
    makes after a run that created no container). ``admin``: the config's ``container.mounts``,
    to name where a mount came from."""
    theirs = set(parse_mounts(",".join(admin))) if admin else set()
    for mount in mounts:
        if mount.kind != "bind":
            continue
        where = "container.mounts in tether's config" if mount in theirs else "--container-mounts"
        check_reachable(mount.source, f"{where}: {mount.source}", missing="source path does not exist on this node")


def check_save_target(path: str) -> None:
    """``--container-save``'s directory is on this node and the user may write there: found out
    before the workload runs, not once it has run (the container is saved after its command)."""
    parent = os.path.dirname(path) or "/"
    check_reachable(parent, f"--container-save={path}: its directory {parent}")
    if not os.path.isdir(parent):
        raise LaunchError(f"--container-save={path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise LaunchError(f"--container-save={path}: you cannot write in {parent} on this node")


def check_reachable(path: str, label: str, *, missing: str = "no such file or directory on this node") -> None:
    """``path`` exists on this node and this process (the user's) can reach it; a LaunchError
    starting with ``label`` that says which is not so (``missing``: the words for a path that is
    not there; a mount's are pyxis's)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        raise LaunchError(f"{label}: {missing}") from None
    except PermissionError:
        raise LaunchError(f"{label}: permission denied (you cannot reach it on this node: a directory on "
                          f"its path is not open to you)") from None
    except OSError as exc:
        raise LaunchError(f"{label}: {exc.strerror}") from None


# beside a --container-name container on a node: the step that made it (read for NAME:create)
NAMED_MADE_BY = "made-by"


def named_podman_home(spec: LaunchSpec) -> str:
    """Where podman's adapter unpacks the job's named container on this node (in the job's node
    directory: ``<node>/podman-named/<name>``; its ``config.json`` is there once complete)."""
    return os.path.join(os.path.dirname(os.path.dirname(spec.rank_dir or "")), "podman-named", spec.name or "")


def named_enroot_marker(spec: LaunchSpec) -> str:
    """Where enroot's adapter records which step made the job's named container on this node (in
    the job's node directory; enroot's own data path holds the container)."""
    return os.path.join(os.path.dirname(os.path.dirname(spec.rank_dir or "")), "enroot",
                        f"{NAMED_MADE_BY}-{spec.instance}")


def named_traces(spec: LaunchSpec) -> dict[str, str]:
    """Where each runtime leaves a job's named container's trace on this node (runtime -> path):
    podman's unpacked root's configuration, enroot's maker record."""
    if not spec.rank_dir or not spec.name:
        return {}
    return {"podman": os.path.join(named_podman_home(spec), "config.json"), "enroot": named_enroot_marker(spec)}


def no_named_container(spec: LaunchSpec) -> str:
    """The error for ``--container-name=NAME`` without an image when this node has no such container
    for the step's runtime; when an earlier step made one with another runtime, it says which."""
    name = spec.name
    other = next((runtime for runtime, path in named_traces(spec).items()
                  if runtime != spec.runtime and os.path.lexists(path)), None)
    if other:
        return (f"--container-name={name}: this job's container {name} on this node was made with {other}, and "
                f"this step runs {spec.runtime}: add --container-runtime={other} (a named container stays "
                f"with the runtime that made it)")
    return (f"--container-name={name}: this job has no container of that name on this node, and "
            f"--container-image is not set (a step with --container-image=IMAGE --container-name={name} "
            f"makes it)")


def named_exists(name: str) -> str:
    """The error for ``--container-name=NAME:create`` when the job has that container on this node."""
    return (f"--container-name={name}:create: this job already has a container of that name on this node "
            f"(an earlier step made it); without ':create' this step runs in it")


def read_regular(path: str, limit: int = 1 << 20) -> str | None:
    """The first ``limit`` bytes of ``path`` as text if it is a regular file, else None: never
    blocks on a FIFO or a device (opened non-blocking, checked before reading)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def made_by(marker: str) -> str | None:
    """The step a named container's marker says made it (``step-3``), or None: no marker, or not a
    regular file (never waits on a FIFO the user put there)."""
    text = read_regular(marker, 256)
    return text.strip() if text is not None else None


def refuse_existing(spec: LaunchSpec, exists: bool, marker: str | None) -> None:
    """``--container-name=NAME:create``: an error when the job's container NAME is on this node and
    another step made it (the step's other ranks find the one its first rank made: the marker,
    written before the container is complete, names this step). Without an image this step makes
    nothing: an existing one is refused too, as pyxis does."""
    step = os.path.basename(os.path.dirname(spec.rank_dir)) if spec.rank_dir else None
    if spec.name_create and exists and (not spec.image or step is None or marker is None or made_by(marker) != step):
        raise LaunchError(named_exists(spec.name or ""))


_EITHER_VARS = {name: (BY_NAME[f"container-{name}"].env, BY_NAME[f"no-container-{name}"].env)
                for name in ("mount-home", "remap-root", "entrypoint")}


def _either(env: Mapping[str, str], name: str, default: bool | None) -> bool | None:
    """A ``--container-NAME`` / ``--no-container-NAME`` pair: True, False, or ``default`` when
    neither is given; both is refused."""
    on_var, off_var = _EITHER_VARS[name]
    on, off = env.get(on_var), env.get(off_var)
    if on is None and off is None:              # the common case: neither given
        return default
    on = parse_flag(on, f"--container-{name}")
    off = parse_flag(off, f"--no-container-{name}")
    if on and off:
        raise LaunchError(f"--container-{name} and --no-container-{name} ask for opposite things: give one")
    return True if on else False if off else default


def save_path(value: str, cwd: str | None = None) -> str:
    """``--container-save=PATH`` as an absolute path (relative: to the working directory, as pyxis)."""
    if not value:
        raise LaunchError("--container-save: give the path of the file to save the container to")
    path = os.path.normpath(os.path.join(cwd or os.getcwd(), value))
    if path == "/" or value.endswith("/"):
        raise LaunchError(f"--container-save={value!r}: give a file's path, not a directory")
    return path


def parse_unshare(text: str) -> tuple[str, ...]:
    """``--container-unshare=NS[,NS...]`` as a tuple in UNSHARE_NAMESPACES' order (pyxis's words)."""
    if not text:
        return ()
    bad = unknown_namespace(text)
    if bad is not None:
        what = "empty namespace argument" if bad == "" else f"unknown namespace {bad[:40]!r}"
        raise LaunchError(f"--container-unshare={text[:60]}: {what} (expected namespaces separated by commas, "
                          f"of {', '.join(UNSHARE_NAMESPACES)})")
    return tuple(ns for ns in UNSHARE_NAMESPACES if ns in text.split(","))


def parse_env_names(text: str | None) -> tuple[str, ...]:
    names = tuple(n.strip() for n in (text or "").split(",") if n.strip())
    for n in names:
        if not is_env_name(n):
            raise LaunchError(f"--container-env: {n!r} is not a variable name")
    return names


def _container_options(env: Mapping[str, str], command: Sequence[str], default_runtime: str,
                       defaults: Mapping, resolve: bool, normalized: bool = False) -> dict:
    """spec_from_env's checks of the ``TETHER_CONTAINER_*`` options, in its order, and their values
    as LaunchSpec's fields (not the rank's: ids, GPUs). Alone at submit
    (check_container_options): what slurmctld's job_submit call runs per new request. With
    ``normalized`` (values surface.normalize accepted: at submit), the grammars it checked already
    -- the image reference, the container's name and flag, variable names -- are not checked again
    (``env_names`` is then the names as given)."""
    image = _text(env, "TETHER_CONTAINER_IMAGE", "--container-image")
    name, _, flag = env.get("TETHER_CONTAINER_NAME", "").strip().partition(":")
    name = name or None
    if flag and not normalized and flag not in CONTAINER_NAME_FLAGS:
        raise LaunchError(f"--container-name={name}:{flag}: FLAG is one of {', '.join(CONTAINER_NAME_FLAGS)}")
    if not image and not name:
        raise LaunchError("no container image: set --container-image (TETHER_CONTAINER_IMAGE)")
    if image:                 # none: --container-name alone, the job's container of that name (as pyxis)
        try:
            if not normalized:
                parse_image(image)
        except ImageRefError as exc:
            raise LaunchError(str(exc)) from None
        if resolve and not image.startswith("/") and image.startswith(LOCAL_PREFIXES):
            image = resolve_image(image)
    runtime = env.get("TETHER_CONTAINER_RUNTIME", "").strip() or default_runtime
    if runtime not in RUNTIMES:
        raise LaunchError(f"--container-runtime={runtime!r}: expected one of {', '.join(RUNTIMES)}")
    if not command:
        raise LaunchError("no command to run in the container")
    workdir = _text(env, "TETHER_CONTAINER_WORKDIR", "--container-workdir")
    # pyxis: chdir(DIR) inside the container, so a relative one is from the root; '..' stays there
    workdir = container_path(workdir, "--container-workdir", clamp=True) if workdir else CONTAINER_WORKDIR
    if name is not None and not normalized and not _is_name(name):
        raise LaunchError(f"--container-name={name!r}: letters, digits, '.', '_', '-' (at most 63)")
    writable = parse_flag(env.get("TETHER_CONTAINER_WRITABLE"), "--container-writable")
    readonly = parse_flag(env.get("TETHER_CONTAINER_READONLY"), "--container-readonly")
    if writable and readonly:
        raise LaunchError("--container-writable and --container-readonly ask for opposite things: give one "
                          "(without either, the admin's default: container.writable)")
    # None: neither asked nor set by the admin -- the runtime's own default (enroot: its config)
    writable = True if writable else False if readonly else defaults.get("writable")
    mount_home = _either(env, "mount-home", defaults.get("mount_home"))
    remap_root = _either(env, "remap-root", defaults.get("remap_root"))
    entrypoint = bool(_either(env, "entrypoint", bool(defaults.get("entrypoint"))))
    parse_flag(env.get("TETHER_CONTAINER_ENTRYPOINT_LOG"), "--container-entrypoint-log")   # accepted, see surface
    save = _text(env, "TETHER_CONTAINER_SAVE", "--container-save")
    save = save_path(save) if save else None       # relative: to the rank's working directory
    mounts = parse_mounts(_text(env, "TETHER_CONTAINER_MOUNTS", "--container-mounts"))
    if defaults.get("mounts"):       # the admin's, unless the user mounts something at the same target
        taken = {m.target for m in mounts if m.kind != "umount"}     # umount:DST unmounts theirs
        mounts = tuple(m for m in parse_mounts(",".join(defaults["mounts"])) if m.target not in taken) + mounts
    if resolve:
        mounts = resolve_sources(mounts, runtime=runtime)
    batch_script = None
    if env.get(BATCH_VAR) == "1":       # set by the SPANK plugin for a --container-batch script
        batch_script = command[0]      # (in slurmd's spool) runs from where it is mounted inside
        if not os.path.isabs(batch_script) or _path_bad(batch_script):
            raise LaunchError(f"--container-batch: cannot mount the batch script {batch_script[:200]!r}")
    return {"image": image, "runtime": runtime, "mounts": mounts, "workdir": workdir, "name": name,
            "flag": flag, "writable": writable, "mount_home": mount_home, "remap_root": remap_root,
            "entrypoint": entrypoint, "save": save, "batch_script": batch_script,
            "env_names": tuple(n for n in env.get("TETHER_CONTAINER_ENV", "").split(",") if n) if normalized else
            parse_env_names(_text(env, "TETHER_CONTAINER_ENV", "--container-env")),
            "unshare": parse_unshare(_text(env, "TETHER_CONTAINER_UNSHARE", "--container-unshare"))}


def spec_from_env(env: Mapping[str, str], command: Sequence[str], *, default_runtime: str,
                  defaults: Mapping | None = None, resolve: bool = True) -> LaunchSpec:
    """The launch spec from ``TETHER_CONTAINER_*`` and the rank environment (Slurm or PBS);
    ``defaults``: the config's ``container`` section (the admin's defaults: mounts, entrypoint,
    remap_root, mount_home). ``resolve``: relative mount sources against this process's working
    directory (the launcher's, the user's on the node; not at submit: see resolve_sources)."""
    options = _container_options(env, command, default_runtime, defaults or {}, resolve)
    flag, save = options.pop("flag"), options.pop("save")
    job = env.get("SLURM_JOB_ID") or env.get("PBS_JOBID", "0").split(".")[0] or "0"
    batch = options["batch_script"] is not None
    if batch:
        command = (CONTAINER_BATCH_SCRIPT, *command[1:])
    step = "batch" if batch else env.get("SLURM_STEP_ID") or env.get("PBS_TASKNUM") or "0"
    rank = env.get("RANK") or env.get("SLURM_PROCID") or "0"
    gpus = tuple(g for g in (env.get("TETHER_SLOT_IDS") or "").split(",") if g)
    return LaunchSpec(
        **options, command=tuple(command), name_create=flag == "create",
        name_attach={"": "auto", "auto": "auto", "exec": "exec"}.get(flag, "never"),
        rank_dir=env.get("TETHER_RANK_DIR") or None,
        job_id=_safe_id(job), step_id=_safe_id(step), rank=_safe_id(rank), gpus=gpus,
        slot_type=env.get("TETHER_JOB_SLOT_TYPE", "cuda") or "cuda",
        # one container per node is saved, as pyxis saves its one per node: the node's first rank's
        save=save if (env.get("LOCAL_RANK") or env.get("SLURM_LOCALID") or "0") == "0" else None)


def _safe_id(value: str) -> str:
    """Job/step/rank ids go into container names: keep them to name characters."""
    return "".join(c if c in _ALNUM or c in "_.-" else "_" for c in value)[:40] or "0"


def check_container_options(values: Mapping[str, str], default_runtime: str, *, normalized: bool = False,
                            plain_mounts: bool = False) -> None:
    """Validate the --container-* options of a job at submit time (option name -> value), with the
    messages the run side would give: a bad request fails at sbatch, not when its steps start.
    ``normalized``: the values are as surface.normalize accepted them (the grammars it checks are
    not checked again); ``plain_mounts``: its --container-mounts are plain bind mounts (the
    job_submit shim's C checked them: job_submit/request.c), which no runtime refuses -- not parsed
    again."""
    container = [name for name in values if name in BY_NAME and BY_NAME[name].is_container]
    if not container:
        return
    env = {BY_NAME[name].env: value for name, value in values.items() if name in BY_NAME}
    if parse_flag(values.get("container-batch"), "--container-batch") and \
            parse_flag(values.get("no-container-batch"), "--no-container-batch"):
        raise LaunchError("--container-batch and --no-container-batch ask for opposite things: give one (without "
                          "either, the admin's default: container.batch)")
    if "container-image" not in values:
        raise LaunchError("--container-* options need --container-image")
    if values["container-image"] == "":     # --container-image= : no container (a step on the host)
        if len(container) > 1:
            raise LaunchError("--container-* options need --container-image (it is empty: no container)")
        return
    # the run side's checks of the options, without a rank's spec (not per rank here: per request)
    if plain_mounts:
        env.pop("TETHER_CONTAINER_MOUNTS", None)
    spec = _container_options(env, ("true",), default_runtime, {"mount_home": None}, False, normalized)
    runtime = spec["runtime"]
    refusal = mount_refusal(spec["mounts"], runtime)
    if refusal:
        raise LaunchError(refusal)
    if spec["name"] and runtime not in ("enroot", "podman"):
        raise LaunchError(f"--container-name: {runtime} keeps no container between steps (enroot and "
                          f"podman do)")
    if spec["unshare"] and runtime in ("apptainer", "singularity"):
        raise LaunchError(f"--container-unshare: tether does not unshare namespaces with {runtime} yet "
                          f"(podman and enroot do)")
    if env.get("TETHER_CONTAINER_SAVE") and runtime in ("apptainer", "singularity"):
        raise LaunchError(f"--container-save: {runtime} keeps no container to save (it runs the image "
                          f"itself); use podman or enroot, or build a new image with `{runtime} build`")
