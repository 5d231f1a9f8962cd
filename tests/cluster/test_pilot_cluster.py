"""Pilot partitions (issue 19, docs/requirements.md) inside one real 3-node allocation, as the job's
user, submitted with ``tether pilot submit``: 1 node + 50% + FILL ACTIVE on disjoint nodes, a task
in each reports where it ran; the over-use (the fourth of four one-node partitions FAILED, naming
what is over-used) and under-use (a warning); stopping a partition cancels its agent step and its
running task; the history of partitions stays listable; nothing of the agents is left after the
allocation."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import time

import pytest
from helpers import user_processes, wait_until

from tether.pilot.state import ENDED, TERMINATED
from tether.pilot.submit import SCRIPT_ENDED

pytestmark = pytest.mark.cluster


def test_partitions_of_one_allocation(cluster):
    work = cluster.box.work_dir
    out, listing = work / f"pilot-{os.getpid()}.out", work / f"pilot-{os.getpid()}.json"
    pilot_dir = work / f"pilot-{os.getpid()}"
    t = cluster.box.tether[0]
    # the pilot job as tether pilot submit makes it: its initial partitions, then this script
    script = f"""export TETHER_PILOT_DIR={pilot_dir}
{t} partition list > /dev/null
for p in part.0000 part.0001 part.0002; do
  {t} partition run $p -- sh -c 'echo RAN partition=$TETHER_PARTITION_ID node=$SLURMD_NODENAME task=$TETHER_TASK_ID'
