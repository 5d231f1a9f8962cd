"""The Slurm resource table, row by row, and its prose cases (docs/requirements.md, "Slurm resource
calculations")."""

from __future__ import annotations

import pytest

from tether.hooks.errors import RequestError
from tether.hooks.plan import SLURM_TABLE, make_plan
from tether.hooks.request import Request

from helpers import directives, extra, make_config, options, with_sbatch_args


def slurm(request: Request, **config):
    return make_plan(request, make_config(**config), "slurm")


@pytest.mark.parametrize("slot_type", ["cuda", "rocm"])
def test_gpu_tres_gres_with_slots_per_node(slot_type):
    plan = slurm(Request(slots=8, slots_per_node=4, slot_type=slot_type))
    assert plan.row == "slurm-gpu-tres-gres"
    assert options(plan) == (("--gpus", "8"), ("--nodes", "1-8"), ("--tasks-per-node", "1"),
                              ("--gpus-per-task", "4"))
    assert (plan.nodes, plan.gpus, plan.slots_per_node) == ((1, 8), 8, 4)
    assert (plan.slurm.gpus, plan.slurm.gpus_per_task, plan.slurm.tasks_per_node, plan.slurm.task_count) == (8, 4, 1, 2)
    assert plan.notices == ()


def test_gpu_tres_gres_without_slots_per_node_lets_slurm_place_gpus():
    # No --tasks-per-node without --gpus-per-task: Slurm 22.05 would derive one task from the
    # minimum node count and refuse GPUs that do not fit one node (see hooks/plan.py).
    plan = slurm(Request(slots=8))
    assert options(plan) == (("--gpus", "8"), ("--nodes", "1-8"))
    assert plan.slots_per_node is None


def test_gpu_tres_gres_injects_gpu_type():
    plan = slurm(Request(slots=8, slots_per_node=4, gpu_type="a100"))
    assert options(plan) == (("--gpus", "a100:8"), ("--nodes", "1-8"), ("--tasks-per-node", "1"),
                              ("--gpus-per-task", "a100:4"))
    assert plan.gpu_type == "a100"


@pytest.mark.parametrize("slot_type", ["cuda", "rocm"])
def test_gpu_gres_only(slot_type):
    plan = slurm(Request(slots=8, slots_per_node=4, slot_type=slot_type), tres_supported=False)
    assert plan.row == "slurm-gpu-gres"
    assert options(plan) == (("--nodes", "2"), ("--ntasks", "2"), ("--gres", "gpu:4"))
    assert (plan.nodes, plan.gpus, plan.slurm.gpus_per_node, plan.slurm.task_count) == ((2, 2), 8, 4, 2)


def test_gpu_gres_only_injects_gpu_type():
    plan = slurm(Request(slots=8, slots_per_node=4, gpu_type="v100"), tres_supported=False)
    assert options(plan) == (("--nodes", "2"), ("--ntasks", "2"), ("--gres", "gpu:v100:4"))


def test_gpu_gres_only_without_slots_per_node_uses_one_per_node():
    plan = slurm(Request(slots=3), tres_supported=False)
    assert options(plan) == (("--nodes", "3"), ("--ntasks", "3"), ("--gres", "gpu:1"))
    assert plan.slots_per_node == 1


@pytest.mark.parametrize("tres", [True, False])
@pytest.mark.parametrize("gres", [True, False])
def test_cpu_row_ignores_tres_and_gres(tres, gres):
    plan = slurm(Request(slots=12, slots_per_node=4, slot_type="cpu"), tres_supported=tres,
                 gres_supported=gres)
    assert plan.row == "slurm-cpu"
    assert options(plan) == (("--nodes", "3"), ("--ntasks", "3"), ("--cpus-per-task", "4"))
    assert plan.gpus == 0
    assert plan.notices == ()


def test_cpu_without_slots_per_node():
    plan = slurm(Request(slots=2, slot_type="cpu"))
    assert options(plan) == (("--nodes", "2"), ("--ntasks", "2"), ("--cpus-per-task", "1"))


