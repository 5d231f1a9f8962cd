"""Pilot partitions inside a PBS job (issue 19): the requirements' example through ``tether partition`` with
the fake OpenPBS -- a job started as the scheduler would (exec_vnode, nodefile), agents and task
ranks as TM tasks through a strict pbs_tmrsh (the job's environment, not the caller's; no signal
passed on), stops through the records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tether.pilot.allocation import PbsAllocation, parse_exec_vnode
from tether.pilot.resources import Node
from tether.testing.pbs import FakePbs


def test_exec_vnode_is_summed_per_host():
    assert parse_exec_vnode("(n1:ncpus=4:ngpus=1)+(n2[0]:ncpus=2+n2[1]:ncpus=2:ngpus=2)+(n1:ncpus=1)") == [
        Node("n1", 5, 1), Node("n2", 4, 2)]
    assert parse_exec_vnode("") == []


@pytest.fixture
def job(tmp_path):
    """A running 3-node PBS job (select=3:ncpus=4) and the environment its batch script has."""
    pbs = FakePbs(tmp_path / "pbs")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#PBS -l select=3:ncpus=4\n#PBS -l place=scatter\nsleep 1\n")
    job_id = pbs.qsub(str(script), cwd=tmp_path)
    env = pbs.run_job(job_id)
    pilot = tmp_path / "pilot"
    env.update(TETHER_PILOT_DIR=str(pilot), PYTHONDONTWRITEBYTECODE="1")
    yield pbs, job_id, env, pilot
    # whatever a failing test left: the agents end on their own once the records say stop
    for path in (pilot / "partitions").glob("part.*.json"):
        record = json.loads(path.read_text())
        record["stop_requested"] = True
        path.write_text(json.dumps(record))


def tether(env, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tether.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def agents(pilot) -> list[str]:
    """The pilot's processes still running on this host: agents and rank wrappers (the pilot
    directory on their command line) and the tasks' own (TETHER_PILOT_DIR in their environment)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read().split(b"\0")
        except OSError:
            continue
        if ("tether.pilot.agent" in cmdline and str(pilot) in cmdline) or \
                f"TETHER_PILOT_DIR={pilot}".encode() in environ:
            found.append(f"{entry} {cmdline}")
    return found


def test_the_requirements_example_inside_a_pbs_job(job):
    pbs, job_id, env, pilot = job
    assert PbsAllocation(job_id).kind == "pbs"
    created = tether(env, "partition", "create", "1 node", "50%", "FILL", "--wait", "--json")
    assert created.returncode == 0, created.stderr
    parts = json.loads(created.stdout)
    assert [p["state"] for p in parts] == ["ACTIVE"] * 3, parts
    assert [list(p["slice"]) for p in parts] == [["n1"], ["n2"], ["n3"]]
    assert [p["agent_node"] for p in parts] == ["n1", "n2", "n3"]
    assert all(p["slice"][n] == [4, 0] for p in parts for n in p["slice"]), parts      # exec_vnode's ncpus
    # a task in each partition runs where its partition is, as a TM task of the job: the job's
    # environment (PBS_NODENUM of its host), not the exports of the script that asked for it
    env_with_export = {**env, "EXPORTED_IN_SCRIPT": "1"}
    for part, node, nodenum in zip(parts, ("n1", "n2", "n3"), "012"):
        ran = tether(env_with_export, "partition", "run", part["id"], "--", "sh", "-c",
                     "echo node=$TETHER_TASK_NODE nodenum=$PBS_NODENUM part=$TETHER_PARTITION_ID "
                     "exported=${EXPORTED_IN_SCRIPT:-no}")
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip() == f"node={node} nodenum={nodenum} part={part['id']} exported=no", ran.stdout
        assert f"ran in partition {part['id']} on {node}: DONE" in ran.stderr
    # a failing task's exit status comes back
    failed = tether(env, "partition", "run", parts[0]["id"], "--", "sh", "-c", "exit 3")
    assert failed.returncode == 3 and "FAILED" in failed.stderr
    # the requirements' over-use: stop ALL, start four 1-node partitions where three fit
    again = tether(env, "partition", "reconfig", "--stop", "ALL", *["--start=1 node"] * 4, "--wait", "--json")
    assert again.returncode == 1, again.stderr
    states = [p["state"] for p in json.loads(again.stdout)]
    assert states == ["ACTIVE", "ACTIVE", "ACTIVE", "FAILED"], again.stdout
    assert "over-used" in json.loads(again.stdout)[3]["message"]
    listed = json.loads(tether(env, "partition", "list", "--json").stdout)
    assert [p["state"] for p in listed][:3] == ["CANCELED"] * 3          # the history stays
    # a long task is ended by a stop of its partition (the rank reads the record: no signal
    # reaches a TM task from here), and nothing of the pilot is left running
    third = json.loads(again.stdout)[2]["id"]
    sleeper = tether(env, "partition", "run", third, "--no-wait", "--", "sleep", "300")
    task = sleeper.stdout.strip()
    deadline = time.monotonic() + 30
    while json.loads((pilot / "tasks" / f"{task}.json").read_text())["state"] != "RUNNING":
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.2)
    started = time.monotonic()
    stopped = tether(env, "partition", "stop", "ALL")
    assert stopped.returncode == 0, stopped.stderr
    assert time.monotonic() - started < 20
    assert json.loads((pilot / "tasks" / f"{task}.json").read_text())["state"] == "CANCELED"
    deadline = time.monotonic() + 15
    while agents(pilot) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert agents(pilot) == []


