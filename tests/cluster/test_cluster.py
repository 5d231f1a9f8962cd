"""Real-cluster tests: slurmctld + 3 slurmd + munge on localhost, jobs submitted as a non-root user.

The plans are rendered into batch scripts exactly as tether generates them, submitted with the
real sbatch, and checked through ``scontrol show job`` and the jobs' own output.
"""

from __future__ import annotations

import itertools
import os
import pwd
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tether.hooks.config import validate_config
from tether.hooks.header import batch_header
from tether.hooks.plan import make_plan
from tether.hooks.render import script_directives
from tether.hooks.request import Request
from tether.sandbox.cluster import Sandbox
from tether.sandbox.demo import make_job_dir, run_demo, sbatch

from helpers import storage, wait_until, with_sbatch_args

pytestmark = pytest.mark.cluster

_ids = itertools.count(1)


def unique_id() -> str:
    """Job ids unique across test sessions (the sandbox's jobs directory outlives a session)."""
    return f"t{os.getpid()}-{next(_ids)}"


RANK_BODY = r"""
srun bash -c 'echo "rank=$SLURM_PROCID node=$SLURMD_NODENAME gpus=${CUDA_VISIBLE_DEVICES:-none} cpus=$SLURM_CPUS_PER_TASK user=$(id -un)"'
"""


def submit_plan(box, request: Request, config, body: str):
    """A batch script as tether generates one (the Plan's header, logs in the job's own directory),
    submitted with the real sbatch as the job user; waits for the end."""
    plan = make_plan(request, config, "slurm")
    job_dir = make_job_dir(box.work_dir / f"plan-{request.job_id}", box.user)
    script = job_dir / "job.sbatch"
    script.write_text("#!/bin/bash\n" + "\n".join(script_directives(plan, batch_header(request, str(job_dir))))
                      + "\n" + body)
    os.chown(script, job_dir.stat().st_uid, job_dir.stat().st_gid)
    return plan, sbatch(box, job_dir, [str(script)], timeout=300, wait=True)


def run_plan(cluster, request: Request, **config):
    request = Request(**{**request.__dict__, "job_id": unique_id()})
    config = validate_config({"job_storage_root": str(cluster.box.root / "jobs"), **config}, "<sandbox>")
    plan, job = submit_plan(cluster.box, request, config, RANK_BODY)
    assert job.returncode == 0, job.stderr + job.output("job.err")
    ranks = sorted(line for line in job.output().splitlines() if line.startswith("rank="))
    return plan, cluster.job_fields(job.job_id), ranks


def test_three_nodes_in_service_with_four_gpus_each(cluster):
    """(idle, or mixed: the level's time-limited jobs run on some of their CPUs)"""
    out = cluster.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N %T %G"]).stdout.split("\n")
    nodes = sorted(line.replace(" mixed ", " idle ") for line in out if line)
    assert nodes == [f"{n} idle gpu:4" for n in cluster.nodes]


