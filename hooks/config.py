"""tether's configuration: the schema, validation (every problem reported at once) and ``Config``.

Reading the YAML file is tether.hooks.configfile's; this module imports no YAML parser, because
the PBS hooks use it inside pbs_server's interpreter, which PBS finalizes and starts again (pyyaml's
C extension breaks there: see tether.pbs_hooks). They get the validated config as JSON data.

The schema below is the single reference: ``tether config show`` prints it filled in, and the
README's configuration table is checked against it by the tests.
"""

from __future__ import annotations

from collections.abc import Mapping

from .errors import ConfigError, RequestError
from .layout import USER_STORE_ROOT, user_dir_bases
from .policy import Arg, PbsUserRequest, parse_qsub_args, parse_sbatch_args, split_qsub_args
from .records import dataclass, field
from .schema import NAME_PATTERN, Bool, Enum, Int, List, Map, SchemaError, Str, Struct, walk_keys
from .surface import RUNTIMES, SLOT_TYPES

TYPE_CHECKING = False  # not `typing`: slurmctld's interpreter imports this module (the job_submit handler)

if TYPE_CHECKING:
    from typing import Any

BUILTIN = "<built-in defaults>"

ON_FAILURE = ("reject_tether_jobs", "reject_all_jobs")
PROJECT_SOURCE_PATTERN = r"project|workspace|label(:[A-Za-z0-9_.-]+)?|account|user"
# Shared by root-run plugins and written into #SBATCH/#PBS lines: keep it to plain characters.
STORAGE_PATH_PATTERN = r"(?:/[A-Za-z0-9_-][A-Za-z0-9._-]*)+/?"
STORAGE_PATH_ACCEPTED = "an absolute path of letters, digits, '.', '_', '-' (no component starting with '.')"
USER_CACHE_PATTERN = r"(?:\{home\})?(?:/(?:[A-Za-z0-9_.-]|\{uid\})+)+/?"
# container.mounts: what --container-mounts takes for one mount (tether.container.spec.parse_mounts)
_MOUNT_FLAG = r"(?:ro|rw|(?:no)?suid|(?:no)?dev|(?:no)?exec|r?private|r?slave|r?shared|r?unbindable|r?bind)"
MOUNT_PATTERN = rf"/[^,:\s]*(?::/[^,:\s]*(?::{_MOUNT_FLAG}(?:\+{_MOUNT_FLAG})*)?)?"
# a per-user directory on each node: absolute, {uid} in it (one per user), or empty
PODMAN_STORE_PATTERN = r"|(?:/(?:[A-Za-z0-9_.-]|\{uid\})+)*/(?:[A-Za-z0-9_.-]*\{uid\}[A-Za-z0-9_.-]*)(?:/[A-Za-z0-9_.-]+)*/?"


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


def _runtime(binary: str, doc: str, binary_note: str = "", **extra) -> Struct:
    return Struct(doc=doc, fields={
        "binary": Str(default=binary, pattern=r"[^\s]+", accepted="a command name or path",
                      doc="the runtime's executable (looked up in PATH unless absolute)" + binary_note),
        "args": List(item=Str(), default=[],
                     doc="extra arguments inserted after the subcommand (e.g. podman: --runtime, runc)"),
        "env": Map(value=Str(), key_pattern=r"[A-Za-z_][A-Za-z0-9_]*", key_doc="variable name", default={},
                   key_accepted="letters, digits and '_', not starting with a digit",
                   doc="variables set for the runtime process itself (e.g. podman: CONTAINERS_CONF); "
                       "they do not enter the container"),
        **extra,
    })



def _check_gateways(value: dict, path: str, errors: list[SchemaError]) -> None:
    """A gateway partition needs a daemon to start there."""
    if value.get("partition") and not value.get("daemon"):
        errors.append(SchemaError(f"{path}.daemon" if path else "daemon",
                                  "must name the gateway daemon's command when gateways.partition is set"))

