"""tether's PBS MoM hook, run as PBS runs it: the real hook file (pbs_hooks/tether_exec.py) against
the stub ``pbs`` module, with the real tether-jobdirs helper (built from the SPANK plugin's C source)
creating and removing directories on this machine as root, for a real unprivileged user.
"""

from __future__ import annotations

import json
import time
import signal
import os
import pwd
import select
import stat
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import REPO, run_hook_file, wait_until

HOOK = REPO / "pbs_hooks" / "tether_exec.py"
from tether.testing.pbs import MomJob, pbs_module  # noqa: E402

pbs = pbs_module()  # the stand-in (tether.testing)

USER = "tether-demo"
JOB_ID = "4242.pbs-server"
SLOTS = {"tether_slots": 6, "tether_slot_type": "cuda"}


def three_hosts(**kw) -> MomJob:
    """The job most tests use: one chunk (one rank) on each of h1, h2, h3, as OpenPBS hands it to
    MoM hooks (exec_host None; exec_vnode, exec_host2, schedselect)."""
    return MomJob(JOB_ID, USER, "3:ncpus=2", ["h1", "h2", "h3"], resources=kw.pop("resources", SLOTS), **kw)


@pytest.fixture(scope="module")
def public():
    """A directory the job user can reach (pytest's tmp_path is under a root-only 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="tether-pbs-test-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def helper(public) -> Path:
    from tether.sandbox.cluster import ensure_user
    from tether.admin.pbs import build_helper

    ensure_user(USER)
    libexec = public / "libexec"
    libexec.mkdir(mode=0o755)
    return build_helper(libexec)


@pytest.fixture
def root(tmp_path) -> Path:
    """job_storage_root: root-owned, 0755 (the helper refuses anything else)."""
    os.chmod(tmp_path, 0o755)
    path = tmp_path / "jobs"
    path.mkdir(mode=0o755)
    os.chmod(path, 0o755)
    return path


@pytest.fixture(scope="module")
def launcher(public) -> str:
    """Where the hook config says the launcher is (the hand-off is checked, not the launch)."""
    path = public / "tether-run"
    path.write_text("#!/bin/sh\nexit 99\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def hook(tmp_path, helper, root, launcher):
    """Run the hook file for an event of a job of USER; returns the event."""
    settings = {"python_path": [], "job_storage_root": str(root), "helper": str(helper), "launcher": launcher}
    config = tmp_path / "tether_exec.json"
    config.write_text(json.dumps(settings))

    def run(event_type=pbs.EXECJOB_LAUNCH, *, resources=None, variables=None, host="h1", config_file=None,
            job=None, **kw):
        attrs = (job or three_hosts()).attrs(event_type)
        if resources is not None:           # the job's own resources instead of tether's (PBS's stay)
            attrs["resources"] = {"ncpus": attrs["resources"]["ncpus"], "place": attrs["resources"]["place"],
                                  **resources}
        attrs["Variable_List"].update(variables or {})
        event = pbs.stub_event(event_type, config_file=str(config_file or config), local_node=host, **attrs, **kw)
        return run_hook_file(HOOK, event)

    run.settings = settings
    run.config = config
    return run


def _owned_private(path: Path) -> bool:
    st = os.lstat(path)
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == pwd.getpwnam(USER).pw_uid
            and stat.S_IMODE(st.st_mode) == 0o700)


def _task_env(**extra) -> dict:
    return {"PBS_JOBID": JOB_ID, "TMPDIR": "/var/tmp/pbs.4242", "PATH": "/usr/bin:/bin", **extra}


def test_jobs_without_tether_are_untouched(hook, root):
    for event_type in (pbs.EXECJOB_BEGIN, pbs.EXECJOB_END):
        assert hook(event_type, resources={}).accepted
    e = hook(resources={}, env=_task_env(PBS_TASKNUM="00000002"), progname="/bin/hostname", argv=["hostname"])
    assert e.accepted and e.progname == "/bin/hostname" and e.env.task_env() == _task_env(PBS_TASKNUM="00000002")
    assert list(root.iterdir()) == []


def test_begin_creates_the_job_and_host_directories_as_the_user(hook, root):
    assert hook(pbs.EXECJOB_BEGIN).accepted
    assert _owned_private(root / JOB_ID) and _owned_private(root / JOB_ID / "h1")


def test_the_job_shell_gets_the_job_environment_and_stays_on_the_host(hook, root):
    hook(pbs.EXECJOB_BEGIN)
    e = hook(env=_task_env(PBS_TASKNUM="1"), progname="/bin/bash", argv=[],
             variables={"TETHER_CONTAINER_IMAGE": "/images/busybox"})
    assert e.accepted, e.reject_msg
    env = e.env.task_env()
    assert e.progname == "/bin/bash" and e.argv == []                    # the job shell is never wrapped
    assert env["TETHER_JOB_DIR"] == str(root / JOB_ID)
    assert (env["MASTER_ADDR"], env["NODE_RANK"], env["TETHER_NNODES"]) == ("h1", "0", "3")
    assert env["MASTER_PORT"] == str(12288 + 4242 % 1024 * 16)
    assert (env["TETHER_JOB_SLOTS"], env["TETHER_JOB_SLOT_TYPE"]) == ("6", "cuda")
    assert env["TMPDIR"] == "/var/tmp/pbs.4242" and "RANK" not in env    # PBS's own, read-only
    assert list((root / JOB_ID / "h1").iterdir()) == []                  # no rank directories


def test_a_tm_task_of_a_container_job_is_handed_to_the_launcher(hook, root, launcher):
    hook(pbs.EXECJOB_BEGIN, host="h2")
    e = hook(env=_task_env(PBS_TASKNUM="00000003", TETHER_CONTAINER_IMAGE="/images/busybox"), host="h2",
             progname="/usr/bin/hostname", argv=["hostname", "-f", "it's, odd"],
             variables={"TETHER_CONTAINER_IMAGE": "/images/busybox"})
    assert e.accepted, e.reject_msg
    assert e.progname == launcher and e.argv == [launcher, "-f", "it's, odd"]
    env = e.env.task_env()
    assert env["TETHER_RUN_ARGV0"] == "hostname" and env["TETHER_RUN_SUBREAPER"] == "0"
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("1", "0", "3", "1")
    rank_dir = root / JOB_ID / "h2" / "task-3" / "rank-1"
    assert env["TETHER_RANK_DIR"] == str(rank_dir) and env["TETHER_WORK_DIR"] == str(rank_dir / "work")
    for path in (rank_dir, rank_dir / "work"):
        assert _owned_private(path)
    # the rank's tmp is a container's /tmp: sticky and open as an image's, inside the private rank dir
    tmp = os.lstat(rank_dir / "tmp")
    assert stat.S_ISDIR(tmp.st_mode) and tmp.st_uid == pwd.getpwnam(USER).pw_uid and stat.S_IMODE(tmp.st_mode) == 0o1777


def test_a_tm_task_naming_a_container_alone_is_handed_to_the_launcher(hook, launcher):
    """TETHER_CONTAINER_NAME without an image (a later task of a job whose earlier task made the
    container): the launcher runs it in that container or says there is none -- not the host."""
    hook(pbs.EXECJOB_BEGIN, host="h2")
    e = hook(env=_task_env(PBS_TASKNUM="00000004", TETHER_CONTAINER_NAME="dev"), host="h2",
             progname="/usr/bin/hostname", argv=["hostname"])
    assert e.accepted, e.reject_msg
    assert e.progname == launcher and e.env.task_env()["TETHER_RUN_ARGV0"] == "hostname"


def test_tether_s_own_per_host_launch_is_not_wrapped_twice(hook):
    argv = ["/usr/bin/env", "NODE_RANK=0", "MASTER_ADDR=h1", "/opt/tether/venv/bin/tether", "run",
            "--container-image=/images/busybox", "--", "python", "train.py"]
    e = hook(env=_task_env(PBS_TASKNUM="00000002", TETHER_CONTAINER_IMAGE="/images/busybox"), progname="/usr/bin/env",
             argv=argv)
    assert e.accepted and e.progname == "/usr/bin/env" and e.argv == argv
    assert "TETHER_RUN_ARGV0" not in e.env.task_env()


def test_tasks_without_an_image_run_on_the_host_with_their_directories(hook, root):
    e = hook(env=_task_env(PBS_TASKNUM="00000002"), progname="/bin/sleep", argv=["sleep", "1"])
    assert e.accepted and e.progname == "/bin/sleep"
    assert _owned_private(Path(e.env.task_env()["TETHER_RANK_DIR"]))


def test_values_with_commas_quotes_newlines_and_backslashes_reach_the_task_exactly(hook, tmp_path):
    hostile = "a,b 'c' \"d\" \\e\\,f\nline2 $(id) `id`"
    user_value = "x,y\\z'\"\n"
    e = hook(resources={"tether_slots": 2, "tether_gpu_type": hostile},
             env=_task_env(PBS_TASKNUM="00000002", USER_VAR=user_value), progname="/bin/true", argv=["true"])
    assert e.accepted, e.reject_msg
    env = e.env.task_env()
    assert env["TETHER_JOB_GPU_TYPE"] == hostile          # escaped by the hook, unescaped by PBS
    assert env["USER_VAR"] == user_value                  # the user's own variables are left alone
    assert env["TMPDIR"] == "/var/tmp/pbs.4242" and env["PBS_JOBID"] == JOB_ID


def _ranks(e) -> tuple[str, ...]:
    assert e.accepted, e.reject_msg
    env = e.env.task_env()
    return tuple(env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                                  "MASTER_ADDR"))


def test_pbsdsh_tasks_get_the_ranks_pbs_placed(hook, root):
    """Issue 40, 1: `-l select=1:mpiprocs=2` and `pbsdsh`: OpenPBS sets no PBS_VNODENUM, so both tasks
    were RANK=0 of WORLD_SIZE=1. Ranks come from the placement (schedselect's mpiprocs on
    exec_host2's hosts) and the number the MoM gave the task (hook-execjob_launch-pbsdsh-task-1/2)."""
    job = MomJob(JOB_ID, USER, "1:ncpus=2:mpiprocs=2", ["vm"],
                 resources={"tether_slots": 2, "tether_slots_per_node": 2})
    hook(pbs.EXECJOB_BEGIN, job=job, host="vm")
    tasks = job.pbsdsh()
    assert [env["PBS_TASKNUM"] for _, env in tasks] == ["00000002", "00000003"]        # as recorded
    ranks = [_ranks(hook(job=job, host=host, env=env, progname="/bin/sh", argv=["/bin/sh", "-c", "true"]))
             for host, env in tasks]
    assert ranks == [("0", "0", "2", "2", "0", "vm"), ("1", "1", "2", "2", "0", "vm")]


def test_twelve_tm_tasks_numbered_in_hex_all_run(hook, root):
    """Issue 40, 2: OpenPBS numbers TM tasks in 8-digit upper-case hex (hook-execjob_launch-tmrsh-12-
    tasks: 00000002 ... 0000000D); the tenth task (0000000A) and later were refused."""
    job = MomJob(JOB_ID, USER, "1:ncpus=12:mpiprocs=12", ["vm"], resources={"tether_slots": 12})
    hook(pbs.EXECJOB_BEGIN, job=job, host="vm")
    seen = []
    for _ in range(12):
        env = job.task_env("vm")
        e = hook(job=job, host="vm", env=env, progname="/bin/sh", argv=["/bin/sh", "-c", "true"])
        seen.append((env["PBS_TASKNUM"], _ranks(e)[0], e.env.task_env()["TETHER_RANK_DIR"]))
    assert [t for t, _, _ in seen] == [f"{n:08X}" for n in range(2, 14)]
    assert [r for _, r, _ in seen] == [str(n) for n in range(12)]
    assert [d for _, _, d in seen] == [str(root / JOB_ID / "vm" / f"task-{n}" / f"rank-{n - 2}") for n in range(2, 14)]


def test_more_tm_tasks_than_mpiprocs_take_the_host_s_ranks_again(hook):
    """12 sequential pbs_tmrsh on a host with 2 mpiprocs (the recorded job): each round of tasks
    gets the host's ranks again (a later step of the job), none is refused."""
    job = MomJob(JOB_ID, USER, "1:ncpus=2:mpiprocs=2", ["vm"], resources={"tether_slots": 2})
    ranks = [_ranks(hook(job=job, host="vm", env=job.task_env("vm"), progname="/bin/true", argv=["true"]))[0]
             for _ in range(12)]
    assert ranks == ["0", "1"] * 6


@pytest.mark.parametrize("order", [("h1", "h2"), ("h2", "h1")])
def test_a_job_on_two_hosts_with_two_tasks_each(hook, root, order):
    """Issue 40, 3 (and its 'done when'): exec_host is None in MoM hooks; the hosts come from
    exec_host2/exec_vnode. 2 hosts x 2 pbsdsh tasks: ranks 0-3, one MASTER_ADDR, NODE_RANK by host
    order, and after both hosts' end nothing is left under the job storage root -- also what the
    job wrote directly into $TETHER_JOB_DIR -- whichever host ends first."""
    job = MomJob(JOB_ID, USER, "2:ncpus=2:mpiprocs=2", ["h1", "h2"],
                 resources={"tether_slots": 4, "tether_slots_per_node": 2})
    for host in job.hosts:
        assert hook(pbs.EXECJOB_BEGIN, job=job, host=host).accepted
    shell = hook(job=job, host="h1", env=job.shell_env(), progname="/bin/sh", argv=[]).env.task_env()
    assert (shell["MASTER_ADDR"], shell["NODE_RANK"], shell["TETHER_NNODES"]) == ("h1", "0", "2")
    results = []
    for host, env in job.pbsdsh():
        e = hook(job=job, host=host, env=env, progname="/bin/sh", argv=["/bin/sh", "-c", "true"])
        results.append(_ranks(e))
        Path(e.env.task_env()["TETHER_WORK_DIR"], "out").write_text("x")
    assert results == [("0", "0", "4", "2", "0", "h1"), ("1", "1", "4", "2", "0", "h1"),
                       ("2", "0", "4", "2", "1", "h1"), ("3", "1", "4", "2", "1", "h1")]
    (root / JOB_ID / "written-by-the-job-shell").write_text("x")     # $TETHER_JOB_DIR/...
    for host in order:
        assert hook(pbs.EXECJOB_END, job=job, host=host).accepted
    assert list(root.iterdir()) == []


def test_variables_a_job_can_set_do_not_change_ranks_or_hosts(hook, tmp_path):
    """A job's own TM client can put anything into a task's environment (tm_spawn's envp is applied
    after PBS's own variables): PBS_VNODENUM, PBS_NODEFILE, PBS_NODENUM change nothing; as root the
    hook reads no file a task names."""
    secret = tmp_path / "secret"
    secret.write_text("h1\nh2\nh2\nh2\nh2\n")
    job = three_hosts()
    for forged in ({}, {"PBS_VNODENUM": "3", "PBS_NODEFILE": str(secret), "PBS_NODENUM": "0",
                        "MASTER_ADDR": "evil", "NODE_RANK": "7"}):
        e = hook(job=job, host="h2", env=job.task_env("h2"), job_set=forged, progname="/bin/true", argv=["true"])
        assert _ranks(e) == ("1", "0", "3", "1", "1", "h1")


@pytest.mark.parametrize("number", ["0000000a", "2", "00000002 ", "0x2", "000000002", "", "+2", "٢"])
def test_a_task_number_pbs_never_gives_is_refused_with_its_value(hook, number):
    e = hook(env=_task_env(), job_set={"PBS_TASKNUM": number}, progname="/bin/true", argv=["true"])
    assert e.accepted is False and f"PBS_TASKNUM={number!r}" in e.reject_msg, e.reject_msg


def test_a_planted_symlink_is_refused_not_followed(hook, root, tmp_path):
    hook(pbs.EXECJOB_BEGIN)
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.symlink(target, root / JOB_ID / "h1" / "task-2")       # the user owns h1/: they could do this
    e = hook(env=_task_env(PBS_TASKNUM="00000002"), progname="/bin/true", argv=["true"])
    assert e.accepted is False
    assert "is a symlink where tether's directory belongs; refusing to follow it" in e.reject_msg
    assert list(target.iterdir()) == []
    hook(pbs.EXECJOB_END)
    assert not (root / JOB_ID).exists() and target.is_dir()   # the link went, not its target


def test_end_removes_each_host_and_the_job_directory_with_the_last(hook, root):
    for host in ("h1", "h2.cluster.example"):          # exec_host2 says h2: the same host, spelled long
        hook(pbs.EXECJOB_BEGIN, host=host)
        hook(env=_task_env(PBS_TASKNUM="00000002"), host=host, progname="/bin/true", argv=["true"])
    (root / JOB_ID / "h1" / "task-2" / "rank-0" / "tmp" / "left").write_text("x")
    (root / JOB_ID / "written-by-the-job-shell").write_text("x")     # $TETHER_JOB_DIR/...
    os.symlink("/etc", root / JOB_ID / "planted")
    assert hook(pbs.EXECJOB_END, host="h1").accepted                 # h1: the job's first host
    assert sorted(p.name for p in (root / JOB_ID).iterdir()) == ["h2.cluster.example"]
    assert Path("/etc/passwd").exists()
    assert hook(pbs.EXECJOB_ABORT, host="h2.cluster.example").accepted
    assert list(root.iterdir()) == []


def test_end_runs_the_launcher_s_leftover_cleanup_as_the_user(hook, root, public):
    out = public / "out"
    out.mkdir(mode=0o777)
    os.chmod(out, 0o777)
    launcher = public / "fake-run"
    launcher.write_text(f"#!/bin/sh\necho \"$TETHER_CLEANUP $(id -un)\" > {out}/cleanup\nexec 3>&-\n")
    launcher.chmod(0o755)
    hook.settings["launcher"] = str(launcher)
    hook.config.write_text(json.dumps(hook.settings))
    hook(pbs.EXECJOB_BEGIN)
    hook(env=_task_env(PBS_TASKNUM="00000002"), progname="/bin/true", argv=["true"])
    (root / JOB_ID / "h1" / "task-2" / ".cleanup-0").write_text("{'commands': [], 'env': {}}")
    assert hook(pbs.EXECJOB_END).accepted
    wait_until(lambda: (out / "cleanup").exists(), timeout=15)
    assert (out / "cleanup").read_text() == f"{root / JOB_ID / 'h1'} {USER}\n"
    assert not (root / JOB_ID).exists()


def test_the_leftover_cleanup_starts_with_clean_signals_and_is_killed_at_its_bound(root, public, tmp_path):
    """Regression (issue 12): the cleanup inherited the daemon's blocked TERM/HUP/ALRM, so neither
    `kill` nor its alarm(120) could end it. Here the helper is built with a 2 s bound and started by
    a parent that blocks those signals, as slurmstepd does. The launcher and its child hold a FIFO's
    write end that the test opened for reading first: its hang-up is the moment the last of them
    died, against the launcher's start by the kernel's count -- at the bound, never before it."""
    from tether.admin.pbs import pbs_source_dir
    from tether.native.build import source_dir
    from tether.system.toolchain import CBuild

    cbuild = CBuild(tmp_path / "build")
    helper = cbuild.link([cbuild.compile(source_dir() / "jobdirs.c", defines=["-DTETHER_CLEANUP_SECONDS=2"]),
                          cbuild.compile(source_dir() / "values.c"),
                          cbuild.compile(pbs_source_dir() / "tether_jobdirs.c", include_dirs=[str(source_dir())])],
                         public / "tether-jobdirs-2s")
    out = public / "bound"
    out.mkdir(mode=0o777)
    os.chmod(out, 0o777)
    os.mkfifo(out / "alive", 0o622)
    os.chmod(out / "alive", 0o622)
    launcher = public / "slow-run"
    launcher.write_text("#!/usr/bin/python3 -S\n"       # not a shell: dash resets the signal mask itself
                        "import os, subprocess, time\n"
                        f"out = {str(out)!r}\n"
                        "alive = os.open(out + '/alive', os.O_WRONLY | os.O_NONBLOCK)\n"
                        "status = open('/proc/self/status').read().splitlines()\n"
                        "open(out + '/signals', 'w').write('\\n'.join(l for l in status if l.startswith(('SigBlk', 'SigIgn'))))\n"
                        "open(out + '/started', 'w').write(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])\n"
                        "os.close(3)\n"
                        "child = subprocess.Popen(['sleep', '600'], pass_fds=[alive])\n"
                        "open(out + '/child', 'w').write(str(child.pid))\n"
                        "open(out + '/launcher', 'w').write(str(os.getpid()))\n"
                        "time.sleep(600)\n")
    launcher.chmod(0o755)
    uid, gid = pwd.getpwnam(USER).pw_uid, pwd.getpwnam(USER).pw_gid
    subprocess.run([str(helper), "begin", str(root), "9", "h1", str(uid), str(gid)], check=True)
    subprocess.run([str(helper), "task", str(root), "9", "h1", "2", "0", str(uid), str(gid)], check=True,
                   capture_output=True)
    (root / "9" / "h1" / "task-2" / ".cleanup-0").write_text("{}")
    blocked = {signal.SIGTERM, signal.SIGHUP, signal.SIGALRM, signal.SIGINT}
    alive = os.open(out / "alive", os.O_RDONLY | os.O_NONBLOCK)     # before any writer: no hang-up yet
    pid = os.fork()              # not subprocess: it resets the mask after preexec_fn
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        os.execv(str(helper), [str(helper), "end", str(root), "9", "h1", str(uid), str(gid), str(launcher)])
    assert os.waitpid(pid, 0)[1] == 0
    assert wait_until(lambda: (out / "launcher").exists(), timeout=10)
    masks = {k: int(v, 16) for k, v in (line.split(":") for line in (out / "signals").read_text().splitlines())}
    bits = sum(1 << (sig - 1) for sig in blocked)
    assert masks["SigBlk"] & bits == 0 and masks["SigIgn"] & bits == 0, masks
    try:
        hung_up = select.poll()
        hung_up.register(alive, select.POLLHUP)
        assert hung_up.poll(15_000), "the launcher and its child outlived the 2 s bound by 13 s"
        died = time.clock_gettime(time.CLOCK_BOOTTIME)
    finally:
        os.close(alive)
    # /proc/PID/stat's start time: clock ticks since boot, rounded down -- the bound counts from
    # just after it; the hang-up is seen at the death or a little later (this process's wake-up)
    lived = died - int((out / "started").read_text()) / os.sysconf("SC_CLK_TCK")
    assert 2.0 <= lived < 15, f"the cleanup was killed {lived:.2f} s after it started, its bound is 2 s"
    pids = [int((out / name).read_text()) for name in ("launcher", "child")]
    assert wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), timeout=15)
    assert not (root / "9").exists()


