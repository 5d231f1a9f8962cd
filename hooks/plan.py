"""Request -> Plan: the resource tables, pure and I/O-free.

Source of truth: docs/requirements.md, "Slurm resource calculations" and "PBS resource
calculations". Each table row below is that document's row written as data: which slot types and
cluster capabilities select it, and which resource fields it sets to which quantity -- ``SLOTS`` is
slots_per_trial, ``SPN`` slots_per_node, ``NODES`` slots_per_trial / slots_per_node. A field marked
``IF_SPN`` is set only when slots_per_node is known (the first Slurm row: slots_per_node, when
given, becomes --gpus-per-task). The Plan holds numbers; text (``--gpus=a100:8``,
``select=2:ngpus=4``) is made only at the edge, by tether.hooks.render.

One deliberate difference from the table's first row: ``--tasks-per-node=1`` is set only together
with ``--gpus-per-task``. Without slots_per_node, Slurm 22.05 refuses ``--gpus=6 --nodes=1-6
--tasks-per-node=1`` on 4-GPU nodes ("Requested node configuration is not available": it derives one
task from the minimum node count), while ``--gpus=6 --nodes=1-6`` gets 2 nodes with one task each --
which is what the row describes (Slurm works out the nodes that hold the GPUs; one container per
node). See docs/requirements.md, "Facts verified against real programs".

The Plan is the single source of truth: the job_submit plugin, the PBS hooks, generated batch
scripts and ``tether plan`` all use the same Plan.
"""

from __future__ import annotations

import math
import re

from .config import Config, PartitionOverride
from .errors import RequestError
from .policy import (
    SLURM_FIELD_OPTIONS, Arg, PbsMerge, PbsUserRequest, check_slurm_args, merge_pbs_request,
)
from .records import asdict, dataclass
from .request import JOB_ID_PATTERN, JOB_TYPE_PATTERN, SCHEDULERS, Request
from .schema import NAME_PATTERN
from .surface import GPU_SLOT_TYPES, MAX_SLOTS, MAX_SLOTS_PER_NODE, SLOT_TYPES

TYPE_CHECKING = False  # not `typing`: slurmctld's interpreter imports this module (the job_submit handler)

if TYPE_CHECKING:
    from typing import Any

PROJECT_PATTERN = r"[A-Za-z0-9_.:,-]{1,255}"
# compiled once: re's own cache costs a lookup per call, and the job_submit handler plans in slurmctld
_NAME, _JOB_TYPE, _JOB_ID, _PROJECT = (re.compile(p).fullmatch for p in (NAME_PATTERN, JOB_TYPE_PATTERN,
                                                                          JOB_ID_PATTERN, PROJECT_PATTERN))

# Quantities a row uses, and when a field is set.
SLOTS, SPN, NODES, ONE = "slots_per_trial", "slots_per_node", "slots_per_trial/slots_per_node", "1"
ALWAYS, IF_SPN = "always", "slots_per_node given"


@dataclass(frozen=True)
class Row:
    """One row of a resource table: when it applies and the fields it sets, in the table's order."""

    key: str
    slot_types: tuple[str, ...]
    tres: bool | None          # None: not applicable (n/a in the table)
    gres: bool | None
    sets: tuple[tuple[str, str, str], ...]  # (field, quantity, when)
    description: str           # what the row means, in short


# docs/requirements.md, "Slurm resource calculations". Zero slots (an auxiliary task) is tether's
# extra row.
# Fields are SlurmResources'; ``nodes`` sets min_nodes (``ONE`` here) and max_nodes.
SLURM_TABLE: tuple[Row, ...] = (
    Row("slurm-gpu-tres-gres", GPU_SLOT_TYPES, True, True,
        (("gpus", SLOTS, ALWAYS), ("min_nodes", ONE, ALWAYS), ("max_nodes", SLOTS, ALWAYS),
         ("tasks_per_node", ONE, IF_SPN), ("gpus_per_task", SPN, IF_SPN)),
        "Slurm determines the number of nodes necessary to allocate the requested GPUs; one "
        "container per node; slots_per_node, if given, becomes --gpus-per-task"),
    Row("slurm-gpu-gres", GPU_SLOT_TYPES, False, True,
        (("min_nodes", NODES, ALWAYS), ("max_nodes", NODES, ALWAYS), ("ntasks", NODES, ALWAYS),
         ("gpus_per_node", SPN, ALWAYS)),
        "slots_per_trial/slots_per_node nodes with slots_per_node GPUs each; one container per node"),
    Row("slurm-cpu", ("cpu",), None, None,
        (("min_nodes", NODES, ALWAYS), ("max_nodes", NODES, ALWAYS), ("ntasks", NODES, ALWAYS),
         ("cpus_per_task", SPN, ALWAYS)),
        "slots_per_trial/slots_per_node nodes with slots_per_node CPUs each; one container per node"),
    Row("slurm-gpu-nogres", GPU_SLOT_TYPES, False, False,
        (("min_nodes", NODES, ALWAYS), ("max_nodes", NODES, ALWAYS), ("ntasks", NODES, ALWAYS)),
        "slots_per_trial/slots_per_node nodes; the user must make sure they have slots_per_node GPUs "
        "(e.g. a resource pool of such nodes or a constraint)"),
    Row("slurm-aux", SLOT_TYPES, None, None,
        (("min_nodes", ONE, ALWAYS), ("max_nodes", ONE, ALWAYS), ("ntasks", ONE, ALWAYS)),
        "zero slots: an auxiliary task on one node of the aux resource pool, no dedicated GPUs/CPUs"),
)

