"""The launch spec: everything a runtime adapter needs to start one rank's (or one node's) container.

It is built from the same ``TETHER_CONTAINER_*`` variables the SPANK plugin sets in each task (and
that ``qsub -v`` / ``tether run`` options provide), plus the rank environment and the per-rank
directories. Only the standard library is imported here: this runs once per rank.
"""

from __future__ import annotations

import os

from ..hooks.imageref import ImageRefError, parse_image
from ..hooks.surface import BY_NAME, MAX_TEXT, RUNTIMES

TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

if TYPE_CHECKING:
    from typing import Mapping, Sequence

# Where the per-rank directories appear inside every container, whatever the runtime.
CONTAINER_TMP = "/tmp"
CONTAINER_WORKDIR = "/run/tether/workdir"

# Plain string checks, not regular expressions: this runs once per rank, and `re` costs milliseconds.
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def is_env_name(name: str) -> bool:
    """[A-Za-z_][A-Za-z0-9_]*"""
    return bool(name) and not name[0].isdigit() and all(c in _ALNUM or c == "_" for c in name)


def _is_name(name: str) -> bool:
    """[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"""
    return 0 < len(name) <= 63 and name[0] in _ALNUM and all(c in _ALNUM or c in "_.-" for c in name)


def _path_bad(value: str) -> bool:
    return any(c in " ,:" or ord(c) < 32 or ord(c) == 127 or c.isspace() for c in value)


def _control(value: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in value)


# A flag's values, as the SPANK plugin accepts them (spank/options.c): anything else is refused.
FLAG_VALUES = {"": True, "1": True, "true": True, "yes": True, "on": True,
               "0": False, "false": False, "no": False, "off": False}


def parse_flag(value: str | None, what: str) -> bool:
    if value is None:
        return False
    if value not in FLAG_VALUES:
        raise LaunchError(f"{what}={value[:40]!r}: expected 1/0, true/false or yes/no")
    return FLAG_VALUES[value]


def _text(env: Mapping[str, str], name: str, what: str) -> str:
    """A TETHER_CONTAINER_* value: one line of printable text, at most MAX_TEXT bytes."""
    value = env.get(name, "")
    if len(value.encode("utf-8", "surrogateescape")) > MAX_TEXT or _control(value):
        raise LaunchError(f"{what}: expected printable text of at most {MAX_TEXT} characters")
    return value.strip()


class LaunchError(Exception):
    """A launch tether cannot perform; ``str()`` is the message for the user."""


class Record:
    """A small value class: keyword fields with defaults (``FIELDS``), equality and repr by value.
    Not a dataclass: `dataclasses` imports `inspect`, several milliseconds per rank."""

    FIELDS: dict = {}
    __slots__ = ()

    def __init__(self, *args, **kw):
        names = list(self.FIELDS)
        values = dict(self.FIELDS)
        values.update(zip(names, args))
        for key, value in kw.items():
            if key not in values:
                raise TypeError(f"{type(self).__name__} has no field {key!r}")
            values[key] = value
        for key in names:
            object.__setattr__(self, key, values[key])

    def _values(self) -> tuple:
        return tuple(getattr(self, k) for k in self.FIELDS)

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other._values() == self._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.FIELDS)})"


class Mount(Record):
    """A bind mount from the host into the container."""

    FIELDS = {"source": "", "target": "", "readonly": False}
    __slots__ = tuple(FIELDS)
    source: str
    target: str
    readonly: bool

    def __str__(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.readonly else "")


class LaunchSpec(Record):
    """One container launch (see the module docstring)."""

    FIELDS = {
        "image": "", "runtime": "", "command": (),
        "mounts": (),
        "workdir": CONTAINER_WORKDIR,
        "env_names": (),          # --container-env: host variables that win over the image's
        "writable": False,
        "name": None,             # --container-name: one container reused by the job's steps
        "rank_dir": None,         # host path holding the rank's tmp/ and work/
        "job_id": "0", "step_id": "0", "rank": "0",
        "gpus": (),               # the rank's GPU ids as the resource manager bound them
        "slot_type": "cuda",
        "mount_home": None,       # --[no-]container-mount-home; None: the runtime's own default
    }
    __slots__ = tuple(FIELDS)
    image: str
    runtime: str
    command: tuple[str, ...]
    mounts: tuple[Mount, ...]
    workdir: str
    env_names: tuple[str, ...]
    writable: bool
    name: str | None
    rank_dir: str | None
    job_id: str
    step_id: str
    rank: str
    gpus: tuple[str, ...]
    slot_type: str
    mount_home: bool | None

    @property
    def instance(self) -> str:
        """A container name unique to this launch: tether-<job>-<step>-<rank> (or the job's name)."""
        if self.name:
            return f"tether-{self.job_id}-{self.name}"
        return f"tether-{self.job_id}-{self.step_id}-{self.rank}"

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


