"""Hypothesis properties of the planner over generated requests and configs.

How many examples: the hypothesis profile (tests/conftest.py): ``ci`` by default, ``thorough``
(thousands per property) with ``HYPOTHESIS_PROFILE=thorough``.
"""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.hooks.errors import RequestError
from tether.hooks.header import batch_header
from tether.hooks.plan import make_plan
from tether.hooks.policy import SPEC_HINT, parse_sbatch_args
from tether.hooks.render import (
    directive_lines, header_options, is_shell_safe, option_words, resource_options, script_directives,
)
from tether.hooks.request import SLOT_TYPES, Request

from helpers import make_config, with_sbatch_args

NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,12}", fullmatch=True)

requests = st.builds(
    Request,
    slots=st.one_of(st.integers(0, 64), st.integers(0, 100_000)),
    slots_per_node=st.one_of(st.none(), st.integers(1, 16), st.integers(1, 4096)),
    slot_type=st.one_of(st.none(), st.sampled_from(SLOT_TYPES)),
    gpu_type=st.one_of(st.none(), NAMES),
    resource_pool=st.one_of(st.none(), NAMES),
    job_type=NAMES,
    job_id=st.one_of(st.none(), NAMES),
    project=st.one_of(st.none(), NAMES),
)
configs = st.fixed_dictionaries({
    "slot_type": st.sampled_from(SLOT_TYPES),
    "tres_supported": st.booleans(),
    "gres_supported": st.booleans(),
    "default_compute_resource_pool": st.one_of(st.none(), NAMES),
    "default_aux_resource_pool": st.one_of(st.none(), NAMES),
    "job_project_source": st.sampled_from([None, "project"]),
})
schedulers = st.sampled_from(["slurm", "pbs"])

def plan_or_none(request, config, scheduler):
    try:
        return make_plan(request, make_config(**config), scheduler)
    except RequestError:
        return None


@given(requests, configs, schedulers)
def test_plans_exist_exactly_when_slots_per_node_divides_slots(request, config, scheduler):
    plan = plan_or_none(request, config, scheduler)
    spn = request.slots_per_node
    valid = request.slots == 0 or spn is None or (spn <= request.slots and request.slots % spn == 0)
    assert (plan is not None) == valid


@given(requests, configs, schedulers)
def test_gpu_rows_request_exactly_slots_gpus(request, config, scheduler):
    plan = plan_or_none(request, config, scheduler)
    if plan is None:
        return
    res = plan.slurm
    if plan.row == "slurm-gpu-tres-gres":
        asked = res.gpus
        if res.gpus_per_task is not None:                 # one task per node, spn GPUs each
            assert res.gpus_per_task * res.task_count == asked and res.tasks_per_node == 1
    elif plan.row == "slurm-gpu-gres":
        asked = res.min_nodes * res.gpus_per_node
    elif plan.row == "pbs-gpu-gres":
        asked = plan.pbs.chunks * int(dict(plan.pbs.chunk)["ngpus"])
    else:
        assert plan.gpus == 0
        if res is not None:
            assert (res.gpus, res.gpus_per_task, res.gpus_per_node) == (None, None, None)
        else:
            assert "ngpus" not in dict(plan.pbs.chunk)
        return
    assert plan.slot_type in ("cuda", "rocm")
    assert asked == request.slots == plan.gpus


@given(requests, configs, schedulers)
def test_nodes_times_slots_per_node_is_slots(request, config, scheduler):
    plan = plan_or_none(request, config, scheduler)
    if plan is None:
        return
    low, high = plan.nodes
    if request.slots == 0:
        assert (low, high) == (1, 1)
    elif plan.row == "slurm-gpu-tres-gres":
        assert (low, high) == (1, request.slots)          # the table's --nodes=1-N
    else:
        assert low == high and low * plan.slots_per_node == request.slots
        if scheduler == "slurm":
            assert plan.slurm.ntasks == low               # one task (container) per node


@given(requests, configs, schedulers)
def test_planning_is_deterministic_and_rendered_values_are_shell_safe(request, config, scheduler):
    plan = plan_or_none(request, config, scheduler)
    if plan is None:
        return
    again = make_plan(request, make_config(**config), scheduler)
    assert again == plan
    header = batch_header(request)
    assert script_directives(again, header) == script_directives(plan, header)
    for word in option_words(resource_options(plan) + header_options(plan, header), scheduler):
        assert is_shell_safe(word), word
    for line in script_directives(plan, header):
        assert shlex.split(line)[0] in ("#SBATCH", "#PBS")


# Printable text that a user may legitimately put in a pass-through option value.
free_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=30)


@given(free_text)
def test_user_values_round_trip_through_sbatch_directive_quoting(text):
    """sbatch 22.05 parses #SBATCH lines with shell quoting: a quoted value comes back unchanged."""
    line = directive_lines([("--comment", text)], "slurm")[0]
    words = shlex.split(line, comments=False)
    assert words == ["#SBATCH", f"--comment={text}"]
    assert [(a.name, a.value) for a in parse_sbatch_args([words[1]])] == [("--comment", text)]


# each option a user may not pass, as typed, and the option tether names as its own
CONTROLLED = {"--nodes=2": "--nodes", "-N2": "--nodes", "--ntasks=1": "--ntasks", "-n1": "--ntasks",
              "--gpus=1": "--gpus", "-G1": "--gpus", "--gpus-per-node=1": "--gpus-per-node",
              "--gres=gpu:1": None, "--tasks-per-node=1": "--tasks-per-node", "--job-name=x": "--job-name",
              "-p": "--partition", "--wckey=x": "--wckey", "--requeue": "--requeue", "--output=o": "--output",
              "-e": "--error", "--ntasks-per-gpu=1": "--ntasks-per-gpu"}


@given(requests.filter(lambda r: r.slots > 0), st.sampled_from(sorted(CONTROLLED)))
def test_controlled_options_never_pass_through(request, option):
    """Whatever the request, a controlled option is refused with the message naming it and the
    option tether sets (a GPU --gres: that GPUs come from slots) -- never planned, never another error."""
    args = (option, "value") if option in ("-p", "-e") else (option,)
    fields = {k: v for k, v in request.__dict__.items() if k not in ("sbatch_args", "slots_per_node")}
    request = with_sbatch_args(args, **fields)
    if CONTROLLED[option] is None:
        expected = (f"scheduler arguments: {option} requests GPUs; tether computes GPU requests from slots, so "
                    f"remove it (a --gres without GPUs, e.g. --gres=nic:1, is allowed)")
    else:
        expected = (f"scheduler arguments: {option} conflicts with {CONTROLLED[option]}, which tether sets from the "
                    f"slot request; remove it ({SPEC_HINT})")
    with pytest.raises(RequestError) as refused:
        make_plan(request, make_config(), "slurm")
    assert str(refused.value) == expected
