"""Workflow packs (issue 18, docs/requirements.md) on the real cluster: a consumer delayed one
minute after the producer's start overlaps it; released early from inside the producer it starts
within seconds; with its dependency changed to afterok it waits for the producer's end. The three
packs run at once (one to two minutes in all: the delayed consumer's producer runs until it has
started); times from sacct. Gateway nodes of heterogeneous jobs."""

from __future__ import annotations

import datetime
import json
import os
import pwd
import subprocess

import pytest
from helpers import parse, user_processes, wait_until

pytestmark = pytest.mark.cluster



# a producer that waits until its pack's consumer has started (150 s at most; a failed squeue waits on)
UNTIL_CONSUMER_STARTED = ('i=0; until [ $i -ge 150 ] || squeue -h -u "$(id -un)" -t R,CG,CD,F,CA,TO -o %k | '
                          'grep -qxF "tether-pack:$TETHER_PACK:consumer"; do sleep 1; i=$((i+1)); done')


def pack(name: str, producer: str, producer_seconds: int) -> dict:
    return {"name": name, "jobs": [
        {"name": "producer", "sbatch_args": ["-n1", "-c1", "--time=5", "--output=/dev/null"],
         "script": f"#!/bin/sh\n{producer}\nsleep {producer_seconds}\n"},
        {"name": "consumer", "delay": 1, "sbatch_args": ["-n1", "-c1", "--time=5", "--output=/dev/null"],
         "command": ["true"]}]}


def times(cluster, job: str) -> tuple[datetime.datetime, datetime.datetime]:
    line = cluster.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "Start,End"]).stdout.strip().splitlines()[0]
    start, end = line.split("|")
    return datetime.datetime.fromisoformat(start), datetime.datetime.fromisoformat(end)


def ended(cluster, job: str) -> bool:
    state = cluster.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"]).stdout.strip()
    return state.startswith(("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"))


def test_delays_overlap_release_starts_the_consumer_at_once_and_afterok_waits(cluster):
    tether = cluster.box.tether[0]
    packs = {
        # Slurm acts on a fulfilled time delay at its next scheduling pass (sched_interval 60 s,
        # bf_interval 30 s by default): the consumer starts 60-120 s after the producer, which runs
        # until it sees its pack's consumer started (squeue) and 3 s more, 150 s at most
        "delay": pack("delay", UNTIL_CONSUMER_STARTED, 3),
        "release": pack("release", f"sleep 5; {tether} workflow release", 40),
        "afterok": pack("afterok", f"{tether} workflow set-dependency --type afterok", 15),
    }
    jobs = {}
    for name, spec in packs.items():
        out = cluster.as_user([tether, "workflow", "submit", "--json", "-"], input=json.dumps(spec)).stdout
        result = json.loads(out)
        assert result["pack"].startswith(f"{name}-")
        jobs[name] = result["jobs"]
    status = cluster.as_user([tether, "workflow", "status", "--json", json.loads(out)["pack"]]).stdout
    assert {r["job"] for r in json.loads(status)} == {"producer", "consumer"}
    all_jobs = [j for pair in jobs.values() for j in pair.values()]
    assert wait_until(lambda: all(ended(cluster, j) for j in all_jobs), timeout=300)
    offsets = {}
    for name, pair in jobs.items():
        p_start, p_end = times(cluster, pair["producer"])
        c_start, _ = times(cluster, pair["consumer"])
        offsets[name] = ((c_start - p_start).total_seconds(), (p_end - c_start).total_seconds())
    print(f"consumer start after the producer's start, and before its end (s): {offsets}")
    after, before_end = offsets["delay"]
    assert 55 <= after <= 130 and before_end > 0, offsets          # the delay held, and they overlapped
    after, before_end = offsets["release"]
    assert after <= 25 and before_end > 0, offsets                 # released: eligible at once
    after, before_end = offsets["afterok"]
    assert before_end <= 0, offsets                                # afterok: only once the producer ended


