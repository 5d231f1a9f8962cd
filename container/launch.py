"""Run a Launch: exec the runtime in place, or supervise it as a child subreaper.

*Exec in place* (Apptainer, Singularity): the rank's process becomes the runtime, which execs the
workload -- nothing between slurmstepd (or pbs_mom) and the rank.

*Supervise* (Podman, Enroot): the wrapper marks itself a child subreaper (``PR_SET_CHILD_SUBREAPER``)
and starts the runtime as its child (``posix_spawn``). Whatever the runtime double-forks (podman's
conmon and the container's processes) is re-parented to the wrapper instead of init, so it stays in
the step's process tree: Slurm's process tracking signals it, job accounting counts its CPU time,
and it is killed with the step. Signals the wrapper receives are passed on (in a Slurm step's
cgroup to the container's first process, as Slurm signals a host rank's first process; elsewhere to
the runtime and every process below it: see ``_supervise``); when the runtime exits, the ``after``
commands run (e.g. removing a container an abnormal end left behind), the remaining descendants get
a short grace -- all but the runtime's own (``Launch.runtime_own``: rootless podman's pause process,
made to outlive every container for the user's later podman commands), which are ended instead of
waited for -- and the wrapper ends as the runtime did (same exit code, or the same signal).

Errors before the runtime starts are printed as ``tether: ...`` on stderr (the job's output) and
sent to syslog for the admin; the runtime's own errors reach the job's stderr unchanged.
"""

from __future__ import annotations

import errno
import fcntl
import os
import _signal as signal   # the C module signal.py wraps: signal.py imports enum, ~6 ms of each rank's start
import stat                # os imports it: free
import sys
import time
TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

from ..hooks.layout import FAILED_PREFIX
from ..hooks.surface import TELL_REAPING_VAR   # the tests' question: what the launcher waited for
from ..system.dirstamp import DirStamp
from .spec import LaunchError, sha256_hex

if TYPE_CHECKING:
    from typing import Mapping, NoReturn

    from .runtimes import Launch