def _listening(pid: int) -> list[str]:
    """``ADDRESS:PORT`` of each TCP socket process ``pid`` listens on (its descriptors' inodes looked
    up in the kernel's tables of its network namespace)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:          # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            if width == 8:
                shown = ".".join(str(b) for b in reversed(raw))
            else:                                  # four little-endian 32-bit words
                words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
                shown = "[" + b"".join(words).hex() + "]"
            found.append(f"{shown}:{int(port, 16)}")
    return found


def test_every_daemon_of_the_sandbox_listens_on_loopback_only(cluster):
    """The machine's rule: a daemon the sandbox starts listens on loopback only. Slurm 24.11's
    slurmdbd took no NoInAddrAny (slurm.conf's CommunicationParameters; its own slurmdbd.conf has no
    such option) and listened on 0.0.0.0."""
    loopback = ("127.", "[" + "0" * 31 + "1]:")      # 127/8: each node has its own 127.0.0.N
    seen = {}
    for daemon in cluster.box.daemons():
        pid = daemon.pid()
        assert pid, f"{daemon.name} is not running"
        seen[daemon.name] = _listening(pid)
    assert [a for a in seen["slurmctld"] if a.startswith(loopback)], seen   # the check sees sockets at all
    wide = {name: [a for a in addresses if not a.startswith(loopback)] for name, addresses in seen.items()}
    assert not any(wide.values()), wide


def test_srun_three_nodes_per_node_output(cluster):
    out = cluster.as_user(["srun", "-N3", "--label", "bash", "-c",
                           'echo "$SLURMD_NODENAME $(id -un)"']).stdout
    assert sorted(out.splitlines()) == [f"{i}: {cluster.nodes[i]} {cluster.user}" for i in range(3)]


def test_each_node_is_a_host_of_its_own_sharing_only_home_and_the_job_storage_root(cluster):
    """Issue 46: each node has its own hostname, address (its NodeAddr, by which every node
    resolves it, and from which its connections leave) and /tmp, /var/tmp, /run, /dev/shm; a file
    in the job storage root or the home directory is seen from every node, a file in /tmp is not."""
    nodes = cluster.nodes
    addresses = {node: cluster.box.node_address(node) for node in nodes}
    assert len(set(addresses.values())) == len(nodes) and "127.0.0.1" not in addresses.values()
    job = cluster.submit("--slots=3", "--slots-per-node=1", "--slot-type=cpu", "--wrap", "sleep 300")
    try:
        assert wait_until(lambda: cluster.job_fields(job)["JobState"] == "RUNNING", 60)
        shared = storage(cluster) / job / "shared-from-first"         # the job's directory: the user's
        assert wait_until(lambda: shared.parent.is_dir(), 30)

        def on(node: str, script: str, check: bool = True) -> str:
            return cluster.as_user(["srun", "--overlap", f"--jobid={job}", "-N1", "-w", node, "bash", "-c", script],
                                   check=check).stdout
        names = " ".join(nodes)
        home = pwd.getpwnam(cluster.user).pw_dir
        first = on(nodes[0], f"echo $(hostname) $(getent hosts {names} | tr -s ' \n' ' '); "
                             f"echo n1 > /tmp/tether-node-{job}; echo n1 > {shared}; echo n1 > {home}/tether-node-{job}")
        assert first.split() == [nodes[0], *(w for n in nodes for w in (addresses[n], n))], first
        for node in nodes[1:]:
            seen = on(node, f"echo $(hostname); ls /tmp/tether-node-{job} 2>&1 >/dev/null | wc -l; cat {shared}; "
                            f"cat {home}/tether-node-{job}")
            assert seen.split() == [node, "1", "n1", "n1"], (node, seen)     # /tmp its own; shared, home seen
        assert cluster.box.node_path(nodes[0], f"/tmp/tether-node-{job}").read_text() == "n1\n"
        assert not cluster.box.node_path(nodes[1], f"/tmp/tether-node-{job}").exists()
    finally:
        cluster.run(["scancel", job], check=False)
        cluster.wait_job(job)
        Path(pwd.getpwnam(cluster.user).pw_dir, f"tether-node-{job}").unlink(missing_ok=True)


def test_multinode_sbatch_wait_as_user(cluster, tmp_path):
    script = cluster.box.work_dir / "multinode.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -N3\n#SBATCH --output=multinode-%j.out\n"
                      "srun --label hostname >/dev/null\nsrun -N3 bash -c 'echo node $SLURMD_NODENAME'\n")
    result = cluster.as_user(["sbatch", "--wait", "--parsable", str(script)])
    job_id = result.stdout.strip()
    lines = (cluster.box.work_dir / f"multinode-{job_id}.out").read_text().splitlines()
    assert sorted(lines) == [f"node {n}" for n in cluster.nodes]
    fields = cluster.job_fields(job_id)
    assert (fields["JobState"], fields["NumNodes"], fields["ExitCode"]) == ("COMPLETED", "3", "0:0")


# ---- the Slurm resource table on the real cluster -------------------------------------------------
def test_tres_gres_row(cluster):
    plan, fields, ranks = run_plan(cluster, Request(slots=6, slots_per_node=2), job_project_source="project",
                                   default_compute_resource_pool="gpu")
    assert plan.row == "slurm-gpu-tres-gres"
    assert (fields["NumNodes"], fields["NumTasks"]) == ("3", "3")
    # written by sbatch itself here (the plan's directives): 24.11 shows its per-task value as gres/gpu=2
    assert fields["TresPerJob"] == cluster.gres("gpu:6")
    assert fields["TresPerTask"] in (cluster.gres("gpu:2"), cluster.gres("gpu=2")), fields["TresPerTask"]
    assert (fields["Partition"], fields["Requeue"]) == ("gpu", "0")
    assert fields["JobName"].startswith("tether_cmd-t") and fields["StdOut"].endswith(f"{fields['JobName'][11:]}/job.out")
    assert ranks == [f"rank={i} node={cluster.nodes[i]} gpus=0,1 cpus= user={cluster.user}" for i in range(3)]


def test_tres_gres_row_without_slots_per_node(cluster):
    """6 GPUs do not fit one 4-GPU node: Slurm must pick the nodes, one task (container) each."""
    plan, fields, ranks = run_plan(cluster, Request(slots=6))
    assert fields["TresPerJob"] == cluster.gres("gpu:6") and "TresPerTask" not in fields
    assert fields["NumNodes"] == fields["NumTasks"] == str(len(ranks)) == "2"
    gpus = sum(len(re.search(r"gpus=(\S+)", r).group(1).split(",")) for r in ranks)
    assert gpus == 6


def test_gres_row(cluster):
    plan, fields, ranks = run_plan(cluster, Request(slots=8, slots_per_node=4), tres_supported=False)
    assert plan.row == "slurm-gpu-gres"
    assert (fields["NumNodes"], fields["NumTasks"], fields["TresPerNode"]) == ("2", "2", cluster.gres("gpu:4"))
    assert [r.split()[2] for r in ranks] == ["gpus=0,1,2,3", "gpus=0,1,2,3"]


def test_cpu_row(cluster):
    plan, fields, ranks = run_plan(cluster, Request(slots=6, slots_per_node=2, slot_type="cpu"))
    assert (fields["NumNodes"], fields["NumTasks"], fields["CPUs/Task"]) == ("3", "3", "2")
    assert "TresPerJob" not in fields and "TresPerNode" not in fields
    assert [r.split()[2:4] for r in ranks] == [["gpus=none", "cpus=2"]] * 3


def test_no_gres_row(cluster):
    plan, fields, ranks = run_plan(cluster, Request(slots=6, slots_per_node=2), tres_supported=False,
                                   gres_supported=False)
    assert (fields["NumNodes"], fields["NumTasks"]) == ("3", "3")
    assert not any(k.startswith("TresPer") for k in fields)
    assert len(ranks) == 3


def test_aux_row_in_the_aux_pool_with_wckey(cluster):
    request = Request(slots=0, project="vision")
    plan, fields, ranks = run_plan(cluster, request, default_aux_resource_pool="aux",
                                   job_project_source="project")
    assert (fields["NumNodes"], fields["NumTasks"], fields["Partition"]) == ("1", "1", "aux")
    assert fields["WCKey"].lstrip("*") == "vision"
    assert len(ranks) == 1


def test_user_arguments_with_hostile_text_reach_slurm_unchanged(cluster):
    comment = """a b#c "q" 'x' $(id) `id` ; rm -rf /"""
    request = with_sbatch_args([f"--comment={comment}", "--time=5"], slots=3, slot_type="cpu")
    plan, fields, ranks = run_plan(cluster, request)
    shown = cluster.run(["scontrol", "show", "job", fields["JobId"]]).stdout
    assert re.search(r"^\s*Comment=(.*?)\s*$", shown, re.M).group(1) == comment
    assert fields["TimeLimit"] == "00:05:00"


