"""Request -> Plan: the seed's resource tables, pure and I/O-free.

Source of truth: seed 000, "Slurm Resource Calculations" and "PBS Resource Calculations". Each table
row below is the seed's row written as data: which slot types and cluster capabilities select it,
and the options it produces. ``{gpu}`` is ``<gpu_type>:`` when a GPU type is set, ``{slots}`` is
slots_per_trial, ``{spn}`` slots_per_node and ``{nodes}`` slots_per_trial / slots_per_node. An option
marked ``SPN`` is emitted only when slots_per_node is known (the seed: "If slots_per_node is
specified, it is added as --gpus-per-task").

One deliberate difference from the seed's first row: ``--tasks-per-node=1`` is emitted only together
with ``--gpus-per-task``. Without slots_per_node, Slurm 22.05 refuses ``--gpus=6 --nodes=1-6
--tasks-per-node=1`` on 4-GPU nodes ("Requested node configuration is not available": it derives one
task from the minimum node count), while ``--gpus=6 --nodes=1-6`` gets 2 nodes with one task each --
which is what the seed's row describes ("Slurm determines the number of nodes necessary to allocate
the requested GPUs. One container is started per node.").

The Plan is the single source of truth: the job_submit plugin, the PBS hooks, generated batch
scripts and ``tether plan`` all render the same Plan.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from .config import Config
from .errors import RequestError
from .policy import (
    PbsMerge, check_slurm_args, merge_pbs_args, parse_qsub_args, parse_sbatch_args,
)
from .request import (
    GPU_SLOT_TYPES, JOB_ID_PATTERN, JOB_TYPE_PATTERN, MAX_SLOTS, MAX_SLOTS_PER_NODE, SCHEDULERS,
    SLOT_TYPES, Request,
)
from .schema import NAME_PATTERN

JOB_NAME_PREFIX = "tether_"
PROJECT_PATTERN = r"[A-Za-z0-9_.:,-]{1,255}"

Option = tuple[str, "str | None"]
ALWAYS, SPN = "always", "slots_per_node given"


@dataclass(frozen=True)
class Row:
    """One row of a seed resource table."""

    key: str
    slot_types: tuple[str, ...]
    tres: bool | None          # None: not applicable (n/a in the seed)
    gres: bool | None
    options: tuple[tuple[str, str, str], ...]  # Slurm: (option, template, when); PBS: (resource, template, when)
    seed: str                  # the seed's description of the row


# Seed 000, "Slurm Resource Calculations". Zero slots (an auxiliary task) is tether's extra row.
SLURM_TABLE: tuple[Row, ...] = (
    Row("slurm-gpu-tres-gres", GPU_SLOT_TYPES, True, True,
        (("--gpus", "{gpu}{slots}", ALWAYS), ("--nodes", "1-{slots}", ALWAYS),
         ("--tasks-per-node", "1", SPN), ("--gpus-per-task", "{gpu}{spn}", SPN)),
        "Slurm determines the number of nodes necessary to allocate the requested GPUs; one "
        "container per node; slots_per_node, if given, becomes --gpus-per-task"),
    Row("slurm-gpu-gres", GPU_SLOT_TYPES, False, True,
        (("--nodes", "{nodes}", ALWAYS), ("--ntasks", "{nodes}", ALWAYS), ("--gres", "gpu:{gpu}{spn}", ALWAYS)),
        "slots_per_trial/slots_per_node nodes with slots_per_node GPUs each; one container per node"),
    Row("slurm-cpu", ("cpu",), None, None,
        (("--nodes", "{nodes}", ALWAYS), ("--ntasks", "{nodes}", ALWAYS), ("--cpus-per-task", "{spn}", ALWAYS)),
        "slots_per_trial/slots_per_node nodes with slots_per_node CPUs each; one container per node"),
    Row("slurm-gpu-nogres", GPU_SLOT_TYPES, False, False,
        (("--nodes", "{nodes}", ALWAYS), ("--ntasks", "{nodes}", ALWAYS)),
        "slots_per_trial/slots_per_node nodes; the user must make sure they have slots_per_node GPUs "
        "(e.g. a resource pool of such nodes or a constraint)"),
    Row("slurm-aux", SLOT_TYPES, None, None,
        (("--nodes", "1", ALWAYS), ("--ntasks", "1", ALWAYS)),
        "zero slots: an auxiliary task on one node of the aux resource pool, no dedicated GPUs/CPUs"),
)

# Seed 000, "PBS Resource Calculations": select=<chunks>:<chunk resources>.
PBS_TABLE: tuple[Row, ...] = (
    Row("pbs-gpu-gres", GPU_SLOT_TYPES, None, True, (("ngpus", "{spn}", ALWAYS),),
        "slots_per_trial/slots_per_node chunks with ngpus=slots_per_node; one container per node"),
    Row("pbs-gpu-nogres", GPU_SLOT_TYPES, None, False, (),
        "slots_per_trial/slots_per_node chunks; the user must make sure they have slots_per_node "
        "GPUs and set CUDA_VISIBLE_DEVICES"),
    Row("pbs-cpu", ("cpu",), None, None, (("ncpus", "{spn}", ALWAYS),),
        "slots_per_trial/slots_per_node chunks with ncpus=slots_per_node"),
    Row("pbs-aux", SLOT_TYPES, None, None, (),
        "zero slots: one chunk in the aux resource pool, no dedicated GPUs/CPUs"),
)

ROWS = {row.key: row for row in SLURM_TABLE + PBS_TABLE}


@dataclass(frozen=True)
class Plan:
    """What tether asks the scheduler for. ``resources`` are the table's options for this request;
    ``common`` the options tether owns in its batch scripts; ``extra`` the admin's and user's
    options that passed the policy; ``notices`` are for the user (replaced values, fallbacks)."""

    scheduler: str
    row: str
    slot_type: str
    slots: int
    slots_per_node: int | None
    min_nodes: int
    max_nodes: int
    tasks_per_node: int
    gpus: int
    gpu_type: str | None
    partition: str | None
    project: str | None
    job_name: str
    log_dir: str
    resources: tuple[Option, ...]
    common: tuple[Option, ...]
    extra: tuple[Option, ...]
    notices: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("resources", "common", "extra"):
            out[key] = [list(o) for o in out[key]]
        out["notices"] = list(self.notices)
        return out


def make_plan(request: Request, config: Config, scheduler: str) -> Plan:
    """Apply the seed's tables and the option policy to ``request``; raise RequestError if invalid."""
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
    uses_gpu_type = any("{gpu}" in tmpl for _, tmpl, _ in row.options)
    if gpu_type and not uses_gpu_type:
        notices.append(f"{request.name_of('gpu_type')} {gpu_type!r} is not used: this job requests "
                       f"no typed GPUs (slot type {slot_type}, table row {row.key})")
    spn = _slots_per_node(request, row, notices)
    nodes = request.slots // spn if spn else None
    values = {"slots": request.slots, "spn": spn, "nodes": nodes,
              "gpu": f"{gpu_type}:" if gpu_type else ""}

    job_name = _job_name(request)
    project = project_key(config.job_project_source, request)
    log_dir = f"{config.job_storage_root.rstrip('/')}/{job_name}"

    if scheduler == "slurm":
        resources = tuple((opt, _fill(tmpl, values)) for opt, tmpl, when in row.options
                          if when == ALWAYS or spn is not None)
        extra = _slurm_extra(request, override, partition, [o for o, _ in resources])
        common = _slurm_common(job_name, partition, project, log_dir)
        min_nodes, max_nodes = _node_range(dict(resources)["--nodes"])
    else:
        chunks = nodes if nodes else 1
        tether_chunk = tuple((res, _fill(tmpl, values)) for res, tmpl, _ in row.options)
        merge = _pbs_merge(request, override, partition, slot_type, chunks, tether_chunk)
        notices.extend(merge.notices)
        chunk = ":".join([str(chunks)] + [f"{k}={v}" for k, v in tether_chunk + merge.chunk_resources])
        place = ":".join(("scatter",) + merge.place_extra)
        resources = (("-l", f"select={chunk}"), ("-l", f"place={place}"))
        extra = tuple((a.name, a.value) for a in merge.args)
        common = _pbs_common(job_name, partition, project, log_dir)
        min_nodes = max_nodes = chunks

    return Plan(
        scheduler=scheduler, row=row.key, slot_type=slot_type, slots=request.slots,
        slots_per_node=spn, min_nodes=min_nodes, max_nodes=max_nodes, tasks_per_node=1,
        gpus=requested_gpus(row, request.slots), gpu_type=gpu_type if uses_gpu_type else None,
        partition=partition, project=project, job_name=job_name, log_dir=log_dir,
        resources=resources, common=common, extra=extra, notices=tuple(notices),
    )


