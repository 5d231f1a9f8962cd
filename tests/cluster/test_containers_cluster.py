"""Containers on the real cluster: real podman (rootless, as the job user) under real srun/sbatch,
handed over by the SPANK plugin in slurmstepd to tether's launcher.

The image is a busybox root filesystem the tests build (root-owned and shared, as an admin's
image directory would be); the sandbox config selects podman with runc (see Sandbox.tether_settings).
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest

from tether.container.runtimes.podman import Podman
from helpers import cpu_seconds, job_entries, parse, user_processes, wait_until, without_runc_warnings

pytestmark = pytest.mark.cluster

SHOW = ("echo RANK=$RANK LOCAL_RANK=$LOCAL_RANK NODE_RANK=$NODE_RANK WORLD_SIZE=$WORLD_SIZE "
        "TMPDIR=$TMPDIR WORK=$TETHER_WORK_DIR PWD=$(pwd) UID=$(id -u) IN=$(grep -qF \"@IMAGE@ / \" "
        "/proc/self/mountinfo && echo container || echo host) OWN_TMP=$(ls /tmp | tr '\\n' +) MASTER=$MASTER_ADDR:$MASTER_PORT "
        "PATH_IN=$PATH SECRET=${SECRET:-unset} OTHER=${OTHER:-unset} JOB=$SLURM_JOB_ID")


def show(image: str) -> str:
    """SHOW for this image: a rank is in the container when its / is the image directory."""
    return SHOW.replace("@IMAGE@", image)


def podman_containers(cluster, job: str, listing: tuple[str, ...] = ("ps", "-a", "--format", "{{.Names}}")
                      ) -> list[str]:
    """The job's containers in the job user's podman store of every node (running or not); or
    what another ``listing`` names (its pods)."""
    names = []
    for node in cluster.nodes:
        out = cluster.run([*cluster.box.user_podman(node), *listing], check=False, cwd="/").stdout
        names += [n for n in out.split() if n.startswith(f"tether-{job}-")]
    return names


def of_job(lines: list[str], job: str) -> list[str]:
    """The ``ps`` lines of processes started for ``job`` (by SLURM_JOB_ID in their environment):
    the other tests' jobs run meanwhile."""
    mine = []
    for line in lines:
        try:
            env = Path(f"/proc/{line.split()[0]}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURM_JOB_ID={job}".encode() in env:
            mine.append(line)
    return mine


def test_srun_runs_each_rank_in_its_own_container(cluster, image):
    out = cluster.box.work_dir / f"mnt-{os.getpid()}"
    out.mkdir(exist_ok=True)
    os.chmod(out, 0o777)
    result = cluster.run(["runuser", "-u", cluster.user, "--", "env", "SECRET=s3", "OTHER=o", "srun", "-N3",
                          "-n6", "--ntasks-per-node=2", f"--container-image={image}", f"--container-mounts={out}:/mnt",
                          "--container-env=SECRET", "sh", "-c",
                          f"echo $RANK > /tmp/mine; touch /mnt/rank-$RANK; {show(image)}"])
    ranks = parse(result.stdout)
    assert [r["RANK"] for r in ranks] == [str(i) for i in range(6)], result.stdout + result.stderr
    uid = cluster.run(["id", "-u", cluster.user]).stdout.strip()
    for r in ranks:
        rank = int(r["RANK"])
        assert (r["WORLD_SIZE"], r["NODE_RANK"], r["LOCAL_RANK"]) == ("6", str(rank // 2), str(rank % 2)), r
        assert (r["IN"], r["UID"], r["TMPDIR"], r["WORK"], r["PWD"]) == (
            "container", uid, "/tmp", "/run/tether/workdir", "/run/tether/workdir"), r
        assert r["OWN_TMP"] == "mine+", r                       # its own /tmp: nobody else's file
        assert r["MASTER"] == ranks[0]["MASTER"] and r["PATH_IN"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        assert (r["SECRET"], r["OTHER"]) == ("s3", "o")         # the job's environment enters (issue 22)
    assert sorted(p.name for p in out.iterdir()) == [f"rank-{i}" for i in range(6)]
    assert {p.stat().st_uid for p in out.iterdir()} == {int(uid)}
    assert podman_containers(cluster, ranks[0]["JOB"]) == []


def test_the_common_case_takes_the_c_launcher_on_every_node(cluster, image):
    """An image-only rank is planned and supervised by tether-run itself (its plan baked from the
    Python adapter at install), on each node of the installed cluster; a rank with another
    container option goes to the Python launcher, and says so (TETHER_RUN_WHY_PYTHON)."""
    common = cluster.run(["runuser", "-u", cluster.user, "--", "env", "TETHER_RUN_WHY_PYTHON=1", "srun", "-N3",
                          "--ntasks-per-node=1", f"--container-image={image}", "sh", "-c",
                          "echo ran $RANK $TETHER_CONTAINER"])
    assert sorted(common.stdout.split("\n"))[1:] == [f"ran {r} 1" for r in range(3)], common.stdout + common.stderr
    assert "tether-run: python:" not in common.stderr, common.stderr
    other = cluster.run(["runuser", "-u", cluster.user, "--", "env", "TETHER_RUN_WHY_PYTHON=1", "srun", "-N1",
                         f"--container-image={image}", "--container-workdir=/tmp", "sh", "-c", "echo ran $PWD"])
    assert other.stdout.strip() == "ran /tmp", other.stdout + other.stderr
    assert "tether-run: python: a container option besides the image" in other.stderr, other.stderr


def test_an_interactive_container_shell_under_srun_pty(cluster, image):
    """`srun --pty --container-image=IMG sh`, typed at a terminal (`script` gives srun one): the
    shell reads what is typed, has a terminal inside, and its exit status is srun's. podman run
    without --interactive gave it no stdin: the shell ended at once, silently."""
    typed = "(sleep 5; echo 'echo in-$((6*7)); tty'; sleep 2; echo 'exit 3')"
    session = cluster.as_user(["sh", "-c", f"{typed} | script -qec 'srun -N1 --pty --container-image={image} sh' "
                               "/dev/null"], check=False, timeout=120)
    assert session.returncode == 3, session.stdout + session.stderr
    assert "\nin-42" in session.stdout.replace("\r", "") and "/dev/pts/" in session.stdout, session.stdout


def test_exit_codes_and_start_failures_reach_the_user(cluster, image):
    fail = cluster.as_user(["srun", "-N2", "-n2", f"--container-image={image}", "sh", "-c", "exit $((RANK+3))"],
                           check=False)
    assert fail.returncode != 0
    assert "task 0: Exited with exit code 3" in fail.stderr and "task 1: Exited with exit code 4" in fail.stderr
    missing = cluster.as_user(["srun", "-N1", "--container-image=/no/such/image", "true"], check=False)
    assert "tether: --container-image=/no/such/image: no such file or directory on this node" in missing.stderr
    assert "Exited with exit code 125" in missing.stderr
    nocmd = cluster.as_user(["srun", "-N1", f"--container-image={image}", "no-such-command"], check=False)
    assert "executable file not found" in nocmd.stderr and "podman could not start the container (exit 126)" \
        in nocmd.stderr
    bad = cluster.as_user(["srun", "-N1", f"--container-image={image}", "--container-mounts=rel:/x", "true"],
                          check=False)
    assert "tether: --container-mounts: 'rel:/x': the source must be an absolute path, a relative path" in bad.stderr
    gone = cluster.as_user(["srun", "-N1", f"--container-image={image}", "--container-mounts=/no/such/dir:/x",
                            "true"], check=False)
    assert "tether: --container-mounts: /no/such/dir: source path does not exist on this node" in gone.stderr
    assert "Exited with exit code 125" in gone.stderr and "statfs" not in gone.stderr    # podman never ran
    # these two were refused until the shared rootfs could be imported into the user's store
    target = cluster.as_user(["srun", "-N1", f"--container-image={image}", "--container-mounts=/etc:/data",
                              "test", "-d", "/data/slurm"], check=False)
    assert target.returncode == 0, target.stderr
    writable = cluster.as_user(["srun", "-N1", f"--container-image={image}", "--container-writable", "true"],
                               check=False)
    assert writable.returncode == 0, writable.stderr


def test_image_references_are_checked_where_they_are_typed(cluster):
    """Issue 14: `--container-image=ubuntu:22.04` (pyxis's spelling) was refused, and only on the
    node after the queue wait. Registry references are accepted at submit; a bad one is refused by
    sbatch (job_submit) and, inside an allocation, by srun itself (the SPANK plugin's client check)."""
    held = cluster.submit("-H", "--container-image=ubuntu:22.04", "--wrap", "true")
    cluster.run(["scancel", held])
    bad = cluster.as_user(["sbatch", "-H", "--container-image=img.sif", "--wrap", "true"], check=False)
    assert bad.returncode != 0 and "tether: --container-image=img.sif: expected a path" in bad.stderr
    assert "(a local image: its path, absolute or starting with ./)" in bad.stderr
    inside = cluster.as_user(["salloc", "-N1", "srun", "--container-image=Ubuntu", "true"], check=False)
    assert inside.returncode != 0 and "tether: --container-image=Ubuntu: expected a path" in inside.stderr
    assert "nvcr.io#nvidia/pytorch:24.01-py3" in inside.stderr           # the accepted forms, by example


def test_a_registry_image_is_pulled_once_per_node_and_then_never(cluster, registry_image):
    """Issue 14: a real registry (the sandbox's docker-registry), real rootless podman: 3 nodes x 2
    ranks of a cold image cause one pull per store -- counted in the registry's own access log --
    with the other ranks waiting (and saying so); the next job pulls nothing. The store is per user
    per node on a node-local disk (container.podman.store): each sandbox node has its own, so one
    pull per node, as on a cluster."""
    for node in cluster.nodes:                                          # cold: not in the user's stores
        cluster.run([*cluster.box.user_podman(node), "rmi", "--force", registry_image], check=False, cwd="/")
    repository = registry_image.split("/", 1)[1].split(":")[0]
    runs = []
    for _ in range(2):
        before = len(cluster.box.registry_access_log())
        result = cluster.as_user(["srun", "-N3", "-n6", f"--container-image={registry_image}", "sh", "-c",
                                  "echo rank=$RANK in=$(test -e /etc/debian_version && echo host || echo container)"])
        requests = cluster.box.registry_access_log()[before:]
        runs.append((result, requests))
    (cold, cold_requests), (warm, warm_requests) = runs
    assert sorted(cold.stdout.split("\n")[:-1]) == [f"rank={r} in=container" for r in range(6)]
    manifests = [r for r in cold_requests if f"/v2/{repository}/manifests/" in r and '"GET ' in r]
    assert len(manifests) == 3, cold_requests                         # one pull per store: per node
    assert cold.stderr.count(f"tether: pulling {registry_image} (podman) ...") == 3, cold.stderr
    assert cold.stderr.count("tether: waiting for another rank on this node") <= 3
    # the next job: the tag checked against the registry once per node (its manifest, and podman
    # reads the image's config again), no layer fetched, nothing said
    config = _manifest(cluster, registry_image)["config"]["digest"]
    blobs = [r.split('"GET ', 1)[1].split()[0] for r in warm_requests if "/blobs/" in r]
    assert blobs == [f"/v2/{repository}/blobs/{config}"] * len(blobs) and len(blobs) <= 3, blobs
    assert "pulling" not in warm.stderr
    assert len([r for r in warm_requests if f"/v2/{repository}/manifests/" in r and '"GET ' in r]) == 3, warm_requests
    assert "tether:" not in warm.stderr, warm.stderr
    assert sorted(warm.stdout.split("\n")[:-1]) == [f"rank={r} in=container" for r in range(6)]


def _manifest(cluster, image: str) -> dict:
    """The registry's manifest of ``image`` (ADDRESS/REPOSITORY:TAG), as podman reads it."""
    import json
    import urllib.request

    address, rest = image.split("/", 1)
    repository, tag = rest.rsplit(":", 1)
    request = urllib.request.Request(f"http://{address}/v2/{repository}/manifests/{tag}",
                                     headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def test_a_moved_tag_runs_the_new_image_in_the_next_job(cluster):
    """A tag pushed again (app:1 rebuilt) names a new image: pyxis imports it anew every step, and
    tether's store keeps the old copy -- so each job checks a tagged image against the registry
    once per node, pulls the new one and says so; the job's later steps run it too."""
    node = cluster.nodes[0]

    def push(version: int) -> str:
        return cluster.box.registry_image(repository="tether/moving", changes=("CMD /bin/sh", f"ENV IMAGE_VERSION={version}"),
                                          replace=True)

    image = push(1)
    first = cluster.as_user(["srun", "-N1", "-w", node, f"--container-image={image}", "sh", "-c", "echo v$IMAGE_VERSION"])
    assert first.stdout.strip() == "v1", first
    assert push(2) == image
    steps = cluster.as_user(["salloc", "-N1", "-w", node, "sh", "-c",
                             f"srun --container-image={image} sh -c 'echo v$IMAGE_VERSION'; "
                             f"srun --container-image={image} sh -c 'echo v$IMAGE_VERSION'"])
    assert steps.stdout.split() == ["v2", "v2"], steps
    assert steps.stderr.count(f"tether: {image} has changed in its registry since your store's copy: pulled the "
                              f"new one") == 1, steps.stderr


def test_an_image_the_registry_lacks_is_pulled_once_per_node_and_every_rank_fails(cluster, registry_image):
    """pyxis's "attempted once" (docker_image.bats): the ranks of a step on a node pull an image
    once; when that fails, the rank that pulled says why in pyxis's words, the others fail at once
    with a line that says so, and none tries again -- per node, as each node has its own store.
    The next step tries again (the registry may have it by then)."""
    missing = registry_image.rsplit("/", 1)[0] + "/nosuch-image:1"
    for _ in range(2):
        result = cluster.as_user(["srun", "-N2", "-n4", f"--container-image={missing}", "true"], check=False)
        assert result.returncode != 0, result
        assert result.stderr.count(f"tether: pulling {missing} (podman) ...") == 2, result.stderr
        assert result.stderr.count(f"failed to import docker image: {missing}") == 2, result.stderr
        assert result.stderr.count(f"tether: pulling {missing} (podman) failed for another rank of this step on "
                                   f"this node (its message says why); not tried again") == 2, result.stderr


def test_a_mount_onto_a_target_the_registry_image_lacks_just_works(cluster, registry_image):
    """Issue 14: a registry image lives in the user's own store, where podman creates the missing
    target in the container's own layer, as pyxis/enroot users expect."""
    result = cluster.as_user(["srun", "-N1", f"--container-image={registry_image}",
                              "--container-mounts=/etc/debian_version:/data/version:ro", "cat", "/data/version"])
    assert result.stdout.strip() == cluster.box.host_path("/etc/debian_version").read_text().strip()



def _make_stale(cluster, podman: list[str], name: str, image: str, *, payload: bool = True) -> None:
    """A detached container whose conmon and the user's pause processes are then SIGKILLed, and
    the payload too unless ``payload`` is False."""
    uid = pwd.getpwnam(cluster.user).pw_uid
    # a container still running (another test's step ending) gives podman a namespace to join
    assert wait_until(lambda: not user_processes(cluster, "conmon"), timeout=90), \
        cluster.run(["ps", "-u", cluster.user, "-o", "pid,ppid,stat,etime,args"], check=False).stdout
    # a state another sandbox's start left stale (it ends the user's pause processes of a Slurm
    # root, which every sandbox on that root shares) is repaired first, as jobs repair it
    cluster.box.repair_podman(podman)
    cluster.run([*podman, "run", "-d", "--name", name, "--network=host", "--userns=keep-id", "--read-only",
                 "--rootfs", image, "sleep", "300"], cwd="/", timeout=60)
    # the pause process of the run directory jobs use (podman's record of it): the user's podman by
    # hand has a run directory, and a pause process, of its own, which later tests need working
    run_dir = Podman(cluster.box.tether_settings()["container"]["podman"]).run_dir(uid)
    try:
        pause = int(cluster.box.node_path(None, f"{run_dir}/libpod/tmp/pause.pid").read_text().strip())
    except (OSError, ValueError):
        pause = None
    victims = [pause] if pause and Path(f"/proc/{pause}").exists() else []
    for proc in Path("/proc").iterdir():        # the container's conmon
        try:
            if not (proc.name.isdigit() and proc.stat().st_uid == uid):
                continue
            if name.encode() in (proc / "cmdline").read_bytes():
                victims.append(int(proc.name))
        except OSError:
            continue
    assert victims, "no conmon found for the detached container"
    for pid in victims:
        os.kill(pid, 9)

    def dead(pid: int) -> bool:     # SIGKILL is not instant: podman would join a dying pause process
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True

    assert wait_until(lambda: all(dead(pid) for pid in victims), timeout=10)
    if payload:
        _kill_sleepers(uid)


def _kill_sleepers(uid: int) -> None:
    for proc in Path("/proc").iterdir():        # the container's sleep (its conmon is gone)
        try:
            if proc.name.isdigit() and proc.stat().st_uid == uid and (proc / "cmdline").read_bytes() == b"sleep\x00300\x00":
                os.kill(int(proc.name), 9)
        except OSError:
            continue


def test_a_stale_podman_state_left_by_killed_processes_heals_itself(cluster, image, time_limited_jobs):
    """A step's processes killed outright (a node's processes killed, the OOM killer, SIGKILL at a
    time limit before podman's cleanup) leave rootless podman's run state naming a pause process
    and a running container that are gone; every podman command of that user on that node then
    fails ("invalid internal status ... podman system migrate"; silently under --log-level=fatal:
    the rank just exited 1). It did so in CI on a machine restored from a snapshot. The launcher
    repairs the state (nothing of the user had run) and the step runs."""
    # This test breaks the user's podman state on this host (it kills the user's pause process):
    # the session's time-limited container jobs must be over first, and the cleanup their ends
    # started as the same user. A cleanup that met the broken state left its container
    # "Stopping" in podman's records, and the time-limit tests failed (twice here, when this file
    # ran first and this test came while those jobs ended).
    ids = set(time_limited_jobs.values())
    assert wait_until(lambda: not ids & set(cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split()), timeout=300)
    assert wait_until(lambda: not user_processes(cluster, "tether-run"), timeout=150), \
        user_processes(cluster, "tether-run")
    podman = cluster.box.user_podman()              # the user's store on the first node, as jobs use it
    name = f"tether-stale-{os.getpid()}"
    for attempt in range(3):
        # with everything killed, podman sometimes finds the container stopped (runc's state) and
        # builds a fresh namespace instead of failing: then the payload is left running, so its
        # records name a running container whose conmon and namespace holder are gone
        _make_stale(cluster, podman, name, image, payload=attempt == 0)
        broken = cluster.run([*podman, "ps"], check=False, cwd="/")
        if broken.returncode != 0:
            break
        for _ in range(2):
            cluster.run([*podman, "rm", "--force", "--ignore", name], check=False, cwd="/")
    assert broken.returncode != 0 and "podman system migrate" in broken.stderr, \
        (broken, cluster.run(["ps", "-u", cluster.user, "-o", "pid,stat,args"], check=False).stdout)
    result = cluster.as_user(["srun", "-N1", "-w", cluster.nodes[0], f"--container-image={image}", "sh", "-c",
                              "echo in=$(grep -qF ' " + image + " / ' /proc/self/mountinfo && echo container)"])
    assert result.stdout.strip() == "in=container", result.stderr
    # either the launcher found the state stale and repaired it, or podman's first run rebuilt it
    # but exited 1 without a word (about 1 in 2 here) and the launcher tried once more
    assert ("podman's run state on this node is stale" in result.stderr
            or "its state checks out now: trying once more" in result.stderr), result.stderr
    assert cluster.run([*podman, "ps"], check=False, cwd="/").returncode == 0
    for _ in range(2):      # the first rm of a container whose conmon was killed only marks it stopped
        cluster.run([*podman, "rm", "--force", "--ignore", name], check=False, cwd="/")
    _kill_sleepers(pwd.getpwnam(cluster.user).pw_uid)


def test_a_gpu_rank_in_a_container_sees_exactly_its_own_gpus(cluster, image):
    """Issue 15: GPU slots in a podman container got every GPU of the node (CDI nvidia.com/gpu=all)
    and failed without a CDI spec. Each rank now gets --device KIND=ID for its own GPUs only (the
    sandbox's fake GPUs, /dev/tether-fakegpuN, described by its CDI spec), counted from 0 inside.
    Another job holds GPU 0 of every node, so this step's GPU is the node's GPU 1."""
    job = cluster.submit("--slots=3", "--slots-per-node=1", "--wrap", "sleep 120")
    try:
        assert wait_until(lambda: cluster.job_fields(job)["JobState"] == "RUNNING", timeout=60)
        result = cluster.as_user(["srun", "--slots=2", "--slots-per-node=1", f"--container-image={image}", "sh", "-c",
                                  "echo RANK=$RANK NODE=$SLURMD_NODENAME CUDA=$CUDA_VISIBLE_DEVICES "
                                  "IDS=$TETHER_SLOT_IDS DEVS=$(ls /dev | grep tether-fakegpu | tr '\\n' +)"])
    finally:
        cluster.run(["scancel", job], check=False)
    ranks = parse(result.stdout)
    assert len(ranks) == 2 and len({r["NODE"] for r in ranks}) == 2, result.stdout + result.stderr
    # Slurm numbers the step's GPUs from 0 when the devices cgroup hides the others (ConstrainDevices,
    # the full sandbox); the device in the container is the node's GPU 1 either way
    ids = "1" if cluster.box.quick() else "0"
    for r in ranks:
        assert (r["IDS"], r["DEVS"], r["CUDA"]) == (ids, "tether-fakegpu1+", "0"), r


@pytest.mark.parametrize("mpi,program", [("pmix", "/usr/local/bin/tether-mpi-ping"),
                                         ("pmi2", "/usr/local/bin/tether-pmi2-ping")])
def test_mpi_ranks_in_containers_on_three_nodes_exchange_messages(cluster, mpi_image, mpi, program):
    """Issue 15: MPI could not work in podman containers (PMI_FD was not passed). Three ranks on
    three nodes, each in its own container: OpenMPI over srun's PMIx (the server's directory is
    mounted), and Slurm's own PMI-2 (the PMI_FD socket passed as fd 3) -- rank 0 prints what the
    others sent."""
    env = ["env", "OMPI_MCA_pml=ob1", "OMPI_MCA_btl=self,tcp", "OMPI_MCA_btl_tcp_if_include=lo"]
    result = cluster.as_user([*env, "srun", "-N3", "-n3", f"--mpi={mpi}", f"--container-image={mpi_image}",
                              program], timeout=180)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if mpi == "pmix":
        assert lines == ["rank 0 of 3", "rank 1 of 3 says hello", "rank 2 of 3 says hello"], result.stderr
    else:
        assert lines == [f"rank {r} of 3 says hello" for r in range(3)], result.stderr


def test_an_empty_container_image_runs_one_step_of_a_container_job_on_the_host(cluster, image):
    """Issue 15: `--container-image=` (pyxis users' way to run one step outside the image) was
    refused with "expected printable text"; now that step runs on the host, the others in the
    job's container."""
    out = cluster.box.work_dir / f"host-step-{os.getpid()}.out"
    where = f"\\$(grep -qF ' {image} / ' /proc/self/mountinfo && echo container || echo host)"  # in the step
    result = cluster.sbatch_wait(["-N1", f"--container-image={image}", f"--output={out}", "--wrap",
                                  f"srun sh -c \"echo default={where}\"; "
                                  f"srun --container-image= sh -c \"echo empty={where}\""], timeout=180)
    text = out.read_text()
    assert result.returncode == 0, text
    assert "default=container" in text and "empty=host" in text, text


def test_an_empty_container_image_without_a_job_image_is_refused(cluster):
    """Issue 45 (pyxis's invalid_args "--container-image= (without argument)"): with no image of
    the job to leave, an empty `--container-image=` is a mistake; srun and sbatch refuse it before
    anything runs, instead of running the command on the host."""
    step = cluster.as_user(["srun", "-N1", "--container-image=", "true"], check=False)
    assert step.returncode != 0, step
    assert "tether: --container-image= (empty): no image given" in step.stderr, step.stderr
    assert "this job has none" in step.stderr, step.stderr
    job = cluster.as_user(["sbatch", "--container-image=", "--wrap", "true"], check=False)
    assert job.returncode != 0 and "Submitted batch job" not in job.stdout, job
    assert "tether: --container-image= (empty): no image given" in job.stderr, job.stderr


def test_tether_variables_work_on_the_node_as_their_options_do(cluster, image):
    """Issue 15: `TETHER_CONTAINER_IMAGE=IMG srun …` ran on the host without a word, and
    `TETHER_SLOTS=2 TETHER_SLOTS_PER_NODE=1 srun …` got the plan but no rank setup. The remote side
    now reads the job's TETHER_* variables exactly as the options."""
    where = f"$(grep -qF ' {image} / ' /proc/self/mountinfo && echo container || echo host)"
    contained = cluster.as_user(["env", f"TETHER_CONTAINER_IMAGE={image}", "srun", "-N1", "sh", "-c",
                                 f"echo IN={where}"])
    assert contained.stdout.strip() == "IN=container", contained.stderr
    slots = cluster.as_user(["env", "TETHER_SLOTS=2", "TETHER_SLOTS_PER_NODE=1", "TETHER_SLOT_TYPE=cpu", "srun",
                             "sh", "-c", "echo RANK=$RANK WORLD_SIZE=$WORLD_SIZE TMPDIR=$TMPDIR NODE=$SLURMD_NODENAME"])
    ranks = sorted(parse(slots.stdout), key=lambda r: r["RANK"])
    assert [r["RANK"] for r in ranks] == ["0", "1"] and {r["WORLD_SIZE"] for r in ranks} == {"2"}, slots.stdout
    assert len({r["NODE"] for r in ranks}) == 2
    root = str(cluster.box.root / "jobs")
    assert all(r["TMPDIR"].startswith(root + "/") and r["TMPDIR"].endswith(f"/rank-{r['RANK']}/tmp") for r in ranks)


def test_a_batch_script_from_tether_plan_runs_one_container_per_node(cluster, registry_image, tmp_path):
    """`tether plan SPEC -- COMMAND` writes a whole batch script; submitted as it is, it starts
    one container per node (srun, one task per node, `tether run` in each)."""
    spec = tmp_path / "job.yaml"
    spec.write_text("resource_pool: null\nslots_per_trial: 6\nslot_type: cpu\nslurm: {slots_per_node: 2}\n")
    out = cluster.box.work_dir / f"plan-{os.getpid()}"
    script = cluster.run(
        [*cluster.box.tether, "plan", "--config", str(cluster.box.tether_conf), str(spec),
         f"--container-image={registry_image}", f"--log-dir={out}", "--", "sh", "-c",
         "echo node=$SLURMD_NODENAME in=$(test -e /etc/debian_version && echo host || echo container) "
         "rank=$NODE_RANK of=$TETHER_NNODES master=$MASTER_ADDR:$MASTER_PORT"]).stdout
    out.mkdir()
    account = pwd.getpwnam(cluster.user)
    os.chown(out, account.pw_uid, account.pw_gid)
    path = out / "job.sh"
    path.write_text(script)
    job = cluster.submit(str(path), env={"TETHER_CONFIG": str(cluster.box.tether_conf)})
    assert cluster.wait_job(job)["JobState"] == "COMPLETED"
    lines = sorted((out / "job.out").read_text().splitlines())
    # each node's container knows its place, as a tether step's ranks do: the first node's NodeAddr
    # and the job's port
    port = 12288 + int(job) % 1024 * 16
    master = cluster.box.node_address(cluster.nodes[0])
    assert lines == [f"node={n} in=container rank={i} of=3 master={master}:{port}"
                     for i, n in enumerate(cluster.nodes)], (out / "job.err").read_text()


def test_batch_script_stays_on_the_host_and_its_sruns_run_in_containers(cluster, image):
    out = cluster.box.work_dir / f"batch-{os.getpid()}.out"
    result = cluster.sbatch_wait(["-N3", f"--container-image={image}", f"--output={out}",
                                  "--wrap", f"echo BATCH=$(grep -q ' {image} / ' /proc/self/mountinfo && echo "
                                            f"container || echo host) IMAGE=$TETHER_CONTAINER_IMAGE; "
                                            f"srun -N3 -n3 sh -c '{show(image)}'"],
                             timeout=180)
    text = out.read_text()
    assert result.returncode == 0, text
    assert f"BATCH=host IMAGE={image}" in text
    assert [r["IN"] for r in parse(text)] == ["container"] * 3, text


def conmons(cluster, job: str) -> list[str]:
    """The job's podman monitors (podman gives conmon a clean environment: found by container name)."""
    return [line for line in user_processes(cluster, "conmon") if f" -n tether-{job}-" in line]


def workload(cluster, job: str) -> list[str]:
    """The job's containerized shells (not srun, whose arguments hold the same text)."""
    return of_job([line for line in user_processes(cluster, "while")
                   if line.split(None, 2)[2].startswith("sh -c")], job)


def _running_step(cluster, image, script: str) -> tuple[subprocess.Popen, str]:
    """A 3-rank containerized step running ``script``; (srun, its job id) once all 3 containers run."""
    def jobs() -> set[str]:
        return set(cluster.run(["squeue", "-h", "-u", cluster.user, "-o", "%i"]).stdout.split())

    before = jobs()
    proc = subprocess.Popen(cluster.box.wrap(["runuser", "-u", cluster.user, "--", "srun", "-N3", "-n3",
                                              f"--container-image={image}", "sh", "-c", script]),
                            env=cluster.box.command_env(), cwd=str(cluster.box.work_dir),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    new: list[str] = []

    def started() -> bool:
        new[:] = sorted(jobs() - before)[:1] or new
        return bool(new) and len(podman_containers(cluster, new[0])) == 3 and len(workload(cluster, new[0])) == 3 \
            and len(conmons(cluster, new[0])) == 3

    if not wait_until(started, timeout=60):
        # never leave the step running (a busy loop would load every later test): cancel it and
        # say what the ranks said
        for job in new or sorted(jobs() - before):
            cluster.run(["scancel", job], check=False)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(f"the containers did not start (job {new}): {out}{err}")
    return proc, new[0]


def _left_behind(cluster, job: str) -> list[str]:
    return podman_containers(cluster, job) + conmons(cluster, job) \
        + workload(cluster, job) + of_job(user_processes(cluster, "tether-run"), job)


def test_scancel_leaves_no_container_and_no_process(cluster, image):
    before = job_entries(cluster)
    proc, job = _running_step(cluster, image, "while :; do sleep 1; done")
    cluster.run(["scancel", job])
    proc.communicate(timeout=120)
    said = cluster.box.work_dir / "timeout-signals" / f"job-{job}.out"       # the job's output, to say why
    assert wait_until(lambda: _left_behind(cluster, job) == [], timeout=30), (
        _left_behind(cluster, job), said.read_text() if said.exists() else "(no output)")
    # the job's directory goes with the job: slurmd's job epilog on each node (an srun's own job)
    assert wait_until(lambda: job not in job_entries(cluster) - before, timeout=30)


def test_a_killed_launcher_leaves_nothing_behind(cluster, image):
    """SIGKILL of tether's launcher (what the OOM killer would do): podman's conmon and the container
    re-parent to slurmstepd (a child subreaper for container steps), so the step still ends them."""
    proc, job = _running_step(cluster, image, "while :; do sleep 1; done")
    launchers = [int(line.split()[0]) for line in of_job(user_processes(cluster, "tether-run"), job)]
    assert len(launchers) == 3
    for pid in launchers:
        os.kill(pid, 9)
    _, err = proc.communicate(timeout=120)
    assert "Killed" in err
    assert wait_until(lambda: conmons(cluster, job) + workload(cluster, job) == [],
                      timeout=30)
    assert wait_until(lambda: podman_containers(cluster, job) == [], timeout=60)   # cleaned after the step
    assert wait_until(lambda: job not in job_entries(cluster), timeout=30)


def _cpu_of(pids: list[str]) -> float:
    """CPU seconds the processes used so far, as the kernel counts them (utime + stime)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def test_cpu_time_of_containerized_ranks_is_accounted(cluster, image):
    """jobacct_gather sees the containers' CPU time: conmon and the container stay in the step's
    tree. Measured against the CPU the ranks' own processes used (the kernel's count, read just
    before sstat), never the clock: a busy machine gives them less, and Slurm must account what
    they got."""
    proc, job = _running_step(cluster, image, "while :; do :; done")
    try:
        pids = [line.split()[0] for line in workload(cluster, job)]
        # enough work to tell accounted from not: 6 CPU seconds a rank (jobacct_gather samples every 2 s)
        assert wait_until(lambda: _cpu_of(pids) >= 6 * len(pids), timeout=300), _cpu_of(pids)
        used = _cpu_of(pids)
        fields = cluster.run(["sstat", "-a", "-P", "-n", "-j", f"{job}.0", "-o", "NTasks,AveCPU"]).stdout.split("|")
    finally:                        # the busy ranks never outlive the test
        cluster.run(["scancel", job], check=False)
        proc.communicate(timeout=120)
    ntasks = int(fields[0])
    cpu = ntasks * cpu_seconds(fields[1])
    print(f"accounted CPU {cpu:.1f} s for {ntasks} ranks; their processes used {used:.1f} s")
    assert ntasks == len(pids), (ntasks, pids)
    # what sstat reports lags the kernel's count by up to one 2-second sample a rank
    assert cpu >= 0.7 * (used - 2 * ntasks), (cpu, used, ntasks)
    assert wait_until(lambda: _left_behind(cluster, job) == [], timeout=30)


def test_a_container_job_that_hits_its_time_limit_leaves_nothing(cluster, time_limited_jobs):
    job = time_limited_jobs["container"]
    assert wait_until(lambda: job not in cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split(), timeout=240)
    state = cluster.run(["scontrol", "-o", "show", "job", job]).stdout
    assert "JobState=TIMEOUT" in state, state
    said = cluster.box.work_dir / "timeout-signals" / f"job-{job}.out"       # the job's output, to say why
    assert wait_until(lambda: _left_behind(cluster, job) == [], timeout=30), (
        _left_behind(cluster, job), said.read_text() if said.exists() else "(no output)")
    assert wait_until(lambda: job not in job_entries(cluster), timeout=30)


def test_a_containerized_rank_reads_its_stdin_like_a_host_rank(cluster, image):
    """podman runs with the rank's own stdio (--log-driver=passthrough): srun's stdin reaches the
    container (podman's default attach would not pass it)."""
    result = cluster.run(["runuser", "-u", cluster.user, "--", "srun", "-N1", "-n1", f"--container-image={image}",
                          "sh", "-c", "read line; echo got=$line"], input="from-srun-stdin\n", timeout=120)
    assert result.stdout.strip() == "got=from-srun-stdin", result.stdout + result.stderr


def test_pyxis_container_readonly_is_the_default_and_contradicting_writable_is_refused_at_submit(cluster, image):
    """pyxis scripts say --container-readonly; tether accepts it (read-only is its default) and
    refuses it with --container-writable before the job is queued."""
    result = cluster.as_user(["srun", "-N1", f"--container-image={image}", "--container-readonly", "sh", "-c",
                              "touch /x 2>&1; echo rc=$?"])
    assert "Read-only file system" in result.stdout and "rc=1" in result.stdout, result.stdout
    for command in (["srun", "-N1"], ["sbatch", "--wrap", "true"]):
        refused = cluster.as_user([*command, f"--container-image={image}", "--container-readonly",
                                   "--container-writable", *([] if command[0] == "sbatch" else ["true"])], check=False)
        assert refused.returncode != 0, refused
        assert "--container-writable and --container-readonly ask for opposite things" in refused.stderr, refused.stderr


def test_a_writable_container_is_the_users_own_to_write_and_goes_with_the_step(cluster, registry_image, image):
    """pyxis's writable container (issue 45, writable.bats): the user -- not only root inside --
    writes anywhere in it (`touch /newfile`, a directory in /etc), as enroot's root unpacked as the
    user is; the step's two ranks on the node share it, as pyxis's container per node; the next
    step starts from the image again. A shared rootfs directory the same. With
    --container-remap-root, root inside writes."""
    uid = str(pwd.getpwnam(cluster.user).pw_uid)
    script = ('touch /newfile-$SLURM_PROCID && mkdir /etc/made-$SLURM_PROCID && stat -c "%u %a" / '
              '/newfile-$SLURM_PROCID && i=0 && while [ ! -e /newfile-$((1 - SLURM_PROCID)) ] && [ $i -lt 300 ]; do '
              'sleep 0.2; i=$((i + 1)); done; [ -e /newfile-$((1 - SLURM_PROCID)) ] && echo shared')
    for img in (registry_image, image):
        first = cluster.as_user(["srun", "-N1", "-n2", "--container-writable", f"--container-image={img}",
                                 "sh", "-c", script], timeout=180)
        assert sorted(first.stdout.splitlines()) == sorted([f"{uid} 755", f"{uid} 644", "shared"] * 2), first
        again = cluster.as_user(["srun", "-N1", "--container-writable", f"--container-image={img}", "sh", "-c",
                                 "ls /newfile-0 2>&1; echo rc=$?"], timeout=180)
        assert again.stdout.endswith("rc=1\n") and "No such file" in again.stdout, again
    root = cluster.as_user(["srun", "-N1", "--container-writable", "--container-remap-root",
                            f"--container-image={registry_image}", "sh", "-c", "touch /newfile && id -u"],
                           timeout=180)
    assert root.stdout == "0\n", root
    # --container-save of such a container: its root directory saved (podman exports nothing of a
    # --rootfs container: the file was empty), its files root's as in enroot's export
    where = cluster.box.work_dir / f"writable-save-{os.getpid()}"
    _write_as(cluster.user, where / ".keep", "")
    try:
        for saved in ("saved.sqsh", "saved.tar"):
            cluster.as_user(["srun", "-N1", f"--chdir={where}", "--container-writable", f"--container-save={saved}",
                             f"--container-image={registry_image}", "sh", "-c", "echo mine > /written"], timeout=180)
            ref = f"{where}/{saved}" if saved.endswith(".sqsh") else f"oci-archive:{where}/{saved}"
            again = cluster.as_user(["srun", "-N1", f"--container-image={ref}", "sh", "-c",
                                     'cat /written && stat -c "%u" /written /bin'], timeout=180)
            assert again.stdout == "mine\n0\n0\n", again
    finally:
        subprocess.run(["rm", "-rf", str(where)], check=False)


def test_pyxis_container_mount_home_on_and_off(cluster, image):
    """Issue 15 (pyxis parity): --container-mount-home mounts the user's home at its own path
    (podman's default is not to: a shared image without that directory is imported into the
    user's store for it); --no-container-mount-home with it is refused at submit."""
    home = Path(pwd.getpwnam(cluster.user).pw_dir)
    marker = home / f"tether-home-{os.getpid()}"
    _write_as(cluster.user, cluster.box.host_path(marker), "mine\n")
    try:
        on = cluster.as_user(["srun", "-N1", f"--container-image={image}", "--container-mount-home", "cat", str(marker)])
        assert on.stdout == "mine\n", on.stderr
        # root's home with --container-remap-root, as enroot's home hook mounts it (pyxis's mount_home.bats)
        root = cluster.as_user(["srun", "-N1", f"--container-image={image}", "--container-mount-home",
                                "--container-remap-root", "sh", "-c", f"cat /root/{marker.name}; echo $HOME"])
        assert root.stdout == "mine\n/root\n", root
        off = cluster.as_user(["srun", "-N1", f"--container-image={image}", "sh", "-c",
                               f"test -e {marker} && echo seen || echo absent"])
        assert off.stdout.strip() == "absent", off.stderr
    finally:
        cluster.box.host_path(marker).unlink(missing_ok=True)
    both = cluster.as_user(["sbatch", "-H", f"--container-image={image}", "--container-mount-home",
                            "--no-container-mount-home", "--wrap", "true"], check=False)
    assert both.returncode != 0 and "ask for opposite things" in both.stderr, both.stderr


def test_pyxis_remap_root_entrypoint_and_mount_flags(cluster):
    """Issue 15 (pyxis parity), real podman: yourself inside by default, root with
    --container-remap-root; the image's ENTRYPOINT runs only with --container-entrypoint (its ENV
    applies either way); mount flags joined with '+' reach the mount (noexec: a script on it
    cannot run)."""
    image = cluster.box.entrypoint_image()
    uid = str(pwd.getpwnam(cluster.user).pw_uid)
    plain = cluster.as_user(["srun", "-N1", f"--container-image={image}", "sh", "-c", "id -u; echo $TETHER_IMAGE_ENV"])
    assert plain.stdout.split() == [uid, "from-the-image"], plain.stdout + plain.stderr
    asked = cluster.as_user(["srun", "-N1", f"--container-image={image}", "--container-remap-root",
                             "--container-entrypoint", "id", "-u"])
    assert asked.stdout.split("\n")[:2] == ["entrypoint ran", "0"], asked.stdout + asked.stderr
    # root inside has root's capabilities over the container's own namespaces, as enroot's
    # remapped root (pyxis's exec.bats mounts a tmpfs so); seccomp's filter stays; yourself: none
    mounted = cluster.as_user(["srun", "-N1", f"--container-image={image}", "--container-remap-root", "sh", "-c",
                               "mount -t tmpfs none /mnt && grep -c ' /mnt tmpfs ' /proc/mounts && "
                               "grep -c 'Seccomp:.2' /proc/self/status && stat -c %a /tmp"])
    # /tmp (the rank's own) is open to the image's own users as an image's is: apt's _apt writes there
    assert mounted.stdout.split() == ["1", "1", "1777"], mounted
    refused = cluster.as_user(["srun", "-N1", f"--container-image={image}", "sh", "-c",
                               "mount -t tmpfs none /mnt 2>/dev/null || grep CapEff /proc/self/status"])
    assert refused.stdout.split() == ["CapEff:", "0000000000000000"], refused
    fallback = cluster.as_user(["env", "TETHER_CONTAINER_ENTRYPOINT=1", "srun", "-N1", f"--container-image={image}",
                                "true"])
    assert fallback.stdout == "entrypoint ran\n", fallback.stdout + fallback.stderr
    scripts = cluster.box.work_dir / f"noexec-{os.getpid()}"
    _write_as(cluster.user, scripts / "hello.sh", "#!/bin/sh\necho hello\n")
    os.chmod(scripts / "hello.sh", 0o755)
    try:
        ok = cluster.as_user(["srun", "-N1", f"--container-image={image}", f"--container-mounts={scripts}:/data:ro",
                              "/data/hello.sh"])
        assert ok.stdout == "hello\n", ok.stderr
        noexec = cluster.as_user(["srun", "-N1", f"--container-image={image}",
                                  f"--container-mounts={scripts}:/data:ro+noexec", "sh", "-c",
                                  "/data/hello.sh; echo rc=$?"], check=False)
        assert "Permission denied" in noexec.stdout + noexec.stderr and "rc=126" in noexec.stdout, noexec
        bad = cluster.as_user(["srun", "-N1", f"--container-image={image}",
                               f"--container-mounts={scripts}:/data:noatime", "true"], check=False)
        assert bad.returncode != 0 and "unknown flag 'noatime'" in bad.stderr, bad.stderr
    finally:
        subprocess.run(["rm", "-rf", str(scripts)], check=False)


def test_the_entrypoint_starts_with_the_named_variables_and_the_command_gets_the_jobs(cluster):
    """Issue 45 (pyxis's entrypoint.bats, real podman): the image's entrypoint starts without the
    job's own variables unless --container-env names them (docker's entrypoint picks its port by
    DOCKER_TLS_VERIFY); the command has them after it, where the entrypoint and the image's ENV
    left them unset; the rank's variables reach both."""
    image = cluster.box.entrypoint_image()
    job = ["env", "PROBE=job", "IMAGE_GREETING=job", "srun", "-N1", f"--container-image={image}"]
    show = ["sh", "-c", "echo $PROBE $IMAGE_GREETING $SLURM_PROCID"]
    hidden = cluster.as_user([*job, "--container-entrypoint", *show])
    assert hidden.stdout.split("\n")[:2] == ["entrypoint ran", "job hello-from-the-image 0"], \
        hidden.stdout + hidden.stderr
    named = cluster.as_user([*job, "--container-entrypoint", "--container-env=PROBE", *show])
    assert named.stdout.split("\n")[:2] == ["entrypoint ran with PROBE=job", "job hello-from-the-image 0"], named
    plain = cluster.as_user([*job, *show])             # no entrypoint: the job's values win over the image's
    assert plain.stdout == "job job 0\n", plain.stdout + plain.stderr


def test_container_save_writes_an_image_the_next_job_runs(cluster):
    """Issue 15: --container-save=PATH (relative to the working directory) saves the node's first
    rank's container after the step as an OCI archive; a later job runs it with
    --container-image=oci-archive:PATH -- the file it wrote there, the image's own ENTRYPOINT and
    ENV, and none of the job's environment baked in."""
    image = cluster.box.entrypoint_image()
    where = cluster.box.work_dir / f"save-{os.getpid()}"
    _write_as(cluster.user, where / ".keep", "")
    try:
        saved = cluster.as_user(["env", "SECRET_OF_THE_JOB=hidden", "srun", "-N1", f"--chdir={where}",
                                 f"--container-image={image}", "--container-writable", "--container-remap-root",
                                 "--container-save=saved.tar", "sh", "-c",
                                 "echo written-in-job-1 > /marker; echo $SECRET_OF_THE_JOB $SLURM_JOB_ID"])
        secret, job = saved.stdout.split()
        assert secret == "hidden" and f"saved the container to {where}/saved.tar" in saved.stderr, saved
        assert not podman_containers(cluster, job)                     # removed once saved
        assert (where / "saved.tar").stat().st_uid == pwd.getpwnam(cluster.user).pw_uid
        assert not list(where.glob("*.partial*"))
        again = cluster.as_user(["srun", "-N1", f"--container-image=oci-archive:{where}/saved.tar",
                                 "--container-entrypoint", "sh", "-c",
                                 "cat /marker; echo ${TETHER_IMAGE_ENV} ${SECRET_OF_THE_JOB:-not-baked-in}"])
        assert again.stdout.split("\n")[:3] == ["entrypoint ran", "written-in-job-1", "from-the-image not-baked-in"], \
            again.stdout + again.stderr
    finally:
        subprocess.run(["rm", "-rf", str(where)], check=False)


def test_a_squashfs_image_runs_on_podman_and_a_step_saves_one_the_next_job_runs(cluster, image):
    """Issue 45 (pyxis's squashfs_image tests): --container-image=IMAGE.sqsh -- enroot's and pyxis's
    image format -- runs on podman (unpacked and imported once per user per node: the second step
    unpacks nothing), and --container-save=NAME.sqsh writes a squashfs file the next job runs."""
    where = cluster.box.work_dir / f"sqsh-{os.getpid()}"
    _write_as(cluster.user, where / ".keep", "")
    sqsh = where / "busybox.sqsh"
    try:
        # with an /etc/environment, where enroot keeps an image's ENV: podman gets it as the image's
        subprocess.run(["mksquashfs", image, str(sqsh), "-noappend", "-all-root", "-quiet", "-no-progress",
                        "-p", "/made-as-squashfs f 444 0 0 echo squashed",
                        "-p", "/etc/environment f 444 0 0 echo SQSH_ENV=from-etc-environment"], check=True,
                       capture_output=True, timeout=300)
        os.chmod(sqsh, 0o644)
        first = cluster.as_user(["srun", "-N2", f"--container-image={sqsh}", "sh", "-c",
                                 "echo $(cat /made-as-squashfs) $TETHER_CONTAINER $SLURMD_NODENAME $SQSH_ENV"],
                                timeout=300)
        rows = sorted(line.split() for line in first.stdout.splitlines())
        assert [r[:2] for r in rows] == [["squashed", "1"]] * 2, first.stdout + first.stderr
        assert [r[3] for r in rows] == ["from-etc-environment"] * 2, first.stdout + first.stderr
        assert first.stderr.count(f"unpacking the squashfs image {sqsh} into your podman store on this node ...") \
            == 2, first.stderr                                                                   # once per node
        # on a node of the first step: nothing to unpack there any more (the image's root is its
        # root's: --container-remap-root, as for a registry image, to write there)
        second = cluster.as_user(["srun", "-N1", f"--nodelist={rows[0][2]}", f"--chdir={where}",
                                  f"--container-image={sqsh}", "--container-writable", "--container-remap-root",
                                  "--container-save=saved.sqsh", "sh", "-c",
                                  "echo written-in-job > /marker; cat /made-as-squashfs"], timeout=300)
        assert second.stdout.strip() == "squashed" and "unpacking" not in second.stderr, second.stderr
        # writable as yourself: a root unpacked for the step, the image's ENV from its
        # /etc/environment still (the import has no config to carry it)
        own = cluster.as_user(["srun", "-N1", f"--nodelist={rows[0][2]}", f"--container-image={sqsh}",
                               "--container-writable", "sh", "-c", "touch /mine && echo $SQSH_ENV"], timeout=300)
        assert own.stdout.strip() == "from-etc-environment", own.stdout + own.stderr
        saved = where / "saved.sqsh"
        assert f"saved the container to {saved}" in second.stderr, second.stderr
        assert saved.read_bytes()[:4] == b"hsqs" and saved.stat().st_uid == pwd.getpwnam(cluster.user).pw_uid
        assert not list(where.glob("*.partial*")) and not list(where.glob(".tether-save-*"))
        # pyxis's ./NAME.sqsh: a path from the step's working directory
        again = cluster.as_user(["srun", "-N1", f"--chdir={where}", "--container-image=./saved.sqsh", "cat", "/marker",
                                 "/made-as-squashfs"], timeout=300)
        assert again.stdout.split("\n")[:2] == ["written-in-job", "squashed"], again.stdout + again.stderr
    finally:
        subprocess.run(["rm", "-rf", str(where)], check=False)


def podman_pods(cluster, job: str) -> list[str]:
    """The job's pods in the job user's podman store of every node."""
    return podman_containers(cluster, job, ("pod", "ps", "--format", "{{.Name}}"))


def test_a_steps_ranks_on_a_node_share_the_namespaces_they_unshare(cluster, image):
    """pyxis's unshare_*.bats, "multiple tasks": a step's tasks on a node are one container, so
    with --container-unshare=ipc,uts,net they share one IPC, UTS and network namespace -- not the
    node's -- with the node's host name and a loopback of their own (a rank reaches another's
    port there). tether's ranks are containers of the step's pod on the node: the last rank
    removes it; the step's cleanup removes it when its ranks could not (killed)."""
    script = ("echo $SLURMD_NODENAME $(readlink /proc/self/ns/ipc) $(readlink /proc/self/ns/uts) $SLURM_JOB_ID "
              "$(readlink /proc/self/ns/net) $(hostname); "
              # rank 0 serves one line on its loopback, rank 1 reads it: the same network namespace
              "if [ $SLURM_LOCALID = 0 ]; then echo over-loopback | timeout 30 nc -l -p 7077 >/dev/null; "
              "else i=0; until nc 127.0.0.1 7077 </dev/null 2>/dev/null || [ $i -ge 100 ]; do sleep 0.1; "
              "i=$((i+1)); done; fi")
    result = cluster.as_user(["srun", "-N2", "-n4", "--ntasks-per-node=2", f"--container-image={image}",
                              "--container-unshare=ipc,uts,net", "sh", "-c", script], timeout=300)
    rows = sorted(line.split() for line in result.stdout.splitlines() if " ipc:[" in line)
    assert len(rows) == 4 and "over-loopback" in result.stdout.split(), result.stdout + result.stderr
    job = rows[0][3]
    rows = [row[:3] + row[4:] for row in rows]
    nodes = sorted({row[0] for row in rows})          # whichever two Slurm gave the step
    assert len(nodes) == 2 and set(nodes) <= set(cluster.nodes), rows
    for node in nodes:
        mine = [row[1:] for row in rows if row[0] == node]
        slurmd = cluster.box._pid_of(f"slurmd-{node}")
        host = [os.readlink(f"/proc/{slurmd}/ns/{ns}") for ns in ("ipc", "uts", "net")]
        assert len(mine) == 2 and mine[0] == mine[1], rows                    # one namespace each
        assert all(mine[0][i] != host[i] for i in range(3)) and mine[0][3] == node, (rows, host)
    assert podman_pods(cluster, job) == []                  # the last rank on each node removed it
    # ranks killed before they left the pod (SIGKILL of their launchers, as the OOM killer would):
    # the step's cleanup removes it
    proc = subprocess.Popen(cluster.box.wrap(["runuser", "-u", cluster.user, "--", "srun", "-N1", "-n2",
                                              f"--container-image={image}", "--container-unshare=ipc",
                                              "sh", "-c", "echo $SLURM_JOB_ID; sleep 300"]),
                            env=cluster.box.command_env(), cwd=str(cluster.box.work_dir),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.isdigit(), proc.stderr.read() if proc.poll() is not None else line
        assert wait_until(lambda: podman_pods(cluster, line) == [f"tether-{line}-0-pod"], timeout=60)
        launchers = [int(row.split()[0]) for row in of_job(user_processes(cluster, "tether-run"), line)]
        assert len(launchers) == 2, launchers
        for pid in launchers:
            os.kill(pid, 9)
        proc.communicate(timeout=120)
        assert wait_until(lambda: podman_pods(cluster, line) == [] and podman_containers(cluster, line) == [],
                          timeout=60), podman_pods(cluster, line)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_step_attaches_to_the_named_container_another_step_of_the_job_runs(cluster, registry_image):
    """pyxis's attach (exec.bats), real podman: while a step runs the job's container NAME on a
    node, a step naming it runs inside that very container (here: the first step's own /tmp mount),
    at /, ignoring --container-mounts with pyxis's words, as this step's process (its cgroup is this
    step's); JOB.STEP names a step's unnamed container; :no_exec runs a container of its own; :exec
    fails once nothing runs it."""
    out = cluster.box.work_dir / f"attach-{os.getpid()}.out"
    here = "-N1 -w $SLURMD_NODENAME --overlap"
    script = "\n".join([
        "#!/bin/sh",
        "running() { i=0; until srun " + here + " --container-name=$1:exec true 2>/dev/null || [ $i -ge 60 ]; "
        "do sleep 1; i=$((i+1)); done; }",
        # an unnamed step, its id as it says it (steps started at once get their ids in any order)
        f"srun {here} --container-image={registry_image} sh -c 'echo $SLURM_STEP_ID; echo unnamed > /tmp/where; "
        "sleep 60' > /tmp/unnamed-$SLURM_JOB_ID & second=$!",
        "i=0; until [ -s /tmp/unnamed-$SLURM_JOB_ID ] || [ $i -ge 300 ]; do sleep 0.2; i=$((i+1)); done",
        "unnamed=$SLURM_JOB_ID.$(cat /tmp/unnamed-$SLURM_JOB_ID); rm -f /tmp/unnamed-$SLURM_JOB_ID",
        "running $unnamed",
        f"srun {here} --container-image={registry_image} --container-name=att sh -c "
        "'echo first-step > /tmp/where; cd /var; sleep 60' & first=$!",
        "running att",
        f"srun {here} --container-name=att sh -c 'cat /tmp/where; pwd'",
        f"srun {here} --container-name=att --container-mounts=/etc:/mnt/x sh -c '[ -d /mnt/x ] || echo no-mount'",
        f"srun {here} --container-name=att sh -c "
        "'echo step=$SLURM_STEP_ID $(grep -c \"step_$SLURM_STEP_ID\" /proc/self/cgroup)'",
        f"srun {here} --container-name=$unnamed cat /tmp/where",
        f"srun {here} --container-name=att:no_exec sh -c 'cat /tmp/where 2>/dev/null || echo own-container'",
        f"srun {here} --container-name=att --container-unshare=ipc true 2>&1 | grep -o 'requested but the "
        "container is not in a separate IPC namespace'",
        "kill $first $second; wait",
        f"srun {here} --container-name=att:exec true 2>&1 | grep -o 'no step of this job runs that container'",
        ""])
    try:
        cluster.sbatch_wait(["-N1", f"--output={out}"], input=script, timeout=300, check=False)
        text = out.read_text()
    finally:
        out.unlink(missing_ok=True)
    lines = [line for line in without_runc_warnings(text).splitlines()
             if not line.startswith(("tether: pull", "tether: unpack", "srun:", "slurmstepd", "Terminated"))]
    assert lines[:2] == ["first-step", "/"], text
    assert lines[2:4] == ["tether: ignoring --container-mounts when attaching to a running container", "no-mount"], text
    step, count = lines[4].split()
    assert step.startswith("step=") and int(count) >= 1, text      # this step's cgroup, not the first's
    assert lines[5:] == ["unnamed", "own-container", "requested but the container is not in a separate IPC namespace",
                         "no step of this job runs that container"], text


def test_a_named_podman_container_keeps_its_files_across_the_jobs_steps_on_each_node(cluster, image):
    """Issue 15 (pyxis's --container-name, for podman too): the first step on a node unpacks the
    image into the job's directory on that node; the next steps run in the same root -- what a
    writable step wrote is there, per node, with the image's ENV; a step naming it alone runs in it
    (a name the job has not made on that node fails with the reason, never on the host) -- and it
    goes with the job, even when the batch script itself has no tether option."""
    registry = cluster.box.entrypoint_image()
    out = cluster.box.work_dir / f"named-{os.getpid()}.out"
    script = "\n".join([
        "#!/bin/sh",
        f"srun -N2 --container-image={registry} --container-name=dev --container-writable "
        "sh -c 'echo written-on-$SLURMD_NODENAME > /state'",
        f"srun -N2 --container-image={registry} --container-name=dev sh -c 'echo $(cat /state) $TETHER_IMAGE_ENV'",
        # one node's named container: where the batch script runs (24.11 may place an -N1 step on
        # either node of the allocation; 22.05 took the first)
        f"srun -N1 -w $SLURMD_NODENAME --container-image={image} --container-name=fs --container-writable "
        "sh -c 'echo 1 > /f; cat /f'",
        # the name alone, as pyxis: the job's container of that name, or the reason there is none
        "srun -N1 -w $SLURMD_NODENAME --container-name=fs cat /f",
        "srun -N1 -w $SLURMD_NODENAME --container-name=nosuch true || echo nosuch-$?",
        # other container options without an image or a name: refused, not run on the host
        "srun -N1 -w $SLURMD_NODENAME --container-mounts=/etc:/x true || echo mounts-alone-$?",
        # ... but a variable alone is a default (a job's, a profile's): the step runs on the host
        "TETHER_CONTAINER_MOUNTS=/etc:/x srun -N1 -w $SLURMD_NODENAME echo variable-alone-on-host",
        f"srun -N1 -w $SLURMD_NODENAME --container-image={image} sh -c 'cat /f 2>/dev/null || echo unnamed-is-fresh'",
        # a container whose command fails at once ran: it is not tried again (podman 5 removes its
        # --cidfile with the container, which once looked like "never created")
        f"srun -N1 --container-image={image} sh -c 'echo ran-once; exit 1'",
        # pyxis's flags: no_exec is the name as it is; create is refused once the job has it, and
        # makes a new one for every rank of its own step (two per node here); exec needs it running
        "srun -N1 -w $SLURMD_NODENAME --container-name=fs:no_exec cat /f",
        f"srun -N1 -w $SLURMD_NODENAME --container-image={image} --container-name=fs:create true || echo create-$?",
        f"srun -N2 -n4 --overcommit --container-image={image} --container-name=new:create --container-writable "
        "sh -c 'echo $SLURMD_NODENAME >> /made; i=0; while [ $(wc -l < /made) -lt 2 ] && [ $i -lt 150 ]; "
        "do sleep 0.2; i=$((i+1)); done; wc -l < /made' | sort | uniq -c | awk '{print \"made\", $1, $2}'",
        "srun -N1 --container-name=fs:exec true 2>&1 | grep -o 'no step of this job runs that container' "
        "|| echo exec-ran",
        "echo JOB=$SLURM_JOB_ID", ""])
    result = cluster.sbatch_wait(["-N2", f"--output={out}"], input=script, timeout=300)
    text = out.read_text()
    out.unlink()
    # tether's progress lines, srun's own ("step creation temporarily disabled, retrying" when
    # the previous step's nodes are not released yet) and slurmstepd's are not the ranks' output
    lines = [line for line in without_runc_warnings(text).splitlines()
             if not line.startswith(("tether:", "srun:", "slurmstepd"))]
    assert sorted(lines[:2]) == [f"written-on-{n} from-the-image" for n in cluster.nodes[:2]], text
    assert lines[2:14] == ["1", "1", "nosuch-125", "mounts-alone-1", "variable-alone-on-host", "unnamed-is-fresh",
                           "ran-once", "1", "create-125", "made 4 2", "no step of this job runs that container",
                           lines[-1]], text
    assert "--container-name=fs:create: this job already has a container of that name on this node" in text, text
    assert "tether: --container-mounts needs --container-image or --container-name" in text, text
    assert "tether: --container-name=nosuch: this job has no container of that name on this node, and " \
        "--container-image is not set" in text, text
    assert "trying once more" not in text and "before it created the container" not in text, text
    assert text.count("for --container-name=dev (podman; once per node): done") == 2, text
    job = parse_job(lines[-1])
    assert not (cluster.box.root / "jobs" / job).exists(), result      # gone with the job


def test_an_allocations_named_containers_go_with_it_on_every_node(cluster, image):
    """An allocation without a batch step (salloc): the named container its steps kept on each node
    (the unpacked root below the job's node directory) is there for the next step and gone once the
    job has ended -- slurmd's job epilog (the SPANK job_epilog) removes each node's part. It stayed
    behind before, one image copy per node and per allocation."""
    jobs = cluster.box.root / "jobs"
    steps = (f"srun -N2 --container-image={image} --container-name=keep --container-writable "
             "sh -c 'echo kept > /k'; srun -N2 --container-name=keep cat /k; "
             f"ls -d {jobs}/$SLURM_JOB_ID/*/podman-named/keep/rootfs; echo JOB=$SLURM_JOB_ID")
    out = cluster.as_user(["salloc", "-N2", "sh", "-c", steps], timeout=300)
    lines = [line for line in without_runc_warnings(out.stdout).splitlines()
             if not line.startswith(("tether:", "srun:", "salloc:"))]
    assert lines[:2] == ["kept", "kept"], (out.stdout, out.stderr)
    assert len([line for line in lines if line.endswith("/podman-named/keep/rootfs")]) == 2, out.stdout
    job = parse_job(lines[-1])
    assert wait_until(lambda: not (jobs / job).exists(), timeout=60), sorted(map(str, (jobs / job).glob("*/*")))
    assert wait_until(cluster.in_service, timeout=30), cluster.node_states()     # the epilog drained nothing


def parse_job(line: str) -> str:
    assert line.startswith("JOB="), line
    return line[4:]


def test_container_batch_runs_the_batch_script_itself_in_the_container(cluster, image):
    """Issue 15 (pyxis's sbatch_support, asked for): --container-batch runs the batch script in the
    container; without it the script stays on the host (where its srun works)."""
    probe = "echo $(test -e /etc/debian_version && echo host || echo container) RANK=$RANK TC=${TETHER_CONTAINER:-no}"
    results = {}
    for name, extra in (("asked", ["--container-batch"]), ("default", [])):
        out = cluster.box.work_dir / f"batch-{name}-{os.getpid()}.out"
        cluster.sbatch_wait(["-N1", f"--output={out}", f"--container-image={image}", *extra,
                             "--wrap", probe], timeout=180)
        results[name] = without_runc_warnings(out.read_text())
        out.unlink()
    assert results["asked"].strip().splitlines()[-1] == "container RANK=0 TC=1", results
    assert results["default"].strip().splitlines()[-1] == "host RANK=0 TC=no", results
    # the admin's container.batch: true (plugstack.conf container_batch=1, as pyxis's sbatch_support):
    # the script in the container without the option; --no-container-batch keeps it on the host
    conf = cluster.box.plugstack_conf
    saved = conf.read_text()
    line = next(w for w in saved.splitlines() if "spank_tether.so" in w and not w.lstrip().startswith("#"))
    try:
        conf.write_text(saved.replace(line, line + " container_batch=1"))
        for name, extra in (("site", []), ("declined", ["--no-container-batch"])):
            out = cluster.box.work_dir / f"batch-{name}-{os.getpid()}.out"
            cluster.sbatch_wait(["-N1", f"--output={out}", f"--container-image={image}", *extra,
                                 "--wrap", probe], timeout=180)
            results[name] = without_runc_warnings(out.read_text())
            out.unlink()
    finally:
        conf.write_text(saved)
    assert results["site"].strip().splitlines()[-1] == "container RANK=0 TC=1", results
    assert results["declined"].strip().splitlines()[-1] == "host RANK=0 TC=no", results


# ---- images (issue 14); last: a podman process of theirs may outlive a step for a moment, and
# the stale-state test above needs none of the user's podman processes alive ----------------------
def test_a_bare_shared_rootfs_runs_and_takes_mounts_onto_missing_targets(cluster):
    """Issue 14: a root-owned rootfs directory holding only busybox -- no /etc, none of podman's
    mount targets, no /data -- used to be refused ("this shared rootfs lacks /etc/passwd, ...").
    Now it is imported once into the user's store on the node (the ranks wait for it), and runs
    read-only with a mount onto a target it lacks, and writable (changes gone with the container)."""
    bare = cluster.box.bare_busybox_image()
    # as an admin's download: no /etc, and root's -- the job user can create nothing in it (the
    # test runs as root, for whom os.access would say yes)
    assert not Path(bare, "etc").exists()
    assert [(os.stat(p).st_uid, stat.S_IMODE(os.stat(p).st_mode)) for p in (bare, f"{bare}/bin")] == [(0, 0o755)] * 2
    assert cluster.as_user(["test", "-w", bare], check=False).returncode == 1
    for node in cluster.nodes:                      # cold: each node's store
        podman = cluster.box.user_podman(node)
        before = cluster.run([*podman, "images", "--format", "{{.Repository}}:{{.Tag}}"], check=False, cwd="/").stdout
        for name in before.split():
            if name.startswith("localhost/tether-rootfs:"):
                cluster.run([*podman, "rmi", "--force", name], check=False, cwd="/")
    result = cluster.as_user(["srun", "-N3", "-n6", f"--container-image={bare}",
                              "--container-mounts=/etc/debian_version:/data/version:ro",
                              "sh", "-c", "echo rank=$RANK $(cat /data/version) $(touch /x 2>&1)"])
    version = cluster.box.host_path("/etc/debian_version").read_text().strip()
    assert sorted(result.stdout.splitlines()) == [f"rank={r} {version} touch: /x: Read-only file system"
                                                  for r in range(6)], result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith(f"tether: importing the rootfs {bare} ")]
    assert len(said) == 6 and said[0].endswith(") ...") and ": done in " in said[-1], result.stderr   # once a node
    # writable: the user's own copy for the step (pyxis's writable container: yours to write, /
    # too), the shared image never written
    again = cluster.as_user(["srun", "-N1", f"--container-image={bare}", "--container-writable", "sh", "-c",
                             "mkdir -p /tmp/made && echo hi > /tmp/made/f && cat /tmp/made/f; touch /x 2>&1; id -u"])
    uid = str(pwd.getpwnam(cluster.user).pw_uid)
    assert again.stdout.split("\n")[:2] == ["hi", uid], again
    assert "importing" not in again.stderr and f"unpacking {bare} as your writable container" in again.stderr, again
    assert not Path(bare, "x").exists()
    assert not Path(bare, "tmp").exists()


def _remove_everywhere(cluster, image: str) -> None:
    """``image`` out of the job user's tether store on every node."""
    for node in cluster.nodes:
        cluster.run([*cluster.box.user_podman(node), "rmi", "--force", image], check=False, cwd="/")


def _write_as(user: str, path: Path, text: str) -> None:
    """``path`` (and the directories made for it) owned by ``user``, the file 0600."""
    entry = pwd.getpwnam(user)
    missing = [p for p in reversed(path.parents) if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    for directory in missing:
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def test_a_private_registry_image_runs_with_the_users_own_login(cluster):
    """Issue 14: images from a registry that asks for a login (the sandbox's second registry,
    htpasswd). The credentials are the user's own -- podman's ~/.config/containers/auth.json, or
    the file $REGISTRY_AUTH_FILE names -- never tether's config, never a command line: without
    one the step fails with the registry's refusal; with one it runs."""
    from tether.sandbox.cluster import registry_auth

    ref = cluster.box.private_registry_image()
    user, password = cluster.box.private_registry_credentials()
    home = Path(pwd.getpwnam(cluster.user).pw_dir)
    default_auth, elsewhere = home / ".config/containers/auth.json", home / f"tether-auth-{os.getpid()}.json"
    host_auth, host_elsewhere = cluster.box.host_path(default_auth), cluster.box.host_path(elsewhere)
    login = json.dumps(registry_auth(cluster.box.private_registry_address, user, password))
    show = ["sh", "-c", "echo in=$(test -e /etc/debian_version && echo host || echo container)"]
    try:
        host_auth.unlink(missing_ok=True)
        _remove_everywhere(cluster, ref)
        denied = cluster.as_user(["srun", "-N1", f"--container-image={ref}", "true"], check=False)
        assert denied.returncode != 0 and "authentication required" in denied.stderr, denied.stderr
        assert password not in denied.stderr
        _write_as(cluster.user, host_auth, login)
        ok = cluster.as_user(["srun", "-N2", f"--container-image={ref}", *show])
        assert ok.stdout.split() == ["in=container", "in=container"], ok.stderr
        host_auth.unlink()
        _remove_everywhere(cluster, ref)
        _write_as(cluster.user, host_elsewhere, login)
        named = cluster.as_user(["env", f"REGISTRY_AUTH_FILE={elsewhere}", "srun", "-N1",
                                 f"--container-image={ref}", *show])
        assert named.stdout.split() == ["in=container"] and "pulling" in named.stderr, named.stderr
    finally:
        host_auth.unlink(missing_ok=True)
        host_elsewhere.unlink(missing_ok=True)


def test_tether_images_lists_pulls_and_prunes_the_users_podman_store(cluster, registry_image):
    """Issue 14: `tether images` covers the user's podman store on the node: pull (as a first rank
    would: the progress lines), ls (with the last use tether recorded), prune (refuses nonsense,
    never removes an image a container uses, removes it once unused)."""
    images = ["env", f"TETHER_CONFIG={cluster.box.tether_conf}", *cluster.box.tether, "images"]
    bad = cluster.on_node_as_user(None, [*images, "prune", "--older-than", "-5"], check=False)
    assert bad.returncode == 1 and "--older-than -5: give a number of days >= 0" in bad.stderr
    # an empty store: the same image under another name (the private registry's) would keep its
    # layers, and rmi of one name of several only untags
    cluster.run([*cluster.box.user_podman(), "rmi", "--all", "--force"], check=False, cwd="/")
    pulled = cluster.on_node_as_user(None, [*images, "pull", "--runtime", "podman", registry_image])
    assert pulled.stdout.strip() == registry_image and f"tether: pulling {registry_image} (podman): done in" \
        in pulled.stderr
    listed = cluster.on_node_as_user(None, [*images, "ls", "--runtime", "podman"]).stdout
    assert [line.split()[0] for line in listed.splitlines() if registry_image in line] == ["podman"], listed
    proc, job = _running_step(cluster, registry_image, "while :; do sleep 1; done")
    try:
        kept = cluster.on_node_as_user(None, [*images, "prune", "--older-than", "0", "--runtime", "podman"])
        assert registry_image not in kept.stdout and f"kept {registry_image}" in kept.stderr, kept
    finally:
        cluster.run(["scancel", job])
        proc.communicate(timeout=60)
    assert wait_until(lambda: not podman_containers(cluster, job), timeout=60)
    gone = cluster.on_node_as_user(None, [*images, "prune", "--older-than", "0", "--runtime", "podman"])
    assert f"podman: removed {registry_image}" in gone.stdout, gone
    assert registry_image not in cluster.on_node_as_user(None, [*images, "ls", "--runtime", "podman"]).stdout


NAMESPACES = "for ns in net ipc uts; do echo $ns=$(readlink /proc/self/ns/$ns); done; echo HOST=$(hostname)"


def test_pyxis_container_variables_work_as_their_options(cluster, image, public_dir):
    """Issue 45: pyxis users keep PYXIS_CONTAINER_* in their scripts and module files; tether
    ignored them and ran the step on the host. They are the options' fallbacks as in pyxis 0.24:
    the command line wins, tether's own TETHER_CONTAINER_* win over them, and one without an image
    or a name does not refuse a plain step."""
    where = f"$(grep -qF ' {image} / ' /proc/self/mountinfo && echo container || echo host)"
    contained = cluster.as_user(["env", f"PYXIS_CONTAINER_IMAGE={image}", "PYXIS_CONTAINER_WORKDIR=/etc",
                                 "srun", "-N1", "sh", "-c", f"echo IN={where} PWD=$(pwd)"])
    assert contained.stdout.split() == ["IN=container", "PWD=/etc"], contained.stderr
    mounts = cluster.as_user(["env", f"PYXIS_CONTAINER_MOUNTS={public_dir}:/mnt-env", "srun", "-N1",
                              f"--container-image={image}", f"--container-mounts={public_dir}:/mnt-cli", "sh", "-c",
                              "test -d /mnt-cli && echo cli; test -d /mnt-env && echo env; true"])
    assert mounts.stdout.split() == ["cli"], mounts.stderr          # the command line wins
    touch = ["srun", "-N1", f"--container-image={image}", "sh", "-c", "touch /newfile 2>&1; true"]
    writable = cluster.as_user(["env", "PYXIS_CONTAINER_WRITABLE=1", *touch])
    readonly = cluster.as_user(["env", "PYXIS_CONTAINER_WRITABLE=1", *touch[:3], "--container-readonly", *touch[3:]])
    mine = cluster.as_user(["env", "PYXIS_CONTAINER_WRITABLE=1", "TETHER_CONTAINER_READONLY=1", *touch])
    off = cluster.as_user(["env", "PYXIS_CONTAINER_READONLY=0", *touch])
    assert "Read-only file system" not in writable.stdout + off.stdout, (writable.stdout, off.stdout)
    assert "Read-only file system" in readonly.stdout and "Read-only file system" in mine.stdout
    unshared = cluster.as_user(["env", f"PYXIS_CONTAINER_IMAGE={image}", "PYXIS_CONTAINER_UNSHARE=net", "srun",
                                "-N1", "readlink", "/proc/self/ns/net"])
    host = cluster.as_user(["srun", "-N1", "readlink", "/proc/self/ns/net"])
    assert unshared.stdout.startswith("net:[") and unshared.stdout != host.stdout, (unshared.stdout, host.stdout)
    alone = cluster.as_user(["env", "PYXIS_CONTAINER_MOUNTS=/etc:/mnt", "PYXIS_CONTAINER_WRITABLE=1", "srun", "-N1",
                             "sh", "-c", f"echo IN={where}"], check=False)
    assert alone.returncode == 0 and alone.stdout.strip() == "IN=host", alone.stderr
    bad = cluster.as_user(["env", "PYXIS_CONTAINER_UNSHARE=net,foo", "srun", "-N1", f"--container-image={image}",
                           "true"], check=False)
    assert bad.returncode != 0 and "tether: PYXIS_CONTAINER_UNSHARE=net,foo: unknown namespace 'foo'" in bad.stderr


def test_container_unshare_gives_the_container_namespaces_of_its_own(cluster, image):
    """Issue 45: pyxis 0.24's --container-unshare=net|ipc|uts was an unknown option. Without it a
    podman rank shares the node's network, IPC and UTS namespaces (as pyxis's; podman's own default
    made the last two private); with it each asked-for namespace is the container's own: net with
    nothing but a loopback interface, uts with the node's host name."""
    node = ["-N1", "-w", cluster.nodes[0]]          # one node: each has its own host name
    host = parse_namespaces(cluster.as_user(["srun", *node, "sh", "-c", NAMESPACES]).stdout)
    plain = parse_namespaces(cluster.as_user(["srun", *node, f"--container-image={image}", "sh", "-c",
                                              NAMESPACES]).stdout)
    assert (plain["net"], plain["ipc"], plain["uts"]) == (host["net"], host["ipc"], host["uts"])   # as pyxis's
    every = cluster.as_user(["srun", *node, f"--container-image={image}", "--container-unshare=net,ipc,uts",
                             "sh", "-c", NAMESPACES + "; echo LINKS=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ')"])
    inside = parse_namespaces(every.stdout)
    assert all(inside[ns] != host[ns] for ns in ("net", "ipc", "uts")), (inside, host)
    assert inside["LINKS"] == "lo" and inside["HOST"] == host["HOST"], every.stdout
    # net alone: the node's UTS namespace and name (podman refused a --hostname there: every such rank failed)
    net = parse_namespaces(cluster.as_user(["srun", *node, f"--container-image={image}", "--container-unshare=net",
                                            "sh", "-c", NAMESPACES]).stdout)
    assert (net["uts"], net["HOST"]) == (host["uts"], host["HOST"]) and net["net"] != host["net"], net
    bad = cluster.as_user(["srun", "-N1", f"--container-image={image}", "--container-unshare=net,foo", "true"],
                          check=False)
    assert bad.returncode != 0 and "tether: --container-unshare=net,foo: unknown namespace 'foo'" in bad.stderr


def parse_namespaces(text: str) -> dict[str, str]:
    """``name=value`` lines (NAMESPACES' output) as a mapping."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_pyxis_mount_grammar_and_workdir_on_real_podman(cluster, image):
    """Issue 45, what only a real container shows: a relative source with spaces from the step's
    working directory, a relative target, a tmpfs with its size really mounted, unbindable
    propagation, umount:DST taking the home mount away, a relative --container-workdir from the
    root, and a missing one failing the step (pyxis creates none); a tmpfs with every option."""
    work = cluster.box.work_dir / f"pyxis mounts {os.getpid()}"
    _write_as(cluster.user, work / "in put" / "f.txt", "hello\n")
    home = pwd.getpwnam(cluster.user).pw_dir
    try:
        shown = cluster.as_user(
            ["srun", "-N1", f"--container-image={image}", "--container-mount-home",
             f"--container-mounts=./in put:./my data:ro+unbindable,tmpfs:/scratch:size=8m+mode=1777,umount:{home}",
             "--container-workdir=my data", "sh", "-c",
             "pwd; cat f.txt; grep ' /scratch ' /proc/mounts | cut -d' ' -f1,3,4; "
             "grep -c ' /my\\\\040data ' /proc/self/mountinfo; grep ' /my\\\\040data ' /proc/self/mountinfo "
             "| grep -o unbindable; touch /scratch/ok && echo scratch-writable; "
             f"grep -c ' {home} ' /proc/self/mountinfo; exit 0"], cwd=str(work))
        lines = shown.stdout.splitlines()
        assert lines[:2] == ["/my data", "hello"] and lines[2].startswith("tmpfs tmpfs rw,") \
            and "size=8192k" in lines[2].split()[2].split(",") \
            and lines[3:] == ["1", "unbindable", "scratch-writable", "0"], shown.stdout + shown.stderr
        missing = cluster.as_user(["srun", "-N1", f"--container-image={image}", "--container-workdir=/pyxis", "pwd"],
                                  check=False)
        assert missing.returncode != 0 and 'workdir "/pyxis" does not exist' in missing.stderr, missing.stderr
        # tmpfs options podman's --tmpfs refuses (pyxis's mounts.bats: huge=within_size): an anonymous
        # volume of a tmpfs, gone with the container
        node = cluster.nodes[0]
        huge = cluster.as_user(["srun", "-N1", f"--nodelist={node}", f"--container-image={image}",
                                "--container-mounts=tmpfs:/t:huge=within_size+nr_inodes=1k+noexec", "sh", "-c",
                                "grep ' /t ' /proc/mounts | cut -d' ' -f4"])
        options = huge.stdout.strip().split(",")
        assert {"huge=within_size", "nr_inodes=1024", "noexec"} <= set(options), huge.stdout + huge.stderr
        left = cluster.run([*cluster.box.user_podman(node), "volume", "ls", "--quiet"], cwd="/").stdout
        assert left.strip() == "", left
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)
