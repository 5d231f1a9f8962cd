"""The layout under ``job_storage_root``, in one place (the C side's names come from here too).

docs/requirements.md, "Job directories": per-job files and per-rank local directories live under
the cluster-wide ``job_storage_root`` and are removed when the job ends. tether keeps one tree per
scheduler job, named by the job's id -- never by anything the job's user controls (a name or the environment),
because root creates and removes it::

    <job_storage_root>/                                 root-owned, 0755 (checked on every use)
      <job id>/                                         TETHER_JOB_DIR: created by root for the job
                                                        user (0700) when the job starts on a node,
                                                        removed when it ends
        <node>/step-<step id>/rank-<rank>/tmp|work      Slurm: TMPDIR and TETHER_WORK_DIR of a rank
        <node>/step-<step id>/.cleanup-<rank>           a container launcher's unfinished cleanup
        <node>/step-<step id>/.cleanup-pod              the step's pod on the node (--container-unshare),
                                                        with .pod-ranks/<rank> and .pod-lock
        <node>/step-<step id>/.failed-<hash>            a pull or import that failed for the step here
        <node>/step-<step id>/enroot/                   enroot's data, cache, conf scripts and locks for
                                                        the step (a container step: root binds it onto
                                                        itself while the step runs, STEP_ENROOT)
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
# enroot's directory in a container step's directory (its data and cache paths, the conf scripts,
# the locks): root binds it onto itself as the step starts (spank/stepd.c: bind_enroot_dir), so
# that enroot's walk up to the nearest mount point stops there
STEP_ENROOT = "enroot"
# Where the per-rank directories appear inside every container, whatever the runtime.
CONTAINER_TMP = "/tmp"
CONTAINER_WORKDIR = "/run/tether/workdir"
# --container-batch: where the batch script appears inside (under /run: a tmpfs podman mounts in a
# read-only container, so any image takes it, and no path of the host's spool in the image)
CONTAINER_BATCH_SCRIPT = "/run/tether/batch-script"
# tether's own mount points in a container, and what each is: no --container-mounts target may be
# one, or hold one (/run, /run/tether: the user's mounts go over tether's, and would hide them) --
# reserved_target() (the C shim's check of plain bind mounts, job_submit/cache.c, reads them from
# tether_names.h)
RESERVED = {"/": "the container's root", CONTAINER_TMP: "the rank's /tmp",
            CONTAINER_WORKDIR: "the rank's work directory", CONTAINER_BATCH_SCRIPT: "the batch script"}
RESERVED_TARGETS = tuple(RESERVED)
CLEANUP_MARKER = ".cleanup-"
POD_MARKER = CLEANUP_MARKER + "pod"   # a step's pod on the node (--container-unshare), beside the ranks' markers
FAILED_PREFIX = ".failed-"            # a step's preparation that failed on the node (container.launch.run_before)

# Each user's own directories on each node, ``<base>/<uid>`` (the user's, 0700), made by root for
# the user -- slurmstepd for a container step, the PBS MoM hook for a container task -- in bases
# that only root writes: a directory a user makes in a shared place (/var/tmp, /tmp) can be made
# first by another user, who then denies or changes this user's containers. No path here comes
# from the job's environment (a login node's XDG_RUNTIME_DIR means nothing on a compute node).
USER_RUN_ROOT = "/run/tether"            # <uid>: rootless podman's run state (a tmpfs, emptied at boot)
USER_STORE_ROOT = "/var/lib/tether/users"  # <uid>/podman, <uid>/enroot: the default image stores


def user_run_dir(uid: int) -> str:
    """This user's run directory on the node (root's: podman's own, /run)."""
    return "/run" if uid == 0 else f"{USER_RUN_ROOT}/{uid}"


def user_dir_base(template: str) -> str | None:
    """The base under which root makes the user's directory for a store ``template``: the path
    above its ``/{uid}/`` component; None when ``{uid}`` is not a whole component (a store the
    user makes on their own, e.g. ``/var/tmp/tether-podman-{uid}``)."""
    head, sep, tail = template.partition("/{uid}")
    if not sep or not head.startswith("/") or (tail and not tail.startswith("/")) or "{uid}" in tail:
        return None
    return head


def user_dir_bases(store_templates) -> list[str]:
    """Every base root makes users' directories in (``user_dirs=`` of plugstack.conf): the run
    directory's and each store template's, in order, once each."""
    bases = [USER_RUN_ROOT]
    for template in store_templates:
        base = user_dir_base(template or "")
        if base and base not in bases:
            bases.append(base)
    return bases


def job_dir_name(job_id: str) -> str:
    """The job's directory name: its id with anything but letters, digits, ``.``, ``_``, ``-``
    made ``_`` (PBS array ids: ``12[3].srv`` -> ``12_3_.srv``)."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in str(job_id))


def step_dir_name(step: str) -> str:
    """``step-0``, ``step-batch``, ... (Slurm)."""
    return NODE_STEP_PREFIX + step


def rank_dir_name(rank: int | str) -> str:
    return f"{RANK_PREFIX}{rank}"


def reserved_target(path: str) -> str | None:
    """The mount point of tether's (RESERVED) that container path ``path`` (normalized:
    spec.container_path's) is, or holds; None when neither."""
    if path in RESERVED:
        return path
    return next((r for r in RESERVED if r.startswith(path + "/")), None)
