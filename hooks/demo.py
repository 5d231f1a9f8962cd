"""``tether demo``: the main job on the built-in defaults, end to end on the sandbox cluster.

It plans a 3-node GPU job from a job spec exactly as tether's generated batch scripts do (the
seed's architecture: a directory per job under job_storage_root, owned by the job user; a batch
script whose header is the Plan), submits it with ``sbatch --wait`` as the unprivileged demo user,
and prints what each rank saw. Later issues grow this into a containerized job.
"""

from __future__ import annotations

import os
import pwd
import time
from dataclasses import dataclass
from pathlib import Path

from .config import Config, validate_config
from .plan import Plan, make_plan
from .proc import run_command
from .render import plan_directives
from .request import request_from_spec
from .sandbox import Sandbox

DEMO_SPEC = {
    "job_type": "demo",
    "slots_per_trial": 6,
    "slurm": {"slots_per_node": 2, "sbatch_args": ["--time=5"]},
}

DEMO_BODY = r"""
echo "job $SLURM_JOB_ID ($SLURM_JOB_NAME): $SLURM_JOB_NUM_NODES nodes ($SLURM_JOB_NODELIST), $SLURM_NTASKS tasks"
srun --label bash -c 'echo "node=$SLURMD_NODENAME rank=$SLURM_PROCID of $SLURM_NTASKS user=$(id -un) CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"'
"""


@dataclass(frozen=True)
class Submitted:
    """A batch job submitted from a Plan: its id, sbatch's exit status and the job directory."""

    job_id: str
    returncode: int
    job_dir: Path
    stderr: str

    def output(self, name: str = "job.out") -> str:
        path = self.job_dir / name
        return path.read_text() if path.exists() else ""


def sandbox_config(box: Sandbox, **settings) -> Config:
    """A config whose job_storage_root lives inside the sandbox (plus ``settings``)."""
    return validate_config({"job_storage_root": str(box.root / "jobs"), **settings}, "<sandbox>")


def submit_plan(box: Sandbox, plan: Plan, body: str, *, wait: bool = True,
                timeout: float = 300) -> Submitted:
    """Create the per-job directory as the job user, write the batch script, sbatch it as the user."""
    user = pwd.getpwnam(box.user)
    jobs_root = Path(plan.log_dir).parent
    jobs_root.mkdir(mode=0o755, parents=True, exist_ok=True)
    job_dir = Path(plan.log_dir)
    job_dir.mkdir(mode=0o700)
    os.chown(job_dir, user.pw_uid, user.pw_gid)
    script = job_dir / "job.sbatch"
    script.write_text("#!/bin/bash\n" + "\n".join(plan_directives(plan)) + "\n" + body)
    os.chown(script, user.pw_uid, user.pw_gid)
    argv = ["runuser", "-u", box.user, "--", "sbatch", "--parsable", *(["--wait"] if wait else []),
            str(script)]
    result = run_command(argv, env=box.command_env(), cwd=str(job_dir), check=False, timeout=timeout)
    job_id = result.stdout.strip().split(";")[0].splitlines()[0] if result.stdout.strip() else ""
    return Submitted(job_id, result.returncode, job_dir, result.stderr)


def run_demo(box: Sandbox, *, install: bool = True, log=print) -> int:
    """Bring the sandbox up, run the demo job, print its output; returns sbatch's exit status."""
    box.up(install=install, log=log)
    spec = dict(DEMO_SPEC, job_id=f"{int(time.time())}-{os.getpid()}")
    plan = make_plan(request_from_spec(spec, "slurm", "<demo spec>"), sandbox_config(box), "slurm")
    log("batch script header (what `tether plan` prints for the demo spec):")
    for line in plan_directives(plan):
        log(f"  {line}")
    job = submit_plan(box, plan, DEMO_BODY)
    log(f"job {job.job_id}: sbatch exit status {job.returncode}; output ({job.job_dir / 'job.out'}):")
    print(job.output("job.out") + job.output("job.err"), end="")
    if job.returncode != 0:
        log(job.stderr.strip())
    return job.returncode
