"""Issue 16: tight integration proven with Slurm's own accounting and limits (docs/requirements.md,
"Tight integration").

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
from tether.container.runtimes.podman import STALE_STATE
from tether.sandbox.cluster import FAKE_GPU_PREFIX, GPUS_PER_NODE
from helpers import cpu_seconds, user_processes, wait_until

pytestmark = pytest.mark.cluster


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
    return ["env", *cluster.box.podman_env(), "podman", "run", "--runtime", "runc",
            "--network=host", "--read-only", *args, "--rootfs", image]


def loose_podman_has_own_cgroups(cluster) -> bool:
    """Whether podman run by hand makes a cgroup of its own below the task's: podman 4 (the host's
    4.3) does; rootless podman 5 on cgroup v1 (24.11's root has 5.4) runs without cgroups, so its
    container stays in the task's."""
    version = cluster.run(["podman", "--version"], cwd="/").stdout.split()[-1]
    return int(version.split(".")[0]) < 5


def host_rank_cgroups(cluster) -> dict[str, str]:
    """Where a host rank of step 0 is, by controller, below its job's directory (``/step_0/task_0``):
    Slurm's own layout, which differs between releases (22.05 keeps cpuset at the step, 24.11
    goes down to the task)."""
    result, _ = srun_job(cluster, "-N1", "-n1", "cat", "/proc/self/cgroup", check=True)
    layout = {}
    for line in result.stdout.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller in ("memory", "devices", "freezer", "cpuset"):
                layout[controller] = re.sub(r"^.*/job_\d+", "", path)
    return layout


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
def _cgroups_of_a_running_step(cluster, argv: list[str], mark: str) -> tuple[str, dict[str, dict[str, str]]]:
    """Run ``srun ARGV`` (it prints its job id, then runs ``sleep 61``); the job id and, for conmon
    and for the ``sleep 61`` of that job, their cgroup v1 paths by controller."""
    proc = subprocess.Popen(cluster.box.wrap(["runuser", "-u", cluster.user, "--", "srun", "--job-name=tight", "-N1",
                                              "-w", cluster.nodes[0], "-n1", *argv]),
                            env=cluster.box.command_env(), cwd=str(cluster.box.work_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        job = proc.stdout.readline().strip()
        assert job.isdigit(), proc.stderr.read() if proc.poll() is not None else job

        def found() -> dict[str, str]:
            conmon = [line.split()[0] for line in user_processes(cluster, "conmon") if mark.format(job=job) in line]
            # the container's first process (sleep, exec'd) is conmon's child
            sleep = [line.split()[0] for line in user_processes(cluster, "sleep 61")
                     if line.split(None, 2)[2] == "sleep 61" and parent(line.split()[0]) in conmon]
            return {conmon[0]: "conmon", sleep[0]: "sleep"} if conmon and sleep else {}

        pids = wait_until(found, timeout=30)
        assert pids, (user_processes(cluster, "conmon"), user_processes(cluster, "sleep"))
        paths = {}
        for pid, what in pids.items():
            groups = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
            paths[what] = {c: next(g for g in groups if f":{c}:" in g).split(":", 2)[2]
                           for c in ("memory", "devices", "freezer", "cpuset")}
        return job, paths
    finally:
        cluster.run(["scancel", "-n", "tight", "-u", cluster.user], check=False)
        proc.communicate(timeout=120)


def test_the_containers_processes_are_in_slurms_own_cgroups_of_the_step(cluster, image):
    job, paths = _cgroups_of_a_running_step(
        cluster, [f"--container-image={image}", "sh", "-c", "echo $SLURM_JOB_ID; exec sleep 61"],
        "-n tether-{job}-")
    # Slurm's own directories, exactly: where a host rank is, so Slurm's OOM accounting and its
    # signals (proctrack/cgroup reads the step's own cgroup.procs) see them
    host = host_rank_cgroups(cluster)
    assert host["memory"] == "/step_0/task_0", host
    for controller in ("memory", "devices", "freezer", "cpuset"):
        assert paths["sleep"][controller].endswith(f"/job_{job}{host[controller]}"), (controller, host, paths)
    for controller, path in paths["conmon"].items():
        assert re.search(rf"/job_{job}/step_0(/|$)", path), (controller, paths)


def test_podman_by_hand_under_srun_leaves_slurms_cgroups_for_a_child_of_its_own(cluster, image):
    """The loose baseline: runc's own cgroup below the task's -- still limited, but Slurm's OOM
    accounting and signals do not see it (what the keeper in spank/cgkeeper.c corrects). Rootless
    podman 5 on cgroup v1 makes none: its container stays in the task's cgroup."""
    job, paths = _cgroups_of_a_running_step(
        cluster, ["sh", "-c", "echo $SLURM_JOB_ID; exec " + " ".join(
            podman_loose(cluster, image, "--rm", "--name", "loose-$SLURM_JOB_ID")) + " sleep 61"], "-n loose-{job}")
    _remove_loose(cluster, f"loose-{job}")
    if not loose_podman_has_own_cgroups(cluster):
        host = host_rank_cgroups(cluster)
        assert paths["sleep"]["memory"].endswith(f"/job_{job}{host['memory']}"), (host, paths)
        return
    assert re.search(rf"/job_{job}/step_0/task_0/[0-9a-f]{{64}}$", paths["sleep"]["memory"]), paths
    assert re.search(rf"/job_{job}/step_0/[0-9a-f]{{64}}$", paths["sleep"]["freezer"]), paths


def _remove_loose(cluster, name: str) -> None:
    """podman by hand leaves its container behind when the step is cancelled: remove it (twice --
    the first rm of a container whose conmon was killed only marks it stopped). On a cold node the
    step's end also took the pause process the step's podman made: with only a container recorded
    running whose conmon is gone to join, the user's podman refuses every command (podman 5's
    `system migrate` cannot repair that). A podman command in tether's store, which has no such
    container, makes a pause process first (outside Slurm: the test's cold_nodes fixture ends it) --
    once its own state is repaired as tether's launcher repairs it: a cold node meets tether's
    store with a container of a killed step recorded running too (the time-limited jobs')."""
    cluster.box.repair_podman(cluster.box.user_podman())
    cluster.run([*cluster.box.user_podman(), "ps", "--quiet"], cwd="/")
    podman = cluster.box.on_node(None, ["runuser", "-u", cluster.user, "--", "env", *cluster.box.podman_env(), "podman"])
    for _ in range(2):
        cluster.run([*podman, "rm", "-f", "--ignore", name], check=False, cwd="/")


def environ(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def parent(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return ""




# ---- 2. CPU time: sacct's TotalCPU of a containerized rank is the CPU its work used ----------------------
# A fixed amount of work (not a fixed time: on a busy machine a time-bound burner gets what the
# machine spares), which then says what CPU it used itself: the shell's `times`.
WORK = "i=0; while [ $i -lt {n} ]; do i=$((i+1)); done; times"


def own_cpu(output: str) -> float:
    """The user + system seconds the shell's ``times`` printed first (``0m4.450000s 0m0.010s``)."""
    first = next(line for line in output.splitlines() if re.fullmatch(r"\s*\d+m[\d.]+s \d+m[\d.]+s\s*", line))
    return sum(int(m) * 60 + float(s) for m, s in re.findall(r"(\d+)m([\d.]+)s", first))


def test_cpu_time_of_a_containerized_rank_is_accounted_like_a_host_rank(cluster, image):
    """sacct accounts the CPU of a rank in a container as of one on the host: all the CPU its work
    used (nothing ran outside the step's cgroup), and not much more (podman's own start, about
    1 s of CPU here). Measured against the CPU the work reports for itself, never the clock, so a
    busy machine changes nothing."""
    seen = {}
    for mode, extra in (("host", []), ("tether", [f"--container-image={image}"])):
        result, job = srun_job(cluster, "-N1", "-n1", *extra, "sh", "-c", WORK.format(n=2_000_000), check=True)
        rows = accounted(cluster, job)
        step = next(r for k, r in rows.items() if k.endswith(".0"))
        seen[mode] = (own_cpu(result.stdout), cpu_seconds(step["TotalCPU"]))
    print(f"(CPU the work reported, sacct TotalCPU): {seen}")
    for mode, (own, accounted_cpu) in seen.items():
        assert own >= 1.0, seen                              # the work did run
        assert accounted_cpu >= 0.95 * own, seen             # all of it in the step's accounting
        assert accounted_cpu - own <= max(0.10 * own, 2.0), seen    # and little besides (podman's start)


# ---- 3. memory: past --mem, the cgroup kills the containerized rank --------------------------------------
ALLOC = "dd if=/dev/zero of=/dev/null bs=300M count=1 && echo survived"


def test_a_containerized_rank_past_its_memory_is_killed_and_ends_out_of_memory_like_a_host_rank(cluster, image):
    runs = {"host": ["busybox", "sh", "-c", ALLOC],
            "tether": [f"--container-image={image}", "sh", "-c", ALLOC],
            "loose": [*podman_loose(cluster, image, "--rm"), "sh", "-c", ALLOC]}
    states = {}
    for mode, argv in runs.items():
        result, job = srun_job(cluster, "-N1", "-n1", "--mem=100M", *argv)
        assert "survived" not in result.stdout and result.returncode != 0, (mode, result.stdout + result.stderr)
        rows = accounted(cluster, job)
        states[mode] = rows[next(k for k in rows if k.endswith(".0"))]["State"]
    print(f"step state past --mem: {states}")
    assert states["host"] == "OUT_OF_MEMORY" and states["tether"] == "OUT_OF_MEMORY", states
    # by hand, the kill happens in runc's child cgroup: Slurm 22.05 does not count it (podman 5 on
    # cgroup v1 makes none: the task's cgroup is where the kill happens)
    assert states["loose"] == ("FAILED" if loose_podman_has_own_cgroups(cluster) else "OUT_OF_MEMORY"), states


# ---- 4. signals: scancel sends SIGTERM into the container, SIGKILL after KillWait; nothing stays -------
# each SIGTERM appends a line (a host rank's trap gets one); the loop runs on until SIGKILL
TRAP = ("trap 'echo term >> /mnt/term-{tag}' TERM; echo up > /mnt/up-{tag}; "
        "while :; do sleep 1; done")


def _cancel_when_up(cluster, argv: list[str], out: Path, tag: str) -> str:
    proc = subprocess.Popen(cluster.box.wrap(["runuser", "-u", cluster.user, "--", "srun", "--job-name=tight", "-N1",
                                              "-w", cluster.nodes[0], "-n1", *argv]),
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
    names = []
    for node in cluster.nodes:
        out = cluster.run([*cluster.box.user_podman(node), "ps", "-a", "--format", "{{.Names}}"], check=False,
                          cwd="/").stdout
        names += [n for n in out.split() if n.startswith(prefix)]
    return names


def test_scancel_reaches_the_container_with_sigterm_first_and_leaves_nothing(cluster, image, tmp_path):
    out = cluster.box.work_dir / f"signals-{os.getpid()}"
    out.mkdir(exist_ok=True)
    os.chmod(out, 0o777)
    tag = "tether"
    job = _cancel_when_up(cluster, [f"--container-image={image}", f"--container-mounts={out}:/mnt", "sh", "-c",
                              TRAP.format(tag=tag)], out, tag)
    # SIGTERM reached the trap first, once -- as a host rank's (Slurm signals the container's
    # processes itself; the launcher does not signal them again, nor does podman's proxy add one)
    assert (out / f"term-{tag}").read_text() == "term\n"
    assert wait_until(lambda: not [line for line in user_processes(cluster, "sleep 1") if f"SLURM_JOB_ID={job}"
                                   in (environ(line.split()[0]) or "")], timeout=30)
    assert wait_until(lambda: _containers(cluster, f"tether-{job}-") == [], timeout=60), _containers(cluster, "tether-")
    assert wait_until(lambda: not _in_job_cgroups(job), timeout=30), _in_job_cgroups(job)   # nothing outlives it


def test_podman_started_by_hand_under_srun_fails_what_tether_keeps(cluster, image):
    """The loose baseline: the same trap through `srun podman run --rm`. runc puts the container in
    a cgroup of its own below the step's, which proctrack/cgroup neither signals nor waits for: the
    step's SIGKILL takes podman and conmon, and the container runs on after the job has ended (in
    the job's cgroups, in the user's own podman). Whether podman's signal proxy passed SIGTERM on
    before that is a race, so it is printed, not asserted."""
    out = cluster.box.work_dir / f"signals-{os.getpid()}"
    out.mkdir(exist_ok=True)
    os.chmod(out, 0o777)
    tag, name = "loose", f"loose-{os.getpid()}"
    try:
        job = _cancel_when_up(cluster, podman_loose(cluster, image, "--rm", "--name", name, "--volume",
                                                    f"{out}:/mnt") + ["sh", "-c", TRAP.format(tag=tag)], out, tag)
        time.sleep(3)
        delivered = (out / f"term-{tag}").exists()
        survivors, left = _in_job_cgroups(job), _loose_containers(cluster, name)
        print(f"loose: SIGTERM reached the trap: {delivered}; after the job: processes {survivors}, "
              f"containers {left}")
    finally:
        _remove_loose(cluster, name)
    # on a cold node the step's end also took the pause process the step's podman made: the user's
    # podman then refuses every command (it would join the container, whose conmon is gone) until
    # its state is repaired -- unless another podman of the user made a pause process meanwhile
    if loose_podman_has_own_cgroups(cluster):     # still running, in runc's cgroup below the task's
        assert survivors and (left == [STALE] or len(left) == 1 and left[0].startswith(f"{name} Up ")), \
            (survivors, left)
    else:     # its processes died with the task's cgroup; podman still lists it as running
        assert not survivors and left in ([STALE], [f"{name} running"]), (survivors, left)
    assert wait_until(lambda: not _in_job_cgroups(job), timeout=30), _in_job_cgroups(job)   # removed by hand


def _in_job_cgroups(job: str) -> list[str]:
    """``pid args`` of every process still in one of job ``job``'s cgroups (any controller)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            groups = (entry / "cgroup").read_text()
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if re.search(rf"/job_{job}(/|$)", groups, re.MULTILINE):
            found.append(f"{entry.name} {args}")
    return found


def _loose_containers(cluster, name: str) -> list[str]:
    """``NAME STATE`` (podman 4.3's: ``Up 5 seconds ago``) of the containers called ``name`` in the
    user's own podman (where podman by hand keeps them -- not tether's store); [STALE] when podman
    refuses to answer because its run state is stale."""
    result = cluster.run(cluster.box.on_node(None, ["runuser", "-u", cluster.user, "--", "env", *cluster.box.podman_env(),
                                                    "podman", "ps", "-a", "--filter", f"name=^{name}$", "--format",
                                                    "{{.Names}} {{.State}}"]), check=False, cwd="/")
    if result.returncode and STALE_STATE in result.stderr:
        return [STALE]
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\n")[:-1] if result.stdout else []


STALE = "(podman refuses: its run state is stale)"


# ---- 5. devices: only the step's GPUs, inside the container too ------------------------------------------
def test_a_container_opens_only_its_steps_gpus(cluster, image):
    """The fake GPUs are char 60:N (no driver: ENXIO once the devices cgroup lets an open through,
    EPERM when it does not). A rank with one GPU sees only its own in the container (CDI); another
    GPU's node bind-mounted in anyway is refused by the step's devices cgroup, as on the host."""
    probe = ("echo $SLURM_STEP_GPUS; for f in /dev/tether-fakegpu*; do (exec 3<$f) 2>&1 | sed \"s|.*: |$f: |\"; done; "
             "(exec 3</extra) 2>&1 | sed 's|.*: |/extra: |'")
    enxio, eperm = "No such device or address", "Operation not permitted"
    host, _ = srun_job(cluster, "-p", "gpu", "-N1", "-n1", "--gpus=1", "sh", "-c",
                       probe.replace("/extra", "/dev/tether-fakegpu3"), check=True)
    own, *lines = host.stdout.splitlines()
    assert own in ("0", "1", "2"), host.stdout    # one GPU, not the one bind-mounted below as another's
    # its own opens as far as the (absent) driver; every other one of the node's, and GPU 3 again, is refused
    assert lines == [f"{FAKE_GPU_PREFIX}{i}: {enxio if str(i) == own else eperm}" for i in range(GPUS_PER_NODE)] + \
        [f"{FAKE_GPU_PREFIX}3: {eperm}"], host.stdout
    inside, _ = srun_job(cluster, "-p", "gpu", "-N1", "-n1", "--gpus=1", f"--container-image={image}",
                         "--container-mounts=/dev/tether-fakegpu3:/dev/extra", "sh", "-c",
                         probe.replace("/extra", "/dev/extra"), check=True)
    own, *lines = inside.stdout.splitlines()
    assert own in ("0", "1", "2"), inside.stdout
    # only its own GPU is in the container, and opens; GPU 3, mounted in as /dev/extra, is refused
    assert lines == [f"{FAKE_GPU_PREFIX}{own}: {enxio}", f"/dev/extra: {eperm}"], inside.stdout


def test_a_time_limit_sends_sigterm_into_the_container_first(cluster, time_limited_jobs):
    """The session's container job with a 1-minute limit: its step traps SIGTERM inside the container."""
    job = time_limited_jobs["container_trap"]
    assert wait_until(lambda: job not in cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split(), timeout=240)
    rows = accounted(cluster, job, "JobID,State")
    assert rows[job]["State"] == "TIMEOUT", rows
    out = cluster.box.work_dir / "timeout-signals"
    said = (out / f"job-{job}.out").read_text() if (out / f"job-{job}.out").exists() else "(no output)"
    # the container was up (its trap set) before the limit, else the test proves nothing
    assert (out / f"up-{job}").exists(), f"the container never started before the time limit: {said}"
    # At the limit slurmd signals the step's tasks with SIGTERM twice, back to back: _rpc_timelimit,
    # then the _rpc_terminate_job it calls (22.05 req.c). A host rank's trap runs once or twice (two
    # SIGTERMs pending while sh waits for `sleep 1` are one); 20 host and 20 container jobs here all
    # said once, CI once said twice. Never none (the container got it before SIGKILL), never more
    # (tether forwards each signal once).
    term = out / f"term-{job}"
    assert term.exists() and term.read_text() in ("term\n", "term\nterm\n"), said
    assert wait_until(lambda: _containers(cluster, f"tether-{job}-") == [], timeout=60)


def test_podman_as_root_is_refused_in_a_cgroup_step(cluster, image):
    """Part 3: root's podman would move the container to /libpod_parent, out of the step: refused
    with the reason, not run loose."""
    result = cluster.run(["srun", "-N1", "-n1", f"--container-image={image}", "true"], check=False, timeout=120)
    assert result.returncode == 125, result.stdout + result.stderr
    assert "tether: podman as root moves the container into a cgroup of its own (/libpod_parent)" in result.stderr
