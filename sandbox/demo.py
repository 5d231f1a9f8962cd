"""``tether demo``: the main job on the built-in defaults, end to end on the sandbox cluster.

The sandbox builds and installs tether's Slurm plugins exactly as an admin does (``tether slurm
build`` / ``tether slurm install --write``). The demo then submits, as the unprivileged demo user,
an ordinary ``sbatch --slots=6 --slots-per-node=2 --slot-type=cpu --container-image=IMAGE`` job,
IMAGE being a busybox image in the sandbox's own registry: the SPANK plugin carries the options to
slurmctld, the job_submit plugin turns them into the resource request of the tables (3 nodes, 2 CPU
slots each), the batch script runs on the host, and its ``srun`` starts one container per rank --
the image pulled once per node -- in which each rank prints what it got. (CPU slots, so the
output shows every node's CPUs; GPU slots in containers are in the tests.)
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path

from .cluster import Sandbox

DEMO_OPTIONS = ["--slots=6", "--slots-per-node=2", "--slot-type=cpu", "--time=5"]
DEMO_BODY = r"""#!/bin/bash
echo "job $SLURM_JOB_ID: $SLURM_JOB_NUM_NODES nodes ($SLURM_JOB_NODELIST), $SLURM_NTASKS tasks, image $TETHER_CONTAINER_IMAGE"
srun --label sh -c 'echo "node=$SLURMD_NODENAME rank=$RANK of $WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT uid=$(id -u) cpus=$(nproc) TMPDIR=$TMPDIR in=$(test -e /etc/debian_version && echo host || echo container)"'
"""
SHOWN_FIELDS = ("NumNodes", "NumTasks", "CPUs/Task", "TresPerJob", "TresPerNode", "TresPerTask", "Partition",
                "WCKey", "Requeue")


@dataclass(frozen=True)
class Submitted:
    """A batch job: its id, sbatch's exit status (waited for: the job's, as ``sbatch --wait`` gives
    it), where its output went, sbatch's stderr."""

    job_id: str
    returncode: int
    job_dir: Path
    stderr: str

    def output(self, name: str = "job.out") -> str:
        path = self.job_dir / name
        return path.read_text() if path.exists() else ""


def make_job_dir(path: Path, user: str) -> Path:
    """Create a directory for one job's script and output, owned by the job user (mode 0700)."""
    account = pwd.getpwnam(user)
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    path.mkdir(mode=0o700)
    os.chown(path, account.pw_uid, account.pw_gid)
    return path


def sbatch(box: Sandbox, job_dir: Path, argv: list[str], timeout: float, *, wait: bool = False) -> Submitted:
    """``sbatch --parsable ARGV`` as the sandbox's job user, from ``job_dir``. ``wait``: then until
    the job has ended, and ``returncode`` is its exit status as ``sbatch --wait`` gives it
    (Sandbox.wait_for_job: seen within 0.2 s of the end, where sbatch --wait looks after 2, 10, 42 s)."""
    result = box.slurm(["runuser", "-u", box.user, "--", "sbatch", "--parsable", *argv],
                       cwd=str(job_dir), check=False, timeout=60)
    out = result.stdout.strip()
    job_id = out.split(";")[0].splitlines()[0] if out else ""
    code = result.returncode
    if wait and code == 0 and job_id:
        code = box.wait_for_job(job_id, timeout=timeout)
    return Submitted(job_id, code, job_dir, result.stderr)


def run_demo(box: Sandbox, *, install: bool = True, log=print) -> int:
    """Bring the sandbox up, run the demo job, print what it got; returns sbatch's exit status."""
    box.up(install=install, log=log)
    job_dir = make_job_dir(box.work_dir / f"demo-{os.getpid()}-{os.urandom(3).hex()}", box.user)
    script = job_dir / "demo.sh"
    script.write_text(DEMO_BODY)
    os.chmod(script, 0o755)
    image = box.registry_image(log=log)
    argv = [*DEMO_OPTIONS, f"--container-image={image}", f"--output={job_dir}/job.out", str(script)]
    log(f"as {box.user}: sbatch {' '.join(argv)}")
    job = sbatch(box, job_dir, argv, timeout=300, wait=True)
    if job.returncode != 0 and not job.job_id:
        log(f"sbatch failed (exit {job.returncode}): {job.stderr.strip()}")
        return job.returncode
    if job.returncode != 0:
        log(f"job {job.job_id} failed (exit {job.returncode}); its output ({job_dir}/job.out):")
        print(job.output(), end="")
        return job.returncode
    shown = [f"{key}={value}" for key, value in box.job_records(job.job_id)[0].items() if key in SHOWN_FIELDS]
    log(f"job {job.job_id} as planned by tether's job_submit plugin: {' '.join(shown)}")
    print(job.output(), end="")
    return 0
