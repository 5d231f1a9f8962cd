"""The rank environment and MASTER_PORT, computed in one place (README: the rank environment).

What a tether task finds in its environment -- its rank, the step's sizes, the master's port, its
directories -- is computed here, from numbers the scheduler gives, without I/O. Every side takes it
from here: the PBS MoM hook (``pbs_hooks/mom.py``), the per-node launch scripts (their port rule,
``master_port_shell``, and names), the fake srun (``testing/slurm.py``). slurmstepd's C
(``spank/rankenv.c``) computes :func:`slurm_rank_env` again, without Python;
tests/unit/test_rankenv.py compiles it and compares the two over many steps and tasks. The names
are ``surface.RANK_ENV``'s (C: ``TETHER_ENV_<key>`` in the generated ``native/tether_names.h``).

What needs a lookup stays with its caller: MASTER_ADDR (Slurm's node table), the options the step
was given (``TETHER_JOB_*``, ``TETHER_CONTAINER_*``), SLURM_CPUS_PER_TASK.
"""

from __future__ import annotations

from collections import namedtuple

from .layout import RANK_PREFIX, RANK_TMP, RANK_WORK
from .surface import MASTER_PORT_BASE, MASTER_PORT_JOBS, MASTER_PORT_STEPS, RANK_VAR

# Slurm's step ids above the normal ones (slurm.h): the batch script, the extern step, ...
SLURM_MAX_NORMAL_STEP_ID = 0xFFFFFFF0
SLURM_BATCH_SCRIPT = 0xFFFFFFFB


def master_port(job: int, step: int | None = None) -> int:
    """The port every rank of step ``step`` of job ``job`` derives: base + (job mod jobs) * 16 +
    (step mod 16); 15 for Slurm's special steps (the batch script, ...); None: the job's own port
    (a launch script's, which starts one step per node), as step 0's."""
    if step is None:
        offset = 0
    elif step < SLURM_MAX_NORMAL_STEP_ID:
        offset = step % MASTER_PORT_STEPS
    else:
        offset = MASTER_PORT_STEPS - 1
    return MASTER_PORT_BASE + (job % MASTER_PORT_JOBS) * MASTER_PORT_STEPS + offset


def master_port_range() -> tuple[int, int]:
    """The lowest and the highest port :func:`master_port` gives (``tether doctor`` checks them
    against the node's ephemeral ports)."""
    return MASTER_PORT_BASE, MASTER_PORT_BASE + MASTER_PORT_JOBS * MASTER_PORT_STEPS - 1


def master_port_shell(job: str) -> str:
    """:func:`master_port` (the job's own) as shell arithmetic over ``job``, an expression that
    expands to the job's number (for the launch scripts, which learn the job's id when they run)."""
    return f"$(({MASTER_PORT_BASE} + {job} % {MASTER_PORT_JOBS} * {MASTER_PORT_STEPS}))"


def pbs_job_number(job_id: str) -> int:
    """The number of a PBS job id: the digits before the server's name (``12[3].srv`` -> 123)."""
    digits = "".join(c for c in str(job_id).split(".", 1)[0] if c in "0123456789")   # ASCII: "²".isdigit()
    return int(digits or "0")


def rank_env(*, rank: int | None = None, local_rank: int | None = None, node_rank: int | None = None,
             world_size: int | None = None, local_world_size: int | None = None, nnodes: int | None = None,
             master_addr: str | None = None, master_port: int | None = None, job_dir: str | None = None,
             step_dir: str | None = None, rank_dir: str | None = None, tmpdir: bool = True) -> dict[str, str]:
    """The rank environment's variables for the values given (those left None are not set). A rank
    directory gives TETHER_RANK_DIR, TETHER_WORK_DIR and, with ``tmpdir``, TMPDIR (PBS's MoM sets
    its own TMPDIR)."""
    values = {"RANK": rank, "LOCAL_RANK": local_rank, "NODE_RANK": node_rank, "WORLD_SIZE": world_size,
              "LOCAL_WORLD_SIZE": local_world_size, "TETHER_NNODES": nnodes, "MASTER_ADDR": master_addr,
              "MASTER_PORT": master_port, "TETHER_JOB_DIR": job_dir, "TETHER_STEP_DIR": step_dir,
              "TETHER_RANK_DIR": rank_dir}
    if rank_dir is not None:
        values["TETHER_WORK_DIR"] = f"{rank_dir}/{RANK_WORK}"
        if tmpdir:
            values["TMPDIR"] = f"{rank_dir}/{RANK_TMP}"
    return {RANK_VAR[key]: str(value) for key, value in values.items() if value is not None}


