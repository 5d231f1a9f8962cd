"""A sandbox of 16 nodes (issue 46, 4): `tether sandbox up --nodes 16` on this 2-core machine,
and one containerized step with a rank on every node -- ranks, nodes and the rank environment as
on the 3-node sandbox, nothing left behind, every node back in service.

A sandbox of its own on the host's Slurm, beside the session's (its own directory, ports and node
names: Slurm keeps each node's cgroups under /slurm_<node name>), in every pass of `make test`."""

from __future__ import annotations

import re

import pytest

from helpers import TEST_SANDBOX_ROOT, Cluster, parse
from tether.sandbox.cluster import Sandbox

pytestmark = pytest.mark.cluster

NODES = 16


@pytest.fixture(scope="module")
def big_cluster():
    box = Sandbox(f"{TEST_SANDBOX_ROOT}-16", nodes=NODES, node_prefix="big")
    try:
        box.up(install=False, log=lambda m: None)
    except Exception as exc:                 # SandboxError: fail, never skip
        box.down(log=lambda m: None)
        pytest.fail(f"the 16-node sandbox did not start:\n{exc}", pytrace=False)
    yield Cluster(box)
    box.down(purge=True, log=lambda m: None)     # its nodes' directories (stores) go too


def test_a_containerized_step_runs_a_rank_on_each_of_sixteen_nodes(big_cluster):
    cluster = big_cluster
    assert cluster.nodes == tuple(f"big{i}" for i in range(1, NODES + 1))
    assert sorted(cluster.node_states()) == sorted(cluster.nodes)
    image = cluster.box.busybox_image()
    probe = "echo RANK=$RANK WORLD_SIZE=$WORLD_SIZE NODE=$SLURMD_NODENAME MASTER_ADDR=$MASTER_ADDR IN=$TETHER_CONTAINER"
    result = cluster.as_user(["srun", f"-N{NODES}", f"-n{NODES}", "--time=5", f"--container-image={image}",
                              "sh", "-c", probe], timeout=600)
    ranks = parse(result.stdout)                                        # by RANK
    assert [r["RANK"] for r in ranks] == [str(i) for i in range(NODES)], result.stdout
    assert {r["WORLD_SIZE"] for r in ranks} == {str(NODES)}
    assert [r["NODE"] for r in ranks] == list(cluster.nodes)            # one rank per node, in order
    assert len({r["MASTER_ADDR"] for r in ranks}) == 1 and all(r["IN"] == "1" for r in ranks)
    # every node back in service, and no container of the step left in the user's store
    assert cluster.in_service(), cluster.node_states()
    for node in (cluster.nodes[0], cluster.nodes[-1]):
        left = cluster.run([*cluster.box.user_podman(node), "ps", "-a", "--format", "{{.Names}}"], cwd="/").stdout
        assert not re.findall(r"^tether-\d+-0-", left, re.M), (node, left)
