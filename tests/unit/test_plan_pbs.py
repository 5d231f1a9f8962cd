"""The PBS resource table, row by row, and the select-merge rule (docs/requirements.md, "PBS resource
calculations")."""

from __future__ import annotations

import pytest

from tether.hooks.errors import RequestError
from tether.hooks.plan import PBS_TABLE, make_plan
from tether.hooks.request import Request

from helpers import directives, extra, make_config, options, with_qsub_args


def pbs(request: Request, **config):
    return make_plan(request, make_config(**config), "pbs")



@pytest.mark.parametrize("slot_type", ["cuda", "rocm"])
def test_gpu_with_gres(slot_type):
    plan = pbs(Request(slots=8, slots_per_node=4, slot_type=slot_type))
    assert plan.row == "pbs-gpu-gres"
    assert options(plan) == (("-l", "select=2:ngpus=4"), ("-l", "place=scatter"))
    assert (plan.nodes, plan.gpus, plan.pbs.chunks, plan.pbs.chunk) == ((2, 2), 8, 2, (("ngpus", "4"),))


def test_gpu_with_gres_without_slots_per_node_uses_one():
    plan = pbs(Request(slots=3))
    assert options(plan)[0] == ("-l", "select=3:ngpus=1")
    assert plan.slots_per_node == 1


@pytest.mark.parametrize("tres", [True, False])
def test_gpu_without_gres(tres):
    plan = pbs(Request(slots=8, slots_per_node=4), gres_supported=False, tres_supported=tres)
    assert plan.row == "pbs-gpu-nogres"
    assert options(plan) == (("-l", "select=2"), ("-l", "place=scatter"))
    assert plan.gpus == 0


@pytest.mark.parametrize("gres", [True, False])
def test_cpu(gres):
    plan = pbs(Request(slots=12, slots_per_node=4, slot_type="cpu"), gres_supported=gres)
    assert plan.row == "pbs-cpu"
    assert options(plan) == (("-l", "select=3:ncpus=4"), ("-l", "place=scatter"))


def test_cpu_without_slots_per_node_uses_one():
    assert options(pbs(Request(slots=2, slot_type="cpu")))[0] == ("-l", "select=2:ncpus=1")


def test_zero_slots_is_one_chunk_in_the_aux_queue():
    plan = pbs(Request(slots=0), default_aux_resource_pool="aux")
    assert plan.row == "pbs-aux"
    assert options(plan)[0] == ("-l", "select=1")
    assert "#PBS -q aux" in directives(Request(slots=0), plan)


def test_slots_per_node_must_divide_slots():
    with pytest.raises(RequestError) as err:
        pbs(Request(slots=6, slots_per_node=4, origin="spec-pbs"))
    assert str(err.value) == "pbs.slots_per_node=4 does not divide slots_per_trial=6; choose one of 1, 2, 3, 6"


def test_gpu_type_is_ignored_for_pbs_with_a_notice():
    plan = pbs(Request(slots=4, slots_per_node=2, gpu_type="a100"))
    assert options(plan)[0] == ("-l", "select=2:ngpus=2")
    assert any("ignored for PBS" in n for n in plan.notices)


# ---- the select merge rule -------------------------------------------------------------------
def merged(args, request=None, **config):
    request = request or with_qsub_args(args, slots=8, slots_per_node=4, origin="spec-pbs")
    return pbs(request, **config)


def test_user_chunk_resources_are_appended_to_each_chunk():
    plan = merged(["-l select=1:mem=10gb:ncpus=8"])
    assert options(plan)[0] == ("-l", "select=2:ngpus=4:mem=10gb:ncpus=8")
    assert any("chunk count 1 replaced by 2" in n for n in plan.notices)


def test_user_ngpus_and_chunk_count_are_replaced_and_the_user_is_told():
    plan = merged(["-l select=3:ngpus=2:mem=10gb"])
    assert options(plan)[0] == ("-l", "select=2:ngpus=4:mem=10gb")
    assert plan.notices == (
        "pbs.pbsbatch_args: -l select=3:ngpus=2:mem=10gb: chunk count 3 replaced by 2 "
        "(slots_per_trial / slots_per_node)",
        "pbs.pbsbatch_args: -l select: ngpus=2 replaced by ngpus=4 (slots_per_node)",
    )


def test_same_values_replace_silently():
    assert merged(["-l select=2:ngpus=4:mem=1gb"]).notices == ()


def test_cpu_slots_control_ncpus_not_ngpus():
    request = with_qsub_args(["-l select=2:ncpus=16:ngpus=1"], slots=8, slots_per_node=4, slot_type="cpu",
                             origin="spec-pbs")
    plan = merged([], request)
    assert options(plan)[0] == ("-l", "select=2:ncpus=4:ngpus=1")
    assert any("ncpus=16 replaced by ncpus=4" in n for n in plan.notices)