def test_demo_command(cluster, capsys):
    """`tether demo`'s job: sbatch --slots=6 --slots-per-node=2 --slot-type=cpu with an image from the
    sandbox's registry, through the installed plugins; each rank reports from its container."""
    logged = []
    assert run_demo(cluster.box, install=False, log=logged.append) == 0
    out = capsys.readouterr().out.splitlines()
    image = cluster.box.registry_image()
    assert out[0].endswith(f"3 nodes ({cluster.box.node_prefix}[1-3]), 3 tasks, image {image}")
    job = out[0].split()[1].rstrip(":")
    ranks = sorted(line.split(": ", 1)[1] for line in out[1:] if ": node=" in line)
    port = 12288 + (int(job) % 1024) * 16
    uid = pwd.getpwnam(cluster.user).pw_uid
    master = re.search(r" master=([^:]+):", ranks[0]).group(1)
    assert master == cluster.box.node_address(cluster.nodes[0]), ranks   # the first node's NodeAddr
    assert [re.sub(r"cpus=\d+", "cpus=N", r) for r in ranks] == [
        f"node={cluster.nodes[i]} rank={i} of 3 master={master}:{port} uid={uid} cpus=N TMPDIR=/tmp in=container"
        for i in range(3)]
    assert "NumNodes=3 NumTasks=3 CPUs/Task=2" in logged[-1]