EXIT_LAUNCH_FAILED = 125          # as podman/docker: the container could not be started
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
# Under Slurm every process of the step gets signals straight from slurmstepd anyway; forwarding
# matters when tether runs under pbs_tmrsh or by hand. SIGCONT is not forwarded: the runtime gets
# its own, and podman would report the duplicate as an error.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGALRM)
GRACE_SECONDS = 5.0


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9 (what ``signal.Signals(n).name`` says, without importing enum)."""
    for name in ("HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV", "USR2",
                 "PIPE", "ALRM", "TERM", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU", "XCPU", "XFSZ", "SYS"):
        if getattr(signal, f"SIG{name}", None) == signum:
            return f"SIG{name}"
    return f"signal {signum}"


def report(message: str) -> None:
    """Tell the user (stderr: the job's output) and the admin (syslog)."""
    for line in message.splitlines() or [""]:
        print(f"tether: {line}", file=sys.stderr, flush=True)
    report_admin(message)


def progress(message: str) -> None:
    """A progress line for the user only (stderr: the job's output); not an error, not syslogged."""
    print(f"tether: {message}", file=sys.stderr, flush=True)


def report_admin(message: str) -> None:
    """The system log (what the admin reads), tagged tether-run, with the user's uid."""
    try:
        import syslog

        syslog.openlog("tether-run", syslog.LOG_PID, syslog.LOG_USER)
        for line in message.splitlines() or [""]:
            syslog.syslog(syslog.LOG_ERR, f"uid {os.getuid()}: {line}")
    except OSError:
        pass


def run_before(launch: Launch, *, ahead: bool = False) -> None:
    """The preparation steps (image pull or import, container creation), under the launch's lock:
    the ranks of a node wait for the first one's pull instead of pulling too (a rank that waits
    says so), and a labelled step reports when it starts and how long it took. A step with a
    failure's wording (``(argv, done, label, failure)``: a pull or an import) that fails leaves a
    record in ``Launch.failures`` -- every other rank of the step on the node then fails at once
    -- and its command's failure is told in those words. A fifth element, seconds: the step is
    told only once it has taken that long (enroot create of a small image: pyxis says nothing).
    ``ahead``: this rank's C launcher started the first step, under the lock, before this launcher
    (tether_run.c: create_ahead): its wait is told as the step itself, and a step it left undone
    (it failed, or was killed) runs here as usual -- the failure told in this launcher's words."""
    if not launch.before:
        return

    def done(check) -> bool:
        if check is None:
            return False
        if isinstance(check, str):
            return os.path.exists(check)
        if isinstance(check, tuple):      # (a quick look, the command that decides when it says no)
            return bool(check[0]()) or done(check[1])
        # a command only now (a warm start runs none), spawned without the subprocess module
        from ..system.proc import CommandError, run_quick

        try:
            run_quick(check, env=launch.env, timeout=120)
        except CommandError as exc:
            # a check that failed because the runtime's state is stale says nothing: repair, ask again
            if launch.runtime is None or not launch.runtime.recover_state(launch.env, exc.stderr or ""):
                return False
            return done(check)
        return True

    lock_fd, told_first = None, False
    if launch.lock:
        os.makedirs(os.path.dirname(launch.lock), mode=0o700, exist_ok=True)
        lock_fd = os.open(launch.lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # the wait for a step told only when slow (a quick enroot create) is told when it is
            pending = [step for step in launch.before if len(step) > 2 and not done(step[1])]
            # the rank's own step, started by its C launcher: told as the step, with its end
            own = ahead and bool(pending) and pending[0] is launch.before[0]
            wait = "{} ..." if own else "waiting for another rank on this node: {}"
            stop = (say_later(wait.format(pending[0][2]), _quiet_time(pending[0])) if pending else None)
            started = time.monotonic()
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            finally:
                said = stop() if stop else False
            if own and said and done(pending[0][1]):
                progress(f"{pending[0][2]}: done in {time.monotonic() - started:.1f} s")
            told_first = own and said      # its "..." said once: not again when it runs here
    try:
        for step in launch.before:
            argv, check = step[0], step[1]
            label = step[2] if len(step) > 2 else None
            if done(check):
                continue
            if getattr(argv, "outside_lock", False) and lock_fd is not None:
                os.close(lock_fd)     # the steps before it are done: the node's other ranks may look
                lock_fd = None
            if isinstance(check, str):
                try:
                    os.makedirs(os.path.dirname(check), mode=0o700, exist_ok=True)
                except OSError as exc:       # something not the user's in the way: said, not a crash
                    raise LaunchError(f"cannot make {os.path.dirname(check)}: {exc.strerror}") from None
            from ..system.proc import CommandError

            # a step with a failure's wording (an image's pull or import) is tried once per step
            # and node: a rank that finds the record another one left fails at once
            failure = step[3] if len(step) > 3 else None
            record = _failure_record(launch, label) if failure else None
            if record and os.path.lexists(record):
                raise LaunchError(f"{label} failed for another rank of this step on this node (its message says "
                                  f"why); not tried again")
            started = time.monotonic()
            if told_first and step is launch.before[0]:
                told = lambda: True           # noqa: E731 (its end is told as any step's)
            else:
                told = say_later(f"{label} ...", _quiet_time(step)) if label else None
            try:
                if callable(argv):       # a step tether runs itself (a rootfs import: tar | podman)
                    try:
                        argv(launch.env)
                    except LaunchError as exc:
                        # as for a command: a runtime whose state was stale (podman 4.3 says so,
                        # or exits 1 without a word after its pause process was killed) is
                        # repaired, once
                        if launch.runtime is None or not launch.runtime.recover_state(launch.env, exc.output):
                            raise
                        argv(launch.env)
                else:
                    run_recovering(launch.runtime, argv, launch.env)
            except CommandError as exc:
                if record:
                    _record_failure(record, str(exc))
                raise LaunchError(f"{failure}: {exc}" if failure else str(exc)) from None
            except LaunchError as exc:
                if record:
                    _record_failure(record, str(exc))
                raise
            finally:
                said = told() if told else False      # never a late "..." line after the step
            if said:
                progress(f"{label}: done in {time.monotonic() - started:.1f} s")
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


def _quiet_time(step: tuple) -> float:
    """A preparation step's quiet time (its fifth element; 0: told at once)."""
    return step[4] if len(step) > 4 else 0


def start_thread(function) -> None:
    """Run ``function()`` in a daemon thread with every signal blocked in it: the launcher's
    signals (the SIGCHLD it waits for with sigtimedwait, those it forwards to the container) stay
    the main thread's -- one delivered to a sleeping thread would be lost. ``_thread``, not
    threading: threading.py imports functools and collections, ~8 ms of each rank's start."""
    import _thread

    old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        _thread.start_new_thread(function, ())   # the new thread inherits the mask
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def say_later(message: str, after: float):
    """Say ``message`` now, or once ``after`` seconds have passed (a thread: see start_thread).
    Returns stop(): called once, it ends the wait (and the thread, at once) and says whether the
    message was said; nothing is said after it returns."""
    if after <= 0:
        progress(message)
        return lambda: True
    import _thread

    wake, ended, guard = _thread.allocate_lock(), _thread.allocate_lock(), _thread.allocate_lock()
    wake.acquire()
    ended.acquire()
    state = {"said": False, "over": False}

    def later() -> None:
        try:
            wake.acquire(timeout=after)          # released by stop(): over at once
            with guard:
                if not state["over"]:
                    progress(message)
                    state["said"] = True
        finally:
            ended.release()

    start_thread(later)

    def stop() -> bool:
        with guard:
            state["over"] = True
        wake.release()
        ended.acquire()                          # the thread has ended
        return state["said"]
    return stop


def run_recovering(runtime, argv: list[str], env: Mapping[str, str], timeout: float = 3600):
    """``run_quick`` (run_command without the subprocess module), and once more when it failed
    because ``runtime``'s state was stale and the runtime repaired it (see
    Runtime.recover_state); its result."""
    from ..system.proc import CommandError, run_quick

    try:
        return run_quick(argv, env=env, timeout=timeout)
    except CommandError as exc:
        if runtime is None or not runtime.recover_state(env, exc.stderr or ""):
            raise
        return run_quick(argv, env=env, timeout=timeout)


def _failure_record(launch: Launch, label: str | None) -> str | None:
    """Where a labelled preparation step's failure is recorded for the step's other ranks on
    this node (``Launch.failures``), or None: one file per label (its hash: a label names an
    image, any length)."""
    if not launch.failures or not label:
        return None
    return os.path.join(launch.failures, FAILED_PREFIX + sha256_hex(label)[:16])


def _record_failure(record: str, message: str) -> None:
    """Leave the record (the message, for whoever looks): best effort -- without it the next
    rank only tries again."""
    from ..system.files import write_atomic

    try:
        write_atomic(record, message[:4000] + "\n", 0o600)
    except OSError:
        pass


def _decimal(text: str) -> bool:
    """What C's %d prints: ASCII digits with an optional minus -- not all that int() takes ("1_0",
    " 1", "+1", other scripts' digits)."""
    digits = text[1:] if text.startswith("-") else text
    return 0 < len(digits) <= 10 and all("0" <= c <= "9" for c in digits)


RESUMED_RUNTIMES = ("podman", "enroot")      # what the C rank launcher runs itself


def parse_resume(text: str) -> tuple[int, bool | None, list[int], list[tuple[str, int]], str] | None:
    """What the C rank launcher (container/tether_run.c) hands over after a run it did not conclude
    itself: ``status;written;received;monitor signal;others killed;runtime`` -- the runtime's wait
    status, whether it wrote the id file (1, 0, -1: unknown), the signals forwarded
    (comma-separated), the signal that killed the monitor (conmon; 0: none), how many other
    processes a signal killed, the runtime it ran. None when ``text`` is not that."""
    parts = text.split(";")
    if len(parts) != 6 or len(text) > 160 or parts[5] not in RESUMED_RUNTIMES:     # the C side's buffer
        return None
    signals = parts[2].split(",") if parts[2] else []
    if not all(_decimal(p) for p in (parts[0], parts[1], parts[3], parts[4], *signals)):
        return None
    status, written, monitor, others = int(parts[0]), int(parts[1]), int(parts[3]), int(parts[4])
    received = [int(s) for s in signals]
    if not 0 <= status <= 0xffff or written not in (-1, 0, 1) or not 0 <= monitor <= 64 or others < 0 \
            or not all(1 <= s <= 64 for s in received):
        return None
    killed = [("conmon", monitor)] * bool(monitor) + [("", signal.SIGKILL)] * min(others, 64)
    return status, None if written < 0 else bool(written), received, killed, parts[5]


def execute(launch: Launch, *, subreaper: bool = False, resume: str | None = None, ahead: bool = False) -> NoReturn:
    """Run the launch; never returns (execs, or exits with the runtime's status). ``subreaper``:
    this process is a child subreaper already (the SPANK plugin sets it before the launcher runs).
    ``resume``: the C rank launcher ran this launch and hands over its conclusion (parse_resume);
    ``ahead``: it started the first preparation step (run_before)."""
    first = parse_resume(resume) if resume else None
    # what the C launcher runs: this runtime (the config may have changed since), no preparation
    # step but those it knows (the enroot rank's create and start turn), nothing after or to save
    theirs = (first is not None and launch.runtime is not None and launch.runtime.name == first[4]
              and all(getattr(step[0], "rank_launcher_runs", False) for step in launch.before)
              and not launch.after and launch.finish is None)
    if resume and (not theirs or not launch.supervise or launch.prepare is not None):
        report(f"internal error: the rank launcher handed over a run this launcher would not have made "
               f"({resume[:80]!r}); its container, if any, is removed at the step's end")
        os._exit(EXIT_LAUNCH_FAILED)
    # the cleanup marker of a supervised container, before its pull or unpack: a step that attaches
    # to this container by its name (running_container) sees it coming and waits
    marked = bool(launch.supervise and launch.marker and launch.container)
    if marked:
        write_marker(launch.marker, launch.marker_data or {})
    try:
        if first is None:
            run_before(launch, ahead=ahead)
            if launch.prepare is not None:
                launch.argv = launch.prepare(launch.argv)
    except (LaunchError, OSError, ValueError) as exc:
        report(str(exc))
        if marked:
            remove_file(launch.marker)
        os._exit(EXIT_LAUNCH_FAILED)
    if not launch.supervise:
        _exec(launch)
    code = _supervise(launch, subreaper, first[:4] if first else None)
    # out at once: the interpreter's teardown would cost the rank's end milliseconds for nothing
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _exec(launch: Launch) -> NoReturn:
    """Become the runtime (Apptainer/Singularity): launch.fds passed, and the signals Python
    ignores (SIGPIPE, SIGXFSZ) back at their defaults first -- an ignored signal survives exec and
    would be inherited by the workload."""
    try:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        for source, target in (launch.fds or {}).items():
            if source != target:
                os.dup2(source, target)         # inheritable: the runtime gets it
            else:
                os.set_inheritable(target, True)
        os.execvpe(launch.argv[0], launch.argv, launch.env)
    except OSError as exc:
        if exc.filename is None:   # dup2
            report(f"cannot pass file descriptors {launch.fds} to the container runtime: {exc.strerror}")
            os._exit(EXIT_LAUNCH_FAILED)
        _report_not_started(launch, exc)
        os._exit(EXIT_LAUNCH_FAILED)


def _set_subreaper(on: bool = True) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def run_outside_rank(argv: list[str], env: Mapping[str, str], timeout: float) -> None:
    """Run ``argv`` so that what it leaves running (a pod's infra container: conmon, catatonit)
    is not this rank's: this launcher is no child subreaper meanwhile, so those processes go to
    the step's (slurmstepd) -- this rank's end neither waits for them nor ends them, and the
    step's end still does. Before the rank's own container runs: no orphan of its own is lost."""
    from ..system.proc import run_command

    was = _is_subreaper()
    if was:
        _set_subreaper(False)
    try:
        run_command(argv, env=env, timeout=timeout)
    finally:
        if was:
            _set_subreaper(True)


def _is_subreaper() -> bool:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    flag = ctypes.c_int(0)
    return libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and bool(flag.value)


def _supervise(launch: Launch, subreaper: bool, first=None) -> int:
    """Fork the runtime as a child subreaper's child, forward signals, wait, clean up; its status.
    ``first``: the first run happened already, in the C rank launcher (parse_resume's facts).
    Its cleanup marker is written already (execute)."""
    if not subreaper:
        _set_subreaper()
    received: list[int] = []
    children: list[int] = []

    tracked = slurm_tracked_cgroup()

    def forward(signum, frame):
        received.append(signum)
        below = [p for p in _descendants(os.getpid()) if p not in children]
        if tracked is None:
            # process-tree tracking (proctrack/linuxproc), PBS: the runtime and everything below it
            targets = children + below
        else:
            # In a Slurm step's cgroup, as for a host rank: proctrack/cgroup sends a signal other
            # than SIGKILL to the step's tasks only -- here this launcher -- and SIGKILL to every
            # process in the step's freezer cgroup (the container's too, kept there by the SPANK
            # plugin: spank/cgkeeper.c). So the signal goes to what the task would be on the host,
            # the container's first process (the monitor's child); to the runtime while there is
            # no container yet (podman run itself, on SIGTERM, ends and takes the container with
            # it); and to any process a runtime moved out of Slurm's reach.
            first = _children_of(below, launch.monitor) if launch.monitor else []
            targets = (first or children) + [p for p in below if p not in first and freezer_cgroup(p) != tracked]
        for pid in targets:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    for sig in FORWARDED:            # before fork: a signal in between is not lost (nor fatal)
        signal.signal(sig, forward)
    if first is None:
        status, killed, written = _run_child(launch, children, received)
    else:
        status, written, received[:], killed = first
    if _never_started(launch, status, received, killed, written) and launch.runtime.recover_state(launch.env):
        # the runtime failed before it created the container (its own state was stale): nothing
        # of the user's ran, so one more try is safe
        children.clear()
        status, killed, written = _run_child(launch, children, received)
    not_created = _never_started(launch, status, received, killed, written)
    if launch.created:
        remove_file(launch.created)
    monitor_killed = next((sig for name, sig in killed if name == launch.monitor), None)
    # abnormal: the runtime or its monitor died by a signal, this launcher got one -- or the
    # runtime says its container died by one (128+N) or could not start (125-127). At a step's
    # cancel Slurm signals the step's processes one by one: podman run may exit 143 before this
    # launcher's SIGTERM arrives, and conmon be killed before it records the exit; the container
    # then stays "running" in podman's records (1 in 100 jobs of the soak test). Removal is
    # idempotent and checked, so removing whenever the exit looks like this costs little.
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    abnormal = (os.WIFSIGNALED(status) or bool(received) or monitor_killed is not None
                or (launch.monitor is not None and code is not None and code >= 125))
    saved = None
    if launch.finish and not abnormal and os.WIFEXITED(status):
        saved = save_container(launch)
    cleaned = all([_run_quietly(argv, launch.env) for argv in launch.after])
    removed = True
    if abnormal and launch.container:
        removed = launch.runtime.remove(launch.container, launch.env, reap=True)
        cleaned = removed and cleaned
    if launch.marker and cleaned:
        remove_file(launch.marker)
    reaped, left, ran_out = _reap_descendants(GRACE_SECONDS, lambda: runtime_own(launch.runtime_own))
    ended = _end_runtime_own(left)
    if os.environ.get(TELL_REAPING_VAR):
        tell_reaping("python", reaped, left, ended, ran_out)
    code = _outcome(launch, status, monitor_killed, not_created, removed=removed)
    return EXIT_LAUNCH_FAILED if saved is False and code == 0 else code


def save_container(launch: Launch) -> bool:
    """--container-save: write the container to a file of this rank's own, then rename it into
    place (never a half-written file at the path; nodes saving to one shared path: the last
    one wins, whole). Tells the user where it went, or why not."""
    from ..system.proc import CommandError, run_quick

    steps, partial, final = launch.finish
    started = time.monotonic()
    progress(f"saving the container to {final} ...")
    try:
        for argv in steps:
            if callable(argv):       # a step tether runs itself (podman: the OCI archive)
                argv(launch.env)
            else:
                run_quick(argv, env=launch.env, timeout=3600)
        os.rename(partial, final)
    except (CommandError, LaunchError, OSError) as exc:
        said = exc.strerror if isinstance(exc, OSError) else str(exc)
        report(f"--container-save: could not save the container to {final}: {said}")
        try:
            remove_file(partial)
        except OSError:
            pass
        return False
    progress(f"saved the container to {final} in {time.monotonic() - started:.1f} s")
    return True


def _never_started(launch: Launch, status: int, received: list[int], killed: list, written: bool | None) -> bool:
    """Did the runtime fail (exit 1 or 125+) without creating the container, unsignalled? Only when
    it is certain: the id file (``--cidfile``) was never made -- podman 5 removes it again with
    the container (``--rm``), so that it is gone says nothing; its directory's timestamps say
    whether it was there (system.dirstamp) -- and is not there."""
    return (launch.created is not None and launch.runtime is not None and not received and not killed
            and os.WIFEXITED(status) and os.WEXITSTATUS(status) in (1, 125, 126, 127)
            and written is False and not os.path.exists(launch.created))


def _run_child(launch: Launch, children: list[int],
               received: list[int]) -> tuple[int, list[tuple[str, int]], bool | None]:
    """Fork and exec the runtime, pass it the signals that came before it existed, wait for it;
    (its status, what was killed, whether it wrote the id file: see _never_started)."""
    if not launch.created:
        return (*_start_and_wait(launch, children, received), None)
    remove_file(launch.created)          # podman refuses to overwrite a --cidfile
    stamp = DirStamp(os.path.dirname(launch.created))
    status, killed = _start_and_wait(launch, children, received)
    return status, killed, True if os.path.exists(launch.created) else stamp.changed()


def _start_and_wait(launch: Launch, children: list[int], received: list[int]) -> tuple[int, list[tuple[str, int]]]:
    """Start the runtime (posix_spawn: no copy of this interpreter's memory, no Python in the child;
    a fork cost each rank ~2 ms of CPU more), pass it the signals that came before it existed, wait
    for it. A runtime that cannot be started ends as it did when the child said so: exit 125."""
    try:
        child = _spawn(launch)
    except OSError as exc:
        _report_not_started(launch, exc)
        return EXIT_LAUNCH_FAILED << 8, []
    children.append(child)
    for signum in list(received):    # arrived before the runtime existed: it gets them now
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass
    return _wait_for(child, {name for _, names in launch.runtime_own for name in names})


def _spawn(launch: Launch) -> int:
    """The runtime as a child: launch.fds passed (dup'ed, inheritable), the forwarded signals (and
    those Python ignores, SIGPIPE and SIGXFSZ) at their defaults, as after exec from a fork."""
    actions = []
    for source, target in (launch.fds or {}).items():
        if source != target:
            actions.append((os.POSIX_SPAWN_DUP2, source, target))   # dup2: inheritable
        else:
            os.set_inheritable(target, True)
    return os.posix_spawnp(launch.argv[0], launch.argv, launch.env, file_actions=actions,
                           setsigdef=(*FORWARDED, signal.SIGPIPE, signal.SIGXFSZ))


def _report_not_started(launch: Launch, exc: OSError) -> None:
    """Why exec of the runtime failed, with what to do about that cause."""
    name = launch.runtime.name if launch.runtime is not None else os.path.basename(launch.argv[0])
    if exc.errno == errno.ENOENT:
        hint = f" (install it on this node, or set container.{name}.binary in tether's config)"
    elif exc.errno in (errno.EACCES, errno.ENOEXEC):
        hint = f" (it is not a program you may run: check container.{name}.binary in tether's config)"
    elif exc.errno == errno.E2BIG:
        size = sum(len(a) + 1 for a in launch.argv) + sum(len(k) + len(v) + 2 for k, v in launch.env.items())
        hint = (f" (its command line and environment, {size} bytes with {len(launch.env)} variables, are more than "
                f"the kernel takes: pass fewer variables into the container, or shorter ones)")
    else:
        hint = ""
    report(f"cannot start the container runtime {launch.argv[0]!r}: {exc.strerror}{hint}")


def _outcome(launch: Launch, status: int, monitor_killed: int | None, not_created: bool = False, *,
             removed: bool = True) -> int:
    """End as the runtime did (the same signal, or its exit code) and say what a user must know
    (``removed``: whether the container of an abnormal end is gone)."""
    if monitor_killed is not None:
        left = ("tether removes it when the step ends" if launch.marker else
                f"remove it: {os.path.basename(launch.argv[0])} rm --force {launch.container}")
        report(f"the container's {launch.monitor} was killed ({signal_name(monitor_killed)}): the "
               f"container's exit status is lost; " + ("it was removed" if removed else left))
        return EXIT_LAUNCH_FAILED
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    code = os.WEXITSTATUS(status)
    if code in (125, 126, 127) and launch.monitor:
        report(f"{os.path.basename(launch.argv[0])} could not start the container (exit {code}); its "
               f"message is above")
    elif not_created:
        report(launch.runtime.not_started(code))
    return code


def _comm(pid: int) -> str:
    """A process's command name (a zombie's too), or ''."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _wait_for(child: int, runtime_own: set[str] = frozenset()) -> tuple[int, list[tuple[str, int]]]:
    """Wait for ``child``, reaping re-parented descendants meanwhile: its raw wait status, and the
    (name, signal) of every descendant reaped on the way that a signal killed (a conmon killed
    under a running rank is seen here: it was re-parented to this subreaper) -- but for the
    runtime's own processes (by name, ``runtime_own``: a podman that lost the race to make the
    pause process kills its own)."""
    killed: list[tuple[str, int]] = []
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)   # look before reaping: its name
        except ChildProcessError:
            return 0, killed
        name = _comm(info.si_pid)
        try:
            pid, status = os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            continue
        if pid == child:
            return status, killed
        if os.WIFSIGNALED(status) and name not in runtime_own:
            killed.append((name, os.WTERMSIG(status)))


def _children_of(pids: list[int], name: str) -> list[int]:
    """The children of the processes in ``pids`` whose command name is ``name`` (e.g. conmon's)."""
    found: list[int] = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm", encoding="ascii", errors="replace") as fh:
                if fh.read().strip() != name:
                    continue
        except OSError:
            continue
        found += _children(pid)
    return found


def cgroup_paths(text: str) -> dict[str, str]:
    """cgroup v1 controller -> path, from the text of a ``/proc/<pid>/cgroup``."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


def freezer_cgroup(pid: int | str = "self") -> str | None:
    """The cgroup v1 freezer path of ``pid`` (None: none, or gone)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as fh:
            return cgroup_paths(fh.read()).get("freezer")
    except OSError:
        return None


def slurm_tracked_cgroup() -> str | None:
    """This process's freezer cgroup when it is a Slurm step's (``.../job_<id>/step_<id>``: Slurm's
    proctrack/cgroup signals every process in it), else None."""
    path = freezer_cgroup()
    if path is None:
        return None
    parts = path.split("/")
    return path if any(a.startswith("job_") and b.startswith("step_") for a, b in zip(parts, parts[1:])) else None


def _children(pid: int) -> list[int]:
    """The children of ``pid`` (``/proc/<pid>/task/<tid>/children``, every thread's)."""
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as fh:
                kids += [int(k) for k in fh.read().split() if int(k) not in kids]
        except (OSError, ValueError):
            continue
    return kids


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, nearest first."""
    found: list[int] = []
    queue = [pid]
    while queue:
        for kid in _children(queue.pop(0)):
            if kid not in found:
                found.append(kid)
                queue.append(kid)
    return found


def reap_zombies(keep: int = 0) -> int:
    """Reap this process's children that have ended, without waiting, but for ``keep`` (a command
    whose status its caller collects); how many. A killed container's processes are this
    launcher's children (a subreaper) once their conmon is gone, and stay zombies until reaped --
    which podman 5's ``rm`` waits for ("given PID did not die within timeout"). Only for a process
    that waits for no other child (the launcher after its runtime's end)."""
    reaped = 0
    while True:
        try:         # look first (WNOWAIT): ``keep``'s status is its caller's to take
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None or info.si_pid == keep:
            return reaped
        try:
            os.waitpid(info.si_pid, 0)
            reaped += 1
        except ChildProcessError:
            return reaped


def _reap_descendants(grace: float, runtime_own=frozenset) -> tuple[int, list[int], bool]:
    """Reap what the runtime left (conmon finishing its cleanup, the container's removal) until
    nothing is left but the runtime's own processes (``runtime_own()``: podman's pause process,
    which would live on for the user's later podman commands: see _end_runtime_own), for at most
    ``grace`` seconds; anything still there after that is the step's to kill. (How many
    were reaped, the runtime's own processes left running, whether the grace ran out.)"""
    reaped, mine, hung_up = 0, os.getpid(), frozenset()
    deadline = time.monotonic() + grace
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})   # an exit between look and wait is kept
    try:
        while True:
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    reaped += 1
            except ChildProcessError:
                return reaped, [], False
            children = _children(mine)
            own = runtime_own() if children else ()
            if all(pid in own for pid in children):
                return reaped, sorted(children), False
            hung_up = _hang_up_orphans(children, hung_up)
            left = deadline - time.monotonic()
            if left <= 0 or signal.sigtimedwait({signal.SIGCHLD}, left) is None:
                return reaped, sorted(pid for pid in _children(mine) if pid in own), True
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})


