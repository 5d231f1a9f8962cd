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

from .config import validate_config
from .plan import make_plan
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


def run_demo(box: Sandbox, *, install: bool = True, log=print) -> int:
    """Bring the sandbox up, run the demo job, print its output; returns the job's exit status."""
    box.up(install=install, log=log)
    jobs_root = box.root / "jobs"
    jobs_root.mkdir(mode=0o755, exist_ok=True)
    config = validate_config({"job_storage_root": str(jobs_root)}, "<demo>")
    spec = dict(DEMO_SPEC, job_id=f"{int(time.time())}-{os.getpid()}")
    plan = make_plan(request_from_spec(spec, "slurm", "<demo spec>"), config, "slurm")
    user = pwd.getpwnam(box.user)
    job_dir = jobs_root / plan.job_name
    job_dir.mkdir(mode=0o700)
    os.chown(job_dir, user.pw_uid, user.pw_gid)
    script = job_dir / "job.sbatch"
    script.write_text("#!/bin/bash\n" + "\n".join(plan_directives(plan)) + "\n" + DEMO_BODY)
    os.chown(script, user.pw_uid, user.pw_gid)
    log("batch script header (from `tether plan`):")
    for line in plan_directives(plan):
        log(f"  {line}")
    result = run_command(["runuser", "-u", box.user, "--", "sbatch", "--wait", "--parsable", str(script)],
                         env=box.command_env(), cwd=str(job_dir), check=False, timeout=300)
    log(f"sbatch exit status {result.returncode}; job output ({job_dir / 'job.out'}):")
    for name in ("job.out", "job.err"):
        path = job_dir / name
        if path.exists() and path.read_text().strip():
            print(path.read_text(), end="")
    if result.returncode != 0:
        log(result.stderr.strip())
    return result.returncode