# docs/requirements.md, "PBS resource calculations": select=<chunks>:<chunk resources>, one chunk
# per node.
PBS_TABLE: tuple[Row, ...] = (
    Row("pbs-gpu-gres", GPU_SLOT_TYPES, None, True, (("chunks", NODES, ALWAYS), ("ngpus", SPN, ALWAYS)),
        "slots_per_trial/slots_per_node chunks with ngpus=slots_per_node; one container per node"),
    Row("pbs-gpu-nogres", GPU_SLOT_TYPES, None, False, (("chunks", NODES, ALWAYS),),
        "slots_per_trial/slots_per_node chunks; the user must make sure they have slots_per_node "
        "GPUs and set CUDA_VISIBLE_DEVICES"),
    Row("pbs-cpu", ("cpu",), None, None, (("chunks", NODES, ALWAYS), ("ncpus", SPN, ALWAYS)),
        "slots_per_trial/slots_per_node chunks with ncpus=slots_per_node"),
    Row("pbs-aux", SLOT_TYPES, None, None, (("chunks", ONE, ALWAYS),),
        "zero slots: one chunk in the aux resource pool, no dedicated GPUs/CPUs"),
)

ROWS = {row.key: row for row in SLURM_TABLE + PBS_TABLE}
GPU_FIELDS = ("gpus", "gpus_per_task", "gpus_per_node", "ngpus")


@dataclass(frozen=True)
class SlurmResources:
    """What a Slurm row asks for; None: tether leaves it to the user or Slurm."""

    min_nodes: int
    max_nodes: int
    ntasks: int | None = None
    tasks_per_node: int | None = None
    cpus_per_task: int | None = None
    gpus: int | None = None            # --gpus (the job's)
    gpus_per_task: int | None = None   # --gpus-per-task
    gpus_per_node: int | None = None   # --gres=gpu:N
    gpu_type: str | None = None        # the gres type in all three

    @property
    def task_count(self) -> int | None:
        """Tasks of the job: ``ntasks``, or what sbatch derives from --gpus / --gpus-per-task."""
        if self.ntasks is not None:
            return self.ntasks
        if self.gpus and self.gpus_per_task:
            return self.gpus // self.gpus_per_task
        return None


@dataclass(frozen=True)
class PbsResources:
    """What a PBS row asks for: ``chunks`` identical chunks of ``chunk`` resources (tether's first,
    then the user's), one per host (``place`` is scatter plus the user's sharing/grouping)."""

    chunks: int
    chunk: tuple[tuple[str, str], ...]
    place: tuple[str, ...] = ("scatter",)


@dataclass(frozen=True)
class Plan:
    """What tether asks the scheduler for: the row's resources (``slurm`` or ``pbs``), the partition or
    queue, the WCKey/project, and ``notices`` for the user (replaced values, fallbacks).
    ``extra_args``: the partition override's and the user's other options that passed the policy,
    for a batch script's header (the job_submit plugin and the PBS hooks have none)."""

    scheduler: str
    row: str
    slot_type: str
    slots: int
    slots_per_node: int | None
    gpu_type: str | None
    partition: str | None
    project: str | None
    slurm: SlurmResources | None
    pbs: PbsResources | None
    extra_args: tuple[Arg, ...] = ()
    notices: tuple[str, ...] = ()

    @property
    def nodes(self) -> tuple[int, int]:
        """(minimum, maximum) nodes."""
        if self.slurm is not None:
            return self.slurm.min_nodes, self.slurm.max_nodes
        assert self.pbs is not None
        return self.pbs.chunks, self.pbs.chunks

    @property
    def gpus(self) -> int:
        """GPUs the plan asks the scheduler for: every slot on rows that request GPUs, else none."""
        return self.slots if any(f in GPU_FIELDS for f, _, _ in ROWS[self.row].sets) else 0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["extra_args"] = [[a.name, a.value] for a in self.extra_args]
        out["nodes"], out["gpus"] = list(self.nodes), self.gpus
        return out