def test_an_unloadable_hook_refuses_tether_jobs_only(hook, tmp_path):
    missing = tmp_path / "no-such.json"
    e = hook(env=_task_env(PBS_TASKNUM="00000002"), progname="/bin/true", argv=["true"], config_file=missing)
    assert e.accepted is False and e.reject_msg.startswith("tether unavailable")
    assert hook(resources={}, env=_task_env(PBS_TASKNUM="1"), config_file=missing).accepted
    assert hook(pbs.EXECJOB_END, config_file=missing).accepted      # never blocks a job's end


def test_a_missing_helper_or_launcher_is_named(hook, tmp_path):
    hook.settings["launcher"] = str(tmp_path / "nowhere" / "tether-run")
    hook.config.write_text(json.dumps(hook.settings))
    e = hook(env=_task_env(PBS_TASKNUM="00000002", TETHER_CONTAINER_IMAGE="/images/busybox"), progname="/bin/true",
             argv=["true"])
    assert e.accepted is False and "tether-run is missing on this host" in e.reject_msg
    hook.settings["helper"] = str(tmp_path / "nowhere" / "tether-jobdirs")
    hook.config.write_text(json.dumps(hook.settings))
    e = hook(pbs.EXECJOB_BEGIN)
    assert e.accepted is False and "tether-jobdirs is missing on this host" in e.reject_msg


