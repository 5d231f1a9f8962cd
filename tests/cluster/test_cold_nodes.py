"""A container step on a cold node, through the real daemons (issue 46, 6): the job user has no
rootless-podman pause process there -- a compute node's state between jobs, since each step's end
kills the one its podman made. The pause process the step's podman then makes is podman's, kept for
the user's later podman commands: the rank's launcher must not wait for it (it waited its whole
5-second grace, every cold step). It must not outlive the step either: the launcher ends it, as
the step's end would (left to Slurm, it cost the step another second: proctrack/cgroup kills what
is left and looks again a second later)."""

from __future__ import annotations

import os
import pwd
import re

import pytest

from helpers import wait_until
from tether.container.runtimes.podman import PAUSE_NAMES, Podman, pause_pid_file

pytestmark = pytest.mark.cluster

# the launchers' answer to the tests' question (TETHER_RUN_TELL_REAPING): what they waited for
# once podman had exited
REAPING = re.compile(r"^tether-run: after the runtime: launcher=(c|python) reaped=(\d+) "
                     r"runtime_own=(none|[\d,]+) ended=(\d+) grace_ran_out=([01])$", re.M)


def _pause_file(cluster, node: str) -> str:
    """podman's record of the job user's pause process on ``node``."""
    box = cluster.box
    uid = pwd.getpwnam(cluster.user).pw_uid
    run_dir = Podman(box.tether_settings()["container"]["podman"]).run_dir(uid)
    return str(box.node_path(node, pause_pid_file(run_dir)))


def _state(pid: int) -> tuple[str, str, int] | None:
    """(command name, state letter, uid) of a process, or None when there is none."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            comm = fh.read().strip()
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return comm, state, os.stat(f"/proc/{pid}").st_uid
    except (OSError, IndexError):
        return None


def _live_pause_process(cluster) -> int | None:
    """A job user's pause process as podman recorded it on one of the nodes, when it is alive."""
    user = pwd.getpwnam(cluster.user).pw_uid
    for node in cluster.nodes:
        try:
            with open(_pause_file(cluster, node)) as fh:
                pid = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        found = _state(pid)
        if found and found[0] in PAUSE_NAMES and found[1] != "Z" and found[2] == user:
            return pid
    return None


@pytest.fixture
def cold_node(cluster):
    """The job user without a pause process on the node (the state each test leaves: the
    cold_nodes fixture). Another job of the user running a container step holds one in its step
    (this session's time-limited jobs do, for their minute): the node is cold only once they
    ended."""
    assert wait_until(lambda: not cluster.run(["squeue", "-h", "-u", cluster.user, "-o", "%i"]).stdout.strip(),
                      timeout=300), "the job user's other jobs did not end"
    cluster.box.cool_nodes()
    assert wait_until(lambda: _live_pause_process(cluster) is None, timeout=30)


def _reaping(stderr: str) -> list[tuple[str, list[int], int, bool]]:
    """Each rank's answer: (launcher, the runtime's own processes not waited for, how many of them
    it ended, whether its grace ran out)."""
    return [(launcher, [] if own == "none" else [int(p) for p in own.split(",")], int(ended), ran_out == "1")
            for launcher, _, own, ended, ran_out in REAPING.findall(stderr)]


@pytest.mark.parametrize("kind", ["registry", "rootfs"])
def test_a_cold_nodes_container_step_never_waits_for_podmans_pause_process(cluster, cold_node, kind, image,
                                                                        registry_image):
    """Three ranks on cold nodes: the rank whose podman made the pause process does not wait for it
    (named, as podman recorded it) but ends it, no launcher runs out its grace, and nothing of it
    outlives the step. A registry image goes through the Python launcher, a rootfs directory
    through the C one."""
    chosen = registry_image if kind == "registry" else image
    if kind == "registry":      # in the store already: the step's cost is the cold node's, not a pull
        cluster.as_user(["srun", "-N3", "-n3", f"--container-image={chosen}", "true"])
    assert _live_pause_process(cluster) is None       # ended by the rank whose podman made it
    result = cluster.as_user(["env", "TETHER_RUN_TELL_REAPING=1", "srun", "-N3", "-n3",
                              f"--container-image={chosen}", "true"], check=False)
    assert result.returncode == 0, result.stderr
    ranks = _reaping(result.stderr)
    assert len(ranks) == 3, result.stderr
    assert {launcher for launcher, *_ in ranks} == {"python" if kind == "registry" else "c"}
    assert not any(ran_out for *_, ran_out in ranks), result.stderr
    # each node its own run directory: each rank's podman made the pause process of its node
    own = sorted(pid for _, pids, _, _ in ranks for pid in pids)
    recorded = []
    for node in cluster.nodes:
        with open(_pause_file(cluster, node)) as fh:
            recorded.append(int(fh.read().strip()))
    assert own == sorted(recorded), result.stderr
    assert sum(ended for _, _, ended, _ in ranks) == 3, result.stderr
    assert all((_state(pid) or ("", "Z", 0))[1] == "Z" for pid in recorded)   # gone with their ranks
    assert cluster.in_service(), cluster.node_states()


def test_a_new_users_first_container_step_runs_on_three_cold_nodes(cluster, registry_image):
    """Issue 46: a job user who never ran anything -- created now, no home contents, no store, no
    run directory, no pause process on any node -- runs a 3-node container step of a registry
    image as their very first job: each node pulls into the user's new store there and the ranks
    run as them, in the container, one per node. (Its time against a warm step is a benchmark
    figure, bench/launch.py, not asserted here.)"""
    name = f"tether-new{os.getpid() % 100000}"
    uid = cluster.box.add_job_user(name)
    try:
        assert sorted(os.listdir(pwd.getpwnam(name).pw_dir)) == sorted(os.listdir("/etc/skel"))
        for node in cluster.nodes:                   # nothing of theirs on the nodes
            for base in ("/run/tether", str(cluster.box.store_base)):
                assert not cluster.box.node_path(node, f"{base}/{uid}").exists(), (node, base)
        result = cluster.run(["runuser", "-u", name, "--", "srun", "-N3", "-n3", f"--container-image={registry_image}",
                              "sh", "-c", "echo $(hostname) $RANK $(id -u) $(test -e /etc/debian_version && echo host || echo in)"],
                             check=False, timeout=300)
        assert result.returncode == 0, result.stderr
        assert sorted(result.stdout.split("\n")[:-1]) == [f"{node} {i} {uid} in" for i, node in enumerate(cluster.nodes)], \
            result.stdout + result.stderr
        for node in cluster.nodes:                   # each node's own store, the user's
            store = cluster.box.node_path(node, f"{cluster.box.store_base}/{uid}")
            assert store.is_dir() and store.stat().st_uid == uid, node
        assert cluster.in_service(), cluster.node_states()
    finally:
        cluster.box.remove_job_user(name)
    assert not any(cluster.box.node_path(node, f"{cluster.box.store_base}/{uid}").exists() for node in cluster.nodes)
