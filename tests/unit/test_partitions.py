"""slurm.conf's partitions as the job_submit handler counts their nodes (job_submit/partitions.py)
and Slurm's hostlist syntax (hooks/hostlist.py)."""

from __future__ import annotations

import pytest

from tether.hooks.hostlist import expand_hostlist
from tether.job_submit.partitions import partition_sizes, partition_table


@pytest.mark.parametrize("text,names", [
    ("n[1-3,5],m1", ["n1", "n2", "n3", "n5", "m1"]),
    ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("gpu-a,gpu-b", ["gpu-a", "gpu-b"]),
    ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
    ("", []),
])
def test_a_hostlist_is_the_names_slurm_makes_of_it(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["n[a-b]", "n[3-1]", "n[1-2000000]"])
def test_a_hostlist_slurm_would_not_take_is_an_error(text):
    with pytest.raises(ValueError):
        expand_hostlist(text)


def test_partitions_are_counted_as_slurm_conf_defines_them(tmp_path):
    (tmp_path / "nodes.conf").write_text("NodeName=g[1-4] Gres=gpu:4\nNodeSet=gpus Nodes=g[1-4]\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "# a comment with PartitionName=fake Nodes=x[1-100]\n"
        "ClusterName=c\n"
        "NodeName=DEFAULT CPUs=8\n"
        "NodeName=n[1-3] CPUs=2\n"
        "include nodes.conf\n"
        "NodeSet=fat Feature=bigmem\n"
        "PartitionName=DEFAULT Nodes=n[1-3] MaxTime=1:00:00\n"
        "PartitionName=debug Default=YES\n"
        "PartitionName=gpu Nodes=gpus,n1 \\\n  State=UP\n"
        "PartitionName=all Nodes=ALL\n"
        "PartitionName=fat Nodes=fat\n"
        'PartitionName=quoted Nodes="n[1-2]"\n'
        "bogus\n")                                    # no setting at all: skipped, never an error
    sizes, default = partition_sizes(str(conf))
    # DEFAULT's values carry on; a NodeSet counts its nodes once; ALL is every NodeName; a
    # feature NodeSet is not known from the file (no note rather than a wrong one)
    assert sizes == {"debug": 3, "gpu": 5, "all": 7, "quoted": 2} and default == "debug"
    assert partition_table(str(conf)) == "debug\ndebug 3\ngpu 5\nall 7\nquoted 2\n"
    assert partition_sizes(str(tmp_path / "missing.conf")) == ({}, None)
    dynamic = tmp_path / "dynamic.conf"
    dynamic.write_text("PartitionName=dyn State=UP Default=YES\n")     # no Nodes= (dynamic nodes): not known
    assert partition_sizes(str(dynamic)) == ({}, "dyn")


def test_a_hostlist_too_long_is_refused_before_it_is_built():
    with pytest.raises(ValueError, match="more than 1000000 names"):
        expand_hostlist("a[1-100000]b[1-100000]")


def test_a_slurm_conf_the_counter_cannot_read_costs_the_note_only(tmp_path, monkeypatch):
    """The note at submit is worth no refused job: a slurm.conf whose counting fails is logged once
    and the job is planned as ever."""
    from tether.job_submit import handler as handler_mod
    from tether.job_submit.handler import ACCEPT, Handler
    from tether.testing.slurm import PluginLib, bridge_ffi

    def broken(path):
        raise RuntimeError("unreadable")

    monkeypatch.setattr(handler_mod, "partition_table", broken)
    conf = tmp_path / "slurm.conf"
    conf.write_text("PartitionName=debug Nodes=n1\n")
    config = tmp_path / "tether.yaml"
    config.write_text("default_compute_resource_pool: debug\n")
    lib = PluginLib()
    h = Handler(bridge_ffi(), lib, env={"TETHER_CONFIG": str(config), "SLURM_CONF": str(conf)})
    assert h.init() == ACCEPT
    assert lib.partitions == "\n" and any("cannot count the partitions' nodes" in m for _, m in lib.log)
