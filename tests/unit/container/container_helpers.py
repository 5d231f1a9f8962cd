"""What the container tests share: the job environment most of them launch in, a spec, `tether run`
through the fakes, a supervised launch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tether.container.spec import LaunchSpec


TETHER = [sys.executable, "-m", "tether.cli.main"]


HOST = {
    "PATH": "/usr/bin:/bin", "HOME": "/home/u", "LD_PRELOAD": "/x.so", "PYTHONPATH": "/p",
    "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "6", "MASTER_ADDR": "n1", "MASTER_PORT": "21408",
    "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "PMIX_RANK": "3",
    "CUDA_VISIBLE_DEVICES": "0,1", "TETHER_SLOT_IDS": "0,1", "TETHER_RANK_DIR": "/jobs/42/n2/step-0/rank-3",
    "TMPDIR": "/jobs/42/n2/step-0/rank-3/tmp", "APPTAINER_BIND": "/evil", "APPTAINERENV_X": "1",
    "CONTAINERS_CONF": "/etc/c.conf", "MYVAR": "a,b\nc 'q' $(x)", "OTHER": "no",
    "BASH_FUNC_f%%": "() { :; }",
}


def spec(**kw) -> LaunchSpec:
    base = dict(image="/images/busybox.sif", runtime="apptainer", command=("python", "train.py"),
                rank_dir="/jobs/42/n2/step-0/rank-3", job_id="42", step_id="0", rank="3")
    base.update(kw)
    return LaunchSpec(**base)


def _as_user(uid: int, fn):
    """Run ``fn()`` in a child process with uid/gid ``uid`` (the test runs as root); its result."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            result = repr(fn())
        except Exception as exc:  # reported to the parent
            result = repr(f"{type(exc).__name__}: {exc}")
        os.write(write, result.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        out = fh.read()
    os.waitpid(pid, 0)
    return eval(out)  # noqa: S307 - our own repr


def _tether_run(tmp_path, fakes, config, *args, user: int | None = None, rank_dir: Path | None = None,
                cwd: str = "/", **env):
    """``tether run ARGS`` with the fakes first on PATH (as ``user`` when given, in ``cwd``); its result."""
    rank_dir = rank_dir or tmp_path / "7/n1/step-2/rank-1"
    run_env = {"PATH": fakes.path_env(), "TETHER_CONFIG": str(config), "RANK": "1", "SLURM_JOB_ID": "7",
               "SLURM_STEP_ID": "2", "HOME": str(rank_dir.parent), "TETHER_RANK_DIR": str(rank_dir),
               "SECRET": "s", **env}
    preexec = None
    if user is not None:
        def preexec():
            os.setgroups([])
            os.setgid(user)
            os.setuid(user)
    return subprocess.run([*TETHER, "run", *args], env=run_env, capture_output=True, text=True, timeout=60,
                          preexec_fn=preexec, cwd=cwd)


def conf_printed(conf: str | Path, function: str) -> list[str] | None:
    """What an enroot --conf script's function (environ, mounts, rc) prints, run by bash as
    enroot runs it (set -euo pipefail); None when the script has no such function."""
    script = (f'set -euo pipefail; source "$1"; if declare -F {function} > /dev/null; then '
              + ("declare -f rc | sed '1,2d;$d'" if function == "rc" else function) + "; else exit 3; fi")
    ran = subprocess.run(["bash", "--norc", "-c", script, "bash", str(conf)], capture_output=True, timeout=30)
    assert ran.returncode in (0, 3), ran.stderr
    return None if ran.returncode == 3 else ran.stdout.decode("utf-8", "surrogateescape").splitlines()
