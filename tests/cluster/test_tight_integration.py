"""Issue 16: tight integration proven with Slurm's own accounting and limits (seed 002).

The sandbox runs as sites run Slurm: slurmdbd on MariaDB, proctrack/cgroup, task/cgroup with
ConstrainRAMSpace/ConstrainCores/ConstrainDevices, jobacct_gather/cgroup. Each behaviour is shown for
a containerized rank through tether (real rootless podman), for the same program as a plain host rank,
and -- where it differs -- for podman started by hand under srun ("loose"), so a test can tell
tight from loose.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from helpers import cpu_seconds, user_processes, wait_until

pytestmark = pytest.mark.cluster

BURN = "timeout {s} sh -c 'while :; do :; done'; true"


def accounted(cluster, job: str, fields: str = "JobID,State,ExitCode,TotalCPU") -> dict[str, dict[str, str]]:
    """The job's records in slurmdbd (sacct), by JobID, once the job and its steps have ended there."""
    names = fields.split(",")
    rows: dict[str, dict[str, str]] = {}

    def ended() -> bool:
        out = cluster.run(["sacct", "-n", "-P", "-j", job, "-o", fields + ",End"], check=False).stdout
        rows.clear()
        for line in out.splitlines():
            values = line.split("|")
            rows[values[0]] = dict(zip(names, values))
            if values[-1] in ("", "Unknown"):
                return False
        return bool(rows)

    assert wait_until(ended, timeout=60), f"job {job} has no finished record in slurmdbd: {rows}"
    return rows


def srun_job(cluster, *argv: str, check: bool = False, timeout: float = 180) -> tuple:
    """``srun ARGV`` as the job user under a job name of its own; (result, job id from slurmdbd)."""
    name = f"tight-{time.monotonic_ns()}"
    result = cluster.run(["runuser", "-u", cluster.user, "--", "srun", f"--job-name={name}", *argv],
                         check=check, timeout=timeout)
    return result, job_named(cluster, name)


def job_named(cluster, name: str) -> str:
    """The id of the job called ``name`` (slurmctld tells slurmdbd a moment after the job starts)."""
    ids: list[str] = []

    def known() -> bool:
        ids[:] = cluster.run(["sacct", "-n", "-X", "-P", "-u", cluster.user, f"--name={name}", "-o", "JobID",
                              "-S", "now-1hours"]).stdout.split()
        return bool(ids)

    assert wait_until(known, timeout=30), f"no job {name} in slurmdbd"
    return ids[-1]


def podman_loose(cluster, image: str, *args: str) -> list[str]:
    """podman run as a user would start it by hand under srun (this machine needs runc and the host's
    network; a shared, root-owned rootfs needs --read-only)."""
    conf = cluster.box.etc / "containers.conf"
    return ["env", f"CONTAINERS_CONF={conf}", "podman", "run", "--runtime", "runc", "--network=host", "--read-only",
            *args, "--rootfs", image]


# ---- the sandbox itself ---------------------------------------------------------------------------
def test_the_sandbox_runs_slurm_as_sites_do(cluster):
    config = cluster.run(["scontrol", "show", "config"]).stdout
    for line in ("ProctrackType           = proctrack/cgroup", "TaskPlugin              = task/cgroup,task/affinity",
                 "AccountingStorageType   = accounting_storage/slurmdbd", "JobAcctGatherType       = jobacct_gather/cgroup"):
        assert line in config, line
    assert "tether-sandbox" in cluster.run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"]).stdout
    result, _ = srun_job(cluster, "-N1", "-n1", "cat", "/proc/self/cgroup", check=True)
    memory = next(line for line in result.stdout.splitlines() if ":memory:" in line)
    assert "/uid_" in memory and "/job_" in memory and "/step_0/task_0" in memory, memory


