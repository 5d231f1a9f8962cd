"""The user's surface in one table: every option, variable and resource name tether gives users.

Everything else is generated from or checked against this module:

* the C side's option table and names (``native/tether_names.h``, written by
  ``tether.native.build.names_header()``; a test keeps the committed header equal to it);
* how the job_submit handler reads option values out of ``spank_job_env``;
* the PBS custom resources ``tether pbs install`` creates and the submit and MoM hooks read;
* the ``TETHER_CONTAINER_*`` variables the container launcher reads, and ``tether run``'s flags;
* the spelling of every option in messages (``--slots``, ``slots_per_trial``, ``tether_slots``);
* the README's option and rank-environment tables (kept equal by the tests).

The container launcher imports this module once per rank: plain classes only (no ``typing``,
``re`` or ``dataclasses``, each several milliseconds of start-up).
"""

from __future__ import annotations

from .imageref import FORMS as IMAGE_FORMS
from .imageref import valid_reference

TYPE_CHECKING = False  # not `typing`: see above

if TYPE_CHECKING:
    from typing import Mapping

PLUGIN = "tether"  # SPANK_PLUGIN(tether, 1): Slurm forwards options as _SLURM_SPANK_OPTION_tether_<name>

SLOT_TYPES = ("cuda", "rocm", "cpu")
GPU_SLOT_TYPES = ("cuda", "rocm")
RUNTIMES = ("apptainer", "singularity", "podman", "enroot")

# Upper bounds keep every computed value inside Slurm's and PBS's integer fields
# (cpus_per_task is a uint16 in job_desc_msg_t; 65534 is NO_VAL16).
MAX_SLOTS = 10_000_000
MAX_SLOTS_PER_NODE = 65_533
MAX_NAME = 128     # a gpu type or pool name (an option may set a lower maximum: container-name 63)
MAX_TEXT = 4096    # an image, mounts, a directory
# Ports tether derives for a job, all below Linux's ephemeral range (ip_local_port_range,
# 32768..60999 by default), where a node's own outgoing connections can hold a port at the moment
# a rank or daemon binds it: MASTER_PORT = base + (job id mod jobs) * 16 + (step id mod 16), and a
# gateway node's daemon port = base + (job id mod jobs) * 16 + n.
MASTER_PORT_BASE, MASTER_PORT_JOBS = 12288, 1024       # 12288..28671
MASTER_PORT_STEPS = 16                                 # a job's ports: one per step id mod 16
GATEWAY_PORT_BASE, GATEWAY_PORT_JOBS = 28672, 256      # 28672..32767

# Value kinds: each is checked in C in srun/sbatch/salloc (cheap, with a clear message) and again
# where the value is used (slurmctld, the PBS server, the launcher).
KINDS = ("count", "slot_type", "name", "runtime", "text", "env_names", "flag", "image", "container_name",
         "namespaces")
# pyxis's --container-name=NAME[:FLAG]: auto (the default) attaches to the job's container of that
# name while another step runs it on the node (podman), else runs in a container of its own over its
# files, made by the step when missing; no_exec never attaches; exec must attach (the container must
# be running); create: this step makes it and fails when the job has it already.
CONTAINER_NAME_FLAGS = ("auto", "no_exec", "exec", "create")
# pyxis 0.24's --container-unshare=NS[,NS...]: namespaces the container gets of its own (the host's
# network, IPC and UTS namespaces otherwise).
UNSHARE_NAMESPACES = ("net", "ipc", "uts")


