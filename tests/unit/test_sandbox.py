"""The sandbox's own setup as root in places users can write (a node's /tmp): nothing a user planted
first is followed."""

from __future__ import annotations

import os
import subprocess
import stat
import sys

import pytest

from tether.sandbox.cluster import NODE_DIRS, SandboxError, make_node_dirs


def test_node_dirs_are_made_root_owned_with_their_modes_and_a_boot_empties_tmp_and_run(tmp_path):
    node = tmp_path / "nodes" / "n1"
    make_node_dirs(node)
    modes = {sub: stat.S_IMODE((node / sub).stat().st_mode) for sub, _, _ in NODE_DIRS}
    assert modes == {"tmp": 0o1777, "var/tmp": 0o1777, "run": 0o755, "dev/shm": 0o1777, "local": 0o755}
    for sub in ("tmp", "var/tmp", "run", "dev/shm", "local"):
        (node / sub / "left").mkdir()
        (node / sub / "left" / "file").write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    (node / "tmp" / "link").symlink_to(outside)
    make_node_dirs(node)                                          # again: a node's next boot
    assert [sub for sub in ("tmp", "var/tmp", "run", "dev/shm", "local") if (node / sub / "left").exists()] \
        == ["var/tmp", "local"]                                   # /var/tmp and the stores survive a boot
    assert (outside / "keep").exists()                            # the link went, not what it named


def test_a_boot_empties_a_nodes_tmp_past_a_users_fifo_without_hanging(tmp_path):
    """A FIFO (or a directory swapped for one) in a node's /tmp, which every user can write: the
    boot moves the directory aside and removes it with rm, which never opens a FIFO."""
    node = tmp_path / "nodes" / "n1"
    make_node_dirs(node)
    os.mkfifo(node / "tmp" / "fifo")
    (node / "tmp" / "d").mkdir()
    os.mkfifo(node / "tmp" / "d" / "fifo")
    make_node_dirs(node)
    assert list((node / "tmp").iterdir()) == [] and stat.S_IMODE((node / "tmp").stat().st_mode) == 0o1777
    assert sorted(p.name for p in node.iterdir()) == ["dev", "local", "run", "tmp", "var"]    # nothing aside left


NODE_SOURCE_PROBE = """
import socket, sys
server = socket.create_server(("127.0.0.1", 0))
port = server.getsockname()[1]
fresh = socket.create_connection(("127.0.0.1", port))
bound = socket.socket()
bound.bind(("127.0.0.1", 0))
bound.connect(("127.0.0.1", port))
print(fresh.getsockname()[0], bound.getsockname()[0])
"""


def test_a_nodes_loopback_connections_leave_from_its_own_address(tmp_path):
    """sandbox/node_source.c, each node's /etc/ld.so.preload: a TCP connect() to loopback from an
    unbound socket leaves from the address in the node's /run (Slurm answers a request at the
    address it came from); a socket its program bound keeps its address; without the file,
    nothing changes. Run in a mount namespace of its own whose /run is a fresh tmpfs."""
    from importlib import resources

    shim = tmp_path / "node_source.so"
    with resources.as_file(resources.files("tether.sandbox").joinpath("node_source.c")) as source:
        subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(shim), str(source), "-ldl"],
                       check=True)
    script = (f"mount -t tmpfs none /run && {{ [ -z \"$1\" ] || echo \"$1\" > /run/tether-sandbox-node-address; }} && "
              f"LD_PRELOAD={shim} exec {sys.executable} -c '{NODE_SOURCE_PROBE}'")
    seen = {}
    for address in ("127.0.0.7", "", "10.0.0.1"):      # a node's, none, one that is not loopback (ignored)
        out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", address],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        seen[address] = out.stdout.split()
    assert seen == {"127.0.0.7": ["127.0.0.7", "127.0.0.1"], "": ["127.0.0.1", "127.0.0.1"],
                    "10.0.0.1": ["127.0.0.1", "127.0.0.1"]}


def test_root_enters_only_roots_own_slurmd():
    """Sandbox.on_node enters the namespaces of the pid slurmd's pid file names: a stale file
    could name a user's process by then. Only a slurmd run by root in this user namespace passes."""
    from tether.sandbox.cluster import _is_roots_slurmd

    assert not _is_roots_slurmd(os.getpid())                 # root's, but python, not slurmd
    assert not _is_roots_slurmd(2 ** 22 + 1)                 # no such process


