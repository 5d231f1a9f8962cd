"""Pilot partitions (issue 19, docs/requirements.md) without a cluster: the state model (every
transition, a crash between any two), concurrent readers, how descriptions fit an allocation, the
requirements' reconfiguration example. The agents as job steps run on the sandbox
(tests/cluster/test_pilot_cluster.py)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.pilot import ALL, FILL, Pilot, PilotError
from tether.pilot.resources import Description, Node, PartitionError, Slice, fit, parse_cpus_per_node, unused
from tether.pilot.state import (
    ACTIVE, CANCELED, DONE, FAILED, FINAL, NEW, PENDING, STARTING, STATES, TRANSITIONS, PilotStore, StateError,
    recover,
)

THREE = [Node("n1", 8, 2), Node("n2", 8, 2), Node("n3", 8, 2)]


@pytest.fixture
def store(tmp_path):
    return PilotStore(tmp_path / "pilot").create()


def new(store: PilotStore) -> str:
    with store.lock():
        return store.new_partition({"nodes": 1, "config": "default"}, {"command": None, "cores": 0})["id"]


# ---- the state model ------------------------------------------------------------------------------
ROUTE = {NEW: [], PENDING: [PENDING], STARTING: [PENDING, STARTING], ACTIVE: [PENDING, STARTING, ACTIVE],
         DONE: [PENDING, STARTING, ACTIVE, DONE], FAILED: [FAILED], CANCELED: [CANCELED]}


@pytest.mark.parametrize("source", STATES)
def test_every_transition_of_the_model_and_no_other(store, source):
    for target in STATES:
        pid = new(store)
        for state in ROUTE[source]:
            store.transition(pid, state)
        if source in FINAL:
            assert store.transition(pid, target)["state"] == source     # final stays final
        elif target in TRANSITIONS[source]:
            assert store.transition(pid, target)["state"] == target
        else:
            with pytest.raises(StateError, match=f"{source} -> {target} is not a transition"):
                store.transition(pid, target)
            assert store.read(pid)["state"] == source


def test_the_history_keeps_every_state_with_its_time(store):
    pid = new(store)
    for state in (PENDING, STARTING, ACTIVE, DONE):
        store.transition(pid, state, f"to {state}")
    history = store.read(pid)["history"]
    assert [h[0] for h in history] == [NEW, PENDING, STARTING, ACTIVE, DONE]
    assert all(a[1] <= b[1] for a, b in zip(history, history[1:]))


# A crash of the command after each step of a partition's life: what recover() makes of it, with
# the agent step alive or gone (squeue's step names), and with a stop asked for.
CRASH_POINTS = [
    # (states reached, launched, step alive, stop asked) -> state after recover
    ([NEW], False, False, False, FAILED),
    ([NEW, PENDING], False, False, False, FAILED),
    ([NEW, PENDING, STARTING], True, True, False, STARTING),      # srun is creating it: wait
    ([NEW, PENDING, STARTING], True, False, False, FAILED),
    ([NEW, PENDING, STARTING, ACTIVE], True, True, False, ACTIVE),
    ([NEW, PENDING, STARTING, ACTIVE], True, False, False, FAILED),
    ([NEW, PENDING, STARTING, ACTIVE], True, False, True, CANCELED),
    ([NEW, PENDING, STARTING, ACTIVE, DONE], True, False, False, DONE),
]


@pytest.mark.parametrize("reached, launched, alive, stop, expected", CRASH_POINTS)
def test_a_crash_between_any_two_transitions_is_settled(store, reached, launched, alive, stop, expected):
    pid = new(store)
    for state in reached[1:]:
        store.transition(pid, state, **({"launched": 1.0, "step_name": f"tether-{pid}"} if state == STARTING else {}))
    if stop:
        store.update(pid, stop_requested=True)
    if not launched:                                       # the record is old: its command is gone
        record = store.read(pid)
        record["history"][-1][1] -= 3600
        store.update(pid, history=record["history"])
    assert recover(store, {f"tether-{pid}"} if alive else set()) == ([] if expected == reached[-1] else [pid])
    assert store.read(pid)["state"] == expected
    assert recover(store, None) == []                      # squeue unknown: nothing is guessed


def test_a_fresh_record_is_not_settled_while_its_command_may_still_run(store):
    pid = new(store)
    assert recover(store, set()) == [] and store.read(pid)["state"] == NEW


def test_a_crash_in_the_middle_of_a_write_leaves_the_old_record_readable(store):
    pid = new(store)
    (store.parts / f".{pid}.json.999.tmp").write_text('{"id": "part.00')     # a write that never finished
    assert store.read(pid)["state"] == NEW and [p["id"] for p in store.partitions()] == [pid]


def test_concurrent_readers_always_see_whole_records(store):
    pid = new(store)
    seen, errors = set(), []

    def read():
        for _ in range(400):
            try:
                seen.add(store.read(pid)["state"])
            except (ValueError, StateError) as exc:      # a torn record would be a JSON error
                errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(4)]
    for t in readers:
        t.start()
    for state in (PENDING, STARTING, ACTIVE, DONE):
        store.transition(pid, state)
    for t in readers:
        t.join()
    assert not errors and seen <= {NEW, PENDING, STARTING, ACTIVE, DONE}


# ---- fitting descriptions -------------------------------------------------------------------------
def test_descriptions_parse_from_text_and_mappings():
    assert Description.parse("1 node") == Description(nodes=1)
    assert Description.parse("16 cores") == Description(cores=16)
    assert Description.parse("50%") == Description(size="50%")
    assert Description.parse("fill") == Description(size=FILL)
    assert Description.parse({"cores": 4, "gpus": 1, "config": "x"}) == Description(cores=4, gpus=1, config="x")
    for bad in ("0 nodes", "150%", {"nodes": 1, "cores": 2}, {"nodes": 1, "colour": "red"}, {"size": "a lot"}):
        with pytest.raises(PartitionError):
            Description.parse(bad)
    assert parse_cpus_per_node("8(x2),4") == [8, 8, 4]


def test_one_node_half_and_fill_take_disjoint_nodes():
    held = []
    got = []
    for d in ("1 node", "50%", "FILL"):
        s = fit(Description.parse(d), THREE, held)
        held.append(s)
        got.append(s.to_data())
    assert got == [{"n1": [8, 2]}, {"n2": [8, 2]}, {"n3": [8, 2]}]
    assert unused(THREE, held) is None


def test_cores_pack_onto_partly_used_nodes_first_and_the_agent_is_added():
    first = fit(Description(cores=4), THREE, [])
    assert first.to_data() == {"n1": [4, 0]}
    second = fit(Description(cores=6, gpus=1), THREE, [first], agent_cores=1)
    assert second.to_data() == {"n1": [4, 1], "n2": [3, 0]}      # 6 + the agent's 1, n1's rest first
    half = fit(Description(size="50%"), [Node("solo", 8)], [])  # one node: a share of its cores
    assert half.to_data() == {"solo": [4, 0]}


def test_over_use_names_what_is_over_used_and_what_is_free():
    held = [fit(Description(nodes=1), THREE, [])]
    with pytest.raises(PartitionError, match=r"3 nodes needs 3 whole nodes: over-used -- 2 of 3 nodes free, "
                                             r"16 of 24 cores, 4 of 6 GPUs"):
        fit(Description(nodes=3), THREE, held)
    with pytest.raises(PartitionError, match=r"30 cores needs 30 cores: cores over-used"):
        fit(Description(cores=30), THREE, [])
    with pytest.raises(PartitionError, match=r"nothing beside the agent's own 8 cores"):
        fit(Description(nodes=1), THREE, [], agent_cores=8)


# ---- the requirements' reconfiguration example, with the launch of agents left out ---------------
@pytest.fixture
def pilot(tmp_path, monkeypatch):
    p = Pilot(root=tmp_path / "pilot", job="7")
    p._nodes = list(THREE)
    launched = []
    monkeypatch.setattr(p, "_launch", lambda record: launched.append(record["id"]))
    monkeypatch.setattr(p.allocation, "alive", lambda record: False)
    p.launched = launched
    return p


def test_reconfig_as_in_the_requirements(pilot, monkeypatch):
    pd2 = Description(nodes=1)
    first = pilot.reconfig(start=["1 node", "50%", FILL])
    assert [p.state for p in first] == [PENDING] * 3 and pilot.launched == [p.id for p in first]
    assert [p.nodes for p in first] == [["n1"], ["n2"], ["n3"]] and pilot.warnings == []

    def stop(pid, wait=True, timeout=60, reason=None):    # what the agent reports when scancelled
        pilot.store.transition(pid, CANCELED, "stopped")
    monkeypatch.setattr(pilot, "stop", stop)

    parts = pilot.reconfig(stop=ALL, start=[pd2, pd2])   # WARNING (under-used)
    assert [p.state for p in parts] == [PENDING, PENDING]
    assert pilot.warnings == ["under-used: 1 of 3 nodes free, 8 of 24 cores, 2 of 6 GPUs that no partition uses"]
    parts = pilot.reconfig(stop=ALL, start=[pd2, pd2, pd2])     # OK
    assert [p.state for p in parts] == [PENDING] * 3 and pilot.warnings == []
    parts = pilot.reconfig(stop=ALL, start=[pd2, pd2, pd2, pd2])  # ERROR (over-used): the 4th FAILED
    assert [p.state for p in parts] == [PENDING, PENDING, PENDING, FAILED]
    assert "1 node needs 1 whole node: over-used -- 0 of 3 nodes free" in parts[3].record["message"]
    # the history stays: every partition, the CANCELED ones too
    states = [p.state for p in pilot.partitions]
    assert len(states) == 12 and states.count(CANCELED) == 8 and states.count(FAILED) == 1


def test_tasks_go_only_to_partitions_that_take_them(pilot):
    own, = pilot.reconfig(start=[{"nodes": 1, "command": ["my-agent"]}])
    with pytest.raises(PilotError, match="runs its own agent"):
        pilot.run(own, ["true"], wait=False)
    part, = pilot.reconfig(start=["1 node"])
    task = pilot.run(part, ["hostname"], wait=False)
    assert task.record["state"] == "QUEUED" and task.record["partition"] == part.id
    pilot.store.transition(part.id, CANCELED, "stopped")
    assert task.wait(5)["state"] == "CANCELED"                  # no agent will run it now
    with pytest.raises(PilotError, match="is CANCELED"):
        pilot.run(part, ["true"], wait=False)


def test_outside_an_allocation_the_pilot_says_so(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("PBS_JOBID", raising=False)
    with pytest.raises(PilotError, match="not inside an allocation"):
        Pilot()


def test_records_are_plain_json(store):
    pid = new(store)
    assert json.loads((store.parts / f"{pid}.json").read_text())["state"] == NEW
    assert Slice.from_data({"n1": [2, 0]}).cores == 2


def test_tasks_of_an_ended_partition_are_settled(store):
    pid = new(store)
    for state in (PENDING, STARTING, ACTIVE, DONE):
        store.transition(pid, state)
    queued = store.new_task(pid, ["true"], 1)["id"]
    running = store.new_task(pid, ["sleep", "9"], 1)["id"]
    store.update_task(running, "RUNNING")
    recover(store, set())
    assert [store.read_task(t)["state"] for t in (queued, running)] == ["CANCELED", "CANCELED"]
    assert store.read_task(queued)["message"] == f"partition {pid} is DONE"


def test_partition_run_takes_the_words_after_the_double_dash_as_the_command():
    from tether.cli import main as cli

    argv, command = cli._split_command(["partition", "run", "part.0001", "--no-wait", "-n", "2", "--",
                                        "sleep", "--flag", "3"])
    args = cli.build_parser().parse_args(argv)
    assert (args.partition, args.no_wait, args.ntasks, command) == ("part.0001", True, 2, ["sleep", "--flag", "3"])
    assert cli._split_command(["partition", "list", "--", "x"]) == (["partition", "list", "--", "x"], None)


# ---- tether pilot submit ---------------------------------------------------------------------------
def test_a_pilot_is_sized_from_its_initial_partitions_with_the_agents_needs():
    from tether.pilot.submit import pilot_job, pilot_nodes

    assert pilot_nodes([Description(nodes=2), Description(cores=12), Description(cores=3)], 8, agent_cores=1) == 5
    args, script = pilot_job({"partitions": ["1 node", {"cores": 6}], "agent_cores": 1, "time": 30,
                              "partition": "debug", "sbatch_args": ["--account=p"],
                              "script": "tether partition run part.0000 -- ./a\n"}, 8)
    assert args == ["--nodes=2", "--exclusive", "--job-name=tether-pilot", "--partition=debug", "--time=30",
                    "--account=p"]
    assert "\ntether partition create '1 node' '6 cores' --wait || exit 1\ntether partition run part.0000 -- ./a\n" \
        in script
    with pytest.raises(PartitionError, match="a share of the allocation cannot size a pilot"):
        pilot_job({"partitions": ["50%"]}, 8)
    assert pilot_job({"partitions": ["1 node", "50%", "FILL"], "nodes": 3}, 8)[0][0] == "--nodes=3"
    with pytest.raises(PartitionError, match="over-used"):                       # they must fit
        pilot_job({"partitions": ["2 nodes", "2 nodes"], "nodes": 3}, 8)
    with pytest.raises(PartitionError, match="unknown key"):
        pilot_job({"partitions": ["1 node"], "walltime": 5}, 8)
    assert "tether partition wait ALL --state DONE" in pilot_job({"partitions": ["1 node"]}, 8)[1]
    # PBS: whole hosts, the walltime, the queue, the user's qsub arguments; sbatch's are refused
    assert pilot_job({"partitions": ["1 node", {"cores": 6}], "agent_cores": 1, "time": "125", "partition": "workq",
                      "qsub_args": ["-A", "p"]}, 8, "pbs")[0] == [
        "-N", "tether-pilot", "-l", "select=2:ncpus=8", "-l", "place=scatter:excl", "-q", "workq",
        "-l", "walltime=02:05:00", "-A", "p"]
    with pytest.raises(PartitionError, match="qsub_args: not for slurm"):
        pilot_job({"partitions": ["1 node"], "qsub_args": ["-A", "p"]}, 8)
    with pytest.raises(PartitionError, match="time: minutes"):
        pilot_job({"partitions": ["1 node"], "time": "1h"}, 8)


# ---- the allocation's end -----------------------------------------------------------------------------
# An agent may be killed outright at the allocation's end, before its SIGTERM handler runs (srun's
# shepherd SIGKILLs the step of an srun that was SIGKILLed with the batch step): what it could not
# record is settled once the allocation has ended.
def test_once_the_allocation_ended_every_partition_not_final_is_canceled(store):
    from tether.pilot.state import ENDED

    active, stopped, done, fresh = new(store), new(store), new(store), new(store)
    for pid in (active, stopped, done):
        for state in (PENDING, STARTING, ACTIVE):
            store.transition(pid, state, **({"launched": 1.0, "step_name": f"tether-{pid}"} if state == STARTING
                                            else {}))
    store.transition(done, DONE)
    store.update(stopped, stop_requested=True, stop_reason="the pilot script ended")
    task = store.new_task(active, ["sleep", "9"], 1)["id"]
    store.update_task(task, "RUNNING")
    assert recover(store, None) == []                                  # running, squeue unknown: nothing
    assert recover(store, {f"tether-{active}", f"tether-{stopped}"}) == []   # running, agents alive: nothing
    assert recover(store, None, ended=True) == [active, stopped, fresh]
    states = {pid: store.read(pid) for pid in (active, stopped, done, fresh)}
    assert [(r["state"], r["message"]) for r in states.values()] == [
        (CANCELED, ENDED), (CANCELED, "the pilot script ended"), (DONE, ""), (CANCELED, ENDED)]
    assert store.read_task(task)["state"] == "CANCELED"
    assert recover(store, None, ended=True) == []                      # settled once


def _squeue(monkeypatch, rc: int, out: str = "", err: str = ""):
    import subprocess

    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, rc, out, err)
    monkeypatch.setattr("tether.pilot.allocation.run_command", run)
    return calls


@pytest.mark.parametrize("rc, out, err, ended", [
    (0, "RUNNING\n", "", False), (0, "COMPLETING\n", "", False), (0, "PENDING\n", "", False),
    (0, "COMPLETED\n", "", True), (0, "CANCELLED\n", "", True), (0, "TIMEOUT\n", "", True),
    (0, "", "", True),                                                # not listed any more
    (1, "", "slurm_load_jobs error: Invalid job id specified\n", True),   # purged after MinJobAge
    (1, "", "slurm_load_jobs error: Unable to contact slurm controller\n", None)])
def test_a_slurm_allocation_has_ended_as_squeue_says(monkeypatch, rc, out, err, ended):
    from tether.pilot.allocation import SlurmAllocation

    calls = _squeue(monkeypatch, rc, out, err)
    assert SlurmAllocation("42").ended() is ended
    assert calls == [["squeue", "-h", "-t", "all", "-j", "42", "-o", "%T"]]


def test_from_outside_an_ended_allocation_its_records_are_settled(tmp_path, monkeypatch):
    from tether.pilot.state import ENDED

    monkeypatch.delenv("TETHER_PILOT_DIR", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    inside = Pilot(root=tmp_path / "pilot", job="7")                  # the allocation itself: never asks
    monkeypatch.setattr(inside.allocation, "ended", lambda: pytest.fail("asked inside the allocation"))
    monkeypatch.setattr(inside.allocation, "alive", lambda record: True)
    pid = new(inside.store)
    for state in (PENDING, STARTING, ACTIVE):
        inside.store.transition(pid, state, **({"launched": 1.0, "step_name": f"tether-{pid}"}
                                               if state == STARTING else {}))
    assert inside.recover() == [] and inside.store.read(pid)["state"] == ACTIVE
    monkeypatch.delenv("SLURM_JOB_ID")
    outside = Pilot(root=tmp_path / "pilot", job="7")
    assert not outside.inside
    monkeypatch.setattr(outside.allocation, "ended", lambda: None)    # squeue cannot tell: nothing
    monkeypatch.setattr(outside.allocation, "alive", lambda record: None)
    assert outside.recover() == [] and outside.store.read(pid)["state"] == ACTIVE
    monkeypatch.setattr(outside.allocation, "ended", lambda: True)
    assert outside.recover() == [pid]
    assert (outside.store.read(pid)["state"], outside.store.read(pid)["message"]) == (CANCELED, ENDED)


def test_the_pilot_directory_of_another_job_is_not_this_jobs(monkeypatch, tmp_path):
    from tether.pilot import pilot_dir

    env = {"SLURM_JOB_ID": "7", "TETHER_JOB_DIR": str(tmp_path / "job7")}
    assert pilot_dir(env) == tmp_path / "job7" / "pilot"
    assert pilot_dir(env, job="7") == tmp_path / "job7" / "pilot"
    assert str(pilot_dir(env, job="8")).endswith("/.tether/pilots/8")
    assert str(pilot_dir({}, job="8")).endswith("/.tether/pilots/8")
    assert pilot_dir({**env, "TETHER_PILOT_DIR": "/p"}, job="8") == Path("/p")
    assert str(pilot_dir({}, job="8.pbs-server")).endswith("/.tether/pilots/8.pbs-server")


def test_another_jobs_records_are_read_never_made(tmp_path, monkeypatch):
    """``tether partition list --job N`` for a job without pilot records says so; it creates nothing."""
    for var in ("TETHER_PILOT_DIR", "SLURM_JOB_ID", "PBS_JOBID", "TETHER_JOB_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(PilotError, match=r"job 8 has no pilot records in .*/\.tether/pilots/8"):
        Pilot(job="8")
    assert not (tmp_path / ".tether").exists()
    (tmp_path / ".tether" / "pilots" / "8").mkdir(parents=True)
    assert Pilot(job="8").partitions == []


@pytest.mark.parametrize("job", ["../7", "7/../../x", "/etc", "", ".", "..", "7.", "7..x", "7./x", "x7", "7 ", "7\n",
                                 "7.a/b", "7[1]/x", "-7", "7_", "7+", "1" * 21])
def test_a_job_id_given_by_hand_must_have_a_job_ids_form(job):
    """``--job`` names a directory below ~/.tether/pilots: nothing but a job id gets that far."""
    from tether.pilot import pilot_dir
    from tether.pilot.allocation import current

    with pytest.raises(PilotError, match="is not a job id"):
        pilot_dir({}, job=job)
    with pytest.raises(PilotError, match="is not a job id"):
        current({}, job=job)


def test_outside_any_job_the_id_tells_the_scheduler():
    from tether.pilot.allocation import PbsAllocation, SlurmAllocation, current

    for job in ("7", "7_3", "7+1"):
        assert type(current({}, job=job)) is SlurmAllocation
    for job in ("7.server", "7[].server", "7[3].pbs.example.org"):
        assert type(current({}, job=job)) is PbsAllocation
    assert type(current({"PBS_JOBID": "5.server"}, job="7")) is PbsAllocation      # qstat's default server
    assert type(current({"SLURM_JOB_ID": "5"}, job="7")) is SlurmAllocation
    assert current({"SLURM_JOB_ID": "5"}).job == "5" and type(current({"PBS_JOBID": "5.s"})) is PbsAllocation
    with pytest.raises(PilotError, match="not inside an allocation"):
        current({})


def test_the_pilot_script_stops_what_still_runs_when_it_ends_keeping_its_exit_status(tmp_path):
    """The generated batch script under sh, with a ``tether`` that records its calls."""
    import os
    import subprocess

    from tether.pilot.submit import SCRIPT_ENDED, pilot_job

    fake = tmp_path / "bin" / "tether"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "$*" >> "$CALLS"\n[ "$2" = create ] && exit "${CREATE_RC:-0}"\nexit 0\n')
    fake.chmod(0o755)
    calls = tmp_path / "calls"
    for body, create_rc, rc in (("echo ran\nexit 3", 0, 3), ("echo ran", 0, 0), ("echo ran", 1, 1)):
        script = pilot_job({"partitions": ["1 node"], "script": body}, 8)[1]
        script = "\n".join(line for line in script.splitlines() if not line.startswith("export PATH="))
        calls.write_text("")
        out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "PATH": f"{fake.parent}:/usr/bin:/bin", "CALLS": str(calls),
                                  "CREATE_RC": str(create_rc)})
        assert out.returncode == rc, out
        assert ("ran" in out.stdout) is (create_rc == 0)
        assert calls.read_text().splitlines() == [
            "partition create 1 node --wait", f"partition stop ALL --reason {SCRIPT_ENDED}"]


# ---- the pilot directory is the user's own (issue 39, finding 1) ----------------------------------
# The attack: another user makes the directory a victim names in TETHER_PILOT_DIR first (`mkdir -m777
# /tmp/p{,/partitions,/tasks}`) and writes a QUEUED task into it; the victim's agent ran it as the
# victim. The tests run as root (the victim here); the attacker is `nobody`.
NOBODY = 65534


def _plant(path: Path, mode: int = 0o777, owner: int = NOBODY) -> Path:
    """`mkdir -m777 p{,/partitions,/tasks}` as another user."""
    for d in (path, path / "partitions", path / "tasks"):
        d.mkdir()
        os.chmod(d, mode)
        os.chown(d, owner, owner)
    return path


def _write(path: Path, data, owner: int | None = None) -> None:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    if owner is not None:
        os.chown(path, owner, owner)


def _partition(pid: str = "part.0000", state: str = ACTIVE, **fields) -> dict:
    return {"id": pid, "description": {"nodes": 1, "config": "default"},
            "agent": {"command": None, "cores": 0, "gpus": 0, "config": "default"}, "slice": {"n1": [1, 0]},
            "state": state, "message": "", "history": [[NEW, 1.0, ""], [state, 2.0, ""]], "stop_requested": False,
            "launched": 2.0, "step_name": f"tether-{pid}", "batch": "slurm", **fields}


def _task(tid: str, command: list, partition: str = "part.0000", **fields) -> dict:
    return {"id": tid, "partition": partition, "command": command, "ntasks": 1, "state": "QUEUED",
            "exit_code": None, "nodes": [], "history": [["QUEUED", 1.0]], **fields}


def _one_round_of_the_agent(monkeypatch) -> list[str]:
    """The lead agent's loop for one round, each task it starts run here (not with srun) to its end;
    the ids of the tasks it started."""
    from tether.pilot import agent as agent_mod
    from tether.pilot.allocation import SlurmAllocation

    started, rounds = [], []
    real_start = agent_mod.Agent.start

    def start(self, task):
        started.append(task["id"])
        real_start(self, task)
        for proc in self.running.get(task["id"], []):
            proc.wait()
    monkeypatch.setattr(agent_mod.Agent, "start", start)
    monkeypatch.setattr(SlurmAllocation, "task_argvs", lambda self, pid, task, nodes, env: [list(task["command"])])
    monkeypatch.setattr(agent_mod, "_stopped", lambda store, pid: rounds.append(1) or len(rounds) > 1)
    monkeypatch.setattr(agent_mod, "POLL", 0)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    return started


def test_the_attack_a_planted_pilot_directory_is_refused(tmp_path):
    """The victim's `tether partition create` in the attacker's directory: refused, nothing written."""
    planted = _plant(tmp_path / "p")
    with pytest.raises(PilotError, match=rf"pilot directory {planted}: it belongs to uid {NOBODY} \(nobody\), "
                                         rf"not to you \(uid 0\).*TETHER_PILOT_DIR"):
        Pilot(root=planted, job="7")
    assert list(planted.rglob("*")) == [planted / "partitions", planted / "tasks"]


def test_the_attack_an_agent_in_a_planted_directory_runs_nothing(tmp_path, monkeypatch, capsys):
    """The attacker's QUEUED task beside the victim's partition: today the agent ran it as the victim."""
    from tether.pilot.agent import run_agent

    planted = _plant(tmp_path / "p")
    pwned = tmp_path / "pwned"
    _write(planted / "partitions" / "part.0000.json", _partition(state=STARTING))   # the victim's
    _write(planted / "tasks" / "task.000099.json", _task("task.000099", ["sh", "-c", f"id > {pwned}"]), NOBODY)
    started = _one_round_of_the_agent(monkeypatch)
    assert run_agent(str(planted), "part.0000", lead=True) == 1
    assert started == [] and not pwned.exists()
    assert f"tether: pilot directory {planted}: it belongs to uid {NOBODY} (nobody)" in capsys.readouterr().err


def test_an_agent_in_the_users_own_directory_runs_the_users_tasks(tmp_path, monkeypatch):
    """The same round in a directory of the user's own: the user's task runs (the check takes nothing
    away)."""
    from tether.pilot.agent import run_agent

    store = PilotStore(tmp_path / "mine").create()
    ran = tmp_path / "ran"
    _write(store.parts / "part.0000.json", _partition(state=STARTING))
    store.new_task("part.0000", ["sh", "-c", f"echo ok > {ran}"], 1)
    started = _one_round_of_the_agent(monkeypatch)
    assert run_agent(str(store.root), "part.0000", lead=True) == 0
    assert started == ["task.000000"] and ran.read_text() == "ok\n"
    assert store.read_task("task.000000")["state"] == "DONE" and store.read("part.0000")["state"] == CANCELED


def _symlink_to_own(path: Path) -> None:
    (path.parent / "elsewhere").mkdir(mode=0o700)
    path.symlink_to(path.parent / "elsewhere")


@pytest.mark.parametrize("case, make, problem", [
    ("another user's, private", lambda p: _plant(p, 0o700), rf"it belongs to uid {NOBODY} \(nobody\)"),
    ("another user's, open", lambda p: _plant(p), rf"it belongs to uid {NOBODY} \(nobody\)"),
    ("yours, world-writable", lambda p: _plant(p, 0o777, 0), r"others can write to it \(mode 0777\)"),
    ("yours, group-writable", lambda p: _plant(p, 0o770, 0), r"others can write to it \(mode 0770\)"),
    ("yours, sticky and open", lambda p: _plant(p, 0o1777, 0), r"others can write to it \(mode 1777\)"),
    ("a symlink", _symlink_to_own, r"it is a symlink"),
    ("a file", lambda p: p.write_text(""), r"it is not a directory"),
])
def test_a_pilot_directory_that_is_not_the_users_own_is_refused(tmp_path, case, make, problem):
    path = tmp_path / "pilot"
    make(path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(StateError, match=rf"^pilot directory {path}: {problem}[^:]*: tether keeps a pilot's records "
                                         r"only in a directory of your own that nobody else can write"):
        PilotStore(path).create()
    with pytest.raises(StateError, match=problem):
        PilotStore(path).open()
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before          # nothing made, nothing changed


@pytest.mark.parametrize("sub", ["partitions", "tasks"])
@pytest.mark.parametrize("make, problem", [
    (lambda p: (p.mkdir(mode=0o700), os.chown(p, NOBODY, NOBODY)), rf"it belongs to uid {NOBODY}"),
    (lambda p: (p.mkdir(), os.chmod(p, 0o777)), r"others can write to it \(mode 0777\)"),
    (_symlink_to_own, r"it is a symlink"),
])
def test_its_partitions_and_tasks_directories_too(tmp_path, sub, make, problem):
    root = tmp_path / "pilot"
    root.mkdir(mode=0o700)
    make(root / sub)
    with pytest.raises(StateError, match=rf"pilot directory {root / sub}: {problem}"):
        PilotStore(root).create()


@pytest.mark.parametrize("make, problem", [
    (lambda p: (p.write_text(""), os.chown(p, NOBODY, NOBODY)), rf"it belongs to uid {NOBODY}"),
    (lambda p: (p.write_text(""), os.chmod(p, 0o666)), r"others can write to it \(mode 0666\)"),
    (lambda p: p.symlink_to(p.parent / "elsewhere"), r"it is a symlink"),
    (lambda p: os.mkfifo(p), r"it is not a regular file"),
])
def test_the_lock_file_must_be_the_users_own_regular_file(tmp_path, make, problem):
    store = PilotStore(tmp_path / "pilot").create()
    (store.root / "lock").unlink()
    make(store.root / "lock")
    with pytest.raises(StateError, match=rf"pilot lock {store.root / 'lock'}: {problem}"):
        with store.lock():
            pass
    with pytest.raises(StateError, match="pilot lock"):
        PilotStore(store.root).create()
    assert not (tmp_path / "elsewhere").exists()                # a symlink is never followed


@pytest.mark.parametrize("case, make, accepted", [
    ("below an open directory", lambda p: (p.mkdir(), os.chmod(p, 0o777)), False),
    ("below another user's directory", lambda p: (p.mkdir(mode=0o755), os.chown(p, NOBODY, NOBODY)), False),
    ("below a group-writable directory", lambda p: (p.mkdir(), os.chmod(p, 0o775)), False),
    ("below a sticky directory such as /tmp", lambda p: (p.mkdir(), os.chmod(p, 0o1777)), True),
    ("below a directory of the user's own", lambda p: p.mkdir(mode=0o755), True),
])
def test_every_parent_of_the_pilot_directory_is_checked(tmp_path, case, make, accepted):
    """As OpenSSH's StrictModes: whoever can rename entries in a parent can swap the pilot directory
    for one of their own between two commands."""
    make(tmp_path / "shared")
    path = tmp_path / "shared" / "a" / "pilot"
    if accepted:
        store = PilotStore(path).create()
        assert store.root == path
        for d in (path, path / "partitions", path / "tasks"):       # made private, whatever the umask
            assert (os.stat(d).st_mode & 0o777, os.stat(d).st_uid) == (0o700, 0)
        return
    with pytest.raises(StateError, match=rf"^pilot directory {path}: its parent {tmp_path / 'shared'} "
                                         r"(belongs to uid 65534|can be written by others)"):
        PilotStore(path).create()
    assert not (tmp_path / "shared" / "a").exists()


def test_a_parent_reached_through_a_symlink_is_checked_where_it_leads(tmp_path):
    """A symlink above the pilot directory (a site's /home -> /export/home) is followed, and what it
    leads to is checked; the store then uses the real path."""
    (tmp_path / "real").mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    store = PilotStore(tmp_path / "link" / "pilot").create()
    assert store.root == tmp_path / "real" / "pilot"
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    (tmp_path / "link2").symlink_to(tmp_path / "open")
    with pytest.raises(StateError, match=rf"its parent {tmp_path / 'open'} can be written by others"):
        PilotStore(tmp_path / "link2" / "pilot").create()


def _unblock(fifo: Path) -> None:
    """Let a reader that hangs in open() on ``fifo`` go (only when it hangs: a failure)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


@pytest.mark.parametrize("case", ["another user's", "a symlink", "a FIFO", "malformed"])
def test_the_agent_runs_only_task_records_it_can_trust(tmp_path, monkeypatch, case):
    """In the user's own directory (so only root could plant these): a task record that is another
    user's file, a symlink, a FIFO (which must not hang the agent) or not a task record is not run."""
    from tether.pilot.agent import run_agent

    store = PilotStore(tmp_path / "mine").create()
    _write(store.parts / "part.0000.json", _partition(state=STARTING))
    pwned = tmp_path / "pwned"
    bad = store.tasks / "task.000000.json"
    planted = _task("task.000000", ["sh", "-c", f"id > {pwned}"])
    if case == "another user's":
        _write(bad, planted, NOBODY)
    elif case == "a symlink":
        _write(tmp_path / "elsewhere.json", planted)
        bad.symlink_to(tmp_path / "elsewhere.json")
    elif case == "a FIFO":
        os.mkfifo(bad)
    else:
        _write(bad, {**planted, "command": f"id > {pwned}"})         # a string, not an argv
    store.new_task("part.0000", ["true"], 1)                           # the user's own: task.000001
    started = _one_round_of_the_agent(monkeypatch)
    hung = []
    watchdog = threading.Timer(60, lambda: (hung.append(1), _unblock(bad)))   # only a hang waits for it
    watchdog.start()
    try:
        rc = run_agent(str(store.root), "part.0000", lead=True)
    finally:
        watchdog.cancel()
    assert not hung, "the agent hung on the task record"
    assert rc == 0 and started == ["task.000001"] and not pwned.exists()
    with pytest.raises(StateError, match=rf"task record {bad}: "):
        store.read_task("task.000000")


# ---- malformed records: a message, never a traceback (issue 39, finding 11) -------------------------
MALFORMED = [
    "", "{", "[]", "null", "7", '"part.0000"', "\xff\xfe", "{}",
    json.dumps({**_partition(), "state": "RUNNING"}),
    json.dumps({**_partition(), "state": None}),
    json.dumps({k: v for k, v in _partition().items() if k != "state"}),
    json.dumps({k: v for k, v in _partition().items() if k != "history"}),
    json.dumps({k: v for k, v in _partition().items() if k != "slice"}),
    json.dumps({**_partition(), "slice": {"n1": 4}}),
    json.dumps({**_partition(), "slice": {"n1": ["a", 0]}}),
    json.dumps({**_partition(), "slice": []}),
    json.dumps({**_partition(), "history": [[]]}),
    json.dumps({**_partition(), "history": {}}),
    json.dumps({**_partition(), "agent": None}),
    json.dumps({**_partition(), "agent": {"command": "x"}}),
    json.dumps({**_partition(), "description": "1 node"}),
    json.dumps({**_partition(), "id": "part.0001"}),
    json.dumps({**_partition(), "launched": "soon"}),
    json.dumps({**_partition(), "message": ["x"]}),
    json.dumps({**_partition(), "fan_out": {"pid": "x"}}),
    json.dumps({**_partition(), "batch": "pbs", "fan_out": {"host": 1}}),
]
COMMANDS = [["stop", "part.0000"], ["stop", "ALL"], ["list"], ["wait", "part.0000", "--timeout", "0"],
            ["wait", "ALL", "--timeout", "0"], ["run", "part.0000", "--no-wait", "--", "true"],
            ["reconfig", "--stop", "part.0000"]]


@pytest.fixture(scope="module")
def cli_parser():
    """The `tether` command's parser, built once: parsing keeps no state in it, and building it
    (every command group's options) costs more than most commands run here."""
    from tether.cli.main import build_parser

    return build_parser()


@pytest.fixture
def cli_pilot(tmp_path, monkeypatch, cli_parser):
    """`tether partition …` inside allocation 7, its squeue and scancel left out."""
    from tether.pilot.allocation import SlurmAllocation

    root = tmp_path / "pilot"

    def agent_ends(pid: str) -> None:                  # what the agent records on the stop's SIGTERM
        try:
            store.transition(pid, CANCELED, "stopped")
        except (StateError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            pass                                        # today's store on a malformed record
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("TETHER_PILOT_DIR", str(root))
    monkeypatch.setattr(SlurmAllocation, "steps", lambda self: [])
    monkeypatch.setattr(SlurmAllocation, "nodes", lambda self: list(THREE))
    monkeypatch.setattr(SlurmAllocation, "ask_stop", lambda self, record: agent_ends(record["id"]))
    monkeypatch.setattr("tether.pilot.state.time.sleep", lambda s: None)
    monkeypatch.setattr("tether.pilot.time.sleep", lambda s: None)
    monkeypatch.setattr("tether.cli.main.build_parser", lambda: cli_parser)
    store = PilotStore(root).create()
    return store


def _partition_cli(*argv: str) -> int:
    from tether.cli.main import main

    return main(["partition", *argv])


def _clear(capsys, rc: int) -> None:
    """The command ended with 0 or 1 and every line it wrote to stderr is a message of tether's."""
    err = capsys.readouterr().err
    assert rc in (0, 1), err
    assert all(line.startswith("tether: ") for line in err.splitlines()), err
    assert "Traceback" not in err


@pytest.mark.parametrize("content", MALFORMED)
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_malformed_partition_record_gets_a_message_not_a_traceback(cli_pilot, capsys, content, command):
    path = cli_pilot.parts / "part.0000.json"
    path.write_bytes(b"\xff\xfe" if content == "\xff\xfe" else content.encode())     # not UTF-8, or the text
    rc = _partition_cli(*command)
    _clear(capsys, rc)
    if "part.0000" in command and command[0] != "reconfig":
        assert rc == 1


def test_stop_on_a_malformed_record_names_it(cli_pilot, capsys):
    path = cli_pilot.parts / "part.0000.json"
    path.write_text(json.dumps({k: v for k, v in _partition().items() if k != "state"}))
    assert _partition_cli("stop", "part.0000") == 1
    assert capsys.readouterr().err == (f"tether: partition record {path}: state: missing (a pilot record is "
                                       f"tether's own: remove it, or the pilot directory, if it is not)\n")


@pytest.mark.parametrize("pid", ["../tasks/task.000000", "part.1/../part.0000", "part.x", "", "ALL/..", "/etc/passwd"])
def test_a_partition_id_must_have_a_partition_ids_form(cli_pilot, capsys, pid):
    assert _partition_cli("stop", pid) == 1
    assert capsys.readouterr().err.startswith(f"tether: {pid!r} is not a partition id (part.NNNN)")


@pytest.mark.parametrize("content", MALFORMED[:8] + [
    json.dumps(_task("task.000000", "true")), json.dumps(_task("task.000000", [])),
    json.dumps(_task("task.000000", [1])), json.dumps(_task("task.000000", ["true"], ntasks="2")),
    json.dumps(_task("task.000000", ["true"], state="GONE")), json.dumps(_task("task.000000", ["true"], partition=3)),
    json.dumps(_task("task.000000", ["true"], history=None)), json.dumps(_task("task.000001", ["true"]))])
def test_a_malformed_task_record_gets_a_message_not_a_traceback(cli_pilot, capsys, content):
    _write(cli_pilot.parts / "part.0000.json", _partition())
    _write(cli_pilot.tasks / "task.000000.json", content)
    for command in COMMANDS:
        rc = _partition_cli(*command)
        _clear(capsys, rc)
        _write(cli_pilot.parts / "part.0000.json", _partition())     # stop ended it: active again


@pytest.mark.parametrize("name", ["part.x.json", "part..json", "part.0000.extra.json", "part.-1.json"])
def test_stray_names_in_the_records_directory_do_not_break_new_ids(cli_pilot, capsys, name):
    (cli_pilot.parts / name).write_text("{}")
    (cli_pilot.tasks / name.replace("part", "task")).write_text("{}")
    with cli_pilot.lock():
        pid = cli_pilot.new_partition({"nodes": 1, "config": "default"}, {"command": None, "cores": 0, "gpus": 0})["id"]
    assert pid == "part.0000"
    assert cli_pilot.new_task(pid, ["true"], 1)["id"] == "task.000000"
    assert _partition_cli("list") == 0


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=3), max_leaves=8)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["partition", "task"]), key=st.sampled_from(sorted({*_partition(), *_task("t", [])})),
       value=json_values | st.just(KeyError), command=st.sampled_from(COMMANDS))
def test_fuzzed_records_get_a_message_not_a_traceback(cli_pilot, capsys, kind, key, value, command):
    """One field of a partition or task record replaced by any JSON value (or removed), then each
    `tether partition` command: it works or says what is wrong, never a traceback."""
    part, task = _partition(), _task("task.000000", ["true"])
    record = part if kind == "partition" else task
    if value is KeyError:
        record.pop(key, None)
    else:
        record[key] = value
    _write(cli_pilot.parts / "part.0000.json", part)
    _write(cli_pilot.tasks / "task.000000.json", task)
    _clear(capsys, _partition_cli(*command))


def test_list_names_a_record_it_cannot_read(cli_pilot, capsys):
    _write(cli_pilot.parts / "part.0000.json", _partition())
    _write(cli_pilot.parts / "part.0001.json", {**_partition("part.0001"), "slice": []})
    assert _partition_cli("list") == 0
    out, err = capsys.readouterr()
    assert out.startswith("part.0000") and "part.0001" not in out
    assert err == (f"tether: warning: partition record {cli_pilot.parts / 'part.0001.json'}: slice: not a mapping of "
                   f"node to [cores, gpus] (a pilot record is tether's own: remove it, or the pilot directory, if it "
                   f"is not)\n")