@pytest.mark.parametrize("slot_type", ["cuda", "rocm"])
def test_gpu_neither_tres_nor_gres(slot_type):
    plan = slurm(Request(slots=8, slots_per_node=4, slot_type=slot_type), tres_supported=False,
                 gres_supported=False)
    assert plan.row == "slurm-gpu-nogres"
    assert options(plan) == (("--nodes", "2"), ("--ntasks", "2"))
    assert plan.gpus == 0
    assert plan.notices == ()


def test_tres_without_gres_falls_back_to_no_gres_row_with_warning():
    plan = slurm(Request(slots=8, slots_per_node=4), tres_supported=True, gres_supported=False)
    assert plan.row == "slurm-gpu-nogres"
    assert options(plan) == (("--nodes", "2"), ("--ntasks", "2"))
    assert len(plan.notices) == 1 and "gres_supported is false" in plan.notices[0]


def test_gpu_type_on_a_row_without_typed_gpus_is_reported():
    plan = slurm(Request(slots=4, slots_per_node=2, slot_type="cpu", gpu_type="a100"))
    assert options(plan) == (("--nodes", "2"), ("--ntasks", "2"), ("--cpus-per-task", "2"))
    assert plan.gpu_type is None
    assert any("'a100' is not used" in n for n in plan.notices)


@pytest.mark.parametrize("slot_type", ["cuda", "rocm", "cpu"])
def test_zero_slots_is_an_aux_task_on_one_node_in_the_aux_pool(slot_type):
    plan = slurm(Request(slots=0, slot_type=slot_type), default_aux_resource_pool="aux",
                 default_compute_resource_pool="gpu")
    assert plan.row == "slurm-aux"
    assert options(plan) == (("--nodes", "1"), ("--ntasks", "1"))
    assert plan.partition == "aux"
    assert "#SBATCH --partition=aux" in directives(Request(slots=0), plan)


def test_zero_slots_ignores_slots_per_node_with_a_notice():
    plan = slurm(Request(slots=0, slots_per_node=4))
    assert options(plan) == (("--nodes", "1"), ("--ntasks", "1"))
    assert any("ignored for a job with 0 slots" in n for n in plan.notices)


@pytest.mark.parametrize("tres,gres", [(True, True), (False, True), (False, False)])
@pytest.mark.parametrize("slot_type", ["cuda", "cpu"])
def test_slots_per_node_must_divide_slots(tres, gres, slot_type):
    with pytest.raises(RequestError) as err:
        slurm(Request(slots=8, slots_per_node=3, slot_type=slot_type, origin="spec-slurm"),
              tres_supported=tres,
              gres_supported=gres)
    assert str(err.value) == ("slurm.slots_per_node=3 does not divide slots_per_trial=8; "
                              "choose one of 1, 2, 4, 8")


def test_slots_per_node_larger_than_slots():
    with pytest.raises(RequestError, match=r"slots_per_node=16 is larger than slots_per_trial=8"):
        slurm(Request(slots=8, slots_per_node=16, origin="spec-slurm"))


def test_messages_use_the_users_spelling():
    with pytest.raises(RequestError) as err:
        slurm(Request(slots=8, slots_per_node=3, origin="slurm"))
    assert str(err.value).startswith("--slots-per-node=3 does not divide --slots=8")


@pytest.mark.parametrize("field,value,fragment", [
    ("slots", -1, "slots_per_trial=-1 is not valid"),
    ("slots", True, "slots_per_trial=True is not valid"),
    ("slots", "8", "slots_per_trial='8' is not valid"),
    ("slots_per_node", 0, "slurm.slots_per_node=0 is not valid"),
    ("slot_type", "gpu", "slot_type='gpu' is not valid; expected one of cuda, rocm, cpu"),
    ("gpu_type", "a100;rm -rf /", "slurm.gpu_type='a100;rm -rf /' is not valid"),
    ("resource_pool", "gpu part", "resource_pool='gpu part' is not valid"),
    ("job_id", "x$(id)", "job_id='x$(id)' is not valid"),
])
def test_invalid_request_values(field, value, fragment):
    with pytest.raises(RequestError, match=None) as err:
        slurm(Request(**{"slots": 8, field: value, "origin": "spec-slurm"}))
    assert fragment in str(err.value)


