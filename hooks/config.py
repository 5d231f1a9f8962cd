"""tether's configuration: one YAML file, validated at load, every problem reported at once.

Where it is read from: ``--config FILE``, else ``$TETHER_CONFIG``, else ``/etc/tether/tether.yaml``;
a missing default file means built-in defaults (an explicitly named file must exist).

The schema below is the single reference: ``tether config show`` prints it filled in, and the
README's configuration table is checked against it by the tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

import yaml

from .errors import ConfigError, RequestError
from .policy import parse_qsub_args, parse_sbatch_args
from .request import SLOT_TYPES
from .schema import NAME_PATTERN, Bool, Enum, List, Map, SchemaError, Str, Struct, walk_keys

DEFAULT_CONFIG_PATH = "/etc/tether/tether.yaml"
CONFIG_ENV = "TETHER_CONFIG"
BUILTIN = "<built-in defaults>"

RUNTIMES = ("apptainer", "singularity", "podman", "enroot")
ON_FAILURE = ("reject_tether_jobs", "reject_all_jobs")
PROJECT_SOURCE_PATTERN = r"project|workspace|label(:[A-Za-z0-9_.-]+)?|account|user"
# Shared by root-run plugins and written into #SBATCH/#PBS lines: keep it to plain characters.
STORAGE_PATH_PATTERN = r"(?:/[A-Za-z0-9_-][A-Za-z0-9._-]*)+/?"
STORAGE_PATH_ACCEPTED = "an absolute path of letters, digits, '.', '_', '-' (no component starting with '.')"


def _check_sbatch_args(value: list, path: str, errors: list[SchemaError]) -> None:
    try:
        parse_sbatch_args([v for v in value if isinstance(v, str)])
    except RequestError as exc:
        errors.append(SchemaError(path, str(exc)))


def _check_override(value: dict, path: str, errors: list[SchemaError]) -> None:
    if value.get("sbatch_args"):
        _check_sbatch_args(value["sbatch_args"], f"{path}.sbatch_args", errors)
    if value.get("pbsbatch_args"):
        try:
            parse_qsub_args([v for v in value["pbsbatch_args"] if isinstance(v, str)])
        except RequestError as exc:
            errors.append(SchemaError(f"{path}.pbsbatch_args", str(exc)))


def _runtime(binary: str, doc: str) -> Struct:
    return Struct(doc=doc, fields={
        "binary": Str(default=binary, pattern=r"[^\s]+", accepted="a command name or path",
                      doc="the runtime's executable (looked up in PATH unless absolute)"),
        "args": List(item=Str(), default=[],
                     doc="extra arguments inserted after the subcommand (e.g. podman: --runtime, runc)"),
        "env": Map(value=Str(), key_pattern=r"[A-Za-z_][A-Za-z0-9_]*", key_doc="variable name", default={},
                   key_accepted="letters, digits and '_', not starting with a digit",
                   doc="variables set for the runtime process itself (e.g. podman: CONTAINERS_CONF); "
                       "they do not enter the container"),
    })


CONFIG_SCHEMA = Struct(doc="tether configuration", fields={
    # --- the seed's cluster configuration (seed 000, "Cluster Configuration") ---
    "slot_type": Enum(choices=SLOT_TYPES, default="cuda",
                      doc="default slot type for slot requests (a partition override or the user's "
                          "--slot-type wins)"),
    "tres_supported": Bool(default=True,
                           doc="Slurm has SelectType=select/cons_tres (enables --gpus/--gpus-per-task)"),
    "gres_supported": Bool(default=True,
                           doc="Slurm: GresTypes=gpu and GPU nodes have gres; PBS: the ngpus resource "
                               "identifies GPUs"),
    "default_aux_resource_pool": Str(pattern=NAME_PATTERN, nullable=True, accepted="a partition/queue name",
                                     doc="partition/queue for zero-slot (auxiliary) jobs; null: the "
                                         "scheduler's default"),
    "default_compute_resource_pool": Str(pattern=NAME_PATTERN, nullable=True,
                                         accepted="a partition/queue name",
                                         doc="partition/queue for jobs with slots; null: the "
                                             "scheduler's default"),
    "job_project_source": Str(pattern=PROJECT_SOURCE_PATTERN, nullable=True,
                              accepted="one of project, workspace, label, label:<prefix>, account, user",
                              doc="where the Slurm WCKey / PBS project comes from; null: none"),
    "job_storage_root": Str(default="/var/lib/tether/jobs", pattern=STORAGE_PATH_PATTERN,
                            accepted=STORAGE_PATH_ACCEPTED,
                                doc="cluster-wide directory for per-job files, logs and per-rank "
                                    "directories"),
    "partition_overrides": Map(
        key_doc="partition", default={},
        doc="per partition/queue settings, keyed by its name",
        value=Struct(doc="settings for one partition", extra_check=_check_override, fields={
            "slot_type": Enum(choices=SLOT_TYPES, nullable=True, doc="slot type of this partition"),
            "gpu_type": Str(pattern=NAME_PATTERN, nullable=True, accepted="a gres type name",
                            doc="GPU gres type used in this partition's --gpus/--gres"),
            "sbatch_args": List(item=Str(), default=[],
                                doc="sbatch options added to every tether job in this partition"),
            "pbsbatch_args": List(item=Str(), default=[],
                                  doc="qsub options added to every tether job in this queue"),
        })),
    # --- tether's own ---
    "container": Struct(doc="container runtime defaults", fields={
        "runtime": Enum(choices=RUNTIMES, default="apptainer",
                        doc="runtime used when a job names an image but no runtime"),
        "apptainer_image_root": Str(default="/var/cache/tether/images", pattern=STORAGE_PATH_PATTERN,
                                    accepted=STORAGE_PATH_ACCEPTED,
                                        doc="shared cache of converted Apptainer/Singularity images"),
        "apptainer": _runtime("apptainer", "Apptainer settings"),
        "singularity": _runtime("singularity", "Singularity settings"),
        "podman": _runtime("podman", "Podman settings"),
        "enroot": _runtime("enroot", "Enroot settings"),
    }),
    "plugin": Struct(doc="plugin behaviour", fields={
        "on_failure": Enum(choices=ON_FAILURE, default="reject_tether_jobs",
                           doc="when tether itself fails (bad config, internal error): reject only "
                               "jobs that ask for tether, or every job"),
    }),
})


@dataclass(frozen=True)
class PartitionOverride:
    """Settings for one partition/queue (``partition_overrides.<name>``)."""

    slot_type: str | None
    gpu_type: str | None
    sbatch_args: tuple[str, ...]
    pbsbatch_args: tuple[str, ...]


@dataclass(frozen=True)
class Config:
    """The validated, effective configuration. ``data`` is the full mapping with defaults."""

    source: str
    data: Mapping[str, Any]

    @property
    def slot_type(self) -> str:
        return self.data["slot_type"]

    @property
    def tres_supported(self) -> bool:
        return self.data["tres_supported"]

    @property
    def gres_supported(self) -> bool:
        return self.data["gres_supported"]

    @property
    def default_aux_resource_pool(self) -> str | None:
        return self.data["default_aux_resource_pool"]

    @property
    def default_compute_resource_pool(self) -> str | None:
        return self.data["default_compute_resource_pool"]

    @property
    def job_project_source(self) -> str | None:
        return self.data["job_project_source"]

    @property
    def job_storage_root(self) -> str:
        return self.data["job_storage_root"]

    def partition_override(self, name: str | None) -> PartitionOverride | None:
        """The override for partition/queue ``name``, if the config has one."""
        raw = self.data["partition_overrides"].get(name) if name else None
        if raw is None:
            return None
        return PartitionOverride(raw["slot_type"], raw["gpu_type"], tuple(raw["sbatch_args"]),
                                 tuple(raw["pbsbatch_args"]))

    def runtime(self, name: str) -> Mapping[str, Any]:
        return self.data["container"][name]

    def to_yaml(self) -> str:
        return yaml.safe_dump(plain_data(self.data), sort_keys=False, default_flow_style=False)


def plain_data(value: Any) -> Any:
    """Mappings and sequences of the config as plain dicts and lists (for YAML, JSON, repr)."""
    if isinstance(value, Mapping):
        return {k: plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    return value


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    out: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(None, None, "unhashable key", key_node.start_mark)
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML strictly; a syntax error becomes a ConfigError naming file, line and column."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [f"{where}invalid YAML: {problem}"]) from None


def validate_config(data: Any, source: str) -> Config:
    """Validate a parsed document; raises ConfigError listing every problem."""
    errors: list[SchemaError] = []
    if data is None:
        data = {}
    normalized = CONFIG_SCHEMA.check(data, "", errors)
    if errors:
        raise ConfigError(source, errors)
    return Config(source, normalized)


def default_config() -> Config:
    """The built-in defaults (what a missing /etc/tether/tether.yaml means)."""
    return validate_config({}, BUILTIN)


def config_path(explicit: str | None = None, env: Mapping[str, str] | None = None) -> tuple[str, bool]:
    """Which file to read, and whether it must exist (explicit file or $TETHER_CONFIG)."""
    env = os.environ if env is None else env
    if explicit:
        return explicit, True
    if env.get(CONFIG_ENV):
        return env[CONFIG_ENV], True
    return DEFAULT_CONFIG_PATH, False


def load_config(explicit: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Load and validate the configuration (see the module docstring for the search order)."""
    path, required = config_path(explicit, env)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        if required:
            raise ConfigError(path, ["file not found"]) from None
        return default_config()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, [f"cannot read: {exc}"]) from None
    return validate_config(load_yaml(text, path), path)


def config_reference() -> str:
    """The configuration reference as a Markdown table (kept in the README, checked by the tests)."""
    rows = ["| key | accepted | default | meaning |", "|---|---|---|---|"]
    for path, node in walk_keys(CONFIG_SCHEMA):
        if isinstance(node, Struct):
            continue
        default = node.fill_default()
        shown = "—" if isinstance(node, Map) else f"`{yaml.safe_dump(default, default_flow_style=True).strip().removesuffix('...').strip()}`"
        rows.append(f"| `{path}` | {node.describe()} | {shown} | {node.doc} |")
    return "\n".join(rows) + "\n"
