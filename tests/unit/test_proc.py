"""tether.system.proc: ``run_quick`` (the rank launcher's spawn, without the subprocess module)
answers as ``run_command`` does, on real processes: output, exit codes, a missing or unusable
command, the command's own PATH, stdin, a timeout that ends the whole group.
"""

from __future__ import annotations

import os
import time

import pytest

from tether.system.proc import CommandError, run_command, run_quick

RUNNERS = pytest.mark.parametrize("run", [run_command, run_quick], ids=["run_command", "run_quick"])


@RUNNERS
def test_output_and_exit_codes(run):
    done = run(["sh", "-c", "echo out; echo err >&2"])
    assert (done.returncode, done.stdout, done.stderr) == (0, "out\n", "err\n")
    with pytest.raises(CommandError) as failed:
        run(["sh", "-c", "echo why >&2; exit 3"])
    assert (failed.value.kind, failed.value.returncode, failed.value.stderr) == ("exit", 3, "why\n")
    assert "command failed (exit code 3): sh -c" in str(failed.value) and "why" in str(failed.value)
    assert run(["sh", "-c", "exit 4"], check=False).returncode == 4
    assert run(["sh", "-c", "kill -9 $$"], check=False).returncode == -9        # a signal: as subprocess says it
    big = run(["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' x; head -c 200000 /dev/zero | tr '\\0' y >&2"])
    assert (big.stdout, big.stderr) == ("x" * 300000, "y" * 200000)             # both pipes drained, no deadlock


@RUNNERS
def test_a_missing_or_unusable_command_and_the_commands_own_path(run, tmp_path):
    with pytest.raises(CommandError) as missing:
        run(["tether-no-such-command"])
    assert (missing.value.kind, missing.value.returncode) == ("missing", None)
    assert missing.value.reason == "command not found: tether-no-such-command"
    plain = tmp_path / "plain"
    plain.write_text("not a program\n")
    with pytest.raises(CommandError) as unusable:
        run([str(plain)])
    assert unusable.value.kind == "missing" and unusable.value.reason.startswith(f"cannot execute {plain}: ")
    # a bare name is looked up on the PATH of the environment the command gets, not this process's
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin/tether-test-tool"
    tool.write_text("#!/bin/sh\necho \"tool $X\"\n")
    tool.chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "X": "1"}
    assert run(["tether-test-tool"], env=env).stdout == "tool 1\n"
    with pytest.raises(CommandError, match="command not found"):
        run(["tether-test-tool"], env={"PATH": "/usr/bin:/bin"})
    # nor in the working directory: a bare name is never a relative path
    here = os.getcwd()
    try:
        os.chdir(tmp_path / "bin")
        with pytest.raises(CommandError, match="command not found"):
            run(["tether-test-tool"], env={"PATH": "/usr/bin:/bin"})
    finally:
        os.chdir(here)


@RUNNERS
def test_stdin_is_empty_and_a_timeout_ends_the_whole_group(run, tmp_path):
    assert run(["cat"], timeout=10).stdout == ""             # /dev/null: never waits for input
    pid_file = tmp_path / "child"
    started = time.monotonic()
    with pytest.raises(CommandError) as late:
        run(["sh", "-c", f"echo before; sleep 30 & echo $! > {pid_file}; wait"], timeout=1)
    assert late.value.kind == "timeout" and late.value.reason == "timed out after 1 s"
    assert late.value.stdout == "before\n"                 # what it printed before the kill
    assert time.monotonic() - started < 20                 # not the sleep's 30 s
    child = int(pid_file.read_text())
    for _ in range(100):                                   # the background sleep went with its group
        try:
            with open(f"/proc/{child}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the timed-out command's child {child} still runs")


def test_run_quick_replaces_output_that_is_not_utf8_and_leaves_no_descriptor_open(tmp_path):
    assert run_quick(["printf", "a\\377b"]).stdout == "a\ufffdb"
    before = sorted(os.listdir("/proc/self/fd"))
    for _ in range(5):
        run_quick(["true"])
        with pytest.raises(CommandError):
            run_quick(["tether-no-such-command"])
    assert sorted(os.listdir("/proc/self/fd")) == before