def requested_gpus(row: Row, slots: int) -> int:
    """GPUs the plan asks the scheduler for: all slots on rows that request GPUs, else none."""
    return slots if any(opt in ("--gpus", "--gres", "ngpus") for opt, _, _ in row.options) else 0


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
        if value is not None and not (isinstance(value, str) and re.fullmatch(NAME_PATTERN, value)):
            raise bad(key, value, "a name of letters, digits, '.', '_', '-'")
    if not (isinstance(request.job_type, str) and re.fullmatch(JOB_TYPE_PATTERN, request.job_type)):
        raise bad("job_type", request.job_type, "a word of letters, digits, '_', '.', '-'")
    if request.job_id is not None and not (isinstance(request.job_id, str)
                                           and re.fullmatch(JOB_ID_PATTERN, request.job_id)):
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
        # count, and uses 1 as the seed's PBS table does.
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


def _fill(template: str, values: dict[str, Any]) -> str:
    return template.format(**values)


def _node_range(value: str) -> tuple[int, int]:
    lo, _, hi = value.partition("-")
    return int(lo), int(hi or lo)


def _job_name(request: Request) -> str:
    job_id = request.job_id or hashlib.sha256(repr(request).encode()).hexdigest()[:16]
    return f"{JOB_NAME_PREFIX}{request.job_type}-{job_id}"


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
    if value is not None and not re.fullmatch(PROJECT_PATTERN, value):
        raise RequestError(f"job_project_source {source} gives {value!r}, which cannot be used as a "
                           f"WCKey/project (letters, digits, '_', '.', ':', ',', '-')")
    return value