def test_a_container_task_gets_the_users_own_directories_made_by_root(hook, root, tmp_path):
    """The user's own directories on the host (podman's store and run directory: hooks.layout
    user_dir_bases) are made by root in the MoM hook, through tether-jobdirs, before the task is
    handed to the launcher -- as slurmstepd does on Slurm (issue 39, finding 5)."""
    bases = [tmp_path / "run-base", tmp_path / "var" / "users"]
    hook.settings["user_dirs"] = ":".join(map(str, bases))
    hook.config.write_text(json.dumps(hook.settings))
    hook(pbs.EXECJOB_BEGIN, host="h2")
    e = hook(env=_task_env(PBS_TASKNUM="00000003", TETHER_CONTAINER_IMAGE="/images/busybox"), host="h2",
             progname="/bin/true", argv=["true"], variables={"TETHER_CONTAINER_IMAGE": "/images/busybox"})
    assert e.accepted, e.reject_msg
    uid = pwd.getpwnam(USER).pw_uid
    for base in bases:
        assert _owned_private(base / str(uid))
        st = os.lstat(base)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755      # made root's, 0755 (any umask)
    # a host task (no image) needs none: nothing made for it
    (bases[0] / str(uid)).rmdir()
    e = hook(env=_task_env(PBS_TASKNUM="00000004"), host="h2", progname="/bin/true", argv=["true"])
    assert e.accepted and not (bases[0] / str(uid)).exists()
    # tether's own per-host launch (pbs-launch.sh: `env ... tether run ...`), not wrapped again,
    # runs the launcher all the same: the directories are made for it too
    e = hook(env=_task_env(PBS_TASKNUM="00000005"), host="h2", progname="/usr/bin/env",
             argv=["/usr/bin/env", "NODE_RANK=1", "/opt/tether/venv/bin/tether", "run", "--", "true"])
    assert e.accepted and e.progname == "/usr/bin/env" and _owned_private(bases[0] / str(uid))
    # ... as the launch script starts it: through the marker that proves the task ran
    from tether.hooks.surface import STARTED_MARK

    (bases[0] / str(uid)).rmdir()
    e = hook(env=_task_env(PBS_TASKNUM="00000006"), host="h2", progname="/bin/sh",
             argv=["/bin/sh", "-c", STARTED_MARK, "/shared/1.s.started.x/1", "/usr/bin/env", "NODE_RANK=1",
                   "/opt/tether/venv/bin/tether", "run", "--", "true"])
    assert e.accepted and e.progname == "/bin/sh" and _owned_private(bases[0] / str(uid))