def launch_hook(pbs: FakePbs, tmp_path, condition: str) -> None:
    """A site execjob_launch hook on every MoM of the fake server that rejects a TM task when
    ``condition`` (on ``argv`` and ``node``, the MoM's) holds -- as a real MoM hook may."""
    hook = tmp_path / "site_launch.py"
    hook.write_text("import pbs\ne = pbs.event()\nargv = [str(a) for a in e.argv]\n"
                    "node = pbs.get_local_nodename()\n"
                    f"if {condition}:\n    e.reject('site: not here')\ne.accept()\n")
    server = json.loads((pbs.state_dir / "server.json").read_text())
    server["launch_hooks"] = [str(hook)]
    (pbs.state_dir / "server.json").write_text(json.dumps(server))


def test_an_agent_that_never_starts_on_its_node_fails_the_partition_with_the_reason(job, tmp_path):
    """Issue 40, 8 and the unseen failure: a MoM hook rejecting the agent's TM task on n3 makes
    pbs_tmrsh exit 0 without a word (recorded: tmrsh-task-rejected-by-launch-hook); the partition
    fails saying its agent there never started. The job's own PBS_NODEFILE plays no part: the
    hosts come from the job's placement (qstat)."""
    pbs, job_id, env, pilot = job
    with open(env["PBS_NODEFILE"], "w") as fh:             # what the job may do to it: no effect
        fh.write("n1\n")
    launch_hook(pbs, tmp_path, "'--node' in argv and node == 'n3'")
    created = tether(env, "partition", "create", "3 nodes", "--wait", "--json")
    part = json.loads(created.stdout)[0]
    assert part["state"] == "FAILED", part
    assert part["message"].startswith("its agent on n3 never started (pbs_tmrsh exit 0; a MoM's execjob_launch "
                                      "hook may have rejected the TM task"), part
    assert "site: not here" in (pbs.state_dir / "mom.log").read_text()
    deadline = time.monotonic() + 15
    while agents(pilot) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert agents(pilot) == []


def test_a_rank_whose_tm_task_never_ran_fails_its_task(job, tmp_path):
    """pbs_tmrsh's exit 0 for a rejected launch is not taken for the rank's success: each rank's
    wrapper leaves a marker, and a rank without one fails the task, saying which and why."""
    pbs, job_id, env, pilot = job
    created = tether(env, "partition", "create", "2 nodes", "--wait", "--json")
    part = json.loads(created.stdout)[0]
    assert part["state"] == "ACTIVE", part
    ran = tether(env, "partition", "run", part["id"], "-n", "2", "--", "sh", "-c", "echo rank $TETHER_TASK_RANK")
    assert ran.returncode == 0 and sorted(ran.stdout.split("\n")[:2]) == ["rank 0", "rank 1"], ran
    launch_hook(pbs, tmp_path, "'--rank' in argv and argv[-2] == '1'")
    ran = tether(env, "partition", "run", part["id"], "-n", "2", "--", "sh", "-c", "echo rank $TETHER_TASK_RANK")
    assert ran.returncode == 1 and ran.stdout == "rank 0\n", ran
    assert ran.stderr.rstrip().endswith(
        "FAILED (rank 1 on n2 (pbs_tmrsh exit 0) never ran: its TM task did not start (a MoM's execjob_launch "
        "hook may have rejected it: see that MoM's log))"), ran.stderr
    assert tether(env, "partition", "stop", "ALL").returncode == 0


