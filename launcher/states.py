"""One state model for a launcher job, mapped from what Slurm and PBS say.

PREPARING (the tree is being made; not submitted yet) -> PENDING -> RUNNING -> COMPLETED | FAILED |
CANCELLED | TIMEOUT; UNKNOWN when the scheduler no longer knows the job (purged from its records).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..system.proc import CommandError, run_command

STATES = ("PREPARING", "PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "UNKNOWN")
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})

# Slurm's job states (squeue %T, sacct State, scontrol JobState) -> the model
SLURM_STATES = {
    "PENDING": "PENDING", "REQUEUED": "PENDING", "REQUEUE_FED": "PENDING", "REQUEUE_HOLD": "PENDING",
    "RESV_DEL_HOLD": "PENDING", "CONFIGURING": "PENDING", "RESIZING": "RUNNING", "RUNNING": "RUNNING",
    "COMPLETING": "RUNNING", "SUSPENDED": "RUNNING", "STOPPED": "RUNNING", "SIGNALING": "RUNNING",
    "STAGE_OUT": "RUNNING", "COMPLETED": "COMPLETED", "CANCELLED": "CANCELLED", "TIMEOUT": "TIMEOUT",
    "DEADLINE": "TIMEOUT", "FAILED": "FAILED", "NODE_FAIL": "FAILED", "BOOT_FAIL": "FAILED",
    "OUT_OF_MEMORY": "FAILED", "PREEMPTED": "FAILED", "SPECIAL_EXIT": "FAILED", "REVOKED": "CANCELLED",
}
# OpenPBS job_state letters (qstat -f): F (finished) is decided by Exit_status
PBS_STATES = {"Q": "PENDING", "H": "PENDING", "W": "PENDING", "T": "PENDING", "S": "RUNNING", "U": "RUNNING",
              "R": "RUNNING", "E": "RUNNING", "B": "RUNNING", "X": "COMPLETED", "M": "PENDING"}
PBS_CANCELLED = (271, -3)        # JOB_EXEC_KILL (qdel of a running job: 256+15); never ran (qdel of a queued job)
PBS_TIMEOUT = (-29, -25, -24)    # JOB_EXEC_KILL_WALLTIME, _CPUT, _MEM: limits (src/include/job.h)


@dataclass(frozen=True)
class JobState:
    state: str
    exit_code: int | None = None
    reason: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def _exit(text: str) -> int | None:
    """Slurm's ExitCode ``code:signal`` -> the code (128+signal when a signal ended it)."""
    code, _, sig = text.partition(":")
    if not code.strip().isdigit():
        return None
    return 128 + int(sig) if sig.strip().isdigit() and int(sig) else int(code)


def slurm_job_state(job_id: str, env: Mapping[str, str] | None = None) -> JobState:
    """squeue while Slurm has the job in memory; sacct for the end (the accounting record); scontrol
    when there is no accounting; UNKNOWN when none knows it."""
    try:
        out = run_command(["squeue", "-h", "-j", job_id, "-o", "%T|%r"], env=env, timeout=30, check=False)
        line = out.stdout.strip().splitlines()[:1]
        if out.returncode == 0 and line:
            state, _, reason = line[0].partition("|")
            mapped = SLURM_STATES.get(state, "UNKNOWN")
            if mapped not in ENDED:
                return JobState(mapped, None, "" if reason in ("None", "") else reason)
        out = run_command(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"], env=env, timeout=30,
                          check=False)
        line = out.stdout.strip().splitlines()[:1]
        if out.returncode == 0 and line:
            state, _, code = line[0].partition("|")
            return JobState(SLURM_STATES.get(state.split()[0], "UNKNOWN") if state else "UNKNOWN", _exit(code))
        out = run_command(["scontrol", "-o", "show", "job", job_id], env=env, timeout=30, check=False)
        if out.returncode == 0:
            fields = dict(w.split("=", 1) for w in out.stdout.split() if "=" in w)
            return JobState(SLURM_STATES.get(fields.get("JobState", ""), "UNKNOWN"), _exit(fields.get("ExitCode", "")),
                            fields.get("Reason", "") if fields.get("Reason") != "None" else "")
    except CommandError as exc:
        return JobState("UNKNOWN", None, str(exc))
    return JobState("UNKNOWN", None, "neither squeue, sacct nor scontrol knows the job")


def pbs_job_state(job_id: str, env: Mapping[str, str] | None = None) -> JobState:
    """``qstat -f -F json -x`` (finished jobs too, while the server keeps their history), read by
    tether's one PBS client (pbs_hooks.commands: it repairs what OpenPBS's clients print)."""
    from ..pbs_hooks.commands import PBSCommandError, job_status

    try:
        jobs = job_status([job_id], history=True, timeout=30, env=env)
    except PBSCommandError as exc:
        return JobState("UNKNOWN", None, str(exc))
    job = next(iter(jobs.values()), None)
    if job is None:
        return JobState("UNKNOWN")
    return pbs_state(job)


def pbs_state(job) -> JobState:
    """One job of ``pbs_hooks.commands.job_status`` as tether's states: a finished job (F) is
    COMPLETED, CANCELLED, TIMEOUT or FAILED by its Exit_status (the launcher and workflow packs)."""
    letter, code = job.state_code, job.exit_status
    if letter != "F":
        return JobState(PBS_STATES.get(letter, "UNKNOWN"), None, job.comment)
    if code == 0:
        return JobState("COMPLETED", 0)
    if code in PBS_CANCELLED:
        return JobState("CANCELLED", code)
    if code in PBS_TIMEOUT:
        return JobState("TIMEOUT", code)
    return JobState("FAILED", code)