# ---- slot type resolution and pools ---------------------------------------------------------
def test_slot_type_resolution_order():
    cfg = dict(slot_type="rocm", partition_overrides={"cpus": {"slot_type": "cpu"}})
    assert slurm(Request(slots=2), **cfg).slot_type == "rocm"                         # cluster
    assert slurm(Request(slots=2, resource_pool="cpus"), **cfg).slot_type == "cpu"    # partition
    assert slurm(Request(slots=2, resource_pool="cpus", slot_type="cuda"), **cfg).slot_type == "cuda"
    assert slurm(Request(slots=2)).slot_type == "cuda"                                 # fallback


def test_partition_override_gpu_type_and_default_compute_pool():
    cfg = dict(default_compute_resource_pool="gpu", partition_overrides={"gpu": {"gpu_type": "h100"}})
    plan = slurm(Request(slots=4, slots_per_node=4), **cfg)
    assert plan.partition == "gpu"
    assert options(plan)[0] == ("--gpus", "h100:4")
    assert options(slurm(Request(slots=4, gpu_type="a100"), **cfg))[0] == ("--gpus", "a100:4")


def test_no_pool_means_the_schedulers_default_partition():
    plan = slurm(Request(slots=4))
    assert plan.partition is None
    assert not any(line.startswith("#SBATCH --partition") for line in directives(Request(slots=4), plan))


def test_resource_pool_wins_over_defaults():
    plan = slurm(Request(slots=0, resource_pool="debug"), default_aux_resource_pool="aux")
    assert plan.partition == "debug"


# ---- common options (docs/requirements.md, "Common Slurm options") -----------------------------
def test_common_options_and_header_order():
    request = with_sbatch_args(["--mem=10G", "--comment=a b"], slots=8, slots_per_node=4,
                               job_type="exp-2-trial-2", job_id="f5388908", project="vision")
    plan = slurm(request, job_project_source="project", default_compute_resource_pool="gpu")
    assert directives(request, plan, "/shared/tether/tether_exp-2-trial-2-f5388908") == [
        "#SBATCH --gpus=8",
        "#SBATCH --nodes=1-8",
        "#SBATCH --tasks-per-node=1",
        "#SBATCH --gpus-per-task=4",
        "#SBATCH --job-name=tether_exp-2-trial-2-f5388908",
        "#SBATCH --partition=gpu",
        "#SBATCH --wckey=vision",
        "#SBATCH --no-requeue",
        "#SBATCH --output=/shared/tether/tether_exp-2-trial-2-f5388908/job.out",
        "#SBATCH --error=/shared/tether/tether_exp-2-trial-2-f5388908/job.err",
        "#SBATCH --mem=10G",
        "#SBATCH --comment='a b'",
    ]


@pytest.mark.parametrize("source,expected", [
    (None, None), ("project", "proj"), ("workspace", "ws"), ("label", "team-a,prio:high"),
    ("label:team-", "a"), ("label:nomatch", None), ("account", "acct"), ("user", "alice"),
])
def test_job_project_source(source, expected):
    request = Request(slots=1, project="proj", workspace="ws", labels=("team-a", "prio:high"),
                      account="acct", user="alice")
    assert slurm(request, job_project_source=source).project == expected


def test_partition_override_sbatch_args_come_before_the_users():
    cfg = dict(partition_overrides={"gpu": {"sbatch_args": ["--constraint=ib", "--time=60"]}})
    plan = slurm(with_sbatch_args(["--time=10"], slots=2, resource_pool="gpu"), **cfg)
    assert extra(plan) == (("--constraint", "ib"), ("--time", "60"), ("--time", "10"))


def test_logs_go_next_to_the_script_unless_a_log_dir_is_given():
    request = Request(slots=2, job_type="cmd", job_id="x1")
    lines = directives(request, slurm(request))
    assert "#SBATCH --output=tether_cmd-x1.out" in lines and "#SBATCH --error=tether_cmd-x1.err" in lines


def test_every_slurm_row_is_tested():
    tested = {"slurm-gpu-tres-gres", "slurm-gpu-gres", "slurm-cpu", "slurm-gpu-nogres", "slurm-aux"}
    assert {row.key for row in SLURM_TABLE} == tested
