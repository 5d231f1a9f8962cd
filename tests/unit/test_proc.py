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
        run(["sh", "-c", f"echo before; sleep 30 & echo $! > {pid_file}; wait"], timeout=3)
    assert late.value.kind == "timeout" and late.value.reason == "timed out after 3 s"
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


@RUNNERS
def test_the_command_starts_as_subprocess_starts_it(run):
    """Signals Python ignores (SIGPIPE, SIGXFSZ) at their defaults again -- a pipeline in enroot's
    bash ends on SIGPIPE, not 'Broken pipe' and exit 1 -- and none of this process's inheritable
    descriptors (a task's PMI_FD) open in the command."""
    ignored = run(["sh", "-c", "grep SigIgn /proc/self/status"]).stdout.split()[1]
    assert not int(ignored, 16) & ((1 << (13 - 1)) | (1 << (25 - 1))), ignored
    assert run(["sh", "-c", "yes | head -c1 >/dev/null; exit 0"]).returncode == 0
    r, w = os.pipe()
    os.set_inheritable(r, True)                            # inheritable, as PMI_FD is
    os.set_inheritable(w, True)
    try:
        listed = run(["sh", "-c", "ls /proc/self/fd"]).stdout.split()
        assert str(r) not in listed and str(w) not in listed, listed
    finally:
        os.close(r)
        os.close(w)


def test_run_quick_stops_its_command_when_its_caller_stops_waiting(tmp_path):
    """Ctrl-C (an exception) while run_quick waits: the command's whole group is killed at once,
    not waited for (it has a session of its own: the terminal's signal never reached it)."""
    import signal
    import threading

    pid_file = tmp_path / "pid"

    def interrupt() -> None:               # once the command runs (its pid written), Ctrl-C
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGUSR1)

    class Interrupted(Exception):
        pass

    def handler(signum, frame):            # as Python's SIGINT handler raises KeyboardInterrupt
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        started = time.monotonic()
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(Interrupted):
            run_quick(["sh", "-c", f"echo $$ > {pid_file}; sleep 30"], timeout=60)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert time.monotonic() - started < 20                 # not the sleep's 30 s
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):                # reaped: gone
        os.kill(pid, 0)


def test_run_quick_replaces_output_that_is_not_utf8_and_leaves_no_descriptor_open(tmp_path):
    assert run_quick(["printf", "a\\377b"]).stdout == "a\ufffdb"
    plain = tmp_path / "plain"
    plain.write_text("not a program\n")
    before = sorted(os.listdir("/proc/self/fd"))
    for _ in range(3):
        run_quick(["true"])
        for argv, timeout in ((["tether-no-such-command"], 10), ([str(plain)], 10), (["sleep", "30"], 0.2)):
            with pytest.raises(CommandError):
                run_quick(argv, timeout=timeout)
    assert sorted(os.listdir("/proc/self/fd")) == before
