"""The job Request: what a user asked tether for, before any table is applied.

A Request comes from a job spec YAML (``tether plan``, generated batch scripts), from the SPANK
options that reach slurmctld, or from a PBS job's custom resources. Arguments arrive parsed
(``Arg``s, a ``PbsUserRequest``): nothing downstream reads scheduler text again. ``origin`` only
changes how fields are named in messages, so a user reads the spelling they typed.
"""

from __future__ import annotations

from .errors import RequestError
from .policy import Arg, PbsUserRequest, parse_qsub_args, parse_sbatch_args, split_qsub_args
from .records import dataclass
from .schema import NAME_PATTERN, Enum, Int, List, SchemaError, Str, Struct
from .surface import BY_FIELD, GPU_SLOT_TYPES, MAX_SLOTS, MAX_SLOTS_PER_NODE, SLOT_TYPES

TYPE_CHECKING = False  # not `typing`: slurmctld's interpreter imports this module (the job_submit handler)

if TYPE_CHECKING:
    from typing import Any

__all__ = ["Request", "request_from_spec", "SLOT_TYPES", "GPU_SLOT_TYPES", "MAX_SLOTS",
           "MAX_SLOTS_PER_NODE", "SCHEDULERS", "JOB_SPEC_SCHEMA"]

SCHEDULERS = ("slurm", "pbs")

JOB_TYPE_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
JOB_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
LABEL_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"

# Where a request came from -> how its scheduler arguments are named in messages.
_ARGS_NAMES = {"spec": "scheduler arguments", "spec-slurm": "slurm.sbatch_args",
               "spec-pbs": "pbs.pbsbatch_args", "slurm": "sbatch options", "pbs": "qsub options"}


def field_name(origin: str, key: str) -> str:
    """How a request field is spelled where the request came from: ``--slots`` (sbatch),
    ``slots_per_trial`` (a job spec), ``tether_slots`` (qsub)."""
    if key == "scheduler_args":
        return _ARGS_NAMES.get(origin, key)
    opt = BY_FIELD.get(key)
    if opt is None:
        return key
    if origin == "slurm":
        return opt.flag
    if origin == "pbs":
        return opt.pbs_resource or ("queue" if key == "resource_pool" else key)
    if origin.startswith("spec-"):
        return opt.spec_name(origin[len("spec-"):]) or key
    return opt.spec_name("slurm").split(".")[-1] if opt.spec_key else key


@dataclass(frozen=True)
class Request:
    """What was asked. ``slots`` is the job request's ``slots_per_trial``; 0 means an auxiliary task.
    ``sbatch_args`` are the user's other sbatch options (parsed); ``qsub`` what a PBS user asked
    for besides slots (their select, place and other qsub options)."""

    slots: int = 0
    slots_per_node: int | None = None
    slot_type: str | None = None
    gpu_type: str | None = None
    resource_pool: str | None = None
    sbatch_args: tuple[Arg, ...] = ()
    qsub: PbsUserRequest = PbsUserRequest()
    job_type: str = "cmd"
    job_id: str | None = None
    project: str | None = None
    workspace: str | None = None
    labels: tuple[str, ...] = ()
    account: str | None = None
    user: str | None = None
    origin: str = "spec"

    def name_of(self, key: str) -> str:
        """The user's spelling of a request field (``--slots``, ``slots_per_trial``, ...)."""
        return field_name(self.origin, key)


def _scheduler_section(args_key: str, with_gpu_type: bool) -> Struct:
    fields = {
        args_key: List(item=Str(), default=[],
                       doc="extra options added as header directives (policy-checked)"),
        "slots_per_node": Int(minimum=1, maximum=MAX_SLOTS_PER_NODE, nullable=True,
                              doc="the minimum number of slots a node must provide"),
    }
    if with_gpu_type:
        fields["gpu_type"] = Str(pattern=NAME_PATTERN, nullable=True,
                                 accepted="a gres type name (letters, digits, '.', '_', '-')",
                                 doc="GPU gres type injected into --gpus/--gres/--gpus-per-task")
    return Struct(fields=fields, doc="scheduler-specific settings")


JOB_SPEC_SCHEMA = Struct(doc="a job spec", fields={
    "name": Str(nullable=True, doc="free text, for people (not used in scheduler options)"),
    "job_type": Str(pattern=JOB_TYPE_PATTERN, default="cmd",
                    accepted="a word of letters, digits, '_', '.', '-'",
                    doc="job type in the generated job name (exp, cmd, gc, ...)"),
    "job_id": Str(pattern=JOB_ID_PATTERN, nullable=True,
                  accepted="a word of letters, digits, '_', '.', '-'",
                  doc="unique id in the job name; derived from the spec when absent"),
    "resource_pool": Str(pattern=NAME_PATTERN, nullable=True,
                         accepted="a partition/queue name", doc="partition or queue"),
    "slots_per_trial": Int(minimum=0, maximum=MAX_SLOTS, default=0,
                           doc="slots for the job; 0 is an auxiliary task"),
    "slot_type": Enum(choices=SLOT_TYPES, nullable=True, doc="overrides partition/cluster slot type"),
    "project": Str(pattern=LABEL_PATTERN, nullable=True, accepted="a project name",
                   doc="project (job_project_source: project)"),
    "workspace": Str(pattern=LABEL_PATTERN, nullable=True, accepted="a workspace name",
                     doc="workspace (job_project_source: workspace)"),
    "labels": List(item=Str(pattern=LABEL_PATTERN, accepted="a label"), default=[],
                   doc="labels (job_project_source: label[:prefix])"),
    "slurm": _scheduler_section("sbatch_args", with_gpu_type=True),
    "pbs": _scheduler_section("pbsbatch_args", with_gpu_type=False),
})


def request_from_spec(spec: Any, scheduler: str, source: str = "job spec") -> Request:
    """Validate a job spec mapping and build the Request for ``scheduler`` (arguments parsed).

    All problems are reported at once in one ``RequestError``.
    """
    errors: list[SchemaError] = []
    doc = JOB_SPEC_SCHEMA.check({} if spec is None else spec, "", errors)
    if errors:
        raise RequestError("\n".join(f"{source}: {e}" for e in errors))
    origin = f"spec-{scheduler}"
    section = doc["slurm"] if scheduler == "slurm" else doc["pbs"]
    try:
        if scheduler == "slurm":
            sbatch, qsub = tuple(parse_sbatch_args(section["sbatch_args"])), PbsUserRequest()
        else:
            sbatch, qsub = (), split_qsub_args(parse_qsub_args(section["pbsbatch_args"]))
    except RequestError as exc:
        raise RequestError(f"{field_name(origin, 'scheduler_args')}: {exc}") from None
    return Request(
        slots=doc["slots_per_trial"],
        slots_per_node=section["slots_per_node"],
        slot_type=doc["slot_type"],
        gpu_type=doc["slurm"]["gpu_type"] if scheduler == "slurm" else None,
        resource_pool=doc["resource_pool"],
        sbatch_args=sbatch,
        qsub=qsub,
        job_type=doc["job_type"],
        job_id=doc["job_id"],
        project=doc["project"],
        workspace=doc["workspace"],
        labels=tuple(doc["labels"]),
        origin=origin,
    )