done
{t} partition reconfig --stop ALL --start "1 node" --start "1 node" --start "1 node" --start "1 node" --wait
echo "OVERUSE exit=$?"
{t} partition reconfig --stop ALL --start "1 node" --start "1 node" --wait 2>&1
echo "UNDERUSE exit=$?"
task=$({t} partition run part.0007 --no-wait -- sleep 300)
sleep 3
{t} partition stop part.0007
echo "STOPPED $task"
squeue -h -s -j $SLURM_JOB_ID -o "STEP %j"
{t} partition list --json > {listing}
"""
    spec = work / f"pilot-{os.getpid()}.yaml"
    spec.write_text(json.dumps({"partitions": ["1 node", "50%", "FILL"], "nodes": 3, "time": 10,
                                "sbatch_args": [f"--output={out}", f"--export=ALL,TETHER_PILOT_DIR={pilot_dir}"],
                                "script": script}))
    job = cluster.as_user([t, "pilot", "submit", str(spec)]).stdout.strip()
    assert job.isdigit(), job
    assert wait_until(lambda: not cluster.run(["squeue", "-h", "-j", job], check=False).stdout.strip(), timeout=400)
    assert cluster.job_fields(job).get("JobName") == "tether-pilot"
    spec.unlink()
    text = out.read_text()
    records = {r["id"]: r for r in json.loads(listing.read_text())}
    out.unlink()
    listing.unlink()
    ran = [dict(w.split("=", 1) for w in line.split()[1:]) for line in text.splitlines() if line.startswith("RAN ")]
    # each partition's task ran on that partition's own node; the three nodes are disjoint
    assert [(r["partition"], r["node"]) for r in ran] == [(f"part.000{i}", node) for i, node in enumerate(cluster.nodes)], text
    assert [list(records[f"part.000{i}"]["slice"]) for i in range(3)] == [[node] for node in cluster.nodes]
    assert all(records[f"part.000{i}"]["state"] == "CANCELED" for i in range(3))      # stopped by reconfig
    assert [h[0] for h in records["part.0000"]["history"]] == ["NEW", "PENDING", "STARTING", "ACTIVE", "CANCELED"]
    # over-use: three fit, the fourth FAILED and says what is over-used; the command exits 1
    assert [records[f"part.000{i}"]["state"] for i in range(3, 7)][-1] == "FAILED", text
    assert "over-used -- 0 of 3 nodes free" in records["part.0006"]["message"]
    assert "OVERUSE exit=1" in text
    # under-use: a warning, exit 0
    assert "tether: warning: under-used: 1 of 3 nodes free" in text and "UNDERUSE exit=0" in text
    # stop: the agent step and its task's step are gone at once, the task CANCELED
    steps = [line.split()[1] for line in text.splitlines() if line.startswith("STEP ")]
    assert "tether-part.0007" not in steps and not any(s.startswith("tether-part.0007-") for s in steps), steps
    assert "tether-part.0008" in steps, steps                  # the other one still runs
    assert records["part.0007"]["state"] == "CANCELED" and records["part.0007"]["message"] == "stopped"
    task = next(line.split()[1] for line in text.splitlines() if line.startswith("STOPPED "))
    assert json.loads((pilot_dir / "tasks" / f"{task}.json").read_text())["state"] == "CANCELED"
    assert len(records) == 9                                  # the whole history
    # after the allocation: no agent process, no step left running; the last partition was ended
    assert wait_until(lambda: not user_processes(cluster, "tether.pilot.agent"), timeout=30), \
        user_processes(cluster, "tether.pilot.agent")
    # the pilot's script ended while part.0008 ran: the batch script's trap stopped it before the
    # allocation ended (Slurm could have killed its agent before it recorded anything)
    last = json.loads((pilot_dir / "partitions" / "part.0008.json").read_text())
    assert (last["state"], last["message"]) == ("CANCELED", SCRIPT_ENDED), last
    # the history, from outside the allocation
    listed = json.loads(cluster.as_user(["env", f"TETHER_PILOT_DIR={pilot_dir}", t, "partition", "list", "--job", job,
                                         "--json"]).stdout)
    assert [(r["id"], r["state"]) for r in listed] == [(r, records[r]["state"]) for r in sorted(records)
                                                       if r != "part.0008"] + [("part.0008", "CANCELED")]
    assert cluster.in_service(), cluster.node_states()
    shutil.rmtree(pilot_dir)


def test_a_pilot_cancelled_whole_leaves_every_partition_and_task_ended(cluster):
    """scancel of the pilot job while its partitions and a task run: Slurm ends the agents (one may
    be killed before it records anything); from outside, once the job has ended, every partition
    reads CANCELED and the task too."""
    work = cluster.box.work_dir
    pilot_dir = work / f"pilot-cancel-{os.getpid()}"
    t = cluster.box.tether[0]
    spec = work / f"pilot-cancel-{os.getpid()}.yaml"
    spec.write_text(json.dumps({"partitions": ["1 node", "1 node"], "nodes": 2, "time": 10,
                                "sbatch_args": ["--output=/dev/null", f"--export=ALL,TETHER_PILOT_DIR={pilot_dir}"],
                                "script": f"{t} partition run part.0001 --no-wait -- sleep 300\nsleep 300\n"}))
    job = cluster.as_user([t, "pilot", "submit", str(spec)]).stdout.strip()
    spec.unlink()

    def running() -> bool:
        try:
            return json.loads((pilot_dir / "tasks" / "task.000000.json").read_text())["state"] == "RUNNING"
        except (OSError, ValueError):
            return False
    assert wait_until(running, timeout=240), cluster.run(["squeue", "-j", job], check=False).stdout
    cluster.as_user(["scancel", job])
    assert wait_until(lambda: not cluster.run(["squeue", "-h", "-j", job], check=False).stdout.strip(), timeout=120)
    assert wait_until(lambda: not user_processes(cluster, "tether.pilot.agent"), timeout=30), \
        user_processes(cluster, "tether.pilot.agent")
    listed = json.loads(cluster.as_user(["env", f"TETHER_PILOT_DIR={pilot_dir}", t, "partition", "list", "--job", job,
                                         "--json"]).stdout)
    assert [(r["id"], r["state"]) for r in listed] == [("part.0000", "CANCELED"), ("part.0001", "CANCELED")]
    assert all(r["message"] in (TERMINATED, ENDED) for r in listed), listed
    assert json.loads((pilot_dir / "tasks" / "task.000000.json").read_text())["state"] == "CANCELED"
    assert cluster.in_service(), cluster.node_states()
    shutil.rmtree(pilot_dir)


def test_partitions_in_a_plain_sbatch_job_run_their_tasks(cluster):
    """The README's first example: `#SBATCH -N2`, no --exclusive, so each node gives the job one
    CPU and DefMemPerCPU of memory. A task's step shares its agent's CPUs and the job's memory
    (--mem=0): before, Slurm 22.05 refused every task ("Memory required by task is not
    available": the agent's part of that memory was taken), and the exit status is the task's."""
    work = cluster.box.work_dir
    out, pilot_dir = work / f"plain-pilot-{os.getpid()}.out", work / f"plain-pilot-{os.getpid()}"
    t = cluster.box.tether[0]
    script = "\n".join([
        "#!/bin/sh", f"#SBATCH -N2 --time=5 --output={out}", f"export TETHER_PILOT_DIR={pilot_dir}",
        f'{t} partition create "1 node" FILL --wait > /dev/null',
        f"{t} partition run part.0000 -- sh -c 'echo RAN $TETHER_PARTITION_ID on $SLURMD_NODENAME'",
        f"{t} partition run part.0001 -- sh -c 'exit 3'; echo TASK-EXIT=$?", ""])
    cluster.sbatch_wait([], input=script, timeout=240)
    text = out.read_text()
    out.unlink()
    shutil.rmtree(pilot_dir, ignore_errors=True)
    assert "RAN part.0000 on" in text and "TASK-EXIT=3" in text, text
    assert "Memory required by task is not available" not in text, text


def test_a_pilot_directory_planted_by_another_user_runs_nothing(cluster):
    """Issue 39, finding 1, through the daemons: another user (nobody) makes the directory the
    victim's job names in TETHER_PILOT_DIR first (`mkdir -m777 p{,/partitions,/tasks}`) and puts a
    QUEUED task for the victim's first partition in it. The victim's `tether partition create`
    refuses the directory, naming it and what to do, and nothing runs -- before, the victim's agent
    ran the task as the victim."""
    work = cluster.box.work_dir
    planted, out = work / f"planted-pilot-{os.getpid()}", work / f"planted-pilot-{os.getpid()}.out"
    pwned = planted / "pwned"
    for d in (planted, planted / "partitions", planted / "tasks"):
        d.mkdir()
        os.chmod(d, 0o777)
        os.chown(d, 65534, 65534)
    task = planted / "tasks" / "task.000099.json"
    task.write_text(json.dumps({"id": "task.000099", "partition": "part.0000", "command": ["sh", "-c", f"id > {pwned}"],
                                "ntasks": 1, "state": "QUEUED", "exit_code": None, "nodes": [],
                                "history": [["QUEUED", time.time()]]}))
    os.chown(task, 65534, 65534)
    planted_task = task.read_text()
    t = cluster.box.tether[0]
    script = "\n".join([
        "#!/bin/sh", f"#SBATCH -N1 --time=5 --output={out}",
        f"{t} partition create '1 node' --wait || exit 3",
        f"for i in $(seq 60); do [ -e {pwned} ] && break; sleep 1; done",     # the agent's time to run it
        f"cat {pwned}", ""])
    done = cluster.sbatch_wait([f"--export=ALL,TETHER_PILOT_DIR={planted}"], input=script, check=False, timeout=240)
    text = out.read_text()
    out.unlink()
    try:
        assert not pwned.exists(), text
        assert done.returncode == 3, text
        uid = pwd.getpwnam(cluster.user).pw_uid
        assert text.startswith(f"tether: pilot directory {planted}: it belongs to uid 65534 (nobody), not to you "
                               f"(uid {uid}): tether keeps a pilot's records only in a directory of your own"), text
        assert "TETHER_PILOT_DIR" in text and "Traceback" not in text, text
        assert list((planted / "partitions").iterdir()) == [] and not (planted / "lock").exists()   # nothing written
        assert task.read_text() == planted_task
        assert not user_processes(cluster, "tether.pilot.agent")
        assert cluster.in_service(), cluster.node_states()
    finally:
        shutil.rmtree(planted)