CONFIG_SCHEMA = Struct(doc="tether configuration", fields={
    # --- the cluster configuration (docs/requirements.md, "Cluster configuration") ---
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
                                    doc="shared cache of converted Apptainer/Singularity images: filled by "
                                        "root (tether images pull), used by everyone"),
        "environment": Enum(choices=("inherit", "allowlist"), default="inherit",
                            doc="which of the job's variables enter a container: inherit = all but the "
                                "few where the image must win (PATH, LD_*, HOME, PYTHONHOME/PYTHONPATH, "
                                "the runtimes' own), as pyxis and Apptainer users expect; allowlist = only "
                                "the rank's, the resource manager's, MPI/GPU and locale variables and the "
                                "names in --container-env (stricter: nothing the image did not ask for leaks "
                                "in, but users must name every other variable they need)"),
        "user_image_cache": Str(default="{home}/.cache/tether/images", pattern=USER_CACHE_PATTERN,
                                accepted="an absolute path, or one starting with {home}; {uid} is the user's id",
                                doc="where a user's own image conversions go (only that user writes and "
                                    "uses them)"),
        "mounts": List(item=Str(pattern=MOUNT_PATTERN, accepted="SRC[:DST[:FLAGS]] with absolute paths and FLAGS "
                                "joined with '+' (ro, rw, [no]suid, [no]dev, [no]exec, [r]private, [r]slave, [r]shared, "
                                "[r]unbindable, [r]bind), "
                                "as --container-mounts"), default=[],
                       doc="bind mounts into every container (e.g. /scratch, /etc/slurm:/etc/slurm:ro); a user's "
                           "--container-mounts onto the same target wins"),
        "entrypoint": Bool(default=False,
                           doc="run the image's entrypoint before the command by default (pyxis's "
                               "execute_entrypoint; users choose with --[no-]container-entrypoint)"),
        "batch": Bool(default=False,
                      doc="run a batch script with --container-image in the container by default, as pyxis "
                          "does (its sbatch_support); false: on the host, where its srun works, unless the "
                          "user adds --container-batch. Users choose with --[no-]container-batch. Slurm "
                          "only (the SPANK plugin's container_batch= in plugstack.conf)"),
        "writable": Bool(nullable=True, default=None,
                         doc="containers writable by default (a step's changes stay with its container: the "
                             "step's, or the job's named one); null: each runtime's own default (podman and "
                             "Apptainer read-only; enroot its ENROOT_ROOTFS_WRITABLE, which pyxis follows); "
                             "users choose with --container-writable / --container-readonly. On podman a "
                             "writable container of a shared rootfs directory is imported into each user's "
                             "store on each node first"),
        "remap_root": Bool(nullable=True, default=None,
                           doc="root (uid 0) inside containers by default (a user namespace: no privilege on "
                               "the host); null: each runtime's own default (tether's podman: yourself, "
                               "enroot: its config); users choose with --[no-]container-remap-root"),
        "mount_home": Bool(nullable=True, default=None,
                           doc="bind-mount the user's home directory by default; null: each runtime's own "
                               "default (Apptainer yes, podman no, enroot its config); users choose with "
                               "--[no-]container-mount-home"),
        "cluster_store": Struct(doc="the cluster image store: each public registry image once for the whole "
                                    "cluster, a read-only squashfs on a filesystem every node sees, fetched and "
                                    "written only by the image service's account; podman, enroot and Apptainer "
                                    "ranks start it without unpacking (squashfuse)", fields={
            "root": Str(nullable=True, default=None, pattern=STORAGE_PATH_PATTERN, accepted=STORAGE_PATH_ACCEPTED,
                        doc="the store's directory on a filesystem every node sees, the service account's "
                            "(tether images setup makes it); null: no cluster store, each user pulls into "
                            "their own store on each node"),
            "account": Str(default="tether-images", pattern=NAME_PATTERN, accepted="a user name",
                           doc="the image service's account: the only one that writes the store (never root, "
                               "never a job user)"),
            "socket": Str(default="/run/tether-images/images.sock", pattern=r"/[^\s]*", accepted="an absolute path",
                          doc="the image service's unix socket on each node (systemd's tether-images.socket, "
                              "or tether images serve --listen)"),
            "resolve_every": Int(default=900, minimum=0, maximum=7 * 86400,
                                 doc="seconds a reference the service resolved at its registry stays good for "
                                     "every job of the cluster; after that the next rank has it resolved again "
                                     "(one manifest request; the image fetched again only if the tag moved)"),
            "max_gib": Int(default=500, minimum=1, maximum=1 << 20,
                           doc="the store's size cap in GiB: tether images gc removes the least recently used "
                               "images above it"),
            "keep_days": Int(default=7, minimum=0, maximum=3650,
                             doc="an image used within this many days is never removed by gc (a running job's "
                                 "next step may need it)"),
            "scratch": Str(default="/var/lib/tether/image-service", pattern=STORAGE_PATH_PATTERN,
                           accepted=STORAGE_PATH_ACCEPTED,
                           doc="the service account's own podman store on each node (node-local), where an "
                               "image is pulled and made a squashfs before it is published; emptied of it then"),
            "fetches_per_hour": Int(default=30, minimum=0, maximum=100000,
                                    doc="fetches one user may have the service make in an hour, across the "
                                        "cluster (any local user can ask for any public image); beyond it their "
                                        "ranks pull into their own store, said; 0: no limit"),
            "apptainer_form": Bool(default=True,
                                   doc="also write each image in the form Apptainer starts as it is: a gzip "
                                       "squashfs with the image's ENV in /.singularity.d (Apptainer before 1.4 "
                                       "reads no zstd); false: Apptainer ranks convert registry images "
                                       "themselves, as without a store"),
            "wait_seconds": Int(default=3600, minimum=10, maximum=86400,
                                doc="how long a rank waits for the service to publish an image another node "
                                    "is fetching"),
        }),
        "apptainer": _runtime("apptainer", "Apptainer settings"),
        "singularity": _runtime("singularity", "Singularity settings"),
        "podman": _runtime(
            "podman", "Podman settings",
            cdi_kind=Str(default="nvidia.com/gpu", pattern=r"[a-z0-9][a-z0-9.-]*/[a-zA-Z0-9][a-zA-Z0-9_.-]*",
                         accepted="a CDI kind, vendor/class", doc="the CDI kind of the node's GPUs: a rank "
                         "with GPU slots gets --device KIND=ID for each of its GPUs (nvidia-ctk cdi generate "
                         "writes nvidia.com/gpu)"),
            cdi_spec_dirs=List(item=Str(pattern=r"/.*", accepted="an absolute path"),
                               default=["/etc/cdi", "/var/run/cdi"],
                               doc="where podman finds CDI specs (podman's own default): checked for the "
                                   "GPU kind before a GPU rank starts"),
            store=Str(default=f"{USER_STORE_ROOT}/{{uid}}/podman", pattern=PODMAN_STORE_PATTERN,
                      accepted="empty, or an absolute path on a node-local disk with {uid} in it",
                      doc="each user's image store on each node (node-local; the storage driver is podman's choice, "
                          "storage.conf's: registry images are "
                          "pulled and rootfs directories imported once per user per node, never into a home "
                          "directory many nodes share); with {uid} as a whole path component, root makes "
                          "<path above it>/<uid> for the user (0700) at their first container step on the "
                          "node, in a directory only root writes (plugstack.conf user_dirs=); empty: "
                          "podman's own default store of the user (~/.local/share/containers)")),
        "enroot": _runtime(
            "enroot", "Enroot settings",
            binary_note="; an absolute path's directory goes first on enroot's own PATH, where enroot "
                        "finds its helpers (enroot-nsenter, enroot-switchroot), installed beside it",
            store=Str(default=f"{USER_STORE_ROOT}/{{uid}}/enroot", pattern=PODMAN_STORE_PATTERN,
                      accepted="empty, or an absolute path on a node-local disk with {uid} in it",
                      doc="each user's imported images (squashfs) on each node: a registry image is imported "
                          "once per user per node and kept for the next steps and jobs (a tag checked against "
                          "its registry once per job, imported again when it moved); the user's directory "
                          "is made by root as for container.podman.store; empty: imported per step into the "
                          "step's directory")),
    }),
    "launcher": Struct(doc="the launcher service (tether submit/status/logs/cancel/cleanup/list, tether serve)", fields={
        "scheduler": Enum(choices=("slurm", "pbs"), default="slurm", doc="the resource manager it submits to"),
        "state_root": Str(default="/var/lib/tether/launcher", pattern=STORAGE_PATH_PATTERN,
                          accepted=STORAGE_PATH_ACCEPTED,
                          doc="the service's own records, one file per job (the service account's directory, "
                              "0700)"),
        "job_root": Str(nullable=True, default=None, pattern=STORAGE_PATH_PATTERN, accepted=STORAGE_PATH_ACCEPTED,
                        doc="where each job's tree is made, by its user (a root-owned directory with mode 1777, "
                            "made by tether launcher install --apply); null: <job_storage_root>/launcher"),
        "agent": Str(default="/usr/local/bin/tether-agent", pattern=r"/[^\s]*", accepted="an absolute path",
                     doc="the agent the service runs as a user through sudo (the only command the sudo policy "
                         "allows it)"),
        "users_group": Str(default="tether-users", pattern=NAME_PATTERN, accepted="a group name",
                           doc="the users the service may act for (the sudo policy's Runas group)"),
        "service_user": Str(default="tether-launcher", pattern=NAME_PATTERN, accepted="a user name",
                            doc="the account the service runs as (never root)"),
        "auto_cleanup": Bool(default=True,
                             doc="remove a job's tree and record once its status says it ended (completed, "
                                 "failed or cancelled, as docs/requirements.md's launcher does)"),
        "log_excerpt_lines": Int(default=40, minimum=1, maximum=10000,
                                 doc="how many lines of the error log a startup failure shows"),
        "socket": Str(default="/run/tether-launcher/launcher.sock", pattern=r"/[^\s]*", accepted="an absolute path",
                      doc="tether serve's unix socket (its directory's permissions decide who may connect; not "
                          "/run/tether, where root makes users' own directories)"),
        "max_request_bytes": Int(default=1 << 20, minimum=4096, maximum=64 << 20,
                                 doc="the largest request body tether serve reads (a job spec with its staged "
                                     "files, as JSON); a larger one is refused with 413 before it is read"),
        "max_requests": Int(default=32, minimum=1, maximum=4096,
                            doc="requests tether serve handles at once; the next gets 503 with Retry-After (so "
                                "it holds at most max_requests x max_request_bytes of bodies)"),
    }),
    "gateways": Struct(doc="gateway nodes (docs/requirements.md): a heterogeneous job's component asking "
                           "--gateways=N",
                       extra_check=_check_gateways, fields={
        "partition": Str(pattern=NAME_PATTERN, nullable=True, default=None, accepted="a partition name",
                         doc="the partition of the gateway nodes, which job_submit gives a component asking "
                             "--gateways=N (the SPANK plugin's gateway_partition= in plugstack.conf); null: "
                             "no gateways, --gateways is refused"),
        "feature": Str(pattern=NAME_PATTERN, nullable=True, default=None, accepted="a node feature",
                       doc="a node feature the gateway nodes must have (the component's --constraint)"),
        "daemon": List(item=Str(pattern=r"[^\x00-\x1f\x7f]+", accepted="printable text"), default=[],
                       doc="the gateway daemon's command, one per gateway node as a job step of the gateway "
                           "component, run as the job's user; {port}, {node}, {index} and {job} are replaced"),
        "port": Int(nullable=True, default=None, minimum=1024, maximum=65519,
                    doc="the first gateway's port (the n-th gateway node's: port + n); null: 28672 + (job id "
                        "mod 256) x 16 + n, between MASTER_PORT's range and Linux's ephemeral ports"),
        "ready_timeout": Int(default=60, minimum=1, maximum=3600,
                             doc="seconds the batch script waits for every gateway daemon to accept a TCP "
                                 "connection; the job fails when one does not"),
    }),
    "plugin": Struct(doc="plugin behaviour", fields={
        "on_failure": Enum(choices=ON_FAILURE, default="reject_tether_jobs",
                           doc="when tether itself fails (bad config, internal error): reject only "
                               "jobs that ask for tether, or every job"),
    }),
})


