"""Gateway nodes (issue 18, docs/requirements.md) without a cluster: job_submit's answer for a --gateways
component, the config, the ports, the daemon's command, the readiness wait (PBS's refusal: test_pbs_hooks.py).
The whole flow runs on the sandbox (tests/cluster/test_workflow_cluster.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tether.admin.slurm import plugstack_line
from tether.container import gateways
from tether.hooks.config import validate_config
from tether.hooks.errors import ConfigError
from tether.hooks.surface import BY_NAME
from tether.testing.slurm import NO_VAL, JobSubmit

from helpers import wait_until

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


def test_the_daemons_step_carries_no_tether_options_and_no_srun_output_options():
    env = {"PATH": "/bin", "TETHER_CONTAINER_IMAGE": "busybox", "SLURM_SPANK__SLURM_SPANK_OPTION_tether_slots": "2",
           "SLURM_SPANK_OTHER": "x", "SLURM_JOB_ID": "5", "SLURM_STDOUTMODE": "gw.out", "SLURM_LABELIO": "1"}
    assert gateways.step_environment(env) == {"PATH": "/bin", "SLURM_SPANK_OTHER": "x", "SLURM_JOB_ID": "5"}


def gateway_task(tmp_path: Path, daemon: list[str], port: int, **extra: str) -> subprocess.Popen:
    """One task of the gateway step as srun starts it on a node (``exec_daemon``), without srun:
    its stdout is what the batch side reads (wait_ready)."""
    env = {"PATH": os.environ["PATH"], "SLURM_PROCID": "0",
           "SLURMD_NODENAME": "n7", "SLURM_JOB_ID": "9", gateways.DAEMON_VAR: json.dumps(daemon),
           gateways.PORTS_VAR: str(port), **extra}
    code = "from tether.container.gateways import exec_daemon; exec_daemon()"
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            start_new_session=True)


def free_port() -> int:
    """A port free on 127.0.0.1 and 127.0.0.2, below Linux's ephemeral range (32768 on): one the
    kernel handed out as ephemeral could be taken again by any outgoing connection on this busy
    machine before the test binds it ("Address already in use", seen once)."""
    import random

    for _ in range(200):
        port = random.randrange(29000, 32700)
        try:
            for host in ("127.0.0.1", "127.0.0.2"):
                socket.create_server((host, port)).close()
        except OSError:
            continue
        return port
    raise RuntimeError("no free port in 29000-32700")


def stop(task: subprocess.Popen) -> None:
    """End the task and every process it started (its session: the daemon's children, the
    watcher), as Slurm ends a step's cgroup."""
    try:
        os.killpg(task.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    task.wait(timeout=30)
    task.stdout.close()


SANDBOX_DAEMON = [sys.executable, "-m", "tether.sandbox.gateway_daemon", "--port", "{port}", "--node", "{node}"]


def test_the_daemons_own_listener_is_ready_also_from_a_child_of_the_daemon(tmp_path):
    port = free_port()
    for daemon in (SANDBOX_DAEMON, ["sh", "-c", " ".join(SANDBOX_DAEMON) + "; exit $?"]):   # sh forks it
        task = gateway_task(tmp_path, daemon, port)
        try:
            gateways.wait_ready([("127.0.0.1", port)], task, timeout=60)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
                assert conn.recv(100).decode().startswith("tether-gateway n7 9 ")
        finally:
            stop(task)


def test_a_port_someone_else_listens_on_is_refused_before_the_daemon_starts(tmp_path):
    """Issue 39, finding 3: "something accepts TCP" was ready; a squatter's listener answered for
    the job's daemon. The task on the node refuses a port another process listens on, naming
    the uid the kernel gives its socket, and the daemon never runs."""
    squatter = socket.create_server(("127.0.0.1", 0))        # the kernel completes connections to it
    port = squatter.getsockname()[1]
    started = tmp_path / "daemon-started"
    task = gateway_task(tmp_path, ["sh", "-c", f"touch {started}; exec sleep 60"], port)
    try:
        with pytest.raises(gateways.GatewayError, match=rf"^port {port} on n7 is already in use by uid "
                                                         rf"{os.getuid()}; the gateway daemon cannot use it"):
            gateways.wait_ready([("127.0.0.1", port)], task, timeout=60)
        assert task.wait(timeout=30) == gateways.EXIT_PORT_IN_USE and not started.exists()
    finally:
        stop(task)
        squatter.close()


def test_a_listener_that_appears_after_the_daemon_started_and_is_not_its_fails(tmp_path):
    """The port was free when the task looked; then, before the daemon listens, another process
    listens there on the node's address (127.0.0.2 here; the daemon would bind another): not
    ready, though the address answers."""
    port = free_port()
    started = tmp_path / "daemon-started"
    task = gateway_task(tmp_path, ["sh", "-c", f"touch {started}; exec sleep 60"], port)
    squatter = None
    try:
        # the task has looked at the port and started the daemon
        assert wait_until(lambda: started.exists() or task.poll() is not None, timeout=60) and started.exists()
        squatter = socket.create_server(("127.0.0.2", port))
        with pytest.raises(gateways.GatewayError, match=rf"^port {port} on n7 is held by uid {os.getuid()}, "
                                                         rf"not by the gateway daemon"):
            gateways.wait_ready([("127.0.0.2", port)], task, timeout=60)
    finally:
        stop(task)
        if squatter:
            squatter.close()


def test_a_daemon_that_ends_or_never_listens_fails_with_its_step(tmp_path):
    port = free_port()
    task = gateway_task(tmp_path, SANDBOX_DAEMON, port, SANDBOX_GATEWAY_FAIL="1")
    try:
        with pytest.raises(gateways.GatewayError, match=rf"the gateway step ended \(srun exit 3\) before its "
                                                         rf"daemon listened on 127.0.0.1:{port}"):
            gateways.wait_ready([("127.0.0.1", port)], task, timeout=60)
    finally:
        stop(task)
    task = gateway_task(tmp_path, ["sleep", "60"], port)
    try:
        with pytest.raises(gateways.GatewayError, match=rf"did not listen on 127.0.0.1:{port} within 0.5 s"):
            gateways.wait_ready([("127.0.0.1", port)], task, timeout=0.5)
    finally:
        stop(task)


def test_port_listeners_reads_both_tables_and_only_listening_sockets(tmp_path):
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (tmp_path / "tcp").write_text(header +
        "   0: 0100007F:7EA0 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1005        0 4242 1\n"
        "   1: 0100007F:7EA0 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1001        0 4343 1\n"
        "   2: 00000000:7EA1 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1\n")
    (tmp_path / "tcp6").write_text(header +
        "   0: 00000000000000000000000000000000:7EA0 00000000000000000000000000000000:0000 0A "
        "00000000:00000000 00:00000000 00000000  1006        0 4545 1\n")
    assert gateways.port_listeners(0x7EA0, str(tmp_path)) == [(1005, 4242), (1006, 4545)]
    (tmp_path / "tcp6").unlink()
    assert gateways.port_listeners(0x7EA1, str(tmp_path)) == [(0, 4444)]


def test_each_task_of_the_gateway_step_execs_the_daemon_with_its_own_port(tmp_path):
    code = "from tether.container.gateways import exec_daemon; exec_daemon()"
    env = {"PATH": os.environ["PATH"], gateways.DAEMON_VAR: json.dumps(["sh", "-c", "echo {node} {index} {port} "
                                                                        "$TETHER_GATEWAY_PORT", "x"]),
           gateways.PORTS_VAR: f"6000,{free_port()}", "SLURM_PROCID": "1", "SLURMD_NODENAME": "n7", "SLURM_JOB_ID": "9"}
    port = env[gateways.PORTS_VAR].split(",")[1]
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    # the daemon's output goes to the job's error stream: the task's stdout carries only its reports
    assert out.stderr == f"n7 1 {port} {port}\n" and out.stdout == "", out
    env[gateways.DAEMON_VAR] = json.dumps(["/nonexistent/gwd"])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 127 and "cannot start the gateway daemon /nonexistent/gwd" in out.stderr


def test_every_gateway_nodes_task_must_report_and_other_lines_pass_through(tmp_path, capfd):
    """srun merges the tasks' stdout: ready once each index has reported, whatever the order."""
    step = subprocess.Popen(["sh", "-c", "echo tether-gateway ready 1; echo a daemon line; sleep 0.2; "
                             "echo tether-gateway ready 0; exec sleep 60"], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        gateways.wait_ready([("10.0.0.1", 30000), ("10.0.0.2", 30001)], step, timeout=60)
        assert "a daemon line" in capfd.readouterr().err
    finally:
        stop(step)
    step = subprocess.Popen(["sh", "-c", "echo tether-gateway ready 0; exec sleep 60"], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        with pytest.raises(gateways.GatewayError, match=r"did not listen on 10.0.0.2:30001 within 0.5 s"):
            gateways.wait_ready([("10.0.0.1", 30000), ("10.0.0.2", 30001)], step, timeout=0.5)
    finally:
        stop(step)