def test_node_dirs_refuse_what_a_user_put_there_first(tmp_path):
    target = tmp_path / "victim"
    target.mkdir()
    planted = tmp_path / "a" / "nodes"
    planted.parent.mkdir()
    planted.symlink_to(target)
    with pytest.raises(SandboxError, match="not a root-owned directory"):
        make_node_dirs(planted / "n1")
    assert list(target.iterdir()) == []                     # nothing made through the link
    foreign = tmp_path / "b" / "nodes" / "n1"
    foreign.mkdir(parents=True)
    os.chown(foreign, 65534, 65534)
    with pytest.raises(SandboxError, match="not a root-owned directory"):
        make_node_dirs(foreign)
    node = tmp_path / "c" / "nodes" / "n1"
    (node / "var").mkdir(parents=True)
    (node / "var" / "tmp").symlink_to(target)
    with pytest.raises(SandboxError, match="not a root-owned directory"):
        make_node_dirs(node)
    assert stat.S_IMODE(target.stat().st_mode) != 0o1777    # the link's target was not chmodded


def test_a_slurm_roots_pause_processes_end_but_only_the_users_catatonit(tmp_path, monkeypatch):
    """end_user_namespaces reads the user's own pid files: a FIFO does not hang it, a pid of
    another program is not killed; the user's catatonit is."""
    import signal
    import subprocess
    import time

    import tether.sandbox.slurmroot as slurmroot

    monkeypatch.setattr(slurmroot, "CACHE", tmp_path)
    root = slurmroot.SlurmRoot("24.11")
    run_dirs = [root.path / "tmp" / f"{kind}-run-0" / "libpod" / "tmp" for kind in ("storage", "podman", "x")]
    for d in run_dirs:
        d.mkdir(parents=True)
    pause = subprocess.Popen(["catatonit", "-P"], start_new_session=True)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (run_dirs[0] / "pause.pid").write_text(f"{pause.pid}\n")
        (run_dirs[1] / "pause.pid").write_text(f"{other.pid}\n")
        os.mkfifo(run_dirs[2] / "pause.pid")
        time.sleep(0.2)                                  # catatonit has exec'd
        assert root.end_user_namespaces(("root",)) == [pause.pid]
        assert pause.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None                      # not a catatonit: left alone
    finally:
        for proc in (pause, other):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_wait_for_job_gives_what_sbatch_wait_gives(monkeypatch):
    """Sandbox.wait_for_job: done when every component has ended (not while one completes); the
    highest exit status over the components, 1 for one a signal ended (sbatch.c _job_wait); a job
    that does not end is an error naming its states."""
    from tether.sandbox.cluster import Sandbox

    def answers(*seen):
        replies = iter(seen)
        monkeypatch.setattr(Sandbox, "job_records", lambda self, job: next(replies))

    box = Sandbox("/nonexistent-sandbox")
    monkeypatch.setattr("time.sleep", lambda s: None)
    ok = {"JobState": "COMPLETED", "ExitCode": "0:0"}
    answers([{"JobState": "PENDING", "ExitCode": "0:0"}], [{"JobState": "RUNNING", "ExitCode": "0:0"}],
            [{"JobState": "COMPLETING", "ExitCode": "0:0"}], [ok])
    assert box.wait_for_job("7") == 0
    answers([ok, {"JobState": "RUNNING", "ExitCode": "0:0"}],
            [ok, {"JobState": "FAILED", "ExitCode": "3:0"}, {"JobState": "CANCELLED", "ExitCode": "0:9"}])
    assert box.wait_for_job("8") == 3                         # a hetjob: the highest of its components
    answers([{"JobState": "CANCELLED", "ExitCode": "0:15"}])
    assert box.wait_for_job("9") == 1                         # ended by a signal: 1, as sbatch --wait
    answers([{"JobState": "TIMEOUT", "ExitCode": "0:1"}])
    assert box.wait_for_job("10") == 1
    monkeypatch.setattr(Sandbox, "job_records", lambda self, job: [{"JobState": "RUNNING"}])
    with pytest.raises(SandboxError, match=r"job 11 has not ended after 0 s \(RUNNING\)"):
        box.wait_for_job("11", timeout=0)