def _slurm_common(job_name: str, partition: str | None, project: str | None,
                  log_dir: str) -> tuple[Option, ...]:
    common: list[Option] = [("--job-name", job_name)]
    if partition:
        common.append(("--partition", partition))
    if project:
        common.append(("--wckey", project))
    common += [("--no-requeue", None), ("--output", f"{log_dir}/job.out"),
               ("--error", f"{log_dir}/job.err")]
    return tuple(common)


def _slurm_extra(request: Request, override: Any, partition: str | None,
                 generated: list[str]) -> tuple[Option, ...]:
    extra: list[Option] = []
    sources = []
    if override is not None and override.sbatch_args:
        sources.append((override.sbatch_args, f"partition_overrides.{partition}.sbatch_args"))
    if request.scheduler_args:
        sources.append((request.scheduler_args, request.name_of("scheduler_args")))
    for args, source in sources:
        parsed = parse_sbatch_args(args)
        extra += [(a.name, a.value) for a in check_slurm_args(parsed, generated, script=True,
                                                              source=source)]
    return tuple(extra)


def _pbs_merge(request: Request, override: Any, partition: str | None, slot_type: str, chunks: int,
               tether_chunk: tuple[tuple[str, str], ...]) -> PbsMerge:
    """Merge the partition override's and then the user's qsub options (the user's win)."""
    controlled = ("ngpus",) if slot_type in GPU_SLOT_TYPES else ("ncpus",)
    sources = []
    if override is not None and override.pbsbatch_args:
        sources.append((override.pbsbatch_args, f"partition_overrides.{partition}.pbsbatch_args"))
    sources.append((request.scheduler_args, request.name_of("scheduler_args")))
    merged = PbsMerge((), (), (), ())
    for args, source in sources:
        part = merge_pbs_args(parse_qsub_args(args), chunks=chunks, controlled_chunk=controlled,
                              tether_chunk=tether_chunk, script=True, source=source)
        merged = PbsMerge(tuple({**dict(merged.chunk_resources), **dict(part.chunk_resources)}.items()),
                          tuple(dict.fromkeys(merged.place_extra + part.place_extra)),
                          merged.args + part.args, merged.notices + part.notices)
    return merged


def _pbs_common(job_name: str, queue: str | None, project: str | None,
                log_dir: str) -> tuple[Option, ...]:
    common: list[Option] = [("-N", job_name)]
    if queue:
        common.append(("-q", queue))
    common += [("-e", f"{log_dir}/job.err"), ("-o", f"{log_dir}/job.out"), ("-V", None),
               ("-r", "n"), ("-W", "umask=0022")]
    if project:
        common.append(("-P", project))
    return tuple(common)