@dataclass(frozen=True)
class PartitionOverride:
    """Settings for one partition/queue (``partition_overrides.<name>``), arguments parsed."""

    slot_type: str | None
    gpu_type: str | None
    sbatch_args: tuple[Arg, ...]
    qsub: PbsUserRequest

    @classmethod
    def from_data(cls, raw: Mapping[str, Any]) -> "PartitionOverride":
        """From validated config data (its argument lists parse: the schema checked them)."""
        return cls(raw["slot_type"], raw["gpu_type"], tuple(parse_sbatch_args(raw["sbatch_args"])),
                   split_qsub_args(parse_qsub_args(raw["pbsbatch_args"])))


@dataclass(frozen=True)
class Config:
    """The validated, effective configuration. ``data`` is the full mapping with defaults;
    ``overrides`` the partition overrides, parsed once at load."""

    source: str
    data: Mapping[str, Any]
    overrides: Mapping[str, PartitionOverride] = field(default_factory=dict)

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
        return self.overrides.get(name) if name else None

    def runtime(self, name: str) -> Mapping[str, Any]:
        return self.data["container"][name]

    def user_dir_bases(self) -> list[str]:
        """Where root makes each user's own directory on a node (plugstack.conf ``user_dirs=``, the
        PBS MoM hook's config): hooks.layout.user_dir_bases of the podman and enroot stores."""
        return user_dir_bases([self.runtime(name).get("store") or "" for name in ("podman", "enroot")])