def test_poll_job_returns_the_last_records_seen(monkeypatch):
    """Sandbox.poll_job (what the tests' Cluster.wait_job builds on): the records once every
    component has ended; after the timeout, the last records seen instead of an error."""
    from tether.sandbox.cluster import Sandbox, job_ended

    box = Sandbox("/nonexistent-sandbox")
    monkeypatch.setattr("time.sleep", lambda s: None)
    replies = iter([[{"JobState": "RUNNING"}], [{"JobState": "COMPLETING"}], [{"JobState": "COMPLETED"}]])
    monkeypatch.setattr(Sandbox, "job_records", lambda self, job: next(replies))
    assert box.poll_job("7") == [{"JobState": "COMPLETED"}]
    monkeypatch.setattr(Sandbox, "job_records", lambda self, job: [{"JobState": "PENDING"}])
    assert box.poll_job("8", timeout=0) == [{"JobState": "PENDING"}]
    assert not job_ended([]) and not job_ended([{"JobState": "COMPLETED"}, {"JobState": "RUNNING"}])
    assert job_ended([{"JobState": "COMPLETED"}, {"JobState": "OUT_OF_MEMORY"}])


def test_cancelling_the_jobs_goes_on_past_a_slurmctld_that_does_not_answer(monkeypatch):
    """CI: `down` after a test raised squeue's 15 s timeout (a loaded machine) and never stopped
    the daemons. Now a command that times out is said and the cancelling gives up within its time;
    a slurmctld that answers gets its jobs cancelled and is waited for."""
    from tether.sandbox.cluster import Sandbox
    from tether.system.proc import CommandError

    box = Sandbox("/nonexistent-sandbox")
    monkeypatch.setattr("time.sleep", lambda s: None)
    asked, said = [], []

    def slow(self, argv, **kwargs):
        asked.append((argv[0], kwargs["timeout"]))
        raise CommandError(argv, None, "", "", reason="timed out after 15 s", kind="timeout")

    monkeypatch.setattr(Sandbox, "slurm", slow)
    box._cancel_all_jobs(log=said.append, within=0.5)       # returns: no CommandError
    assert asked and all(name == "squeue" and 0 < t <= 15 for name, t in asked)
    assert said[0] == "squeue: timed out after 15 s" and said[-1].startswith("slurmctld did not list its jobs")

    queue = iter(["4 5\n", "4 RUNNING\n", ""])
    asked.clear()

    def answering(self, argv, **kwargs):
        asked.append(argv)
        out = "" if argv[0] == "scancel" else next(queue)
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(Sandbox, "slurm", answering)
    box._cancel_all_jobs(log=said.append)
    assert asked == [["squeue", "-h", "-o", "%A"], ["scancel", "4", "5"],
                     ["squeue", "-h", "-o", "%A %T"], ["squeue", "-h", "-o", "%A %T"]]


@pytest.mark.parametrize("count", [0, -1, 65, 1000])
def test_a_node_count_out_of_range_is_refused_before_anything_starts(tmp_path, capsys, count):
    """`tether sandbox up --nodes N` (issue 46, 4): a clear error, and nothing made or started."""
    from tether.cli.main import main

    root = tmp_path / "box"
    assert main(["sandbox", "up", "--dir", str(root), "--nodes", str(count), "--no-install"]) != 0
    assert f"--nodes {count}: a sandbox has 1 to 64 nodes" in capsys.readouterr().err
    assert not root.exists()


