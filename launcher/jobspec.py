"""The launcher's job spec: a tether job spec (tether.hooks.request) plus what the job runs.

::

    user: alice                 # whose job it is: a member of launcher.users_group (never root, nor the service)
    job_type: exp               # exp, cmd, gc, ... (docs/requirements.md's job types)
    slots_per_trial: 6
    slurm: {slots_per_node: 2, sbatch_args: [--time=10]}
    image: nvcr.io#nvidia/pytorch:24.01-py3     # optional: one container per node
    runtime: podman                             # optional
    container: {mounts: /data:/data:ro, writable: true}   # any --container-* option, without the prefix
    command: [python, train.py]
    environment: {WANDB_MODE: offline}
    files: {train.py: "print('hi')\\n"}        # staged into the job's tree (files/), the job's working directory

Everything is checked before anything is written; every problem is reported at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..hooks.errors import RequestError
from ..hooks.request import JOB_SPEC_SCHEMA, Request, request_from_spec
from ..hooks.schema import NAME_PATTERN, List, Map, SchemaError, Str, Struct
from ..hooks.surface import BY_NAME, CONTAINER_OPTIONS, RUNTIMES

MAX_FILES = 256
MAX_FILE_BYTES = 16 << 20            # all staged files together
FILE_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}(/[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}){0,7}"
ENV_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]{0,127}"
USER_PATTERN = r"[a-z_][a-z0-9_-]{0,31}\$?"

# --container-* options a spec may set under `container:` (image and runtime have keys of their own)
CONTAINER_KEYS = {opt.name[len("container-"):]: opt for opt in CONTAINER_OPTIONS
                  if opt.name.startswith("container-") and opt.name not in ("container-image", "container-runtime")}
CONTAINER_KEYS.update({opt.name: opt for opt in CONTAINER_OPTIONS if opt.name.startswith("no-container-")})

LAUNCH_SPEC_SCHEMA = Struct(doc="a launcher job spec", fields={
    **JOB_SPEC_SCHEMA.fields,
    "user": Str(pattern=USER_PATTERN, accepted="a user name", doc="the user the job runs as"),
    "image": Str(nullable=True, doc="container image: one container per node (absent: the command on the host)"),
    "runtime": Str(nullable=True, pattern="|".join(RUNTIMES), accepted="one of " + ", ".join(RUNTIMES),
                   doc="container runtime (default: the config's)"),
    "container": Map(value=Str(), default={}, key_pattern="|".join(sorted(CONTAINER_KEYS)),
                     key_doc="option", key_accepted="a --container-* option without the prefix "
                     f"({', '.join(sorted(CONTAINER_KEYS))})",
                     doc="--container-* options (flags: true or false)"),
    "command": List(item=Str(), doc="the command and its arguments"),
    "environment": Map(value=Str(), default={}, key_pattern=ENV_NAME_PATTERN, key_doc="variable name",
                       key_accepted="letters, digits and '_', not starting with a digit",
                       doc="variables set for the job"),
    "files": Map(value=Str(), default={}, key_pattern=FILE_PATTERN, key_doc="relative path",
                 key_accepted="a relative path of letters, digits, '.', '_', '-' (no '..', no leading '.')",
                 doc="files staged into the job's tree (its working directory)"),
})


@dataclass(frozen=True)
class LaunchSpec:
    """A checked launcher job spec."""

    user: str
    request: Request
    command: tuple[str, ...]
    image: str | None
    container: Mapping[str, str]      # --container-* option name -> value ("1" for a flag)
    environment: Mapping[str, str]
    files: Mapping[str, str]
    raw: Mapping[str, Any]


def _flag_or_text(opt, value: Any) -> str | None:
    if opt.kind == "flag":
        return {"true": "1", "false": None, "1": "1", "0": None, "yes": "1", "no": None}.get(str(value).lower(), "?")
    return str(value)


# Scheduler options a submission by the service may not carry: they make sbatch/qsub wait for the
# job's end (the service's worker waits with it: a few such requests would stall every user's), run
# nothing (a test, help) or take the script's place.
SERVICE_REFUSED_SBATCH = {"--wait": "makes sbatch wait for the job's end", "--test-only": "submits nothing",
                          "--wrap": "replaces the job's script", "--help": "submits nothing",
                          "--usage": "submits nothing", "--version": "submits nothing"}
SERVICE_REFUSED_QSUB = {"-I": "is an interactive job", "-z": "hides the job's id"}


def _refuse_blocking(request, source: str) -> None:
    said = [f"{a.given} {SERVICE_REFUSED_SBATCH[a.name]}" for a in request.sbatch_args if a.name in SERVICE_REFUSED_SBATCH]
    for arg in request.qsub.args:
        if arg.name in SERVICE_REFUSED_QSUB:
            said.append(f"{arg.given} {SERVICE_REFUSED_QSUB[arg.name]}")
        elif arg.name == "-W" and any(part.strip().lower().startswith("block=") for part in (arg.value or "").split(",")):
            said.append(f"-W {arg.value} makes qsub wait for the job's end")
    if said:
        raise RequestError(f"{source}: " + "; ".join(said) + ": the launcher submits and returns (follow the "
                           f"job with tether status --wait)")


def parse_launch_spec(data: Any, scheduler: str, source: str = "job spec") -> LaunchSpec:
    """Check ``data`` (a mapping from YAML or JSON) as a launcher job spec for ``scheduler``."""
    if isinstance(data, Mapping) and isinstance(data.get("container"), Mapping):
        # YAML gives booleans for flags: the schema wants text
        data = {**data, "container": {k: ("true" if v is True else "false" if v is False else v)
                                      for k, v in data["container"].items()}}
    errors: list[SchemaError] = []
    doc = LAUNCH_SPEC_SCHEMA.check({} if data is None else data, "", errors)
    if not errors:
        if not doc.get("user"):
            errors.append(SchemaError("user", "is required"))
        if not doc.get("command"):
            errors.append(SchemaError("command", "is required: the command and its arguments"))
        elif any(not word or "\0" in word for word in doc["command"]):
            errors.append(SchemaError("command", "has an empty word or a NUL byte"))
        if doc.get("container") and not doc.get("image"):
            errors.append(SchemaError("container", "options need an image"))
        if len(doc.get("files") or {}) > MAX_FILES:
            errors.append(SchemaError("files", f"at most {MAX_FILES} files"))
        if sum(len(v.encode()) for v in (doc.get("files") or {}).values()) > MAX_FILE_BYTES:
            errors.append(SchemaError("files", f"at most {MAX_FILE_BYTES >> 20} MiB together"))
        for path in doc.get("files") or {}:
            if any(part in (".", "..") or part.startswith(".") for part in path.split("/")):
                errors.append(SchemaError(f"files.{path}", "no '.', '..' or hidden path components"))
    if errors:
        raise RequestError("\n".join(f"{source}: {e}" for e in errors))
    job_keys = {k: v for k, v in doc.items() if k in JOB_SPEC_SCHEMA.fields}
    request = request_from_spec(job_keys, scheduler, source)
    _refuse_blocking(request, source)
    container: dict[str, str] = {}
    if doc.get("image"):
        container["container-image"] = doc["image"]
        if doc.get("runtime"):
            container["container-runtime"] = doc["runtime"]
        for key, value in (doc.get("container") or {}).items():
            opt = CONTAINER_KEYS[key]
            text = _flag_or_text(opt, value)
            if text == "?":
                raise RequestError(f"{source}: container.{key}: expected true or false")
            if text is not None:
                container[opt.name] = text
    return LaunchSpec(user=doc["user"], request=request, command=tuple(doc["command"]), image=doc.get("image"),
                      container=container, environment=dict(doc.get("environment") or {}),
                      files=dict(doc.get("files") or {}), raw=doc)


__all__ = ["LaunchSpec", "parse_launch_spec", "LAUNCH_SPEC_SCHEMA", "CONTAINER_KEYS", "BY_NAME", "NAME_PATTERN"]