# Plain named tuples, not dataclasses: `dataclasses` imports `inspect`, ~13 ms at every PBS MoM
# hook event, which imports this module
class SlurmStep(namedtuple("SlurmStep", "job_id step_id ntasks nlocal nnodes job_dir step_dir het",
                           defaults=(None,))):
    """What slurmstepd knows of a step on its node: ids, Slurm's counts (for the batch script as
    Slurm gives them), the directories, and for a component of a heterogeneous step (``srun
    --het-group=0,1``) its index, the components' number and the job's first id (``het``)."""
    __slots__ = ()

    @property
    def batch(self) -> bool:
        return self.step_id == SLURM_BATCH_SCRIPT


class SlurmTask(namedtuple("SlurmTask", "global_id local_id node_id procid ntasks node_index nnodes slot_type gpus",
                           defaults=(-1, -1, -1, -1, None, None))):
    """One task: Slurm's ids of it (S_TASK_GLOBAL_ID, S_TASK_ID, S_JOB_NODEID); in a heterogeneous
    step the whole step's numbers from its environment (SLURM_PROCID, SLURM_NTASKS, SLURM_NODEID,
    SLURM_STEP_NUM_NODES; -1 when missing); its slot type and its CUDA_VISIBLE_DEVICES (None: unset)."""
    __slots__ = ()


def slurm_step_env(step: SlurmStep) -> dict[str, str]:
    """What slurmstepd sets for the whole step on its node (user_init), before any task starts."""
    ntasks, nlocal, nnodes = (1, 1, 1) if step.batch else (step.ntasks, step.nlocal, step.nnodes)
    port_job = step.job_id
    values: dict[str, str] = {}
    if step.het is not None:        # one world across the components: the job's first id's port
        component, components, port_job = step.het
        values.update({RANK_VAR["TETHER_HET_COMPONENT"]: str(component),
                       RANK_VAR["TETHER_HET_COMPONENTS"]: str(components),
                       RANK_VAR["TETHER_HET_SIZE"]: str(ntasks)})
    values.update(rank_env(job_dir=step.job_dir, step_dir=step.step_dir, world_size=ntasks,
                           local_world_size=nlocal, nnodes=nnodes, master_port=master_port(port_job, step.step_id)))
    return values


def slurm_task_env(step: SlurmStep, task: SlurmTask) -> dict[str, str]:
    """What slurmstepd sets for one task (task_init), over the step's part. The rank directory is
    named by Slurm's id of the task in its component; in a heterogeneous step RANK, WORLD_SIZE,
    NODE_RANK and TETHER_NNODES are the whole step's."""
    rank, node = (0, 0) if step.batch else (task.global_id, task.node_id)
    rank_dir = f"{step.step_dir}/{RANK_PREFIX}{rank}"
    values: dict[str, str] = {}
    if (step.het is not None and task.procid >= rank and task.ntasks > task.procid and task.node_index >= 0
            and task.nnodes > task.node_index):
        values.update({RANK_VAR["TETHER_HET_OFFSET"]: str(task.procid - rank)})
        values.update(rank_env(world_size=task.ntasks, nnodes=task.nnodes))
        rank, node = task.procid, task.node_index
    values.update(rank_env(rank=rank, local_rank=task.local_id, node_rank=node, rank_dir=rank_dir))
    if task.gpus is not None and task.slot_type != "cpu":        # the slots: the GPUs Slurm bound
        values[RANK_VAR["TETHER_SLOT_IDS"]] = task.gpus
        if task.slot_type == "rocm":
            values[RANK_VAR["ROCR_VISIBLE_DEVICES"]] = task.gpus
    return values


def slurm_rank_env(step: SlurmStep, task: SlurmTask) -> dict[str, str]:
    """The rank environment slurmstepd gives ``task`` of ``step`` (but MASTER_ADDR and the options)."""
    return {**slurm_step_env(step), **slurm_task_env(step, task)}
