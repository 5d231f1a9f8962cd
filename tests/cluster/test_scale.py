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


def test_two_users_sixteen_node_jobs_cost_the_registry_one_manifest_and_each_blob_once(big_cluster):
    """Issue 44's figure: with the cluster image store, a cold 16-node job of one user and then
    one of a second user, both of the same registry image, cost the registry exactly one manifest
    request and one request for each blob in all (its access log); every rank ran on the store's
    squashfs, mounted on its node in its user's namespace."""
    import os

    from test_image_store_cluster import fetches

    cluster = big_cluster
    box = cluster.box
    repository = f"tether/store16-{os.getpid()}"
    ref = box.registry_image(repository=repository, changes=("ENV STORE_TEST=from-image", "CMD /bin/sh"),
                             log=lambda *_: None)
    second = f"tether-s16{os.getpid() % 100000}"
    show = ["sh", "-c", "echo $SLURMD_NODENAME $(id -un) $STORE_TEST "
                        "$(awk '$5 == \"/\"' /proc/self/mountinfo | grep -o squashfuse | head -n 1)"]
    with box.cluster_store_on():
        box.add_job_user(second)
        try:
            before = len(box.registry_access_log())
            first = cluster.as_user(["srun", f"-N{NODES}", f"-n{NODES}", "--time=5", f"--container-image={ref}", *show],
                                    timeout=600)
            other = cluster.run(["runuser", "-u", second, "--", "srun", f"-N{NODES}", f"-n{NODES}", "--time=5",
                                 f"--container-image={ref}", *show], timeout=600)
            fetched = fetches(box.registry_access_log()[before:], repository)
        finally:
            box.remove_job_user(second)
    assert sorted(first.stdout.split("\n")[:-1]) == sorted(f"{n} {cluster.user} from-image squashfuse"
                                                           for n in cluster.nodes), first.stderr
    assert sorted(other.stdout.split("\n")[:-1]) == sorted(f"{n} {second} from-image squashfuse"
                                                           for n in cluster.nodes), other.stderr
    assert [p for p in fetched if "/manifests/" in p] == [f"/v2/{repository}/manifests/1"], fetched
    assert len(fetched) >= 3 and set(fetched.values()) == {1}, fetched        # the manifest, config, layer
    assert first.stderr.count("(once for the whole cluster)") == 1, first.stderr
    assert cluster.in_service(), cluster.node_states()