# ---- 1. processes: conmon and the container stay in the step's cgroup ------------------------------
def test_conmon_and_the_container_stay_in_the_steps_cgroup(cluster, image):
    proc = subprocess.Popen(["runuser", "-u", cluster.user, "--", "srun", "--job-name=tight", "-N1", "-n1",
                             f"--container-image={image}", "sh", "-c", "echo $SLURM_JOB_ID; exec sleep 61"],
                            env=cluster.box.command_env(), cwd=str(cluster.box.work_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        job = proc.stdout.readline().strip()
        assert job.isdigit(), proc.stderr.read() if proc.poll() is not None else job

        def found() -> list[str]:
            return [line for line in user_processes(cluster, "conmon") if f"-n tether-{job}-" in line] + \
                [line for line in user_processes(cluster, "sleep 61") if line.split(None, 2)[2] == "sleep 61"
                 and f"SLURM_JOB_ID={job}".encode() in environ(line.split()[0])]

        assert wait_until(lambda: len(found()) >= 2, timeout=30), found()
        for line in found():
            pid = line.split()[0]
            groups = Path(f"/proc/{pid}/cgroup").read_text()
            for controller in ("memory", "devices", "freezer", "cpuset"):
                path = next(g for g in groups.splitlines() if f":{controller}:" in g).split(":", 2)[2]
                assert re.search(rf"/job_{job}/step_0(/|$)", path), (line, controller, path)
    finally:
        cluster.run(["scancel", "-n", "tight", "-u", cluster.user], check=False)
        proc.communicate(timeout=120)


def environ(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


# ---- 2. CPU time: sacct's TotalCPU of a containerized burner is the host burner's ---------------------
def test_cpu_time_of_a_containerized_rank_is_accounted_like_a_host_rank(cluster, image):
    seconds = 15          # long enough that podman's own start (about 1 s of CPU here) stays within the 10 %
    times = {}
    for mode, extra in (("host", []), ("tether", [f"--container-image={image}"])):
        _, job = srun_job(cluster, "-N1", "-n1", *extra, "sh", "-c", BURN.format(s=seconds), check=True)
        rows = accounted(cluster, job)
        step = next(r for k, r in rows.items() if k.endswith(".0"))
        times[mode] = cpu_seconds(step["TotalCPU"])
    print(f"sacct TotalCPU of a {seconds} s burner: {times}")
    assert times["host"] >= 0.8 * seconds, times
    assert abs(times["tether"] - times["host"]) <= 0.10 * times["host"], times


# ---- 3. memory: past --mem, the cgroup kills the containerized rank --------------------------------------
ALLOC = "dd if=/dev/zero of=/dev/null bs=300M count=1 && echo survived"


def test_a_containerized_rank_past_its_memory_is_killed_by_the_cgroup(cluster, image):
    host, host_job = srun_job(cluster, "-N1", "-n1", "--mem=100M", "busybox", "sh", "-c", ALLOC)
    host_rows = accounted(cluster, host_job)
    tether, tether_job = srun_job(cluster, "-N1", "-n1", "--mem=100M", f"--container-image={image}", "sh", "-c",
                                  ALLOC)
    tether_rows = accounted(cluster, tether_job)
    assert "survived" not in host.stdout and host.returncode != 0, host.stdout + host.stderr
    assert "survived" not in tether.stdout and tether.returncode != 0, tether.stdout + tether.stderr
    assert "Killed" in tether.stderr or "137" in tether.stderr, tether.stderr
    assert host_rows[next(k for k in host_rows if k.endswith(".0"))]["State"] == "OUT_OF_MEMORY", host_rows
    step = tether_rows[next(k for k in tether_rows if k.endswith(".0"))]
    assert step["State"] in ("FAILED", "OUT_OF_MEMORY"), tether_rows


@pytest.mark.xfail(strict=True, reason="podman's runc puts the container in a cgroup below the task's; Slurm "
                   "22.05 (cgroup/v1) counts only OOM kills local to its own step/task cgroups, so the kill is "
                   "enforced but the step ends FAILED (137), not OUT_OF_MEMORY -- see docs/tight-integration.md")
def test_a_containerized_rank_past_its_memory_ends_out_of_memory_like_a_host_rank(cluster, image):
    _, job = srun_job(cluster, "-N1", "-n1", "--mem=100M", f"--container-image={image}", "sh", "-c", ALLOC)
    rows = accounted(cluster, job)
    assert rows[next(k for k in rows if k.endswith(".0"))]["State"] == "OUT_OF_MEMORY", rows


# ---- 4. signals: scancel sends SIGTERM into the container, SIGKILL after KillWait; nothing stays -------
TRAP = ("trap 'echo term > /mnt/term-{tag}; sleep 30' TERM; echo up > /mnt/up-{tag}; "
        "while :; do sleep 1; done")


def _cancel_when_up(cluster, argv: list[str], out: Path, tag: str) -> str:
    proc = subprocess.Popen(["runuser", "-u", cluster.user, "--", "srun", "--job-name=tight", "-N1", "-n1", *argv],
                            env=cluster.box.command_env(), cwd=str(cluster.box.work_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert wait_until(lambda: (out / f"up-{tag}").exists() or proc.poll() is not None, timeout=90), tag
    assert proc.poll() is None, proc.communicate()
    job = last_running(cluster)
    started = time.monotonic()
    cluster.run(["scancel", job])
    proc.communicate(timeout=120)
    assert wait_until(lambda: job not in cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split(), timeout=60)
    print(f"{tag}: ended {time.monotonic() - started:.1f} s after scancel")
    return job


def last_running(cluster) -> str:
    out = cluster.run(["squeue", "-h", "-u", cluster.user, "-n", "tight", "-o", "%i"]).stdout.split()
    assert out, "no running job"
    return sorted(out, key=int)[-1]


def _containers(cluster, prefix: str) -> list[str]:
    conf = cluster.box.etc / "containers.conf"
    out = cluster.run(["runuser", "-u", cluster.user, "--", "env", f"CONTAINERS_CONF={conf}", "podman", "ps", "-a",
                       "--format", "{{.Names}}"], check=False, cwd="/").stdout
    return [n for n in out.split() if n.startswith(prefix)]


def test_scancel_reaches_the_container_with_sigterm_first_and_leaves_nothing(cluster, image, tmp_path):
    out = cluster.box.work_dir / f"signals-{os.getpid()}"
    out.mkdir(exist_ok=True)
    os.chmod(out, 0o777)
    tag = "tether"
    job = _cancel_when_up(cluster, [f"--container-image={image}", f"--container-mounts={out}:/mnt", "sh", "-c",
                              TRAP.format(tag=tag)], out, tag)
    assert (out / f"term-{tag}").read_text().strip() == "term"        # SIGTERM reached the trap first
    assert wait_until(lambda: [l for l in user_processes(cluster, "sleep 30")] == [], timeout=30)
    assert wait_until(lambda: _containers(cluster, f"tether-{job}-") == [], timeout=60), _containers(cluster, "tether-")


def test_podman_started_by_hand_under_srun_fails_what_tether_keeps(cluster, image):
    """The loose baseline: the same trap through `srun podman run --rm`. runc keeps the container in
    a cgroup of its own below the step's, where Slurm's SIGTERM does not reach it, and podman passes
    the signal only to the container's first process; when the step's SIGKILL takes conmon before
    podman cleans up, the container also stays in the user's podman. At least one must show."""
    out = cluster.box.work_dir / f"signals-{os.getpid()}"
    out.mkdir(exist_ok=True)
    os.chmod(out, 0o777)
    tag, name = "loose", f"loose-{os.getpid()}"
    try:
        _cancel_when_up(cluster, podman_loose(cluster, image, "--rm", "--name", name, "--volume", f"{out}:/mnt")
                        + ["sh", "-c", TRAP.format(tag=tag)], out, tag)
        time.sleep(3)
        delivered, left = (out / f"term-{tag}").exists(), _containers(cluster, name)
        print(f"loose: SIGTERM reached the trap: {delivered}; container left behind: {left}")
        assert not delivered or left, "podman by hand behaved as tether does: the test cannot tell them apart"
    finally:
        conf = cluster.box.etc / "containers.conf"
        cluster.run(["runuser", "-u", cluster.user, "--", "env", f"CONTAINERS_CONF={conf}", "podman", "rm", "-f",
                     name], check=False, cwd="/")


# ---- 5. devices: only the step's GPUs, inside the container too ------------------------------------------
def test_a_container_opens_only_its_steps_gpus(cluster, image):
    """The fake GPUs are char 60:N (no driver: ENXIO once the devices cgroup lets an open through,
    EPERM when it does not). A rank with one GPU sees only its own in the container (CDI); another
    GPU's node bind-mounted in anyway is refused by the step's devices cgroup, as on the host."""
    probe = ("for f in /dev/tether-fakegpu*; do (exec 3<$f) 2>&1 | sed \"s|.*: |$f: |\"; done; "
             "(exec 3</extra) 2>&1 | sed 's|.*: |/extra: |'")
    host, _ = srun_job(cluster, "-p", "gpu", "-N1", "-n1", "--gpus=1", "sh", "-c",
                       probe.replace("/extra", "/dev/tether-fakegpu3"), check=True)
    assert host.stdout.count("No such device or address") == 1, host.stdout    # its own
    assert host.stdout.count("Operation not permitted") >= 3, host.stdout       # the others
    inside, _ = srun_job(cluster, "-p", "gpu", "-N1", "-n1", "--gpus=1", f"--container-image={image}",
                         "--container-mounts=/dev/tether-fakegpu3:/dev/extra", "sh", "-c",
                         probe.replace("/extra", "/dev/extra"), check=True)
    lines = inside.stdout.strip().splitlines()
    own = [line for line in lines if line.startswith("/dev/tether-fakegpu")]
    assert len(own) == 1 and ("No such device or address" in own[0] or "such device" in own[0]), lines
    extra = next(line for line in lines if line.startswith("/dev/extra"))
    assert "ermission" in extra or "not permitted" in extra, lines


def test_a_time_limit_sends_sigterm_into_the_container_first(cluster, time_limited_jobs):
    """The session's container job with a 1-minute limit: its step traps SIGTERM inside the container."""
    job = time_limited_jobs["container_trap"]
    assert wait_until(lambda: job not in cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split(), timeout=240)
    rows = accounted(cluster, job, "JobID,State")
    assert rows[job]["State"] == "TIMEOUT", rows
    assert (cluster.box.work_dir / "timeout-signals" / f"term-{job}").read_text().strip() == "term"
    assert wait_until(lambda: _containers(cluster, f"tether-{job}-") == [], timeout=60)


def test_podman_as_root_is_refused_in_a_cgroup_step(cluster, image):
    """Part 3: root's podman would move the container to /libpod_parent, out of the step: refused
    with the reason, not run loose."""
    result = cluster.run(["srun", "-N1", "-n1", f"--container-image={image}", "true"], check=False, timeout=120)
    assert result.returncode == 125, result.stdout + result.stderr
    assert "tether: podman as root moves the container into a cgroup of its own (/libpod_parent)" in result.stderr
