"""Run a Launch: exec the runtime in place, or supervise it as a child subreaper.

*Exec in place* (Apptainer, Singularity): the rank's process becomes the runtime, which execs the
workload -- nothing between slurmstepd (or pbs_mom) and the rank.

*Supervise* (Podman, Enroot): the wrapper marks itself a child subreaper (``PR_SET_CHILD_SUBREAPER``)
and forks the runtime. Whatever the runtime double-forks (podman's conmon and the container's
processes) is re-parented to the wrapper instead of init, so it stays in the step's process tree:
Slurm's process tracking signals it, job accounting counts its CPU time, and it is killed with the
step. Signals the wrapper receives are forwarded to the runtime; when the runtime exits, the
``after`` commands run (e.g. removing a container an abnormal end left behind), the remaining
descendants get a short grace, and the wrapper ends as the runtime did (same exit code, or the same
signal).

Errors before the runtime starts are printed as ``tether: ...`` on stderr (the job's output) and
sent to syslog for the admin; the runtime's own errors reach the job's stderr unchanged.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

from .spec import LaunchError

if TYPE_CHECKING:
    from typing import NoReturn

    from .runtimes import Launch

EXIT_LAUNCH_FAILED = 125          # as podman/docker: the container could not be started
PR_SET_CHILD_SUBREAPER = 36
# Under Slurm every process of the step gets signals straight from slurmstepd anyway; forwarding
# matters when tether runs under pbs_tmrsh or by hand. SIGCONT is not forwarded: the runtime gets
# its own, and podman would report the duplicate as an error.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGALRM)
GRACE_SECONDS = 5.0


def report(message: str) -> None:
    """Tell the user (stderr: the job's output) and the admin (syslog)."""
    for line in message.splitlines() or [""]:
        print(f"tether: {line}", file=sys.stderr, flush=True)
    report_admin(message)


def report_admin(message: str) -> None:
    """The system log (what the admin reads), tagged tether-run, with the user's uid."""
    try:
        import syslog

        syslog.openlog("tether-run", syslog.LOG_PID, syslog.LOG_USER)
        for line in message.splitlines() or [""]:
            syslog.syslog(syslog.LOG_ERR, f"uid {os.getuid()}: {line}")
    except OSError:
        pass


def run_before(launch: Launch) -> None:
    """The preparation steps (image import, container creation), under the launch's lock."""
    if not launch.before:
        return
    from ..system.proc import CommandError, run_command

    lock_fd = None
    if launch.lock:
        os.makedirs(os.path.dirname(launch.lock), mode=0o700, exist_ok=True)
        lock_fd = os.open(launch.lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
    try:
        for argv, creates in launch.before:
            if creates and os.path.exists(creates):
                continue
            if creates:
                os.makedirs(os.path.dirname(creates), mode=0o700, exist_ok=True)
            try:
                run_command(argv, env=launch.env, timeout=3600)
            except CommandError as exc:
                raise LaunchError(str(exc)) from None
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


def execute(launch: Launch, *, subreaper: bool = False) -> NoReturn:
    """Run the launch; never returns (execs, or exits with the runtime's status). ``subreaper``:
    this process is a child subreaper already (the SPANK plugin sets it before the launcher runs)."""
    try:
        run_before(launch)
    except LaunchError as exc:
        report(str(exc))
        os._exit(EXIT_LAUNCH_FAILED)
    if not launch.supervise:
        _exec(launch)
    sys.exit(_supervise(launch, subreaper))


def _exec(launch: Launch) -> NoReturn:
    try:
        os.execvpe(launch.argv[0], launch.argv, launch.env)
    except OSError as exc:
        report(f"cannot start the container runtime {launch.argv[0]!r}: {exc.strerror} "
               f"(set container.<runtime>.binary in tether's config)")
        os._exit(EXIT_LAUNCH_FAILED)


def _set_subreaper() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _supervise(launch: Launch, subreaper: bool) -> int:
    if not subreaper:
        _set_subreaper()
    if launch.marker and launch.after_abnormal:
        _write_marker(launch)
    received: list[int] = []
    children: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        for pid in children:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    for sig in FORWARDED:            # before fork: a signal in between is not lost (nor fatal)
        signal.signal(sig, forward)
    child = os.fork()
    if child == 0:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        _exec(launch)
    children.append(child)
    for signum in list(received):    # arrived before the runtime existed: it gets them now
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass
    status = _wait_for(child)
    abnormal = os.WIFSIGNALED(status) or bool(received)
    cleaned = all([_run_quietly(argv, launch.env) for argv in
                   [*launch.after, *(launch.after_abnormal if abnormal else ())]])
    if launch.marker and cleaned:
        remove_file(launch.marker)
    _reap_descendants(GRACE_SECONDS)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    code = os.WEXITSTATUS(status)
    if code in (125, 126, 127) and launch.argv[0].endswith("podman"):
        report(f"podman could not start the container (exit {code}); its message is above")
    return code


def _wait_for(child: int) -> int:
    """Wait for ``child``, reaping re-parented descendants meanwhile; its raw wait status."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if pid == child:
            return status


def _reap_descendants(grace: float) -> None:
    """Reap what the runtime left (conmon finishing its cleanup) until none is left, for at most
    ``grace`` seconds; anything still there after that is the step's to kill."""

    def give_up(signum, frame):
        raise TimeoutError

    signal.signal(signal.SIGALRM, give_up)
    signal.setitimer(signal.ITIMER_REAL, grace)
    try:
        while True:
            os.waitpid(-1, 0)
    except (ChildProcessError, TimeoutError):
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _run_quietly(argv: list[str], env: dict[str, str], *, tell: bool = True) -> bool:
    from ..system.proc import CommandError, run_command

    try:
        run_command(argv, env=env, timeout=30)
        return True
    except CommandError as exc:
        if tell:
            report(f"cleanup failed: {exc}")
        return False


MARKER_PREFIX = ".cleanup-"


def _write_marker(launch: Launch) -> None:
    """Record what must be cleaned if this launch ends abnormally (see Launch.marker)."""
    tmp = f"{launch.marker}.{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(repr({"commands": list(launch.after_abnormal), "env": dict(launch.marker_env or {})}))
    os.rename(tmp, launch.marker)


def remove_file(path: str) -> None:
    """Unlink ``path``; already gone is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def run_leftovers(step_dir: str) -> int:
    """Cleanup mode: slurmstepd runs the launcher as the job user with TETHER_CLEANUP=<step dir>
    after a container step has ended (or <job dir> at the job's end), detached from the step; read what the markers there say,
    tell slurmstepd (closing fd 3) and do it (each command twice at most: podman's first rm of a
    container whose conmon was killed only marks it exited). 0 when all done. Failures go to the
    system log (nobody reads this process's output)."""
    import ast

    todo = []
    paths = []
    for top, dirs, files in os.walk(step_dir):         # a step's directory, or a job's (its end)
        paths += [os.path.join(top, f) for f in files if f.startswith(MARKER_PREFIX)]
        depth = top[len(step_dir):].count(os.sep)
        dirs[:] = [d for d in dirs if depth < 2 and not d.startswith("rank-")]
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd) as fh:
                marker = ast.literal_eval(fh.read(65536))
            todo.append((list(marker["commands"]), dict(marker["env"])))
        except (OSError, ValueError, SyntaxError, KeyError, TypeError) as exc:
            report_admin(f"cleanup: ignoring {path}: {exc}")
    if os.environ.get("TETHER_CLEANUP_FD") == "3":
        try:
            os.close(3)                      # markers read: slurmstepd may remove the step's directory
        except OSError:
            pass
    failed = 0
    for commands, env in todo:
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        for argv in commands:
            if not (_run_quietly(argv, env, tell=False) or _run_quietly(argv, env)):
                failed += 1
    return 1 if failed else 0
