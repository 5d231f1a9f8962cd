"""The launcher's supervision (tether.container.launch): the runtime as a subreaper's child, signals,
what it waits for and what it reaps, a killed monitor, removals after an abnormal end, its start-up.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from helpers import alive


def test_supervised_runtime_keeps_double_forked_processes_and_forwards_signals(tmp_path):
    """The podman-like path: a 'runtime' that daemonizes a child stays our descendant; SIGTERM to the
    wrapper reaches the runtime and its descendants; the wrapper ends with the runtime's status."""
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        ( ( sleep 30 & echo $! > {tmp_path}/daemon.pid ) & )   # double fork, like conmon
        trap 'echo got-term > {tmp_path}/term; exit 7' TERM
        while :; do sleep 0.1; done
        """))
    runtime.chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-c", _supervised(runtime, tmp_path / "cleaned")])
    deadline = time.monotonic() + 20
    while not (tmp_path / "daemon.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    daemon = int((tmp_path / "daemon.pid").read_text())
    with open(f"/proc/{daemon}/stat") as fh:
        ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
    assert ppid == proc.pid                                  # re-parented to the wrapper, not init
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7
    assert (tmp_path / "term").read_text() == "got-term\n" and (tmp_path / "cleaned").read_text() == "c1"
    # the double-forked 'conmon' got the SIGTERM too: every process below the runtime does, as Slurm
    # signals every process of a step (podman's runc keeps the container's out of Slurm's reach)
    deadline = time.monotonic() + 10
    while alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(daemon)


@pytest.mark.parametrize("record", ["the pause process", "another process"])
def test_the_launcher_never_waits_for_the_runtimes_own_pause_process(tmp_path, record):
    """Issue 46, 6: rootless podman's first command of a user on a node starts its pause process
    (catatonit -P), which outlives the container for the user's later podman commands and -- the
    launcher being a child subreaper -- becomes the launcher's child. The launcher waited its whole
    grace (5 s) for it in every step on a cold node. Now it still waits for the monitor finishing
    (conmon), but not for the pause process podman recorded: it ends that one itself, as the step's
    end would (left there, it cost the step a second of Slurm's). A record that names another
    process (stale: its pid reused) makes nothing the runtime's own."""
    bin_dir, run = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir()
    for name in ("catatonit", "conmon"):          # processes with those command names
        shutil.copy("/bin/sleep", bin_dir / name)
    pause_file = run / "libpod" / "tmp" / "pause.pid"
    recorded = "pause" if record == "the pause process" else "monitor"
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        mkdir -p {pause_file.parent}
        ( setsid {bin_dir}/catatonit 600 </dev/null >/dev/null 2>&1 & echo $! > {tmp_path}/pause )
        ( {bin_dir}/conmon 1 </dev/null >/dev/null 2>&1 & echo $! > {tmp_path}/monitor )
        cp {tmp_path}/{recorded} {pause_file}
        exit 0
        """))
    runtime.chmod(0o755)
    # a grace of 2 s (the launcher's is 5): the monitor's second fits in it, the stale record's
    # pause process outlives it
    code = _supervised(runtime, tmp_path / "removed", monitor="conmon", grace=2.0).replace(
        'monitor=\'conmon\'', f"monitor='conmon', runtime_own=(({str(pause_file)!r}, ('catatonit', 'podman pause')),)")
    try:
        proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TETHER_RUN_TELL_REAPING": "1"},
                              capture_output=True, text=True, timeout=60)
        pause, monitor = (int((tmp_path / name).read_text()) for name in ("pause", "monitor"))
        assert proc.returncode == 0, proc.stderr
        if record == "the pause process":
            said = f"launcher=python reaped=1 runtime_own={pause} ended=1 grace_ran_out=0"
            assert not alive(pause)              # not waited for, but ended: see _end_runtime_own
        else:
            said = "launcher=python reaped=1 runtime_own=none ended=0 grace_ran_out=1"
        assert f"tether-run: after the runtime: {said}\n" in proc.stderr
        assert not alive(monitor)                # the monitor was waited for, and reaped
    finally:
        if (tmp_path / "pause").exists() and alive(int((tmp_path / "pause").read_text())):
            os.kill(int((tmp_path / "pause").read_text()), signal.SIGKILL)


def test_a_pause_process_its_podman_killed_is_not_a_process_of_the_rank_killed(tmp_path):
    """On a cold node the ranks' podmans race to make the pause process; the losers kill theirs,
    which the launcher (a child subreaper) reaps: not a killed process of the rank's, which would
    have stopped the retry of a podman that failed before it made the container."""
    code = textwrap.dedent("""\
        import ctypes, os, time
        from tether.container.launch import _set_subreaper, _wait_for
        from tether.container.runtimes.podman import PAUSE_NAMES
        _set_subreaper()
        child = os.fork()
        if child == 0:                         # 'podman'
            middle = os.fork()
            if middle == 0:                    # which makes the pause process
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:                   # forked from podman: named podman until it execs
                    ctypes.CDLL(None).prctl(15, b"podman", 0, 0, 0)
                    os.write(w, b"x")
                    time.sleep(600)
                os.read(r, 1)
                os.kill(pid, 9)                # lost the race: killed, left to the subreaper
                os._exit(1)
            os.waitpid(middle, 0)
            time.sleep(0.2)                    # podman goes on: the killed one is reaped first
            os._exit(3)
        status, killed = _wait_for(child, set(PAUSE_NAMES))
        print(os.WEXITSTATUS(status), killed)
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout == "3 []\n", proc.stderr


FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.mark.skipif(os.geteuid() != 0 or not FREEZER.is_dir(), reason="needs root and the cgroup v1 freezer")
def test_in_a_slurm_step_signals_go_only_where_slurm_does_not_reach(tmp_path):
    """In a step's freezer cgroup (Slurm's proctrack/cgroup signals every process in it), the
    launcher signals the runtime and the processes a runtime moved into a cgroup of its own -- not
    those Slurm signals itself, which would otherwise get every signal twice."""
    step = FREEZER / f"tether-unit-{os.getpid()}" / "job_1" / "step_0"
    own = step / "runc-like"
    own.mkdir(parents=True)
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        ( ( sleep 30 & echo $! > {tmp_path}/kept.pid ) & )
        ( ( sleep 31 & echo $! > {tmp_path}/moved.pid ) & )
        trap 'exit 7' TERM
        while :; do sleep 0.1; done
        """))
    runtime.chmod(0o755)
    kept = moved = None
    try:
        proc = subprocess.Popen(["sh", "-c", f'echo $$ > {step}/cgroup.procs && exec "$@"', "sh", sys.executable,
                                 "-c", _supervised(runtime, tmp_path / "cleaned", grace=1.0)])
        deadline = time.monotonic() + 20
        # written whole (the shell creates the file before it writes the number)
        while not all((tmp_path / f).exists() and (tmp_path / f).read_text().endswith("\n")
                      for f in ("kept.pid", "moved.pid")) and time.monotonic() < deadline:
            time.sleep(0.05)
        kept, moved = int((tmp_path / "kept.pid").read_text()), int((tmp_path / "moved.pid").read_text())
        (own / "cgroup.procs").write_text(str(moved))             # what podman's runc does
        assert f"{step.relative_to(FREEZER)}" in Path(f"/proc/{kept}/cgroup").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 7                         # the runtime got it
        assert not alive(moved)                                  # out of Slurm's reach: from the launcher
        assert alive(kept)                                       # Slurm's to signal: not twice
    finally:
        for pid in (kept, moved):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        for path in (own, step, step.parent, step.parent.parent):
            while path.exists() and time.monotonic() < deadline:
                try:
                    path.rmdir()
                except OSError:
                    time.sleep(0.05)


def _supervised(runtime: Path, removed: Path, monitor: str | None = None, result: bool = True,
                grace: float | None = None) -> str:
    """Python code that supervises ``runtime`` as the podman adapter's launches are, with a fake
    adapter whose removal writes the container's name into ``removed`` (and answers ``result``);
    ``grace``: the launcher's wait for what the runtime left (GRACE_SECONDS) in seconds."""
    return textwrap.dedent(f"""\
        import os
        import tether.container.launch
        tether.container.launch.GRACE_SECONDS = {grace if grace is not None else "tether.container.launch.GRACE_SECONDS"}
        from tether.container.launch import execute
        from tether.container.runtimes import Launch, Runtime
        class Fake(Runtime):
            name = "fake"
            def remove(self, name, env, *, new_session=True, reap=False):
                open({str(removed)!r}, "w").write(name)
                return {result!r}
        execute(Launch(argv=[{str(runtime)!r}], env=dict(os.environ), supervise=True, runtime=Fake({{}}),
                       container="c1", monitor={monitor!r}))
        """)


@pytest.mark.parametrize("code,removed", [(143, True), (125, True), (3, False), (0, False)])
def test_a_runtime_that_reports_a_killed_container_gets_it_removed(tmp_path, code, removed):
    """Regression (issue 12, soak): at a step's cancel podman run exited 143 before the launcher's own
    SIGTERM arrived, so nothing looked abnormal, the marker went, and conmon -- killed before it
    recorded the exit -- left the container "running" in podman's records."""
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(f"#!/bin/sh\nexit {code}\n")
    runtime.chmod(0o755)
    marker = tmp_path / "removed"
    proc = subprocess.run([sys.executable, "-c", _supervised(runtime, marker, monitor="conmon")], timeout=60)
    assert proc.returncode == code and marker.exists() is removed


@pytest.mark.parametrize("fails", [False, True])
def test_the_cleanup_marker_is_there_while_the_image_is_pulled_or_unpacked(tmp_path, fails):
    """pyxis's unshare_uts.bats "joins existing utsns container": a step that attaches to a named
    container another step is still unpacking waits for it while that step's marker says it is
    coming (running_container); the marker was written only once the unpack was done, so in the
    moment between, the attaching step started a container of its own. Now it is there from
    before the first step of the launch; a failed one takes it away again."""
    marker = tmp_path / "marker"
    seen = tmp_path / "seen"
    step = f"test -f {marker} && echo yes > {seen}; exit {int(fails)}"
    code = textwrap.dedent(f"""\
        import os
        from tether.container.launch import execute
        from tether.container.runtimes import Launch, Runtime
        class Fake(Runtime):
            name = "fake"
            def remove(self, name, env, *, new_session=True, reap=False):
                return True
        execute(Launch(argv=["true"], env=dict(os.environ), supervise=True, runtime=Fake({{}}), container="c1",
                       marker={str(marker)!r}, marker_data={{"container": "c1"}},
                       before=[(["sh", "-c", {step!r}], None, "unpacking")]))
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert seen.read_text() == "yes\n", proc.stderr
    assert proc.returncode == (125 if fails else 0), proc.stderr
    assert not marker.exists()            # removed: after the failed step, or once the run ended


def test_a_supervised_runtime_starts_with_default_signals_and_a_missing_one_is_reported(tmp_path):
    """The launcher spawns the runtime (posix_spawn): the signals it forwards, and SIGPIPE, which
    Python ignores, are at their defaults in the runtime (an ignored SIGPIPE would be inherited by
    everything the runtime execs); a runtime that is not there gets tether's message and 125."""
    seen = tmp_path / "seen"
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(f"#!/bin/sh\ngrep -E '^Sig(Ign|Cgt)' /proc/$$/status > {seen}\n")
    runtime.chmod(0o755)
    proc = subprocess.run([sys.executable, "-c", _supervised(runtime, tmp_path / "removed")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    masks = dict(line.split(":\t") for line in seen.read_text().splitlines())
    assert int(masks["SigIgn"], 16) & (1 << (signal.SIGPIPE - 1)) == 0, masks
    assert int(masks["SigCgt"], 16) & (1 << (signal.SIGTERM - 1)) == 0, masks
    proc = subprocess.run([sys.executable, "-c", _supervised(tmp_path / "no-such-runtime", tmp_path / "removed")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 125, proc.stderr
    assert f"tether: cannot start the container runtime '{tmp_path / 'no-such-runtime'}': No such file" in proc.stderr


def test_a_runtime_run_in_place_starts_with_default_signals(tmp_path):
    """Apptainer/Singularity: the launcher execs the runtime; SIGPIPE and SIGXFSZ, which Python
    ignores, are back at their defaults first (an ignored signal survives exec: ``yes | head``
    in the container would see EPIPE instead of dying of SIGPIPE)."""
    seen = tmp_path / "seen"
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(f"#!/bin/sh\ngrep -E '^SigIgn' /proc/$$/status > {seen}\n")
    runtime.chmod(0o755)
    code = textwrap.dedent(f"""\
        import os
        from tether.container.launch import execute
        from tether.container.runtimes import Launch
        execute(Launch(argv=[{str(runtime)!r}], env=dict(os.environ), supervise=False))
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    ignored = int(seen.read_text().split(":\t")[1], 16)
    assert ignored & (1 << (signal.SIGPIPE - 1)) == 0 and ignored & (1 << (signal.SIGXFSZ - 1)) == 0, hex(ignored)


@pytest.mark.parametrize("make, words", [
    (lambda p: None, "No such file or directory (install it on this node, or set container.fake.binary"),
    (lambda p: p.write_text("#!/bin/sh\n"), "Permission denied (it is not a program you may run: check "
                                             "container.fake.binary"),
    ("e2big", "Argument list too long (its command line and environment, "),
])
@pytest.mark.parametrize("supervise", [False, True])
def test_a_runtime_that_cannot_start_is_reported_with_what_to_do(tmp_path, make, words, supervise):
    runtime = tmp_path / "runtime"
    env = "dict(os.environ)"
    if make == "e2big":
        runtime = Path("/bin/true")
        env = "{**os.environ, **{f'V{i}': 'x' * 100000 for i in range(40)}}"       # 4 MB > ARG_MAX
    else:
        make(runtime)
    code = textwrap.dedent(f"""\
        import os
        from tether.container.launch import execute
        from tether.container.runtimes import Launch, Runtime
        class Fake(Runtime):
            name = "fake"
        execute(Launch(argv=[{str(runtime)!r}], env={env}, supervise={supervise}, runtime=Fake({{}})))
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 125, proc.stderr
    assert f"tether: cannot start the container runtime '{runtime}': {words}" in proc.stderr
    if make == "e2big":
        assert "bytes with " in proc.stderr and "variables, are more than the kernel takes" in proc.stderr


@pytest.mark.parametrize("created", [False, True])
def test_a_run_that_failed_before_creating_its_container_is_tried_again_after_repair(tmp_path, created):
    """A runtime whose own state was stale exits 1 before it creates the container (podman: no
    --cidfile written). The adapter repairs the state and the run is tried once more -- but a run
    that created its container (the user's command ran and exited 1) is never run twice."""
    runs, cid = tmp_path / "runs", tmp_path / "rank-0" / ".cid"     # the rank's own directory
    cid.parent.mkdir()
    runtime = tmp_path / "runtime.sh"
    write_cid = f"echo c1 > {cid}" if created else ":"
    runtime.write_text(f"#!/bin/sh\necho run >> {runs}\n[ -e {tmp_path}/repaired ] && exit 0\n{write_cid}\nexit 1\n")
    runtime.chmod(0o755)
    code = textwrap.dedent(f"""\
        import os
        from tether.container.launch import execute
        from tether.container.runtimes import Launch, Runtime
        class Fake(Runtime):
            name = "fake"
            def recover_state(self, env, output=None):
                open({str(tmp_path / "repaired")!r}, "w").close()
                return True
        execute(Launch(argv=[{str(runtime)!r}], env=dict(os.environ), supervise=True, runtime=Fake({{}}),
                       container="c1", monitor="conmon", created={str(cid)!r}))
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if created:
        assert proc.returncode == 1 and runs.read_text() == "run\n" and not (tmp_path / "repaired").exists()
    else:
        assert proc.returncode == 0 and runs.read_text() == "run\nrun\n", proc.stderr
    assert not cid.exists()


@pytest.mark.parametrize("removal", [True, False])
def test_a_killed_monitor_is_reported_and_its_container_removed(tmp_path, removal):
    """Regression (issue 12): with podman's conmon killed, the rank said "podman could not start the
    container (exit 127)" for a container that had run, and the record stayed. The monitor here is a
    double-forked process named conmon; the 'runtime' exits 127 when it dies, as podman does. When
    the removal fails, the rank no longer says "it was removed" (it did, on podman 5)."""
    conmon = tmp_path / "conmon"
    conmon.symlink_to("/bin/sleep")
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        ( ( exec {conmon} 60 & echo $! > {tmp_path}/conmon.pid ) & )
        while [ ! -s {tmp_path}/conmon.pid ]; do sleep 0.05; done
        pid=$(cat {tmp_path}/conmon.pid)
        # killed once it is conmon and the launcher's, as podman's is (a busy machine: the subshell
        # may not have exec'd it yet, or may still be there to reap it)
        while read -r _ comm _ ppid _ < /proc/$pid/stat; [ "$comm $ppid" != "(conmon) $PPID" ]; do sleep 0.05; done
        kill -9 "$pid"
        sleep 1
        exit 127
        """))
    runtime.chmod(0o755)
    proc = subprocess.run([sys.executable, "-c", _supervised(runtime, tmp_path / "removed", "conmon", removal)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 125, proc.stderr
    # no marker here (run by hand): nothing removes it later, the rank says how to
    said = "it was removed" if removal else "remove it: runtime.sh rm --force c1"
    assert f"the container's conmon was killed (SIGKILL): the container's exit status is lost; {said}" in proc.stderr
    assert "could not start" not in proc.stderr and (tmp_path / "removed").read_text() == "c1"


def test_a_saved_container_is_written_whole_or_not_at_all_and_a_failure_fails_the_rank(tmp_path):
    from tether.container.launch import save_container
    from tether.container.runtimes import Launch

    final, partial = tmp_path / "c.tar", tmp_path / "c.tar.n1.1.partial"
    ok = Launch(argv=[], env=dict(os.environ), finish=([["sh", "-c", f"echo image > {partial}"]], str(partial),
                                                        str(final)))
    assert save_container(ok) and final.read_text() == "image\n" and not partial.exists()
    bad = Launch(argv=[], env=dict(os.environ), finish=([["sh", "-c", f"echo half > {partial}; exit 3"]],
                                                         str(partial), str(tmp_path / "d.tar")))
    assert save_container(bad) is False
    assert not partial.exists() and not (tmp_path / "d.tar").exists()


_MARKER_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(_MARKER_VALUES)
def test_the_markers_json_is_what_json_reads(value):
    from tether.container.launch import json_text

    assert json.loads(json_text(value)) == value


def test_a_supervised_ranks_start_up_imports_neither_re_nor_enum_nor_json():
    """signal.py, re and json each import enum (with functools and collections): milliseconds of
    every rank's start. The launcher's path up to the runtime's exec imports none of them."""
    code = ("import sys\nfrom tether.container.run import handoff\nimport tether.container.runtimes.podman\n"
            "from tether.container.launch import json_text, signal_name\njson_text({'a': ['b', 1, None]})\n"
            "print(' '.join(m for m in ('re', 'enum', 'json', 'signal', 'importlib', 'typing') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-IS", "-c", f"import sys; sys.path[:0] = {sys.path!r}\n{code}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", out


@pytest.mark.parametrize("started", [False, True])
def test_enroot_failing_before_the_command_started_is_told_apart_from_the_workload_exiting_1(tmp_path, started):
    """Issue 45: enroot's own failures inside `enroot start` (enroot-switchroot without /root under
    --container-remap-root, a hook -- real enroot 4.1.2 exits 1 with its message) ended the rank
    with exit 1 and no word, as if the workload had failed. The command's shell now writes a
    started file first (STARTED_PROLOGUE): without it the rank says enroot failed; with it, an
    exit 1 is the workload's own."""
    from tether.container.runtimes.enroot import STARTED_FILE

    work = tmp_path / "rank-0" / "work"
    work.mkdir(parents=True)
    runtime = tmp_path / "enroot"
    body = (f": > {work / STARTED_FILE}\nexit 1\n" if started else
            "echo 'enroot-switchroot: failed to change directory: /root: No such file or directory' >&2\nexit 1\n")
    runtime.write_text("#!/bin/sh\n" + body)
    runtime.chmod(0o755)
    code = textwrap.dedent(f"""\
        import os
        from tether.container.launch import execute
        from tether.container.runtimes import Launch, adapter
        execute(Launch(argv=[{str(runtime)!r}], env=dict(os.environ), supervise=True, runtime=adapter("enroot", {{}}),
                       created={str(work / STARTED_FILE)!r}))
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    said = "tether: enroot exited 1 before the command in the container started: enroot itself failed"
    assert (said in proc.stderr) is not started, proc.stderr


@pytest.mark.parametrize("repairs", [True, False])
def test_a_preparation_step_tether_runs_itself_is_tried_again_after_a_repair(repairs):
    """A named container's unpack (podman create + export) failed once in a full run with podman's
    exit 1 and no word -- the state a killed pause process leaves: the runtime repairs it and the
    step runs once more, as a pull command does; a runtime that finds nothing to repair fails."""
    from tether.container.launch import run_before
    from tether.container.runtimes import Launch, Runtime
    from tether.container.spec import LaunchError

    tries, seen = [], []
    said = 'Error: invalid internal status, try resetting the pause process with "podman system migrate"'

    def unpack(env):
        tries.append(1)
        if len(tries) == 1:
            raise LaunchError("could not unpack: command failed (exit code 1)", said)

    class Fake(Runtime):
        name = "fake"

        def recover_state(self, env, output=None, *, new_session=True):
            seen.append(output)        # what the runtime said goes to its repair
            return repairs

    launch = Launch(argv=["true"], env={}, supervise=True, runtime=Fake({}), before=[(unpack, None, "unpacking")])
    if repairs:
        run_before(launch)
        assert len(tries) == 2 and seen == [said]
    else:
        with pytest.raises(LaunchError, match="could not unpack"):
            run_before(launch)
        assert len(tries) == 1


def test_a_failed_pull_is_tried_once_per_step_and_node(tmp_path):
    """pyxis imports an image once per node for a step: when that fails, every task fails with one
    message (its suite: two tasks, 'failed to import docker image' exactly once). A rank that
    finds the step's record of its pull failing fails at once, without pulling; another step (its
    own directory) tries again."""
    from tether.container.launch import run_before
    from tether.container.runtimes import Launch
    from tether.container.spec import LaunchError

    pulls = tmp_path / "pulls"
    pull = ["sh", "-c", f"echo x >> {pulls}; echo 'Error: manifest unknown' >&2; exit 125"]
    step = [(pull, None, "pulling nosuch (podman)", "failed to import docker image: nosuch")]

    def rank(step_dir):
        step_dir.mkdir(exist_ok=True)
        launch = Launch(argv=["true"], env=dict(os.environ), supervise=True, before=step,
                        lock=str(tmp_path / ".pull-lock"), failures=str(step_dir))
        with pytest.raises(LaunchError) as info:
            run_before(launch)
        return str(info.value)

    first, second = rank(tmp_path / "step-0"), rank(tmp_path / "step-0")
    assert first.startswith("failed to import docker image: nosuch: ") and "manifest unknown" in first, first
    assert second == ("pulling nosuch (podman) failed for another rank of this step on this node (its message "
                      "says why); not tried again"), second
    assert pulls.read_text().count("x") == 1
    assert "failed to import docker image" in rank(tmp_path / "step-1")         # the next step tries again
    assert pulls.read_text().count("x") == 2


def test_a_rank_waiting_for_its_start_turn_lets_the_nodes_other_ranks_take_the_lock(tmp_path):
    """The enroot start turn (StartTurn) waits, with no limit, until the rank before has started
    its command. It runs after the node's lock is let go: held through that wait, it kept the
    node's other ranks from seeing the root made (tether-run waits a second for that lock, then
    handed its rank to this launcher, told 'takes a while')."""
    import fcntl
    import threading

    from tether.container.launch import run_before
    from tether.container.runtimes import Launch
    from tether.container.runtimes.enroot import StartTurn

    made = tmp_path / "made"
    turn, started, node = tmp_path / "start.lock", tmp_path / "started", tmp_path / "node.lock"
    before = [(["touch", str(made)], str(made)), (StartTurn(str(turn), str(started)), None)]
    launch = Launch(argv=["true"], env=dict(os.environ), supervise=True, before=before, lock=str(node))
    other_rank = os.open(turn, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(other_rank, fcntl.LOCK_EX)            # the rank before: its command not started yet
    waiting = threading.Thread(target=run_before, args=(launch,), daemon=True)
    waiting.start()
    try:
        deadline = time.monotonic() + 30
        while not made.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)                               # at its turn's flock by now
        assert waiting.is_alive()
        probe = os.open(node, os.O_RDWR)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)     # BlockingIOError: held through the turn
        finally:
            os.close(probe)
    finally:
        os.close(other_rank)                          # its turn comes
        waiting.join(30)
        started.write_text("")                        # its command ran: the turn is let go
    assert not waiting.is_alive()