def _hang_up_orphans(children: list[int], done: frozenset = frozenset()) -> frozenset:
    """Do for the stopped orphans this launcher inherited what the kernel does for an orphaned
    process group (POSIX): SIGHUP, then SIGCONT, to each stopped one's group (not one in
    ``done``); the groups signalled, ``done`` included. A child subreaper inherits the
    orphans its runtime leaves, and a group whose members' parent is in the same session is never
    orphaned, so the kernel stays silent: enroot's fuse shim (runtime.sh: it stops itself and
    waits for the SIGHUP of its orphaned group to unmount an image started as a file) would stay
    stopped, holding squashfuse, until the step's end killed it."""
    session = os.getsid(0)
    groups = set(done)
    for pid in children:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            state, pgid, sid = fields[0], int(fields[2]), int(fields[3])
        except (OSError, IndexError, ValueError):
            continue
        # only a group the orphan leads itself (as enroot's shim, a `set -m` subshell), in this
        # launcher's session: never another rank's group a process of the user joined
        if state in ("T", "t") and pgid == pid and sid == session and pgid not in groups:
            groups.add(pgid)
            for sig in (signal.SIGHUP, signal.SIGCONT):
                try:
                    os.killpg(pgid, sig)
                except OSError:
                    pass
    return frozenset(groups)