def make_plan(request: Request, config: Config, scheduler: str) -> Plan:
    """Apply the resource tables and the option policy to ``request``; raise RequestError if invalid."""
    if scheduler not in SCHEDULERS:
        raise RequestError(f"unknown scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
    _validate(request)
    notices: list[str] = []

    partition = request.resource_pool or (
        config.default_compute_resource_pool if request.slots > 0 else config.default_aux_resource_pool)
    override = config.partition_override(partition)
    slot_type = request.slot_type or (override.slot_type if override else None) or config.slot_type
    gpu_type = request.gpu_type or (override.gpu_type if override else None)
    if scheduler == "pbs" and gpu_type:
        notices.append(f"{request.name_of('gpu_type')} {gpu_type!r} is ignored for PBS (ngpus has no "
                       f"type); choose GPU nodes with a resource pool or a chunk resource")
        gpu_type = None

    row = _select_row(scheduler, slot_type, request.slots, config, notices)
    typed = scheduler == "slurm" and any(f in GPU_FIELDS for f, _, _ in row.sets)
    if gpu_type and not typed:
        notices.append(f"{request.name_of('gpu_type')} {gpu_type!r} is not used: this job requests "
                       f"no typed GPUs (slot type {slot_type}, table row {row.key})")
    spn = _slots_per_node(request, row, notices)
    values = _fill(row, request.slots, spn)
    slurm = pbs = None
    if scheduler == "slurm":
        slurm = SlurmResources(**values, gpu_type=gpu_type if typed else None)
        extra = _slurm_extra(request, override, partition, [SLURM_FIELD_OPTIONS[f] for f in values])
    else:
        tether_chunk = tuple((name, str(values[name])) for name in ("ngpus", "ncpus") if name in values)
        merged = _pbs_merge(request, override, partition, slot_type, values["chunks"], tether_chunk)
        notices.extend(merged.notices)
        pbs = PbsResources(values["chunks"], tether_chunk + merged.chunk_resources,
                           ("scatter",) + merged.place_extra)
        extra = merged.args

    return Plan(
        scheduler=scheduler, row=row.key, slot_type=slot_type, slots=request.slots,
        slots_per_node=spn, gpu_type=gpu_type if typed else None, partition=partition,
        project=project_key(config.job_project_source, request), slurm=slurm, pbs=pbs,
        extra_args=extra, notices=tuple(notices),
    )


def _fill(row: Row, slots: int, spn: int | None) -> dict[str, int]:
    """The row's fields with their quantities for this request."""
    quantity = {SLOTS: slots, SPN: spn, NODES: slots // spn if spn else None, ONE: 1}
    return {name: quantity[q] for name, q, when in row.sets if when == ALWAYS or spn is not None}


def _validate(request: Request) -> None:
    def bad(key: str, value: object, accepted: str) -> RequestError:
        return RequestError(f"{request.name_of(key)}={value!r} is not valid; expected {accepted}")

    slots = request.slots
    if isinstance(slots, bool) or not isinstance(slots, int) or not 0 <= slots <= MAX_SLOTS:
        raise bad("slots", slots, f"an integer from 0 to {MAX_SLOTS}")
    spn = request.slots_per_node
    if spn is not None and (isinstance(spn, bool) or not isinstance(spn, int)
                            or not 1 <= spn <= MAX_SLOTS_PER_NODE):
        raise bad("slots_per_node", spn, f"an integer from 1 to {MAX_SLOTS_PER_NODE}")
    if request.slot_type is not None and request.slot_type not in SLOT_TYPES:
        raise bad("slot_type", request.slot_type, "one of " + ", ".join(SLOT_TYPES))
    for key, value in (("gpu_type", request.gpu_type), ("resource_pool", request.resource_pool)):
        if value is not None and not (isinstance(value, str) and _NAME(value)):
            raise bad(key, value, "a name of letters, digits, '.', '_', '-'")
    if not (isinstance(request.job_type, str) and _JOB_TYPE(request.job_type)):
        raise bad("job_type", request.job_type, "a word of letters, digits, '_', '.', '-'")
    if request.job_id is not None and not (isinstance(request.job_id, str)
                                           and _JOB_ID(request.job_id)):
        raise bad("job_id", request.job_id, "a word of letters, digits, '_', '.', '-'")


def _select_row(scheduler: str, slot_type: str, slots: int, config: Config,
                notices: list[str]) -> Row:
    table = SLURM_TABLE if scheduler == "slurm" else PBS_TABLE
    if slots == 0:
        return table[-1]
    tres, gres = config.tres_supported, config.gres_supported
    if scheduler == "slurm" and slot_type in GPU_SLOT_TYPES and tres and not gres:
        notices.append("tres_supported is true but gres_supported is false: GPUs cannot be requested "
                       "from Slurm, so tether falls back to --nodes/--ntasks only; make sure the "
                       "nodes have slots_per_node GPUs (resource pool or constraint)")
        tres = False
    for row in table[:-1]:
        if slot_type in row.slot_types and row.tres in (None, tres) and row.gres in (None, gres):
            return row
    raise AssertionError(f"no table row for {scheduler} {slot_type} tres={tres} gres={gres}")


def _slots_per_node(request: Request, row: Row, notices: list[str]) -> int | None:
    spn = request.slots_per_node
    slots = request.slots
    if slots == 0:
        if spn is not None:
            notices.append(f"{request.name_of('slots_per_node')} is ignored for a job with 0 slots "
                           f"(an auxiliary task runs on one node)")
        return None
    if spn is None:
        # Slurm with cons_tres and gres lets Slurm place the GPUs; every other row needs a per-node
        # count, and uses 1 as the PBS table does.
        return None if row.key == "slurm-gpu-tres-gres" else 1
    if spn > slots:
        raise RequestError(f"{request.name_of('slots_per_node')}={spn} is larger than "
                           f"{request.name_of('slots')}={slots}; use at most {slots}")
    if slots % spn:
        raise RequestError(f"{request.name_of('slots_per_node')}={spn} does not divide "
                           f"{request.name_of('slots')}={slots}; choose one of "
                           f"{_divisors_text(slots)}")
    return spn


def _divisors_text(n: int) -> str:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    divisors = sorted(set(small + [n // d for d in small]))
    if len(divisors) > 12:
        return ", ".join(map(str, divisors[:6])) + ", ..., " + ", ".join(map(str, divisors[-3:]))
    return ", ".join(map(str, divisors))


def project_key(source: str | None, request: Request) -> str | None:
    """The WCKey / PBS project for ``request`` per ``job_project_source`` (None when unset/empty)."""
    if source is None:
        return None
    if source.startswith("label"):
        prefix = source[len("label:"):] if source.startswith("label:") else ""
        picked = [label[len(prefix):] for label in request.labels if label.startswith(prefix)]
        value = ",".join(p for p in picked if p) or None
    else:
        value = {"project": request.project, "workspace": request.workspace,
                 "account": request.account, "user": request.user}[source]
    if value is not None and not _PROJECT(value):
        raise RequestError(f"job_project_source {source} gives {value!r}, which cannot be used as a "
                           f"WCKey/project (letters, digits, '_', '.', ':', ',', '-')")
    return value


def _pbs_merge(request: Request, override: PartitionOverride | None, partition: str | None,
               slot_type: str, chunks: int, tether_chunk: tuple[tuple[str, str], ...]) -> PbsMerge:
    """Merge the partition override's and then the user's PBS requests (the user's win)."""
    controlled = ("ngpus",) if slot_type in GPU_SLOT_TYPES else ("ncpus",)
    sources: list[tuple[PbsUserRequest, str]] = []
    if override is not None:
        sources.append((override.qsub, f"partition_overrides.{partition}.pbsbatch_args"))
    sources.append((request.qsub, request.name_of("scheduler_args")))
    merged = PbsMerge()
    for user, source in sources:
        merged = merged.then(merge_pbs_request(user, chunks=chunks, controlled_chunk=controlled,
                                               tether_chunk=tether_chunk, script=True, source=source))
    return merged


def _slurm_extra(request: Request, override: PartitionOverride | None, partition: str | None,
                 controlled: list[str]) -> tuple[Arg, ...]:
    """The partition override's and then the user's sbatch options that pass the policy."""
    if override is None and not request.sbatch_args:
        return ()                     # nothing to check (the job_submit handler's every request)
    extra: list[Arg] = []
    if override is not None:
        extra += check_slurm_args(override.sbatch_args, controlled, script=True,
                                  source=f"partition_overrides.{partition}.sbatch_args")
    extra += check_slurm_args(request.sbatch_args, controlled, script=True,
                              source=request.name_of("scheduler_args"))
    return tuple(extra)