def plain_data(value: Any) -> Any:
    """Mappings and sequences of the config as plain dicts and lists (for YAML, JSON, repr)."""
    if isinstance(value, Mapping):
        return {k: plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    return value


def validate_config(data: Any, source: str) -> Config:
    """Validate a parsed document; raises ConfigError listing every problem."""
    errors: list[SchemaError] = []
    if data is None:
        data = {}
    normalized = CONFIG_SCHEMA.check(data, "", errors)
    if errors:
        raise ConfigError(source, errors)
    overrides = {name: PartitionOverride.from_data(raw)
                 for name, raw in normalized["partition_overrides"].items()}
    return Config(source, normalized, overrides)


def default_config() -> Config:
    """The built-in defaults (what a missing /etc/tether/tether.yaml means)."""
    return validate_config({}, BUILTIN)


def _flow(value: Any) -> str:
    """A default as YAML writes it in flow style (``true``, ``null``, ``[]``, ``cuda``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return str(value)


def config_reference() -> str:
    """The configuration reference as a Markdown table (kept in the README, checked by the tests)."""
    rows = ["| key | accepted | default | meaning |", "|---|---|---|---|"]
    for path, node in walk_keys(CONFIG_SCHEMA):
        if isinstance(node, Struct):
            continue
        shown = "—" if isinstance(node, Map) else f"`{_flow(node.fill_default())}`"
        rows.append(f"| `{path}` | {node.describe()} | {shown} | {node.doc} |")
    return "\n".join(rows) + "\n"