def test_outside_a_running_job_pbs_tmrsh_and_the_pilot_refuse(tmp_path):
    pbs = FakePbs(tmp_path / "pbs")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#PBS -l select=1:ncpus=2\ntrue\n")
    job_id = pbs.qsub(str(script), cwd=tmp_path)
    nodefile = tmp_path / "nodes"
    nodefile.write_text("n1\n")
    env = {"PATH": f"{pbs.bin_dir}:/usr/bin:/bin", "PBS_JOBID": job_id, "PBS_ENVIRONMENT": "PBS_BATCH",
           "PBS_NODEFILE": str(nodefile), "TETHER_PILOT_DIR": str(tmp_path / "pilot"), "HOME": str(tmp_path)}
    result = subprocess.run(["pbs_tmrsh", "n1", "true"], env=env, capture_output=True, text=True)
    assert result.returncode == 255 and "tm_init" in result.stderr           # the job is not running
    listed = tether(env, "partition", "create", "1 node")
    assert listed.returncode == 1 and f"job {job_id} has no exec_vnode" in listed.stderr, listed.stderr


def test_the_fake_pbs_tmrsh_parses_as_openpbs_does(job):
    """src/cmds/pbs_tmrsh.c: -n is a no-op, -l must name the caller, anything else is the usage
    (exit 255); options may follow the host too; the task's status comes back."""
    pbs, job_id, env, pilot = job
    me = __import__("getpass").getuser()
    cases = [(["-n", "n2", "-l", me, "sh", "-c", "exit 7"], 7, ""),
             ([f"-l{me}", "n1", "true"], 0, ""),
             (["-l", "nobody-else", "n1", "true"], 255, 'bad user "nobody-else"'),
             (["-x", "n1", "true"], 255, "usage: pbs_tmrsh"),
             (["n1"], 255, "usage: pbs_tmrsh"),
             (["n9", "true"], 255, f'host "n9" is not a node in job <{job_id}>')]
    for args, code, message in cases:
        result = subprocess.run(["pbs_tmrsh", *args], env=env, capture_output=True, text=True)
        assert result.returncode == code and message in result.stderr, (args, result.returncode, result.stderr)
    result = subprocess.run(["pbs_tmrsh", "n1", "true"], env={k: v for k, v in env.items() if k != "PBS_JOBID"},
                            capture_output=True, text=True)
    assert result.returncode == 255 and "PBS jobid not in environment" in result.stderr


def test_a_pbs_allocation_has_ended_once_qstat_x_says_finished(job, monkeypatch):
    pbs, job_id, env, _ = job
    monkeypatch.setenv("PATH", env["PATH"])
    assert PbsAllocation(job_id).ended() is False
    assert pbs.run("qdel", job_id).returncode == 0
    assert PbsAllocation(job_id).ended() is True                     # F, shown with -x
    assert PbsAllocation(f"999.{job_id.split('.', 1)[1]}").ended() is True   # unknown to the server