def test_without_gres_user_ngpus_is_dropped():
    plan = merged(["-l select=2:ngpus=4:mem=1gb"], gres_supported=False)
    assert options(plan)[0] == ("-l", "select=2:mem=1gb")
    assert any("ngpus=4 dropped" in n for n in plan.notices)


def test_multi_chunk_select_is_combined():
    plan = merged(["-l select=1:mem=4gb+1:host=a"])
    assert options(plan)[0] == ("-l", "select=2:ngpus=4:mem=4gb:host=a")
    assert any("chunk arrangement is tether's" in n for n in plan.notices)


def test_conflicting_values_inside_one_select_are_an_error():
    with pytest.raises(RequestError, match="gives mem twice"):
        merged(["-l select=1:mem=4gb+1:mem=8gb"])


def test_later_select_wins_over_partition_override():
    cfg = dict(partition_overrides={"gpu": {"pbsbatch_args": ["-l select=1:mem=4gb"]}})
    request = with_qsub_args(["-l select=1:mem=8gb"], slots=4, slots_per_node=4, resource_pool="gpu",
                             origin="spec-pbs")
    assert options(pbs(request, **cfg))[0] == ("-l", "select=1:ngpus=4:mem=8gb")


def test_place_arrangement_is_tethers_sharing_is_kept():
    plan = merged(["-l place=pack:excl"])
    assert options(plan)[1] == ("-l", "place=scatter:excl")
    assert any("arrangement pack replaced by scatter" in n for n in plan.notices)


def test_other_resources_pass_through_in_the_same_l():
    plan = merged(["-l walltime=1:00:00,select=1:mem=2gb,software=abc"])
    assert options(plan)[0] == ("-l", "select=2:ngpus=4:mem=2gb")
    assert extra(plan) == (("-l", "walltime=1:00:00,software=abc"),)


@pytest.mark.parametrize("resource", ["nodes=2", "ncpus=8", "ngpus=4", "nodect=2"])
def test_jobwide_counts_are_rejected(resource):
    with pytest.raises(RequestError, match=f"-l {resource} conflicts with the select statement"):
        merged([f"-l {resource}"])


@pytest.mark.parametrize("arg,option", [("-N myjob", "-N"), ("-q gpu", "-q"), ("-e /tmp/e", "-e"),
                                        ("-o /tmp/o", "-o"), ("-V", "-V"), ("-r y", "-r"),
                                        ("-P proj", "-P")])
def test_common_pbs_options_are_tethers(arg, option):
    with pytest.raises(RequestError) as err:
        merged([arg])
    assert str(err.value).startswith(f"pbs.pbsbatch_args: {arg} conflicts with {option}")


def test_w_umask_is_tethers_other_w_attributes_pass():
    with pytest.raises(RequestError, match="conflicts with -W umask"):
        merged(["-W umask=0077"])
    assert extra(merged(["-W depend=afterok:12.srv"])) == (("-W", "depend=afterok:12.srv"),)


def test_pbs_header():
    request = with_qsub_args(["-l select=1:mem=10gb", "-l walltime=2:00:00", "-A phys"], slots=8,
                             slots_per_node=4, job_type="exp", job_id="abc", project="vision", origin="spec-pbs")
    plan = pbs(request, job_project_source="project", default_compute_resource_pool="gpuq")
    assert directives(request, plan, "/shared/tether/tether_exp-abc") == [
        "#PBS -l select=2:ngpus=4:mem=10gb",
        "#PBS -l place=scatter",
        "#PBS -N tether_exp-abc",
        "#PBS -q gpuq",
        "#PBS -e /shared/tether/tether_exp-abc/job.err",
        "#PBS -o /shared/tether/tether_exp-abc/job.out",
        "#PBS -V",
        "#PBS -r n",
        "#PBS -W umask=0022",
        "#PBS -P vision",
        "#PBS -l walltime=2:00:00",
        "#PBS -A phys",
    ]


def test_pbs_directive_quoting():
    plan = merged(["-m abe", "-M a b@example.org"])
    assert directives(Request(), plan)[-1] == '#PBS -M "a b@example.org"'
    with pytest.raises(RequestError, match="cannot be written into a #PBS line"):
        directives(Request(), merged(['-M a"b']))


def test_every_pbs_row_is_tested():
    assert {row.key for row in PBS_TABLE} == {"pbs-gpu-gres", "pbs-gpu-nogres", "pbs-cpu", "pbs-aux"}