class Option:
    """One option: ``--name`` on srun/sbatch/salloc (and ``#SBATCH``), ``TETHER_<NAME>`` in the
    environment and in ``qsub -v``. Slot options (``field`` set) make a request the planner reads;
    for them ``spec_key`` is the job spec's key (``{scheduler}``: under ``slurm:`` or ``pbs:``) and
    ``pbs_resource`` PBS's custom resource."""

    __slots__ = ("name", "arginfo", "kind", "usage", "minimum", "maximum", "field", "spec_key",
                 "pbs_resource", "pbs_type", "env_name", "env", "is_container")

    def __init__(self, name: str, arginfo: str | None, kind: str, usage: str, *, minimum: int = 0,
                 maximum: int = 0, field: str | None = None, spec_key: str | None = None,
                 pbs_resource: str | None = None, pbs_type: str | None = None, env_name: str | None = None):
        assert kind in KINDS, kind
        self.name, self.arginfo, self.kind, self.usage = name, arginfo, kind, usage
        self.minimum, self.maximum = minimum, maximum
        self.field, self.spec_key = field, spec_key
        self.pbs_resource, self.pbs_type = pbs_resource, pbs_type
        self.env_name = env_name
        # worked out once (slurmctld's job_submit handler reads them for each option of each job):
        # the environment fallback (and the PBS job variable), ``TETHER_SLOTS_PER_NODE`` (another
        # name where the plain one is a variable tether sets: ``--gateways``, ``TETHER_GATEWAYS``);
        # whether it is a container option
        self.env = env_name or "TETHER_" + name.upper().replace("-", "_")
        self.is_container = name.startswith(("container-", "no-container-"))

    def spec_name(self, scheduler: str = "slurm") -> str | None:
        """The job spec's key for this option (``slurm.slots_per_node`` in a Slurm spec)."""
        return self.spec_key.format(scheduler=scheduler) if self.spec_key else None

    @property
    def flag(self) -> str:
        return "--" + self.name

    @property
    def spank_env(self) -> str:
        """How Slurm forwards an option given on the command line, in job_desc->spank_job_env."""
        return f"_SLURM_SPANK_OPTION_{PLUGIN}_{self.name.replace('-', '_')}"

    @property
    def job_env(self) -> str:
        """The variable that describes a slot option to the job's ranks: ``TETHER_JOB_SLOTS``."""
        return "TETHER_JOB_" + self.name.upper().replace("-", "_")

    def __repr__(self) -> str:
        return f"Option({self.name!r})"


