"""A job's named container belongs to the runtime that made it (issue 45): a later step naming it
with another runtime is told which one made it, rather than that the job has no such container."""

from __future__ import annotations

import pytest

from tether.container.runtimes import adapter
from tether.container.spec import LaunchError, LaunchSpec

HOST = {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "SLURM_JOB_ID": "42"}


def _alone(tmp_path, runtime: str) -> LaunchSpec:
    """``srun --container-name=c2 CMD`` (no image) as rank 3 of step 1 on n2."""
    return LaunchSpec(image="", runtime=runtime, command=("true",), name="c2", job_id="42", step_id="1", rank="3",
                      rank_dir=str(tmp_path / "42/n2/step-1/rank-3"))


def test_a_container_enroot_made_is_named_when_a_podman_step_asks_for_it(tmp_path):
    with pytest.raises(LaunchError, match=r"^--container-name=c2: this job has no container of that name on this "
                                          r"node, and --container-image is not set"):
        adapter("podman", {"store": ""}).launch(_alone(tmp_path, "podman"), HOST)
    marker = tmp_path / "42/n2/enroot/made-by-tether-42-c2"          # what enroot's create step leaves
    marker.parent.mkdir(parents=True)
    marker.write_text("step-0\n")
    with pytest.raises(LaunchError, match=r"^--container-name=c2: this job's container c2 on this node was made "
                                          r"with enroot, and this step runs podman: add --container-runtime=enroot "
                                          r"\(a named container stays with the runtime that made it\)$"):
        adapter("podman", {"store": ""}).launch(_alone(tmp_path, "podman"), HOST)


def test_another_jobs_or_nodes_container_of_that_name_is_not_taken_for_this_ones(tmp_path):
    """Only this job's node directory counts: n1's container c2, or job 41's, says nothing here."""
    for elsewhere in ("42/n1/enroot/made-by-tether-42-c2", "41/n2/enroot/made-by-tether-41-c2"):
        path = tmp_path / elsewhere
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("step-0\n")
    with pytest.raises(LaunchError, match=r"^--container-name=c2: this job has no container of that name"):
        adapter("podman", {"store": ""}).launch(_alone(tmp_path, "podman"), HOST)
