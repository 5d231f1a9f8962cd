"""The PBS MoM hook's whole path but PBS itself, on the sandbox: the real hook file
(pbs_hooks/tether_exec.py) against the stub ``pbs`` module hands a TM task to the real launcher,
which runs it in rootless podman as the job user (the rest of the hook is tests/unit/test_pbs_mom.py)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, run_hook_file, wait_until
from tether.testing.pbs import MomJob, pbs_module

HOOK = REPO / "pbs_hooks" / "tether_exec.py"
pbs = pbs_module()  # the stand-in (tether.testing)
USER = "tether-demo"


@pytest.fixture
def helper(public_dir) -> Path:
    """The real tether-jobdirs helper, built into a directory the job user can reach."""
    from tether.admin.pbs import build_helper

    libexec = public_dir / "libexec"
    libexec.mkdir(mode=0o755)
    return build_helper(libexec)


@pytest.mark.cluster
def test_a_wrapped_tm_task_runs_in_a_real_podman_container(cluster, helper, public_dir):
    """The whole PBS path but PBS itself: the hook hands a TM task to the real launcher, which this
    test then starts as pbs_mom would (as the job user, with exactly the task environment PBS
    builds from e.env); rootless podman runs it in the sandbox's busybox image."""
    from tether.hooks.configfile import load_config
    from tether.admin.host import install_launcher

    config = load_config(str(cluster.box.tether_conf))
    image = cluster.box.busybox_image()
    launcher = install_launcher(helper.parent, config)
    settings = {"python_path": [], "job_storage_root": config.job_storage_root, "helper": str(helper),
                "launcher": str(launcher), "user_dirs": ":".join(config.user_dir_bases())}
    hook_config = public_dir / f"tether_exec-{os.getpid()}.json"
    hook_config.write_text(json.dumps(settings))
    job_id = f"{os.getpid()}.pbs-e2e"
    user = pwd.getpwnam(USER)
    job = MomJob(job_id, USER, "2:ncpus=1", ["n1", "n2"], resources={"tether_slots": 2, "tether_slot_type": "cpu"},
                 variables={"TETHER_CONTAINER_IMAGE": image})

    def run_hook(event_type, **kw):
        return run_hook_file(HOOK, pbs.stub_event(event_type, config_file=str(hook_config), local_node="n2",
                                                  **job.attrs(event_type), **kw))

    assert run_hook(pbs.EXECJOB_BEGIN).accepted
    command = ("echo RANK=$RANK NODE_RANK=$NODE_RANK WORLD=$WORLD_SIZE TMPDIR=$TMPDIR PWD=$(pwd) UID=$(id -u) "
               "IN=$(grep -qF \"" + image + " / \" /proc/self/mountinfo && echo container || echo host) "
               "V=\"$ODD\"; sleep 3")
    number = job.task_env("n2")["PBS_TASKNUM"]         # n2's first TM task: 40000001
    task_env = {"PBS_JOBID": job_id, "PBS_TASKNUM": number, "PBS_ENVIRONMENT": "PBS_BATCH", "TMPDIR": "/tmp",
                "HOME": user.pw_dir, "USER": USER, "LOGNAME": USER, "PATH": "/usr/local/bin:/usr/bin:/bin",
                "TETHER_CONTAINER_IMAGE": image, "TETHER_CONTAINER_ENV": "ODD", "ODD": "a,b 'c'"}
    e = run_hook(pbs.EXECJOB_LAUNCH, env=task_env, progname="/bin/sh", argv=["sh", "-c", command])
    assert e.accepted, e.reject_msg
    assert e.progname == str(launcher)
    env = e.env.task_env()
    # as pbs_mom starts the task: the job user, in a session of its own, this environment, progname
    # with argv; no one made it a child subreaper (TETHER_RUN_SUBREAPER=0: the launcher does)
    task = subprocess.Popen(["runuser", "-u", USER, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                             e.progname, *e.argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd="/", start_new_session=True)
    name = f"tether-{os.getpid()}-{number}-1"

    def conmon_ancestors() -> list[str] | None:
        """The command lines of conmon's parent, its parent, ... up to the task's session leader.
        On a cold node (no pause process of the user) podman makes one and runs on in a child
        of its own in the new user namespace, the one conmon is then re-parented to."""
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and name.encode() in (proc / "cmdline").read_bytes() and \
                        (proc / "comm").read_text().strip() == "conmon":
                    chain, pid = [], proc.name
                    while pid not in ("0", "1", str(task.pid)):
                        pid = (Path("/proc") / pid / "stat").read_text().rsplit(")", 1)[1].split()[1]
                        chain.append((Path("/proc") / pid / "cmdline").read_bytes().decode(errors="replace"))
                    return chain
            except OSError:
                continue
        return None

    ancestors = wait_until(conmon_ancestors, timeout=60)
    assert ancestors and any(str(launcher) in cmdline for cmdline in ancestors), ancestors  # stayed under it
    stdout, stderr = task.communicate(timeout=120)
    result = subprocess.CompletedProcess(task.args, task.returncode, stdout, stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    fields = dict(word.split("=", 1) for word in result.stdout.split("V=")[0].split())
    assert fields == {"RANK": "1", "NODE_RANK": "1", "WORLD": "2", "TMPDIR": "/tmp", "PWD": "/run/tether/workdir",
                      "UID": str(user.pw_uid), "IN": "container"}
    assert result.stdout.split("V=", 1)[1].strip() == "a,b 'c'"
    assert run_hook(pbs.EXECJOB_END).accepted
    assert not (Path(config.job_storage_root) / job_id).exists()
    names = subprocess.run([*cluster.box.user_podman(), "ps", "-a", "--format", "{{.Names}}"],
                           capture_output=True, text=True, timeout=60, cwd="/").stdout
    assert not [n for n in names.split() if n.startswith(f"tether-{os.getpid()}-")]