OPTIONS: tuple[Option, ...] = (
    # --- the slot request (docs/requirements.md, "The job request": slots_per_trial, slots_per_node,
    # slot_type, gpu_type, resource_pool)
    # The counts are PBS resources of type string, which the submit hook checks itself: with a
    # queuejob hook enabled, OpenPBS drops a malformed value of a type=long resource before the hook
    # sees it (-l tether_slots=abc became a plain job: issue 40, 6; recorded: qsub-custom-long-abc)
    Option("slots", "N", "count", "slots for the job (slots_per_trial in a job spec); 0: an auxiliary task",
           minimum=0, maximum=MAX_SLOTS, field="slots", spec_key="slots_per_trial",
           pbs_resource="tether_slots", pbs_type="string"),
    Option("slots-per-node", "N", "count", "slots each node must provide (slots_per_node)",
           minimum=1, maximum=MAX_SLOTS_PER_NODE, field="slots_per_node", spec_key="{scheduler}.slots_per_node",
           pbs_resource="tether_slots_per_node", pbs_type="string"),
    Option("slot-type", "cuda|rocm|cpu", "slot_type", "what a slot is; overrides the partition's and the cluster's",
           field="slot_type", spec_key="slot_type", pbs_resource="tether_slot_type", pbs_type="string"),
    Option("gpu-type", "TYPE", "name", "GPU gres type for --gpus/--gres (gpu_type)",
           field="gpu_type", spec_key="slurm.gpu_type", pbs_resource="tether_gpu_type", pbs_type="string"),
    Option("resource-pool", "NAME", "name", "partition to run in (resource_pool)",
           field="resource_pool", spec_key="resource_pool"),
    # --- containers (names follow pyxis)
    Option("container-image", "IMAGE", "image",
           "an absolute path (.sif, squashfs, rootfs directory) or a registry image: ubuntu:22.04, "
           "nvcr.io#nvidia/pytorch:24.01-py3, docker://...; empty (--container-image=): this step on the "
           "host"),
    Option("container-runtime", "apptainer|singularity|podman|enroot", "runtime",
           "container runtime (default from the config)"),
    Option("container-mounts", "SRC[:DST[:FLAGS]],...", "text", "mounts into the container (pyxis's grammar): "
           "SRC an absolute path, a relative one (./data: from the working directory), tmpfs, or umount (DST "
           "unmounted); DST absolute or from the container's root (./data); FLAGS joined with '+': ro, rw, "
           "[no]suid, [no]dev, [no]exec, [r]private, [r]slave, [r]shared, [r]unbindable, [r]bind, "
           "x-create=auto, dir or file; a tmpfs also size=, mode=, nr_inodes=, nr_blocks=, uid=, gid=, huge= "
           "(podman: as an anonymous volume, beyond size= and mode=)"),
    Option("container-workdir", "DIR", "text", "working directory inside the container; relative: from the "
           "container's root (as pyxis); it must exist in the image (as pyxis)"),
    Option("container-env", "NAME,...", "env_names", "host variables that win over the image's"),
    Option("container-writable", None, "flag", "writable container filesystem where the runtime supports it"),
    Option("container-readonly", None, "flag", "read-only container filesystem: the default unless the admin's "
           "container.writable says otherwise (pyxis's name for it)"),
    # 63: the launcher's rule (a podman/enroot container and directory name, tether-<job>-<name>)
    Option("container-name", "NAME[:FLAG]", "container_name", "reuse one container across the job's steps; "
           "FLAG (pyxis's): auto (default): attach to it while another step of the job runs it on the node "
           "(podman), else that container, made when missing; no_exec: never attach; exec: attach, an error "
           "when it is not running; create: made by this step, an error if the job has it already",
           maximum=63),
    Option("container-mount-home", None, "flag", "bind-mount your home directory at its own path (default: "
           "the runtime's own: Apptainer/Singularity yes, podman no, enroot its config)"),
    Option("no-container-mount-home", None, "flag", "do not bind-mount your home directory"),
    Option("container-remap-root", None, "flag", "be root (uid 0) inside the container: a user namespace, "
           "no privilege on the host (default: yourself, or the config's container.remap_root)"),
    Option("no-container-remap-root", None, "flag", "be yourself inside the container"),
    Option("container-entrypoint", None, "flag", "run the image's entrypoint before the command (default: "
           "not, as pyxis; or the config's container.entrypoint)"),
    Option("no-container-entrypoint", None, "flag", "do not run the image's entrypoint"),
    Option("container-entrypoint-log", None, "flag", "accepted for pyxis scripts: the entrypoint's output "
           "is always the rank's own output"),
    Option("container-save", "PATH", "text", "after the step, save the first rank's container of each node "
           "(enroot: squashfs; podman: squashfs to a `.sqsh`/`.squashfs`/`.sqfs` name, else an OCI archive); "
           "relative to the working directory"),
    Option("container-unshare", "NS[,NS...]", "namespaces", "namespaces of the container's own, of net, ipc, "
           "uts (default: the host's), shared by the step's ranks on a node: net, only a loopback interface; "
           "ipc, its own SysV IPC and /dev/shm; uts, its own host name (at first the node's)"),
    Option("no-container-batch", None, "flag", "run the batch script on the host (where its srun works) even "
           "where the admin's container.batch puts it in the container"),
    Option("container-batch", None, "flag", "run the batch script itself in the container too (default: on "
           "the host, where its srun works, or the admin's container.batch)"),
    # --- modular jobs (docs/requirements.md, "Gateway nodes"): a heterogeneous job's component of
    # gateway nodes
    Option("gateways", "N", "count", "this heterogeneous job component is N gateway nodes: tether gives it "
           "the gateway partition and starts the gateway daemon there (sbatch; see the README)",
           minimum=1, maximum=16, env_name="TETHER_GATEWAY_COUNT"),
)

_ASCII_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
FLAG_VALUES = {"": "1", "1": "1", "true": "1", "yes": "1", "on": "1", "0": "0", "false": "0", "no": "0", "off": "0"}


def has_control(value: str) -> bool:
    """Whether ``value`` holds a C0 control character or DEL (other characters, non-ASCII too, are
    text): what option values and TETHER_CONTAINER_* values may not hold."""
    # isprintable(): none at all (C0 and DEL are not printable) -- the common case, in one C loop
    return not value.isprintable() and any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)


_ENV_NAME_CHARS = _ASCII_ALNUM | {"_"}


def is_env_name(name: str) -> bool:
    """[A-Za-z_][A-Za-z0-9_]*: a variable name (--container-env, the launcher's environment rules)."""
    return bool(name) and not name[0].isdigit() and set(name) <= _ENV_NAME_CHARS