def _end_runtime_own(pids: list[int], bound: float = 1.0) -> int:
    """End the runtime's own processes this launcher was left with (podman's pause process, made by
    this rank's podman, which the step's end would kill anyway): SIGKILL, reaped within ``bound``
    seconds. Left to the step's end, Slurm's proctrack/cgroup finds a process in the step after
    its tasks, SIGKILLs it and looks again only a second later -- a second every step on a cold node
    paid. Podman commands that joined its user namespace keep it; a later one makes a new pause
    process. How many were reaped."""
    if not pids:
        return 0
    pending, deadline = set(pids), time.monotonic() + bound
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while True:
            for pid in list(pending):
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        pending.discard(pid)
                except ChildProcessError:
                    pending.discard(pid)
            left = deadline - time.monotonic()
            if not pending or left <= 0 or signal.sigtimedwait({signal.SIGCHLD}, left) is None:
                return len(pids) - len(pending)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})


def tell_reaping(launcher: str, reaped: int, left: list[int], ended: int, ran_out: bool) -> None:
    """The answer to TETHER_RUN_TELL_REAPING, on stderr, as tether_run.c writes it: how many
    processes were reaped after the runtime, the runtime's own it did not wait for, how many of
    those it ended, whether the grace ran out."""
    print(f"tether-run: after the runtime: launcher={launcher} reaped={reaped} "
          f"runtime_own={','.join(map(str, left)) or 'none'} ended={ended} grace_ran_out={int(ran_out)}",
          file=sys.stderr, flush=True)