# ---- the sandbox as people use it ------------------------------------------------------------------
def test_second_sandbox_via_cli_does_not_collide_and_stops_cleanly(cluster, tmp_path):
    """`tether sandbox up|status|down` on another root: its own ports, and nothing left after down.
    On the host's Slurm in every pass (a release pass starts its own sandboxes through the same
    Sandbox.up; this one runs no job, so it shares nothing with the session's sandbox)."""
    root = Path("/var/lib/tether/sandbox-pytest-cli")
    tether = [sys.executable, "-m", "tether.cli.main"]
    up = subprocess.run([*tether, "sandbox", "up", "--no-install", "--dir", str(root)],
                        capture_output=True, text=True, timeout=180)
    try:
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == f"export SLURM_CONF={root}/etc/slurm.conf; export TETHER_CONFIG={root}/etc/tether.yaml"
        assert sorted(p.name for p in (root / "nodes").iterdir()) == ["n1", "n2", "n3"]  # each its own /tmp, ...
        env_line = subprocess.run([*tether, "sandbox", "env", "--dir", str(root)],
                                  capture_output=True, text=True).stdout.strip()
        assert env_line == up.stdout.strip()
        sinfo = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N %T %G"], capture_output=True,
                               text=True, env={"SLURM_CONF": f"{root}/etc/slurm.conf", "PATH": "/usr/bin"})
        assert sorted(sinfo.stdout.split("\n")[:-1]) == ["n1 idle gpu:4", "n2 idle gpu:4", "n3 idle gpu:4"]
        assert cluster.box.port_base() != int((root / "sandbox.json").read_text().split(":")[1].split(",")[0])
        status = subprocess.run([*tether, "sandbox", "status", "--dir", str(root)], capture_output=True,
                                text=True)
        assert status.returncode == 0 and status.stdout.count("pid ") == 9   # 2 registries, munged, mariadb, slurmdbd, slurmctld, 3 slurmd
        pids = [int(p) for p in re.findall(r"pid (\d+)", status.stdout)]
    finally:
        down = subprocess.run([*tether, "sandbox", "down", "--purge", "--dir", str(root)],
                              capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", pid
    assert not root.exists()
    assert cluster.box.running()  # the session's sandbox was not touched


def test_a_sandbox_whose_processes_were_killed_outright_starts_again(cluster, tmp_path):
    """CI ran on a machine restored from a snapshot taken mid-run: every process gone, slurmctld's
    saved state still holding running jobs, which kept a node busy past `up`'s 90 s (87 errors).
    `up` now cancels the jobs of the sandbox's earlier life."""
    root = Path(f"/var/lib/tether/sandbox-pytest-crash{cluster.box.release() or ''}")
    # the session's Slurm, with node names of its own (cgroups are per node name: see Sandbox.nodes)
    box = Sandbox(root, slurm=cluster.box.release() or "", node_prefix="crash")
    if root.exists():        # a run of this test that was itself cut short: its mark holds a pid of then
        box.down(purge=True, log=lambda m: None)
    box.up(install=False, log=lambda m: None)
    try:
        mark = box.work_dir / "stepd.pid"
        job = box.slurm(["runuser", "-u", box.user, "--", "sbatch", "--parsable", "-N1", "--wrap",
                         f"echo $PPID > {mark}; exec sleep 600"],
                        cwd=str(box.work_dir)).stdout.strip()          # its output file goes there
        deadline = time.monotonic() + 120
        while not (mark.exists() and mark.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert mark.exists(), box.slurm(["scontrol", "-o", "show", "job", job], check=False).stdout + box.log_tails()
        victims = [int(mark.read_text())] + [d.pid() for d in box.daemons() if d.pid()]
        sleeper = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _is_child_of(p, victims[0])]
        for pid in victims + sleeper:                    # as a snapshot's restore leaves them: gone
            os.kill(pid, signal.SIGKILL)
        assert not box.running()
        started = time.monotonic()
        box.up(install=False, log=lambda m: None)
        assert time.monotonic() - started < 60
        state = box.slurm(["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout
        assert state.strip() in ("", "CANCELLED"), state
    finally:
        box.down(purge=True, log=lambda m: None)
        if cluster.box.packaged:        # the root's config and launcher are the session's again
            cluster.box.claim_package_config()
            cluster.box.install_plugins(log=lambda m: None)


def _is_child_of(proc: Path, parent: int) -> bool:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent
    except (OSError, ValueError, IndexError):
        return False


def test_a_node_whose_namespace_setup_fails_stops_the_start_with_its_reason_and_leaves_nothing_running(cluster):
    """Issue 46's bad input: a node whose own host cannot be set up (here its /dev/shm is gone
    between the boot's directories and its slurmd's start, so NODE_ENTER's bind fails) fails `up`
    with that node's name and the mount's own words, and no daemon of the sandbox is left."""
    from tether.sandbox.cluster import SandboxError

    root = Path(f"/var/lib/tether/sandbox-pytest-broken{cluster.box.release() or ''}")
    box = Sandbox(root, slurm=cluster.box.release() or "", node_prefix="broken")
    boot = box._boot_nodes

    def boot_then_break() -> None:
        boot()
        (box.node_dir(box.nodes[1]) / "dev" / "shm").rmdir()
    box._boot_nodes = boot_then_break
    try:
        with pytest.raises(SandboxError) as failed:
            box.up(install=False, quick=True, log=lambda m: None)
        message = str(failed.value)
        assert f"slurmd-{box.nodes[1]} failed to start" in message and "dev/shm" in message, message
        assert [d.name for d in box.daemons() if d.pid()] == []
        conf = str(box.slurm_conf).encode()
        left = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_has(p, conf)]
        assert left == [], left
    finally:
        box.down(purge=True, log=lambda m: None)
        if cluster.box.packaged:        # the root's config and launcher are the session's again
            cluster.box.claim_package_config()
            cluster.box.install_plugins(log=lambda m: None)


def _cmdline_has(proc: Path, text: bytes) -> bool:
    try:
        return text in (proc / "cmdline").read_bytes()
    except OSError:
        return False