def normalize(opt: Option, value: str) -> str | None:
    """``value`` as option ``opt`` accepts it (flags become "1"/"0"), or None when it is refused --
    exactly what the SPANK plugin's C accepts (spank/options.c; a fuzz test holds the two together)."""
    if opt.kind == "flag":
        return FLAG_VALUES.get(value)
    if opt.kind == "count":
        ok = value.isascii() and value.isdigit() and len(value) <= 18 and opt.minimum <= int(value) <= opt.maximum
    elif opt.kind == "slot_type":
        ok = value in SLOT_TYPES
    elif opt.kind == "runtime":
        ok = value in RUNTIMES
    elif opt.kind in ("name", "container_name"):
        name, colon, flag = value.partition(":") if opt.kind == "container_name" else (value, "", "")
        ok = 0 < len(name) <= (opt.maximum or MAX_NAME) and name[0] in _ASCII_ALNUM and all(
            c in _ASCII_ALNUM or c in "._-" for c in name) and (not colon or flag in CONTAINER_NAME_FLAGS)
    elif opt.kind == "namespaces":
        ok = len(value.encode("utf-8", "surrogateescape")) <= MAX_TEXT and unknown_namespace(value) is None
    elif opt.kind == "image":   # empty: no container (one step on the host in a container job)
        ok = value == "" or valid_reference(value)
    elif opt.kind == "env_names":
        ok = len(value.encode("utf-8", "surrogateescape")) <= MAX_TEXT and all(
            is_env_name(n) for n in value.split(","))
    else:  # text
        ok = 0 < len(value.encode("utf-8", "surrogateescape")) <= MAX_TEXT and not has_control(value)
    return value if ok else None


def expected(opt: Option) -> str:
    """What option ``opt`` accepts, in the words of the plugin's messages."""
    return {
        "count": f"a whole number from {opt.minimum} to {opt.maximum}",
        "slot_type": "one of " + ", ".join(SLOT_TYPES),
        "runtime": "one of " + ", ".join(RUNTIMES),
        "name": f"a name of letters, digits, '.', '_', '-' (at most {opt.maximum or MAX_NAME} characters)",
        "container_name": f"NAME[:FLAG]: a name of letters, digits, '.', '_', '-' (at most {opt.maximum or MAX_NAME} "
                          f"characters), FLAG one of {', '.join(CONTAINER_NAME_FLAGS)}",
        "env_names": "variable names separated by commas (NAME,NAME)",
        "flag": "1/0, true/false or yes/no",
        "text": f"printable text of at most {MAX_TEXT} characters",
        "image": IMAGE_FORMS,
        "namespaces": "namespaces separated by commas, of " + ", ".join(UNSHARE_NAMESPACES),
    }[opt.kind]


def unknown_namespace(value: str) -> str | None:
    """The first word of ``--container-unshare=NS[,NS...]`` that is no namespace tether unshares
    ('' for an empty one), or None when every word is one (pyxis's grammar)."""
    return next((ns for ns in value.split(",") if ns not in UNSHARE_NAMESPACES), None)


BY_NAME = {opt.name: opt for opt in OPTIONS}
BY_FIELD = {opt.field: opt for opt in OPTIONS if opt.field}
SLOT_OPTIONS = tuple(opt for opt in OPTIONS if opt.field)
CONTAINER_OPTIONS = tuple(opt for opt in OPTIONS if opt.is_container)
PBS_RESOURCES = tuple(opt for opt in OPTIONS if opt.pbs_resource)

# Flags of opposite meaning, two options each: given on the command line, one of them wins over the
# other's environment fallback (TETHER_CONTAINER_WRITABLE=1 with --container-readonly: read-only).
PARTNERS = {a: b for x, y in (("container-writable", "container-readonly"),
                              ("container-mount-home", "no-container-mount-home"),
                              ("container-remap-root", "no-container-remap-root"),
                              ("container-entrypoint", "no-container-entrypoint"),
                              ("container-batch", "no-container-batch")) for a, b in ((x, y), (y, x))}

