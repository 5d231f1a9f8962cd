"""The layout under ``job_storage_root``, in one place (the C side's names come from here too).

Seed 000: per-job files and per-rank local directories live under the cluster-wide
``job_storage_root`` and are removed when the job ends. tether keeps one tree per scheduler job,
named by the job's id -- never by anything the job's user controls (a name or the environment),
because root creates and removes it::

    <job_storage_root>/                                 root-owned, 0755 (checked on every use)
      <job id>/                                         TETHER_JOB_DIR: created by root for the job
                                                        user (0700) when the job starts on a node,
                                                        removed when it ends
        <node>/step-<step id>/rank-<rank>/tmp|work      Slurm: TMPDIR and TETHER_WORK_DIR of a rank
        <node>/step-<step id>/.cleanup-<rank>           a container launcher's unfinished cleanup
        <host>/task-<task number>/rank-<rank>/tmp|work  PBS: a TM task's rank directories

``<job id>`` is Slurm's job id, or PBS's with array brackets made safe (``12[3].srv`` ->
``12_3_.srv``); ``<node>`` is the Slurm node name (slurmd's own, not the job's environment) or the
PBS host; ``<step id>`` is the step number, or ``batch``, ``extern``, ``interactive``.
"""

from __future__ import annotations

NODE_STEP_PREFIX = "step-"
TASK_PREFIX = "task-"
RANK_PREFIX = "rank-"
RANK_TMP = "tmp"
RANK_WORK = "work"
CLEANUP_MARKER = ".cleanup-"


def job_dir_name(job_id: str) -> str:
    """The job's directory name: its id with anything but letters, digits, ``.``, ``_``, ``-``
    made ``_`` (PBS array ids: ``12[3].srv`` -> ``12_3_.srv``)."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in str(job_id))


def step_dir_name(step: str) -> str:
    """``step-0``, ``step-batch``, ... (Slurm)."""
    return NODE_STEP_PREFIX + step


def rank_dir_name(rank: int | str) -> str:
    return f"{RANK_PREFIX}{rank}"
