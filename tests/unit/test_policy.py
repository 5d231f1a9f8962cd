"""Option policy: parsing sbatch/qsub arguments and what tether refuses or replaces."""

from __future__ import annotations

import pytest

from tether.hooks.errors import RequestError
from tether.hooks.plan import make_plan
from tether.hooks.policy import (
    SLURM_GPU_OPTIONS, SLURM_LAYOUT_OPTIONS, SLURM_SCRIPT_OPTIONS, gres_references_gpu,
    parse_qsub_args, parse_sbatch_args, parse_select,
)
from tether.hooks.request import Request

from helpers import extra, make_config, with_sbatch_args


def names(args):
    return [(a.name, a.value) for a in args]


# ---- sbatch parsing --------------------------------------------------------------------------
@pytest.mark.parametrize("given,expected", [
    (["--mem=10G"], [("--mem", "10G")]),
    (["--time 10"], [("--time", "10")]),
    (["--time", "10"], [("--time", "10")]),
    (["-t10"], [("--time", "10")]),
    (["-t 10"], [("--time", "10")]),
    (["-t", "10"], [("--time", "10")]),
    (["--exclusive"], [("--exclusive", None)]),
    (["--exclusive=user"], [("--exclusive", "user")]),
    (["-Hv"], [("--hold", None), ("--verbose", None)]),
    (["-vt5"], [("--verbose", None), ("--time", "5")]),
    (["--ntasks-per-n=2"], [("--ntasks-per-node", "2")]),     # getopt_long unique prefix
    (["--comment=a b  c"], [("--comment", "a b  c")]),
    (["--gres=nic:1", "--mem=1G"], [("--gres", "nic:1"), ("--mem", "1G")]),
])
def test_parse_sbatch_args(given, expected):
    assert names(parse_sbatch_args(given)) == expected


@pytest.mark.parametrize("given,fragment", [
    (["--nod=2"], "--nod is ambiguous (could be --nodefile, --nodelist, --nodes)"),
    (["--bogus=1"], "--bogus is not an sbatch option"),
    (["-Z"], "-Z is not an sbatch option"),
    (["--time"], "--time requires a value"),
    (["-t"], "-t requires a value"),
    (["--hold=yes"], "--hold takes no value"),
    (["--exclusive user"], "write --exclusive=VALUE"),
    (["mem=10G"], "is not an option"),
    (["--comment=a\nb"], "contains a control character"),
    (["--slots=4"], "--slots is tether's own option; set slots_per_trial"),
    ([7], "is not a string"),
])
def test_parse_sbatch_args_errors(given, fragment):
    with pytest.raises(RequestError) as err:
        parse_sbatch_args(given)
    assert fragment in str(err.value)


@pytest.mark.parametrize("value,gpu", [
    ("gpu", True), ("gpu:2", True), ("gpu:a100:2", True), ("nic:1,gpu:1", True), ("GPU:1", True),
    ("gres:gpu:2", True), ("gres/gpu:2", True), ("nic:1", False), ("gpumem:1", False),
    ("shard:2", False), ("", False),
])
def test_gres_references_gpu(value, gpu):
    assert gres_references_gpu(value) is gpu


# ---- Slurm conflicts through the planner -------------------------------------------------------
def plan_with(args, slot_type=None, **config):
    return make_plan(with_sbatch_args(args, slots=8, slots_per_node=4, slot_type=slot_type, origin="spec-slurm"),
                     make_config(**config), "slurm")


@pytest.mark.parametrize("option", list(SLURM_LAYOUT_OPTIONS) + list(SLURM_GPU_OPTIONS)
                         + list(SLURM_SCRIPT_OPTIONS))
def test_controlled_options_are_rejected_naming_the_option(option):
    given = option if option in ("--no-requeue", "--requeue") else f"{option}=2"
    with pytest.raises(RequestError) as err:
        plan_with([given])
    assert str(err.value).startswith(f"slurm.sbatch_args: {given} conflicts with {option}")


@pytest.mark.parametrize("given", ["-N2", "-n 4", "-G1", "-J name", "-p debug", "-o out", "-e err",
                                   "--nodes 3", "--ntasks-per-n=1"])
def test_short_and_abbreviated_spellings_are_rejected_too(given):
    with pytest.raises(RequestError, match="conflicts with --"):
        plan_with([given])


def test_gpu_gres_is_rejected_other_gres_passes():
    with pytest.raises(RequestError, match="requests GPUs; tether computes GPU requests"):
        plan_with(["--gres=gpu:2"])
    with pytest.raises(RequestError, match="requests GPUs; tether computes GPU requests"):
        plan_with(["--gres=nic:1,gpu:a100:1"])
    assert extra(plan_with(["--gres=nic:1"])) == (("--gres", "nic:1"),)


def test_cpus_per_task_is_controlled_only_for_cpu_slots():
    assert extra(plan_with(["--cpus-per-task=8"])) == (("--cpus-per-task", "8"),)
    with pytest.raises(RequestError, match="conflicts with --cpus-per-task"):
        plan_with(["-c8"], slot_type="cpu")


def test_non_conflicting_options_pass_through():
    args = ["--mem=10G", "--time=1:00:00", "--constraint=ib", "--exclusive", "--mail-type=END",
            "--account=physics", "--qos=high", "--cpus-per-gpu=4", "--mem-per-gpu=8G"]
    assert [n for n, _ in extra(plan_with(args))] == [
        "--mem", "--time", "--constraint", "--exclusive", "--mail-type", "--account", "--qos",
        "--cpus-per-gpu", "--mem-per-gpu"]


def test_partition_override_args_are_checked_and_named():
    cfg = dict(partition_overrides={"gpu": {"sbatch_args": ["--nodes=2"]}})
    with pytest.raises(RequestError) as err:
        make_plan(Request(slots=2, resource_pool="gpu"), make_config(**cfg), "slurm")
    assert str(err.value).startswith("partition_overrides.gpu.sbatch_args: --nodes=2 conflicts")


# ---- qsub parsing ------------------------------------------------------------------------------
@pytest.mark.parametrize("given,expected", [
    (["-l mem=10gb"], [("-l", "mem=10gb")]),
    (["-lwalltime=1:00:00"], [("-l", "walltime=1:00:00")]),
    (["-q", "gpu"], [("-q", "gpu")]),
    (["-V"], [("-V", None)]),
    (["-A acct", "-m abe"], [("-A", "acct"), ("-m", "abe")]),
])
def test_parse_qsub_args(given, expected):
    assert names(parse_qsub_args(given)) == expected


@pytest.mark.parametrize("given,fragment", [
    (["-Y 1"], "-Y is not a qsub option"),
    (["--mem=1"], "is not a qsub option"),
    (["-l"], "-l requires a value"),
    (["-V yes"], "-V takes no value"),
    (["walltime=1"], "is not a qsub option"),
])
def test_parse_qsub_args_errors(given, fragment):
    with pytest.raises(RequestError) as err:
        parse_qsub_args(given)
    assert fragment in str(err.value)


def test_parse_select():
    assert parse_select("2:ncpus=4:mem=2gb+1:ngpus=1") == [
        (2, [("ncpus", "4"), ("mem", "2gb")]), (1, [("ngpus", "1")])]
    assert parse_select("3") == [(3, [])]
    assert parse_select("mem=1gb") == [(1, [("mem", "1gb")])]
    with pytest.raises(RequestError, match="is not resource=value"):
        parse_select("2:ncpus")