# pyxis's environment fallbacks (pyxis 0.24, args.c), read after tether's own TETHER_<NAME>:
# (variable, the option it sets, for a flag the option a false value sets). A value pyxis would
# ignore with an error is refused here too; an empty one is ignored, as pyxis does.
PYXIS_ENV: tuple[tuple[str, str, str | None], ...] = (
    ("PYXIS_CONTAINER_IMAGE", "container-image", None),
    ("PYXIS_CONTAINER_MOUNTS", "container-mounts", None),
    ("PYXIS_CONTAINER_WORKDIR", "container-workdir", None),
    ("PYXIS_CONTAINER_NAME", "container-name", None),
    ("PYXIS_CONTAINER_SAVE", "container-save", None),
    ("PYXIS_CONTAINER_MOUNT_HOME", "container-mount-home", "no-container-mount-home"),
    ("PYXIS_CONTAINER_REMAP_ROOT", "container-remap-root", "no-container-remap-root"),
    ("PYXIS_CONTAINER_ENTRYPOINT", "container-entrypoint", "no-container-entrypoint"),
    ("PYXIS_CONTAINER_ENTRYPOINT_LOG", "container-entrypoint-log", None),
    ("PYXIS_CONTAINER_WRITABLE", "container-writable", "container-readonly"),
    ("PYXIS_CONTAINER_READONLY", "container-readonly", "container-writable"),
    ("PYXIS_CONTAINER_ENV", "container-env", None),
    ("PYXIS_CONTAINER_UNSHARE", "container-unshare", None),
)
# pyxis's boolean spellings (config.c, parse_bool)
PYXIS_TRUE, PYXIS_FALSE = ("1", "true", "yes", "y"), ("0", "false", "no", "n")