def test_gateway_nodes_serve_every_rank_of_both_components_and_end_with_the_job(cluster, registry_image):
    """Issue 18: a heterogeneous job of a containerized tether component, a plain one and one
    gateway node (--gateways=1). The batch script finds the daemon in $TETHER_GATEWAYS before it
    runs; one step across both working components (srun --het-group=0,1) has global ranks and
    reaches the daemon from every rank, inside the container too; the daemon is a job step of the
    gateway component (sacct) and nothing of it is left after the job."""
    out = cluster.box.work_dir / f"gateways-{os.getpid()}.out"
    script = "\n".join([
        "#!/bin/sh",
        f"#SBATCH --slots=2 --slot-type=cpu --slots-per-node=2 --container-image={registry_image}",
        f"#SBATCH --output={out}",
        "#SBATCH hetjob",
        "#SBATCH -N1 -n1",
        "#SBATCH hetjob",
        "#SBATCH --gateways=1",
        "echo BATCH RANK=-1 GATEWAYS=$TETHER_GATEWAYS NODES=$TETHER_GATEWAY_NODES COMPONENT=$TETHER_GATEWAY_COMPONENT",
        "srun --het-group=0,1 sh -c 'echo RANK=$RANK WORLD_SIZE=$WORLD_SIZE COMPONENT=$TETHER_HET_COMPONENT "
        "IN=$(test -e /etc/debian_version && echo host || echo container) "
        "ANSWER=$(echo | busybox nc ${TETHER_GATEWAYS%:*} ${TETHER_GATEWAYS##*:} | tr \" \" _)'",
        ""])
    result = cluster.sbatch_wait(["--parsable"], input=script, timeout=240, check=False)
    text = out.read_text() if out.exists() else "(no output file)"
    out.unlink(missing_ok=True)
    assert result.returncode == 0, (result.stderr, text)     # the job's own output says why it failed
    job = result.stdout.strip().split(";")[0]
    batch, *ranks = parse(text)
    assert batch["COMPONENT"] == "2" and batch["NODES"] == cluster.nodes[2], text
    port = 28672 + (int(job) % 256) * 16                     # gateways.port: null (automatic)
    assert batch["GATEWAYS"] == f"{cluster.box.node_address(cluster.nodes[2])}:{port}", text   # its NodeAddr
    assert [(r["RANK"], r["WORLD_SIZE"], r["COMPONENT"]) for r in ranks] == [("0", "2", "0"), ("1", "2", "1")], text
    assert ranks[0]["IN"] == "container" and ranks[1]["IN"] == "host", text
    # the sandbox's daemon answers "tether-gateway <node> <job> <uid>"
    uid = str(pwd.getpwnam(cluster.user).pw_uid)
    assert {r["ANSWER"] for r in ranks} == {f"tether-gateway_{cluster.nodes[2]}_{job}_{uid}"}, text

    def steps() -> str:
        return cluster.run(["sacct", "-n", "-P", "-j", f"{job}+2", "-o", "JobID,JobName,NodeList"]).stdout

    # slurmdbd has the step a moment after the job's end (sacct said nothing right at it once)
    assert wait_until(lambda: f"{job}+2.0|tether-gateway|{cluster.nodes[2]}" in steps(), timeout=30), steps()
    assert wait_until(lambda: not user_processes(cluster, "gateway_daemon"), timeout=30), \
        user_processes(cluster, "gateway_daemon")
    assert cluster.in_service(), cluster.node_states()


def test_a_gateway_daemon_that_fails_fails_the_job_with_its_reason_and_the_node_stays(cluster):
    """The daemon exits before it listens (the sandbox's daemon does when SANDBOX_GATEWAY_FAIL is
    in its environment): the batch script does not run, the job fails (exit 1) with tether's
    reason and the daemon's own line in its output; no node is drained. Refused requests too."""
    out = cluster.box.work_dir / f"gateways-fail-{os.getpid()}.out"
    script = f"#!/bin/sh\n#SBATCH -N1 --output={out}\n#SBATCH hetjob\n#SBATCH --gateways=1\necho SCRIPT_RAN\n"
    result = cluster.sbatch_wait([], env={"SANDBOX_GATEWAY_FAIL": "1"}, input=script, timeout=240, check=False)
    text = out.read_text()
    out.unlink()
    assert result.returncode == 1 and "SCRIPT_RAN" not in text, text
    assert "failing as SANDBOX_GATEWAY_FAIL asks" in text, text
    assert "tether: the job's gateway nodes: the gateway step ended (srun exit 3) before its daemon listened on" in text
    assert cluster.in_service(), cluster.node_states()
    # not a component of its own; srun; a container in the gateway component
    refused = {
        "--gateways=1 --wrap=true": "gateway nodes are a component of their own in a heterogeneous job",
        "--wrap=true : --gateways=1 --container-image=busybox": "makes its component the gateway nodes",
        "--wrap=true : --gateways=2 -N2": "--nodes=2 conflicts with --gateways=2",
    }
    for args, message in refused.items():
        r = cluster.as_user(["sbatch", *args.split()], check=False)
        assert r.returncode != 0 and message in r.stderr, (args, r.stderr)
    r = cluster.as_user(["srun", "--gateways=1", "true"], check=False)
    assert r.returncode != 0 and "--gateways is an option of sbatch and salloc" in r.stderr, r.stderr


