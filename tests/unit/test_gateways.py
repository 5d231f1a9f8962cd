"""Gateway nodes (issue 18, seed 004) without a cluster: job_submit's answer for a --gateways
component, the config, the ports, the daemon's command, the readiness wait (PBS's refusal: test_pbs_hooks.py).
The whole flow runs on the sandbox (tests/cluster/test_workflow_cluster.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tether.admin.slurm import plugstack_line
from tether.container import gateways
from tether.hooks.config import validate_config
from tether.hooks.errors import ConfigError
from tether.hooks.surface import BY_NAME
from tether.testing.slurm import NO_VAL, JobSubmit

GATEWAYS = {"partition": "gateway", "daemon": ["/usr/sbin/gwd", "--port", "{port}"]}


@pytest.fixture
def submit(tmp_path):
    def run(job: dict, settings: dict | None = GATEWAYS) -> tuple[bool, str, dict]:
        config = tmp_path / "tether.yaml"
        config.write_text(json.dumps({"gateways": settings} if settings else {}))
        accepted, message = JobSubmit(str(config)).submit(job)
        return accepted, message, job
    return run


def component(offset: int | None = 1, **fields) -> dict:
    job = {"spank_env": {BY_NAME["gateways"].env: str(fields.pop("gateways", 2))}, **fields}
    job["het_job_offset"] = NO_VAL if offset is None else offset
    return job


def test_a_gateway_component_gets_the_partition_nodes_and_one_task_each(submit):
    accepted, message, job = submit(component(2, gateways=2))
    assert accepted, message
    assert (job["partition"], job["min_nodes"], job["max_nodes"], job["num_tasks"], job["ntasks_per_node"]) == (
        "gateway", 2, 2, 2, 1)
    assert "features" not in job
    assert "component 2: 2 gateway node(s) in partition gateway" in message


def test_the_gateway_feature_joins_the_users_constraint(submit):
    settings = {**GATEWAYS, "feature": "gw"}
    assert submit(component(features="ib&fast"), settings)[2]["features"] == "ib&fast&gw"
    assert submit(component(), settings)[2]["features"] == "gw"
    accepted, message, _ = submit(component(features="a|b"), settings)
    assert not accepted and "only features joined with '&'" in message


@pytest.mark.parametrize("job, expected", [
    (component(None), "gateway nodes are a component of their own in a heterogeneous job"),
    (component(0), "gateway nodes are a component of their own"),
    (component(1, min_nodes=3), "--nodes=3 conflicts with --gateways=2"),
    (component(1, num_tasks=4), "--ntasks=4 conflicts with --gateways=2"),
    (component(1, partition="debug"), "--partition=debug conflicts with --gateways=2"),
])
def test_requests_that_cannot_be_a_gateway_component_are_refused(submit, job, expected):
    accepted, message, _ = submit(job)
    assert not accepted and expected in message and message.startswith("tether: "), message


def test_other_tether_options_in_the_gateway_component_are_refused(submit):
    job = component()
    job["spank_env"]["TETHER_SLOTS"] = "2"
    accepted, message, _ = submit(job)
    assert not accepted and "--slots belong(s) in another component" in message


def test_without_a_gateway_partition_gateways_are_refused(submit):
    accepted, message, _ = submit(component(), settings=None)
    assert not accepted and "this cluster has no gateway nodes" in message


def test_the_config_needs_a_daemon_for_a_gateway_partition_and_the_plugstack_line_names_it():
    with pytest.raises(ConfigError, match="gateways.daemon.*must name the gateway daemon"):
        validate_config({"gateways": {"partition": "gw"}}, "t")
    config = validate_config({"gateways": GATEWAYS}, "t")
    assert plugstack_line(Path("/p"), config).endswith(" gateway_partition=gateway")
    assert "gateway_partition" not in plugstack_line(Path("/p"), validate_config({}, "t"))


def test_the_option_variable_is_not_the_variable_tether_sets():
    # TETHER_GATEWAYS is what ranks read; as the option's fallback it would turn a job's own
    # gateway list into a (bad) request in every nested sbatch
    assert BY_NAME["gateways"].env == "TETHER_GATEWAY_COUNT"


def test_ports_placeholders_and_the_gateway_component_from_the_environment():
    assert gateways.gateway_ports(1234, 3, None) == [28672 + 210 * 16 + n for n in range(3)]
    assert gateways.gateway_ports(255, 16, None)[-1] == 32767           # the highest automatic port
    assert gateways.gateway_ports(7, 2, 40000) == [40000, 40001]
    assert gateways.daemon_argv(["d", "--port={port}", "{node}:{index}", "{job}", "{other}"],
                                port=5, node="n3", index=1, job="42") == ["d", "--port=5", "n3:1", "42", "{other}"]
    env = {"SLURM_HET_SIZE": "3", "SLURM_JOB_PARTITION_HET_GROUP_0": "gateway",
           "SLURM_JOB_PARTITION_HET_GROUP_1": "debug", "SLURM_JOB_PARTITION_HET_GROUP_2": "gateway"}
    assert gateways.gateway_component(env, "gateway") == 2          # never the batch's own component 0
    assert gateways.gateway_component(env, None) is None
    assert gateways.gateway_component({"SLURM_HET_SIZE": "x"}, "gateway") is None


def test_the_daemons_step_carries_no_tether_options():
    env = {"PATH": "/bin", "TETHER_CONTAINER_IMAGE": "busybox", "SLURM_SPANK__SLURM_SPANK_OPTION_tether_slots": "2",
           "SLURM_SPANK_OTHER": "x", "SLURM_JOB_ID": "5"}
    assert gateways.step_environment(env) == {"PATH": "/bin", "SLURM_SPANK_OTHER": "x", "SLURM_JOB_ID": "5"}


class FakeStep:
    def __init__(self, rc=None):
        self.rc = rc

    def poll(self):
        return self.rc


def test_wait_ready_waits_for_every_daemon_and_names_the_one_that_did_not_answer():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    def serve():
        while True:
            try:
                server.accept()[0].close()
            except OSError:         # closed at the end of the test
                return

    threading.Thread(target=serve, daemon=True).start()
    gateways.wait_ready([("127.0.0.1", port)], FakeStep(), timeout=5)
    closed = socket.create_server(("127.0.0.1", 0))
    dead = closed.getsockname()[1]
    closed.close()
    with pytest.raises(gateways.GatewayError, match=rf"did not answer on 127.0.0.1:{dead} within 0.5 s"):
        gateways.wait_ready([("127.0.0.1", port), ("127.0.0.1", dead)], FakeStep(), timeout=0.5)
    with pytest.raises(gateways.GatewayError, match=r"the gateway step ended \(srun exit 3\)"):
        gateways.wait_ready([("127.0.0.1", dead)], FakeStep(3), timeout=5)
    server.close()


def test_each_task_of_the_gateway_step_execs_the_daemon_with_its_own_port(tmp_path):
    code = "from tether.container.gateways import exec_daemon; exec_daemon()"
    env = {"PATH": os.environ["PATH"], gateways.DAEMON_VAR: json.dumps(["sh", "-c", "echo {node} {index} {port} "
                                                                        "$TETHER_GATEWAY_PORT", "x"]),
           gateways.PORTS_VAR: "6000,6001", "SLURM_PROCID": "1", "SLURMD_NODENAME": "n7", "SLURM_JOB_ID": "9"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout == "n7 1 6001 6001\n", out.stderr
    env[gateways.DAEMON_VAR] = json.dumps(["/nonexistent/gwd"])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 127 and "cannot start the gateway daemon /nonexistent/gwd" in out.stderr