def test_a_pilot_job_submitted_with_qsub_runs_its_partitions_and_stops_them_when_its_script_ends(tmp_path,
                                                                                                  monkeypatch):
    """``tether pilot submit --scheduler pbs``: qsub with whole hosts (one chunk of all of a
    host's cores per node, ``place=scatter:excl``), the walltime, the user's qsub arguments; the
    job's script, run as the MoM would, creates the partitions, runs the user's script and at its
    end stops what still runs."""
    from tether.pilot.submit import SCRIPT_ENDED

    pbs = FakePbs(tmp_path / "pbs")
    monkeypatch.setenv("PATH", f"{pbs.bin_dir}:{os.environ['PATH']}")
    listing = tmp_path / "listing.json"
    spec = tmp_path / "pilot.yaml"
    spec.write_text(json.dumps({
        "partitions": ["1 node", "1 node"], "time": 90, "qsub_args": ["-A", "proj"],
        "script": f"tether partition run part.0000 -- sh -c 'echo on $TETHER_TASK_NODE'\n"
                  f"tether partition list --json > {listing}\nexit 3\n"}))
    submitted = subprocess.run([sys.executable, "-m", "tether.cli.main", "pilot", "submit", "--scheduler", "pbs",
                                str(spec)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    record = pbs.job(job_id)
    assert record["Job_Name"] == "tether-pilot" and record["Resource_List"]["select"] == "2:ncpus=2"
    assert record["Resource_List"]["place"] == "scatter:excl" and record["Resource_List"]["walltime"] == "01:30:00"
    env = pbs.run_job(job_id)
    env.update(TETHER_PILOT_DIR=str(tmp_path / "pilot"), PYTHONDONTWRITEBYTECODE="1")
    ran = subprocess.run(["sh", "-c", record["script"]], env=env, capture_output=True, text=True, timeout=180,
                         cwd="/")
    assert ran.returncode == 3, ran.stderr                                # the script's own exit status
    lines = ran.stdout.splitlines()                                       # the create's table, then the task's
    assert [line.split()[:2] for line in lines[:2]] == [["part.0000", "ACTIVE"], ["part.0001", "ACTIVE"]], lines
    assert lines[2:] == ["on n1"], lines
    during = {p["id"]: p["state"] for p in json.loads(listing.read_text())}
    assert during == {"part.0000": "ACTIVE", "part.0001": "ACTIVE"}
    after = [json.loads((tmp_path / "pilot" / "partitions" / f"part.000{i}.json").read_text()) for i in (0, 1)]
    assert [(p["state"], p["message"]) for p in after] == [("CANCELED", SCRIPT_ENDED)] * 2
    deadline = time.monotonic() + 15
    while agents(tmp_path / "pilot") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert agents(tmp_path / "pilot") == []
    with pytest.raises(Exception, match="sbatch_args: not for pbs"):
        from tether.pilot.submit import pilot_job
        pilot_job({"partitions": ["1 node"], "sbatch_args": ["-A", "x"]}, 2, "pbs")


def test_pbs_tmrsh_is_found_from_the_pbs_config_where_a_tm_task_s_path_has_none(tmp_path):
    """A TM task's PATH is /bin:/usr/bin (recorded): pbs_tmrsh comes from PBS_EXEC of the PBS
    config (PBS_CONF_FILE, else /etc/pbs.conf), else the caller's PATH; none: a PilotError."""
    from tether.pilot.allocation import PilotError, pbs_client

    tool = tmp_path / "opt" / "pbs" / "bin" / "pbs_tmrsh"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    conf = tmp_path / "pbs.conf"
    conf.write_text(f"PBS_SERVER=vm\nPBS_EXEC={tmp_path / 'opt' / 'pbs'}\nPBS_HOME=/var/spool/pbs\n")
    assert pbs_client("pbs_tmrsh", {"PBS_CONF_FILE": str(conf), "PATH": "/bin:/usr/bin"}) == str(tool)
    assert pbs_client("pbs_tmrsh", {"PBS_CONF_FILE": str(tmp_path / "none"), "PATH": str(tool.parent)}) == str(tool)
    with pytest.raises(PilotError, match="cannot find pbs_tmrsh"):
        pbs_client("pbs_tmrsh", {"PBS_CONF_FILE": str(tmp_path / "none"), "PATH": "/bin:/usr/bin"})


def test_the_node_file_is_the_jobs_placement_as_the_mom_writes_it():
    """From qstat's exec_host and the select's mpiprocs (hook-two-chunks-one-host: `vm vm`)."""
    from tether.pilot.allocation import nodefile_lines

    assert nodefile_lines({"exec_host": "vm/0", "Resource_List": {"select": "1:ncpus=1"}}) == ["vm"]
    assert nodefile_lines({"exec_host": "vm/0+vm/1", "schedselect": "2:ncpus=1:mpiprocs=1"}) == ["vm", "vm"]
    assert nodefile_lines({"exec_host": "n1/0*4+n2/0*4", "Resource_List": {"select": "2:ncpus=4:mpiprocs=2"}}) == \
        ["n1", "n1", "n2", "n2"]
