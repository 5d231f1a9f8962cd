"""Fixtures of the real-cluster level: the sandbox's test image, and the jobs that run into their
time limits -- submitted once, when the first cluster test starts, so that their one-minute waits
overlap each other and the rest of the level instead of adding up."""

from __future__ import annotations

import os
import warnings

import pytest


def _submit(cluster, *argv: str) -> str:
    out = cluster.as_user(["sbatch", "--parsable", *argv]).stdout
    return out.strip().split(";")[0]


@pytest.fixture(scope="session")
def image(cluster) -> str:
    """A busybox rootfs, root-owned and read-only to users (see Sandbox.busybox_image)."""
    return str(cluster.box.busybox_image())


@pytest.fixture(scope="session")
def registry_image(cluster) -> str:
    """The busybox image in the sandbox's own registry (docker-registry on loopback), as a user
    writes it: ``127.0.0.1:PORT/tether/busybox:1``."""
    return cluster.box.registry_image()


@pytest.fixture(scope="session")
def mpi_image(cluster) -> str:
    """The busybox rootfs plus the host's OpenMPI and libpmi2 and two ping programs (see
    Sandbox.mpi_image)."""
    return cluster.box.mpi_image()


@pytest.fixture(scope="session", autouse=True)
def time_limited_jobs(request) -> dict[str, str]:
    """{"plain": id, "container": id} of two jobs that hit their 1-minute limit (checked at the end
    of test_run_side.py and test_containers_cluster.py)."""
    cluster = request.getfixturevalue("cluster")
    image = request.getfixturevalue("image")
    out = cluster.box.work_dir / "timeout-signals"
    out.mkdir(exist_ok=True)
    os.chmod(out, 0o777)
    # the batch script outlives its step at the time limit (trap wait TERM; srun in the background):
    # a script that dies at once gets its srun SIGKILLed with the batch step, and srun's shepherd
    # then SIGKILLs the step -- a race with the SIGTERM the step gets (srun_job.c _shepherd_spawn)
    trap = ("trap wait TERM; srun -N1 sh -c 'trap \"echo term >> /mnt/term-$SLURM_JOB_ID\" TERM; "
            "echo up > /mnt/up-$SLURM_JOB_ID; while :; do sleep 1; done' & wait")
    return {
        "plain": _submit(cluster, "--time=1", "--slots=2", "--slot-type=cpu", "--output=/dev/null",
                         "--wrap", "srun sleep 600"),
        "container": _submit(cluster, "--time=1", "-N2", f"--container-image={image}", f"--output={out}/job-%j.out",
                             "--wrap", "srun -N2 sh -c 'while :; do sleep 1; done'"),
        # its step traps SIGTERM inside the container and writes term-<job> to the mount on /mnt (issue 16)
        "container_trap": _submit(cluster, "--time=1", "-N1", f"--container-image={image}",
                                  f"--container-mounts={out}:/mnt", f"--output={out}/job-%j.out", "--wrap", trap),
    }


@pytest.fixture(autouse=True)
def cold_nodes(request):
    """Each test leaves the nodes cold for the job user, as a compute node is between jobs (issue
    46): no rootless podman pause process of theirs. A test's podman outside Slurm (Sandbox.on_node)
    makes one, and every later step would find that node warm; each step's end ends its own.
    Between jobs also means the test's ended jobs are gone from the nodes: a cancelled step may
    still be removing its container when its job has ended (Sandbox.wait_for_ended_jobs)."""
    yield
    for name in ("cluster", "release_cluster", "big_cluster"):
        if name in request.fixturenames:
            box = request.getfixturevalue(name).box
            left = box.wait_for_ended_jobs()
            if left:
                warnings.warn(f"steps of ended jobs still on the nodes after a minute: {', '.join(left)}")
            box.cool_nodes()