def test_a_sixteen_node_sandbox_has_sixteen_slurmd_on_ports_of_their_own(tmp_path):
    """Its slurm.conf names n1..n16 with one port each, past the registries', slurmdbd's and
    MariaDB's; the count is kept for the next start; the ports it checks before starting are those."""
    import socket

    from tether.sandbox import cluster

    box = cluster.Sandbox(tmp_path, port_base=23000, nodes=16)
    box.etc.mkdir(parents=True)
    box._write_configs(23000)
    conf = (box.etc / "slurm.conf").read_text()
    assert "NodeName=n1 NodeHostname=n1 NodeAddr=127.0.0.2 Port=23010 " in conf     # each node its own host
    assert "NodeName=n16 NodeHostname=n16 NodeAddr=127.0.0.17 Port=23025 " in conf
    assert box._node_hosts() == "".join(f"127.0.0.{i + 1} n{i}\n" for i in range(1, 17))
    assert "PartitionName=debug Nodes=n[1-16] " in conf
    assert box.nodes == tuple(f"n{i}" for i in range(1, 17))
    box.settings_file.write_text('{"nodes": 16}\n')
    assert cluster.Sandbox(tmp_path).node_count == 16                  # as it last ran
    assert cluster.Sandbox(tmp_path / "new").node_count == 3           # a new one
    with socket.socket() as sock:                                      # the 16th slurmd's port taken
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 23025))
        sock.listen()
        assert not cluster._ports_free(23000, 16)
        assert cluster._ports_free(23000, 15)
    with socket.socket() as sock:                                      # taken on the 16th node's address
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.17", 23025))
        sock.listen()
        assert not cluster._ports_free(23000, 16)
        assert cluster._ports_free(23000, 16, separate=False)
        with pytest.raises(cluster.SandboxError, match=r"^ports 23000-23025 on loopback are in use; choose "
                                                       r"another --port-base$"):
            box._choose_ports()                            # asked for: refused before anything starts


def test_sandboxes_on_other_ports_number_their_jobs_apart(tmp_path):
    """Two sandboxes of one release share node names, hence each node's cgroups: jobs of the same id
    on both met in /slurm_n1/uid_<uid>/job_<id> and drained the node. The default ports count from
    1; every other port base elsewhere, below Slurm's MaxJobId (67043328) -- an unaligned base
    (17099) and bases 60 blocks apart too (found in review: the first version mapped both onto
    another's ids)."""
    from tether.sandbox import cluster

    assert cluster.first_job_id(cluster.DEFAULT_PORT_BASE) == 1
    ids = [cluster.first_job_id(base) for base in range(1024, 65536)]
    assert len(set(ids)) == len(ids) and max(ids) < 67043328
    assert cluster.first_job_id(17099) != cluster.first_job_id(17000) != cluster.first_job_id(23000)
    box = cluster.Sandbox(tmp_path, port_base=cluster.DEFAULT_PORT_BASE + 3 * cluster.PORT_BLOCK)
    box.etc.mkdir(parents=True)
    box._write_configs(box.port_base())
    assert "\nFirstJobId=300001\n" in (box.etc / "slurm.conf").read_text()


def test_stopping_slurmctld_stops_one_its_pid_file_does_not_name(tmp_path):
    """Slurm 24.11 re-executes slurmctld on `scontrol reconfigure`; in CI the pid file kept the
    gone parent's PID once, so a restart stopped nothing and the new slurmctld died on its port.
    A process of slurmctld's name holding the sandbox's config is stopped by its PID too; one of
    another name with the same config (a slurmd) is left alone."""
    from tether.sandbox.cluster import Daemon, _stop
    conf = str(tmp_path / "etc" / "slurm.conf")
    for name in ("slurmctld", "slurmd"):
        (tmp_path / name).write_bytes(open("/bin/sleep", "rb").read())
        (tmp_path / name).chmod(0o755)
    ctld = subprocess.Popen([f"slurmctld -f {conf}", "300"], executable=tmp_path / "slurmctld")
    slurmd = subprocess.Popen([f"slurmd -f {conf}", "300"], executable=tmp_path / "slurmd")
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        (tmp_path / "slurmctld.pid").write_text(f"{gone.pid}\n")
        daemon = Daemon("slurmctld", tmp_path / "slurmctld.pid", conf, program="slurmctld")
        assert daemon.pid() is None and daemon.strays() == [ctld.pid]
        assert _stop(daemon) == ctld.pid
        assert ctld.wait(timeout=5) == -15
        assert slurmd.poll() is None
        assert _stop(Daemon("slurmctld", tmp_path / "slurmctld.pid", conf)) is None   # no program: file only
        assert slurmd.poll() is None
    finally:
        for proc in (ctld, slurmd):
            proc.kill()
            proc.wait()