def env_fallbacks(given: Mapping[str, str], env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """The options the environment adds to ``given`` (option name -> value, from the command line
    or #SBATCH lines), as {option name: (value, the variable it came from)}: each option's
    ``TETHER_<NAME>``, then pyxis's ``PYXIS_CONTAINER_<NAME>``, only where neither the option nor
    its partner (PARTNERS) is set already -- what the SPANK plugin does in srun/sbatch/salloc and
    slurmstepd (spank/options.c, tether_env_fallbacks). Values are returned as written: checking
    them is the caller's (pyxis's booleans become "1")."""
    added: dict[str, tuple[str, str]] = {}

    def taken(name: str) -> bool:
        return any(n in given or n in added for n in (name, PARTNERS.get(name)) if n)

    for opt in OPTIONS:
        if not taken(opt.name) and opt.env in env:
            added[opt.name] = (env[opt.env], opt.env)
    for var, on, off in PYXIS_ENV:
        value = env.get(var, "")
        if value == "" or taken(on) or (off and taken(off)):
            continue
        if BY_NAME[on].kind != "flag":
            added[on] = (value, var)
        elif value in PYXIS_TRUE:
            added[on] = ("1", var)
        elif value in PYXIS_FALSE:
            if off:
                added[off] = ("1", var)
        else:
            added[on] = (value, var)          # refused by the flag's check, naming the variable
    return added


class Variable:
    """A variable the run side sets in a tether step's tasks (README: the rank environment).
    ``key``: how code names it -- ``RANK_VAR[key]`` in Python, ``TETHER_ENV_<key less TETHER_>`` in C
    (native/tether_names.h: ``TETHER_ENV_JOB_DIR``) -- the name itself unless given: a variable
    renamed keeps its key, and no code changes."""

    __slots__ = ("name", "meaning", "host_only", "key")

    def __init__(self, name: str, meaning: str, *, host_only: bool = False, key: str | None = None):
        self.name, self.meaning, self.host_only = name, meaning, host_only
        self.key = key or name

    def __repr__(self) -> str:
        return f"Variable({self.name!r})"


# The rank environment (Slurm: slurmstepd's SPANK plugin; PBS: the MoM hook). ``host_only``:
# a host path, not passed into a container (where the rank's own directories have fixed paths).
RANK_ENV: tuple[Variable, ...] = (
    Variable("RANK", "the task's rank in the step (`SLURM_PROCID`)"),
    Variable("LOCAL_RANK", "its rank on this node (`SLURM_LOCALID`)"),
    Variable("NODE_RANK", "this node's index in the step (`SLURM_NODEID`)"),
    Variable("WORLD_SIZE", "tasks in the step"),
    Variable("LOCAL_WORLD_SIZE", "tasks of the step on this node"),
    Variable("MASTER_ADDR", "the step's first node: its `NodeAddr` when slurmstepd can look it up, else its "
                            "node name"),
    Variable("MASTER_PORT", f"`{MASTER_PORT_BASE} + (job id mod {MASTER_PORT_JOBS}) × {MASTER_PORT_STEPS} + "
                            f"(step id mod {MASTER_PORT_STEPS})`: the same for all ranks of a step, different "
                            f"for concurrent steps of a job (up to {MASTER_PORT_STEPS}) and for jobs with "
                            "neighbouring ids; below Linux's ephemeral port range"),
    Variable("TMPDIR", "`<rank dir>/tmp` (private to the rank, 0700, removed with the step)"),
    Variable("TETHER_WORK_DIR", "`<rank dir>/work` (the rank's own work directory)"),
    Variable("TETHER_RANK_DIR", "the rank's directory", host_only=True),
    Variable("TETHER_STEP_DIR", "the step's directory on this node", host_only=True),
    Variable("TETHER_JOB_DIR", "the job's directory", host_only=True),
    Variable("TETHER_NNODES", "nodes in the step"),
    Variable("TETHER_SLOT_IDS", "the GPUs Slurm bound to the task (its `CUDA_VISIBLE_DEVICES`), unless "
                                "`--slot-type=cpu`"),
    Variable("ROCR_VISIBLE_DEVICES", "the same GPUs, with `--slot-type=rocm`"),
    Variable("TETHER_HET_COMPONENT", "in a step across the components of a heterogeneous job "
                                     "(`srun --het-group=0,1`): this task's component; `RANK`, `WORLD_SIZE`, "
                                     "`NODE_RANK`, `TETHER_NNODES` and `MASTER_PORT` are then the whole step's"),
    Variable("TETHER_HET_COMPONENTS", "there: how many components the step spans"),
    Variable("TETHER_HET_OFFSET", "there: the first `RANK` of this task's component"),
    Variable("TETHER_HET_SIZE", "there: the tasks of this task's component"),
)
# Each variable's name by its key: the one spelling of the names for code (hooks/rankenv.py computes
# the values; slurmstepd's C has the same as TETHER_ENV_<key>).
RANK_VAR = {v.key: v.name for v in RANK_ENV}
RANK_NAMES = tuple(RANK_VAR[k] for k in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                         "MASTER_ADDR", "MASTER_PORT"))
HOST_ONLY = tuple(v.name for v in RANK_ENV if v.host_only)
# Set by the hand-off to the container launcher: the task's argv[0] it replaced (Slurm 22.05 and PBS
# cannot prepend to a task's argv), or empty where Slurm (23.11+) prepended the launcher.
RUN_ARGV0 = "TETHER_RUN_ARGV0"
# PBS's per-host launch starts each host's task as `/bin/sh -c STARTED_MARK FILE COMMAND...`: the task
# leaves FILE, then becomes COMMAND -- the launch script's proof that the MoM really ran it (pbs_tmrsh
# exits 0 when a MoM hook rejects a task); the MoM hook sees COMMAND through it.
STARTED_MARK = ': > "$0" && exec "$@"'
# Set with it for a batch script handed over (--container-batch): the command is the script's path.
BATCH_VAR = "TETHER_RUN_BATCH"
# srun's option passes of a heterogeneous step, for slurmstepd (spank/client.c): one per pass.
STEP_OPTIONS_PREFIX = "TETHER_STEP_OPTIONS_"
STEP_PASSES_VAR = "TETHER_STEP_PASSES"
STEP_DEFAULTS_VAR = "TETHER_STEP_DEFAULTS"
# Set with it for a batch script of a job with a gateway component: that component's index.
GATEWAYS_RUN_VAR = "TETHER_RUN_GATEWAYS"
# Set (1) by a launch script for its srun step, which runs `tether run` itself and so is no container
# step to the SPANK plugin: slurmstepd makes the user's own directories on each node all the same
# (hooks.layout.user_dir_bases). A user who sets it gets only their own directories made.
USER_DIRS_VAR = "TETHER_RUN_USER_DIRS"
# The rest of the launcher protocol, between slurmstepd, the PBS MoM hook, tether-jobdirs and tether's
# rank launchers (tether-run, tether-run-py):
SUBREAPER_VAR = "TETHER_RUN_SUBREAPER"    # "0": not made a child subreaper (PBS's hook cannot): itself
CLEANUP_VAR = "TETHER_CLEANUP"            # cleanup mode, after a container step: the step's or job's directory
CLEANUP_FD_VAR = "TETHER_CLEANUP_FD"      # "3": tell the daemon the markers are read by closing fd 3
RESUME_VAR = "TETHER_RUN_RESUME"          # tether-run ran the container: tether-run-py concludes it
AHEAD_VAR = "TETHER_RUN_AHEAD"            # "1": tether-run started the step's enroot create (see tether_run.c)
TELL_REAPING_VAR = "TETHER_RUN_TELL_REAPING"   # the tests' questions: what the launcher waited for,
WHY_PYTHON_VAR = "TETHER_RUN_WHY_PYTHON"       # and why a rank went to the Python launcher
# The protocol's names by key (as RANK_VAR's): the C side's TETHER_ENV_<key less TETHER_>.
LAUNCHER_VAR = {"TETHER_RUN_ARGV0": RUN_ARGV0, "TETHER_RUN_BATCH": BATCH_VAR, "TETHER_RUN_GATEWAYS": GATEWAYS_RUN_VAR,
                "TETHER_RUN_USER_DIRS": USER_DIRS_VAR, "TETHER_RUN_SUBREAPER": SUBREAPER_VAR,
                "TETHER_CLEANUP": CLEANUP_VAR, "TETHER_CLEANUP_FD": CLEANUP_FD_VAR, "TETHER_RUN_RESUME": RESUME_VAR,
                "TETHER_RUN_AHEAD": AHEAD_VAR, "TETHER_RUN_TELL_REAPING": TELL_REAPING_VAR, "TETHER_RUN_WHY_PYTHON": WHY_PYTHON_VAR}