def test_the_helper_makes_a_users_directory_only_where_no_other_user_can_reach(helper, tmp_path):
    """``tether-jobdirs user`` (the same C as slurmstepd's): a base another user can write, a
    symlink on the way, or a directory of another uid where the user's belongs -- refused with the
    reason, nothing followed or changed."""
    uid = pwd.getpwnam(USER).pw_uid

    def run(bases: str):
        return subprocess.run([str(helper), "user", bases, str(uid), str(uid)], capture_output=True, text=True,
                              timeout=30)

    os.chmod(tmp_path, 0o755)
    shared = tmp_path / "shared"             # as /var/tmp: everyone may make entries
    shared.mkdir()
    os.chmod(shared, 0o1777)
    result = run(str(shared))
    assert result.returncode == 1 and "must be owned by root and not writable by group or others" in result.stderr
    assert list(shared.iterdir()) == []
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(elsewhere)
    result = run(str(tmp_path / "link" / "users"))
    assert result.returncode == 1 and "a symlink, which root does not follow" in result.stderr
    assert list(elsewhere.iterdir()) == []
    base = tmp_path / "users"
    base.mkdir(mode=0o755)
    (base / str(uid)).mkdir(mode=0o777)
    os.chown(base / str(uid), 65534, 65534)         # another uid's, where the user's belongs
    result = run(str(base))
    assert result.returncode == 1 and f"owned by uid 65534, not the job's uid {uid}" in result.stderr
    (base / str(uid)).rmdir()
    assert run(f"{base}:{tmp_path / 'new' / 'deeper'}").returncode == 0
    assert _owned_private(base / str(uid)) and _owned_private(tmp_path / "new" / "deeper" / str(uid))
    assert run("relative/path").returncode == 1