def runtime_own(kept) -> frozenset[int]:
    """The processes the runtime keeps for itself (Launch.runtime_own: (pid file, command names)
    pairs) that are alive now: the pid its file records, when that process has one of the names --
    a stale record whose pid went to another process names nothing."""
    found = set()
    for path, names in kept:
        pid = _pid_in(path)
        if pid and _comm(pid) in names:
            found.add(pid)
    return frozenset(found)


def _pid_in(path: str) -> int | None:
    """The pid a runtime's pid file holds (decimal digits, a newline at most), or None. Never
    blocks (a FIFO there is not read) and never follows a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, 32).decode("ascii", "replace").rstrip("\n")
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(text) if 0 < len(text) <= 10 and all("0" <= c <= "9" for c in text) else None


def _run_quietly(argv, env: dict[str, str], *, tell: bool = True) -> bool:
    """One of Launch.after: a command, or a callable(env) tether runs itself (True: done)."""
    from ..system.proc import CommandError, run_quick

    if callable(argv):
        try:
            return bool(argv(env))
        except (LaunchError, OSError) as exc:
            if tell:
                report(f"cleanup failed: {exc}")
            return False

    try:
        run_quick(argv, env=env, timeout=30)
        return True
    except CommandError as exc:
        if tell:
            report(f"cleanup failed: {exc}")
        return False


def write_marker(path: str, data: dict) -> None:
    """Leave the cleanup marker ``data`` at ``path``, whole or not at all (read by
    tether.container.cleanup when the step's end interrupted this launch)."""
    tmp = f"{path}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json_text(data))
    os.rename(tmp, path)


_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def json_text(value: object) -> str:
    """``value`` (dicts with string keys, lists, strings, ints, bools, None) as JSON text -- what
    json.dumps writes, without importing json: it imports re and enum, milliseconds of every
    supervised rank's start-up (json.loads reads it back; tests/unit/container/test_container_launch.py checks)."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, str):
        return '"' + "".join(_JSON_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if c < " " or c == "\x7f"
                                                               or "\ud800" <= c <= "\udfff" else c)
                             for c in value) + '"'
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("json_text: dict keys must be strings")
        return "{" + ", ".join(f"{json_text(k)}: {json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(json_text(v) for v in value) + "]"
    raise TypeError(f"json_text: {type(value).__name__} is not supported")


def remove_file(path: str) -> None:
    """Unlink ``path``; already gone is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