def env_macro(key: str) -> str:
    """The C name of a variable's key: ``TETHER_ENV_`` and the key less its ``TETHER_``
    (``TETHER_JOB_DIR`` -> ``TETHER_ENV_JOB_DIR``, ``RANK`` -> ``TETHER_ENV_RANK``)."""
    return "TETHER_ENV_" + key.removeprefix("TETHER_")


def c_env_names() -> list[tuple[str, str]]:
    """The run-side contract's variable names for C, as (macro, name): the rank environment's and
    the launcher protocol's (native/tether_names.h; tether-run's baked header)."""
    return [(env_macro(key), name) for key, name in (*RANK_VAR.items(), *LAUNCHER_VAR.items())]


# What the batch script (and so every step it starts) of a job with gateway nodes gets.
GATEWAY_ENV: tuple[Variable, ...] = (
    Variable("TETHER_GATEWAYS", "where the gateway daemons listen: `ADDRESS:PORT` of each gateway node, "
                                "comma-separated (the node's `NodeAddr`)"),
    Variable("TETHER_GATEWAY_NODES", "the gateway nodes' names, in the same order"),
    Variable("TETHER_GATEWAY_COMPONENT", "the heterogeneous job component that holds them"),
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")   # a pipe would end a Markdown table cell


def options_reference() -> str:
    """The user options as a Markdown table (kept in the README, checked by the tests)."""
    rows = ["| option | environment | value | meaning |", "|---|---|---|---|"]
    for opt in OPTIONS:
        value = opt.arginfo or "(flag)"
        if opt.kind == "count":
            value += f" ({opt.minimum}..{opt.maximum})"
        rows.append(f"| `{opt.flag}` | `{opt.env}` | `{_cell(value)}` | {opt.usage} |")
    return "\n".join(rows) + "\n"


def rank_env_reference() -> str:
    """The rank environment as a Markdown table (kept in the README, checked by the tests)."""
    rows = ["| variable | value |", "|---|---|"]
    rows += [f"| `{v.name}` | {v.meaning} |" for v in RANK_ENV]
    slots = ", ".join(f"`{o.job_env}`" for o in SLOT_OPTIONS)
    rows.append(f"| {slots} | the step's slot options, when given |")
    rows.append("| " + ", ".join(f"`{o.env}`" for o in CONTAINER_OPTIONS[:2])
                + ", … | the step's `--container-*` options, when given (in a batch script: the defaults "
                  "its `srun`s pick up); see [Containers](#containers) for what a containerized rank sees |")
    return "\n".join(rows) + "\n"