# another user's listener on the job's port: answers what connects, and says so on its stdout
SQUATTER = """import socket, sys
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("LISTENING", flush=True)
while True:
    conn, _ = server.accept()
    print("CONNECTED", flush=True)
    conn.sendall(b"SQUATTED\\n")
    conn.close()
"""


def test_a_port_another_user_listens_on_fails_the_job_and_gets_no_traffic(cluster):
    """Issue 39, finding 3: another user (nobody) listens on the job's automatic gateway port
    before the job starts. Readiness once was "something accepts TCP": the batch script ran and
    its connection reached the squatter. Now the gateway step's task refuses the port before it
    starts the daemon, naming the uid that holds it; the job fails before its script runs, nothing
    connects to the squatter and no node is drained."""
    out = cluster.box.work_dir / f"gateways-squat-{os.getpid()}.out"
    script = (f"#!/bin/sh\n#SBATCH -N1 --output={out}\n#SBATCH hetjob\n#SBATCH --gateways=1\n"
              "echo SCRIPT_RAN ANSWER=$(echo | busybox nc ${TETHER_GATEWAYS%:*} ${TETHER_GATEWAYS##*:})\n")
    # held, so that the squatter is up before the job can start (its port comes from the job id)
    job = cluster.as_user(["sbatch", "--parsable", "--hold"], input=script).stdout.strip().split(";")[0]
    port = 28672 + (int(job) % 256) * 16
    nobody = pwd.getpwnam("nobody")
    squatter = subprocess.Popen(["/usr/bin/python3", "-c", SQUATTER, str(port)], user=nobody.pw_uid,
                                group=nobody.pw_gid, extra_groups=[], stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline() == "LISTENING\n"
        cluster.run(["scontrol", "release", job])
        code = cluster.box.wait_for_job(job, timeout=240)
    finally:
        squatter.kill()
    connections = squatter.communicate()[0]
    text = out.read_text()
    out.unlink()
    assert code == 1 and "SCRIPT_RAN" not in text, text
    assert (f"tether: the job's gateway nodes: port {port} on {cluster.nodes[2]} is already in use by "
            f"uid {nobody.pw_uid}; the gateway daemon cannot use it") in text, text
    assert "CONNECTED" not in connections, connections
    assert cluster.in_service(), cluster.node_states()


def test_in_salloc_tether_gateway_start_gives_the_allocation_its_gateways(cluster):
    """salloc has no batch script: `eval "$(tether gateway start)"` starts the daemon step and sets
    TETHER_GATEWAYS (it once kept the command substitution open until the allocation ended: its
    watcher held the caller's stdout); an srun in the allocation reaches the daemon (and does not
    refuse the allocation's own --gateways, which salloc exports to it). srun's output options in
    the user's environment (SLURM_LABELIO) do not reach the daemon's step, whose stdout carries
    its readiness reports."""
    inner = ('eval "$(' + cluster.box.tether[0] + ' gateway start)" && echo "GATEWAYS=$TETHER_GATEWAYS" && '
             'srun -N1 sh -c "echo | busybox nc \\${TETHER_GATEWAYS%:*} \\${TETHER_GATEWAYS##*:}"')
    out = cluster.as_user(["env", f"TETHER_CONFIG={cluster.box.tether_conf}", "SLURM_LABELIO=1", "salloc", "-N1", ":",
                           "--gateways=1", "sh", "-c", inner], timeout=120).stdout
    assert f"GATEWAYS={cluster.box.node_address(cluster.nodes[2])}:" in out and f"tether-gateway {cluster.nodes[2]} " in out, out
    assert wait_until(lambda: not user_processes(cluster, "gateway_daemon"), timeout=30)
