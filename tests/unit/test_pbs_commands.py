"""qstat/pbsnodes/qdel helpers against the shapes real OpenPBS prints (tests/fixtures/pbs, see its
README), through faked commands with the real argv (pytest-subprocess)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.pbs_hooks.commands import PBSCommandError, cancel, job_status, node_status, parse_json

from helpers import REPO

FIXTURES = REPO / "tests" / "fixtures" / "pbs"


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_a_running_job(fp):
    fp.register(["qstat", "-f", "-F", "json", "-x", "4242.pbs-head"], stdout=_text("qstat_running.json"))
    jobs = job_status(["4242.pbs-head"])
    job = jobs["4242.pbs-head"]
    assert (job.name, job.owner, job.state, job.queue, job.exit_status) == ("train", "alice", "running", "gpu", None)
    assert job.hosts == ("gpu07", "gpu12")
    assert job.resources["tether_slots"] == 8 and job.resources["select"] == "2:ngpus=4:ncpus=8"
    assert job.variables["TETHER_CONTAINER_IMAGE"] == "docker://registry.example.org/ml/train:2.1"
    assert job.variables["PBS_NUM_PPN"] == "8"                       # a bare number, read as text


def test_all_jobs_with_history(fp):
    fp.register(["qstat", "-f", "-F", "json", "-x"], stdout=_text("qstat_mixed.json"))
    jobs = job_status()
    assert {j: (s.state, s.exit_status) for j, s in jobs.items()} == {
        "4240.pbs-head": ("finished", 0), "4241.pbs-head": ("finished", 271),
        "4243.pbs-head": ("queued", None), "4244.pbs-head": ("held", None)}
    assert jobs["4243.pbs-head"].comment.startswith("Not Running: Insufficient amount of resource: ngpus")


def test_without_history_no_x(fp):
    fp.register(["qstat", "-f", "-F", "json"], stdout='{"timestamp":1,"pbs_version":"22.05.11","pbs_server":"s"}\n')
    assert job_status(history=False) == {}


def test_values_real_qstat_prints_as_invalid_json_are_read(fp):
    fp.register(["qstat", "-f", "-F", "json", "-x", "53"], stdout=_text("qstat_leading_zero.json"))
    variables = job_status(["53"])["53.pbs-head"].variables
    assert (variables["foo"], variables["RUN_ID"], variables["PBS_NUM_PPN"]) == ("005", "0042", "2")
    doc = parse_json(_text("qstat_old_escapes.json"), "qstat")
    variables = doc["Jobs"]["77.pbs-head"]["Variable_List"]
    assert variables["MYVAR"] == "'\"asads\"'" and variables["LIST"] == "ab,c,d"
    assert variables["PATHLIKE"] == "/home/alice/Mo\\'"


def test_unreadable_output_is_a_clear_error(fp):
    fp.register(["qstat", "-f", "-F", "json", "-x"], stdout='{"Jobs":{"1.s":{"Variable_List":{"BASH_FUNC_x%%":"() {  echo "hi"\n}"}}}}')
    with pytest.raises(PBSCommandError, match="qstat printed output tether cannot read") as err:
        job_status()
    assert err.value.kind == "bad_output" and not err.value.transient


def test_an_unreachable_server_is_transient(fp):
    fp.register(["qstat", "-f", "-F", "json", "-x", "1"], stdout=_text("qstat_unreachable.out"),
                stderr=_text("qstat_unreachable.err"), returncode=255)
    with pytest.raises(PBSCommandError, match="the PBS server cannot be reached") as err:
        job_status(["1"])
    assert err.value.kind == "unreachable" and err.value.transient


def test_unknown_jobs(fp):
    fp.register(["qstat", "-f", "-F", "json", "-x", "99.pbs-head"],
                stdout='{"timestamp":1,"pbs_version":"22.05.11","pbs_server":"pbs-head"}\n',
                stderr="qstat: Unknown Job Id 99.pbs-head\n", returncode=153)
    with pytest.raises(PBSCommandError, match="Unknown Job Id 99.pbs-head") as err:
        job_status(["99.pbs-head"])
    assert err.value.kind == "unknown_job"
    # one known, one unknown: the known one is returned
    fp.register(["qstat", "-f", "-F", "json", "-x", "4242.pbs-head", "99.pbs-head"],
                stdout=_text("qstat_running.json"), stderr="qstat: Unknown Job Id 99.pbs-head\n", returncode=153)
    assert list(job_status(["4242.pbs-head", "99.pbs-head"])) == ["4242.pbs-head"]


def test_a_hanging_qstat_times_out(fp, tmp_path):
    fp.allow_unregistered(True)                           # a real command that hangs
    hanging = tmp_path / "qstat"
    hanging.write_text("#!/bin/sh\nsleep 30\n")
    hanging.chmod(0o755)
    with pytest.raises(PBSCommandError, match="did not answer within 0.5 s") as err:
        job_status(timeout=0.5, qstat=str(hanging))
    assert err.value.kind == "timeout" and err.value.transient


def test_missing_commands_are_named(fp):
    fp.allow_unregistered(True)                           # the real exec fails: ENOENT
    with pytest.raises(PBSCommandError, match="qstat is not available here") as err:
        job_status(qstat="/nonexistent/qstat")
    assert err.value.kind == "missing"


def test_a_client_that_cannot_be_executed_is_named(fp, tmp_path):
    """Not only ENOENT: a file that is no program (ENOEXEC) is "missing" too. The PBS client runs
    its commands through system.proc.run_command, which said so only for ENOENT and EACCES (any
    other OSError escaped as itself)."""
    from tether.system.proc import CommandError, run_command

    fp.allow_unregistered(True)
    broken = tmp_path / "qstat"
    broken.write_bytes(b"\x7fELF not really")
    broken.chmod(0o755)
    with pytest.raises(PBSCommandError, match="qstat is not available here") as err:
        job_status(qstat=str(broken))
    assert err.value.kind == "missing"
    with pytest.raises(CommandError, match="cannot execute") as failed:
        run_command([str(broken)])
    assert failed.value.kind == "missing" and failed.value.returncode is None


def test_output_that_is_not_utf8_is_read_with_the_handler_asked_for(fp, tmp_path):
    """qstat of the release 23.06.06 client prints bytes that are not UTF-8 (é as \\xe9):
    ``errors="replace"`` reads them as U+FFFD, on stdout and stderr, line ends as printed."""
    from tether.system.proc import run_command

    fp.register(["qstat", "-f"], stdout=b'{"V":"caf\xe9"}\r\n', stderr=b"w\xe9\n", returncode=3)
    done = run_command(["qstat", "-f"], check=False, errors="replace")
    assert (done.stdout, done.stderr, done.returncode) == ('{"V":"caf\ufffd"}\r\n', "w\ufffd\n", 3)


def test_nodes(fp):
    fp.register(["pbsnodes", "-a", "-F", "json"], stdout=_text("pbsnodes.json"))
    nodes = node_status()
    assert sorted(nodes) == ["gpu07", "gpu08", "gpu09"]
    assert nodes["gpu07"].jobs == ("4242.pbs-head",) and nodes["gpu07"].states == ("job-busy",)
    assert [n for n, s in nodes.items() if s.usable] == ["gpu07", "gpu08"]
    assert nodes["gpu09"].states == ("down", "offline") and nodes["gpu09"].comment.startswith("node down")
    assert nodes["gpu08"].gpus == 4
    fp.register(["pbsnodes", "-a", "-F", "json"],
                stdout='{"timestamp":0,"pbs_version":"2024.1.2","pbs_server":"s","nodes":{"x":{"Error":"Unknown node "}}}')
    assert node_status() == {}


def test_cancel(fp):
    fp.register(["qdel", "4242.pbs-head"])
    assert cancel("4242.pbs-head") is True
    fp.register(["qdel", "-W", "force", "4240.pbs-head"], stderr="qdel: Job has finished 4240.pbs-head\n",
                returncode=35)
    assert cancel("4240.pbs-head", force=True) is False
    fp.register(["qdel", "99.pbs-head"], stderr="qdel: Unknown Job Id 99.pbs-head\n", returncode=153)
    assert cancel("99.pbs-head") is False
    fp.register(["qdel", "5.pbs-head"], stderr="qdel: Unauthorized Request  5.pbs-head\n", returncode=159)
    with pytest.raises(PBSCommandError, match="qdel 5.pbs-head failed: qdel: Unauthorized Request") as err:
        cancel("5.pbs-head")
    assert err.value.kind == "failed"