def test_the_helper_refuses_unsafe_roots_bad_names_and_non_root_callers(helper, root, tmp_path):
    uid = str(pwd.getpwnam(USER).pw_uid)

    def run(*args, user=None):
        argv = [str(helper), *args]
        if user:
            argv = ["runuser", "-u", user, "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30)

    open_root = tmp_path / "open"
    open_root.mkdir()
    os.chmod(open_root, 0o1777)
    result = run("begin", str(open_root), "1.s", "h1", uid, uid)
    assert result.returncode == 1 and "must be owned by root and not writable by group or others" in result.stderr
    result = run("begin", str(root), "../etc", "h1", uid, uid)
    assert result.returncode == 1 and "cannot be a job or host directory name" in result.stderr
    result = run("begin", str(root), "1.s", "h1", uid, uid, user=USER)
    assert result.returncode == 1 and "runs as root" in result.stderr
    assert run("begin", str(root), "1.s", "h1", "x", uid).returncode == 2
    assert list(root.iterdir()) == []


def test_the_stub_keeps_pbs_rules_for_mom_events():
    e = pbs.stub_event(pbs.EXECJOB_LAUNCH, env={"TMPDIR": "/t"})
    with pytest.raises(pbs.BadAttributeValueError):
        e.env["TMPDIR"] = "/elsewhere"
    with pytest.raises(pbs.BadAttributeValueError):
        e.env["PBS_O_WORKDIR"] = "/elsewhere"
    e.env["RAW"] = "a,b"                                   # an unescaped comma splits the value
    assert e.env.task_env()["RAW"] == "a"
    begin = pbs.stub_event(pbs.EXECJOB_BEGIN)
    with pytest.raises(pbs.BadAttributeValueError):
        begin.progname = "/bin/sh"


def test_the_removal_detaches_a_mount_left_in_the_tree_and_removes_it(helper, root, tmp_path):
    """Slurm's slurmstepd binds a container step's enroot directory onto itself (spank/stepd.c:
    bind_enroot_dir) and unmounts it at the step's end; one that a killed slurmstepd left, or a
    file system the user mounted in their tree (FUSE), is detached before the removal reaches it
    (native/jobdirs.c, here through PBS's helper), never entered: what the mount holds stays
    where it is, the tree goes. In a mount namespace of its own."""
    uid, gid = pwd.getpwnam(USER).pw_uid, pwd.getpwnam(USER).pw_gid
    subprocess.run([str(helper), "begin", str(root), "9", "h1", str(uid), str(gid)], check=True)
    step = root / "9" / "h1" / "step-0"
    enroot, theirs = step / "enroot", step / "theirs"
    (enroot / "data" / "c").mkdir(parents=True)
    theirs.mkdir()
    script = (f"mount --bind {enroot} {enroot} && mount --bind {enroot}/data {enroot}/data && "
              f"mount -t tmpfs none {theirs} && touch {theirs}/kept && exec 9<{theirs} && "
              f"grep -c ' {step}/' /proc/self/mountinfo && "
              f"{helper} end {root} 9 h1 {uid} {gid} - ; echo rc=$?; "
              f"grep -c ' {root}/' /proc/self/mountinfo; test -e {root}/9 && echo left || echo gone; "
              f"ls /proc/self/fd/9/")
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["3", "rc=0", "0", "gone", "kept"], (out.stdout, out.stderr)