def parse_mounts(text: str | None) -> tuple[Mount, ...]:
    """``SRC:DST[:ro|rw],...`` (the --container-mounts syntax) into mounts; a clear error otherwise."""
    mounts = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split(":")
        if len(parts) == 1:
            parts = [parts[0], parts[0]]
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise LaunchError(f"--container-mounts: {item!r} is not SRC:DST, SRC:DST:ro or SRC:DST:rw")
        src = _check_path(parts[0], "--container-mounts source")
        dst = _check_path(parts[1], "--container-mounts target")
        if dst in ("/", CONTAINER_TMP, CONTAINER_WORKDIR):
            raise LaunchError(f"--container-mounts: {dst} is tether's own mount point (the root, the "
                              f"rank's /tmp or work directory); mount somewhere else")
        mounts.append(Mount(src, dst, len(parts) == 3 and parts[2] == "ro"))
    return tuple(mounts)


def parse_env_names(text: str | None) -> tuple[str, ...]:
    names = tuple(n.strip() for n in (text or "").split(",") if n.strip())
    for n in names:
        if not is_env_name(n):
            raise LaunchError(f"--container-env: {n!r} is not a variable name")
    return names


def spec_from_env(env: Mapping[str, str], command: Sequence[str], *, default_runtime: str) -> LaunchSpec:
    """The launch spec from ``TETHER_CONTAINER_*`` and the rank environment (Slurm or PBS)."""
    image = _text(env, "TETHER_CONTAINER_IMAGE", "--container-image")
    if not image:
        raise LaunchError("no container image: set --container-image (TETHER_CONTAINER_IMAGE)")
    try:
        parse_image(image)
    except ImageRefError as exc:
        raise LaunchError(str(exc)) from None
    runtime = env.get("TETHER_CONTAINER_RUNTIME", "").strip() or default_runtime
    if runtime not in RUNTIMES:
        raise LaunchError(f"--container-runtime={runtime!r}: expected one of {', '.join(RUNTIMES)}")
    if not command:
        raise LaunchError("no command to run in the container")
    workdir = _text(env, "TETHER_CONTAINER_WORKDIR", "--container-workdir")
    workdir = _check_path(workdir, "--container-workdir") if workdir else CONTAINER_WORKDIR
    name = env.get("TETHER_CONTAINER_NAME", "").strip() or None
    if name is not None and not _is_name(name):
        raise LaunchError(f"--container-name={name!r}: letters, digits, '.', '_', '-' (at most 63)")
    writable = parse_flag(env.get("TETHER_CONTAINER_WRITABLE"), "--container-writable")
    if writable and parse_flag(env.get("TETHER_CONTAINER_READONLY"), "--container-readonly"):
        raise LaunchError("--container-writable and --container-readonly ask for opposite things: give one "
                          "(read-only is the default)")
    mount_home = parse_flag(env.get("TETHER_CONTAINER_MOUNT_HOME"), "--container-mount-home") or None
    if parse_flag(env.get("TETHER_NO_CONTAINER_MOUNT_HOME"), "--no-container-mount-home"):
        if mount_home:
            raise LaunchError("--container-mount-home and --no-container-mount-home ask for opposite things: "
                              "give one")
        mount_home = False
    job = env.get("SLURM_JOB_ID") or env.get("PBS_JOBID", "0").split(".")[0] or "0"
    step = env.get("SLURM_STEP_ID") or env.get("PBS_TASKNUM") or "0"
    rank = env.get("RANK") or env.get("SLURM_PROCID") or "0"
    gpus = tuple(g for g in (env.get("TETHER_SLOT_IDS") or "").split(",") if g)
    return LaunchSpec(
        image=image, runtime=runtime, command=tuple(command),
        mounts=parse_mounts(_text(env, "TETHER_CONTAINER_MOUNTS", "--container-mounts")), workdir=workdir,
        env_names=parse_env_names(_text(env, "TETHER_CONTAINER_ENV", "--container-env")), writable=writable,
        name=name,
        rank_dir=env.get("TETHER_RANK_DIR") or None,
        job_id=_safe_id(job), step_id=_safe_id(step), rank=_safe_id(rank), gpus=gpus,
        slot_type=env.get("TETHER_JOB_SLOT_TYPE", "cuda") or "cuda", mount_home=mount_home)


def _safe_id(value: str) -> str:
    """Job/step/rank ids go into container names: keep them to name characters."""
    return "".join(c if c in _ALNUM or c in "_.-" else "_" for c in value)[:40] or "0"


def check_container_options(values: Mapping[str, str], default_runtime: str) -> None:
    """Validate the --container-* options of a job at submit time (option name -> value), with the
    messages the run side would give: a bad request fails at sbatch, not when its steps start."""
    container = [name for name in values if name in BY_NAME and BY_NAME[name].is_container]
    if not container:
        return
    env = {BY_NAME[name].env: value for name, value in values.items() if name in BY_NAME}
    if "container-image" not in values:
        raise LaunchError("--container-* options need --container-image")
    if values["container-image"] == "":     # --container-image= : no container (a step on the host)
        if len(container) > 1:
            raise LaunchError("--container-* options need --container-image (it is empty: no container)")
        return
    spec = spec_from_env(env, ["true"], default_runtime=default_runtime)
    if spec.name and spec.runtime != "enroot":
        raise LaunchError(f"--container-name is supported with --container-runtime=enroot only, not "
                          f"{spec.runtime}")
