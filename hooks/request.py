"""The job Request: what a user asked tether for, before any table is applied.

A Request comes from a job spec YAML (``tether plan``, generated batch scripts), from the SPANK
options that reach slurmctld, or from a PBS job's custom resources. ``origin`` only changes how
fields are named in messages, so a user reads the spelling they typed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .errors import RequestError
from .schema import NAME_PATTERN, Enum, Int, List, SchemaError, Str, Struct

SLOT_TYPES = ("cuda", "rocm", "cpu")
GPU_SLOT_TYPES = ("cuda", "rocm")
SCHEDULERS = ("slurm", "pbs")

# Upper bounds keep every computed value inside Slurm's and PBS's integer fields
# (cpus_per_task is a uint16 in job_desc_msg_t; 65534 is NO_VAL16).
MAX_SLOTS = 10_000_000
MAX_SLOTS_PER_NODE = 65_533

JOB_TYPE_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
JOB_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
LABEL_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"

# How each field is spelled where the request came from.
_SPEC_NAMES = {"slots": "slots_per_trial", "slot_type": "slot_type", "resource_pool": "resource_pool",
               "job_type": "job_type", "job_id": "job_id"}
FIELD_NAMES: Mapping[str, Mapping[str, str]] = {
    "spec": {**_SPEC_NAMES, "slots_per_node": "slots_per_node", "gpu_type": "gpu_type",
             "scheduler_args": "scheduler arguments"},
    "spec-slurm": {**_SPEC_NAMES, "slots_per_node": "slurm.slots_per_node",
                   "gpu_type": "slurm.gpu_type", "scheduler_args": "slurm.sbatch_args"},
    "spec-pbs": {**_SPEC_NAMES, "slots_per_node": "pbs.slots_per_node", "gpu_type": "gpu_type",
                 "scheduler_args": "pbs.pbsbatch_args"},
    "slurm": {"slots": "--slots", "slots_per_node": "--slots-per-node", "slot_type": "--slot-type",
              "gpu_type": "--gpu-type", "resource_pool": "--resource-pool",
              "scheduler_args": "sbatch options"},
    "pbs": {"slots": "tether_slots", "slots_per_node": "tether_slots_per_node",
            "slot_type": "tether_slot_type", "gpu_type": "tether_gpu_type",
            "resource_pool": "queue", "scheduler_args": "qsub options"},
}


@dataclass(frozen=True)
class Request:
    """What was asked. ``slots`` is the seed's ``slots_per_trial``; 0 means an auxiliary task."""

    slots: int = 0
    slots_per_node: int | None = None
    slot_type: str | None = None
    gpu_type: str | None = None
    resource_pool: str | None = None
    scheduler_args: tuple[str, ...] = ()
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
        return FIELD_NAMES.get(self.origin, {}).get(key, key)


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
    """Validate a job spec mapping and build the Request for ``scheduler``.

    All problems are reported at once in one ``RequestError``.
    """
    errors: list[SchemaError] = []
    doc = JOB_SPEC_SCHEMA.check({} if spec is None else spec, "", errors)
    if errors:
        raise RequestError("\n".join(f"{source}: {e}" for e in errors))
    section = doc["slurm"] if scheduler == "slurm" else doc["pbs"]
    args_key = "sbatch_args" if scheduler == "slurm" else "pbsbatch_args"
    return Request(
        slots=doc["slots_per_trial"],
        slots_per_node=section["slots_per_node"],
        slot_type=doc["slot_type"],
        gpu_type=doc["slurm"]["gpu_type"] if scheduler == "slurm" else None,
        resource_pool=doc["resource_pool"],
        scheduler_args=tuple(section[args_key]),
        job_type=doc["job_type"],
        job_id=doc["job_id"],
        project=doc["project"],
        workspace=doc["workspace"],
        labels=tuple(doc["labels"]),
        origin=f"spec-{scheduler}",
    )
