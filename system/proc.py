"""The subprocess entry points: argv lists, a timeout, one error type.

Every external command tether runs (scheduler commands, runtimes, apt, daemons) goes through
``run_command``; tests fake commands at this boundary (pytest-subprocess). A command that times out has its whole
process group killed. The container launcher, which runs once per rank, runs its runtime's
commands with ``run_quick`` instead: the same errors, without the ``subprocess`` module, whose
import (with ``signal``, ``enum``, ``locale``, ``re``, ``threading``) cost each rank more
instructions than the rest of its Python start together. Tests of the launcher's steps with
pytest-subprocess route ``run_quick`` through ``run_command`` (tests/unit/container: fp_quick);
``run_quick`` itself is held to ``run_command`` on real processes (tests/unit/test_proc.py).
"""

from __future__ import annotations

import os
import time
TYPE_CHECKING = False  # not `typing`: the rank launcher imports this module, and typing costs milliseconds

from ..hooks.errors import TetherError

if TYPE_CHECKING:
    import subprocess
    from typing import Callable, Mapping, Sequence

DEFAULT_TIMEOUT = 60.0


class CommandError(TetherError):
    """A command failed: carries argv, exit code (None on timeout/not found), stdout and stderr.
    ``kind``: "missing" (it could not be started), "timeout", or "exit" (it ended non-zero)."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stdout: str, stderr: str,
                 reason: str = "", kind: str = "exit"):
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.kind = kind
        self.reason = reason or f"exit code {returncode}"
        tail = (stderr or stdout).strip().splitlines()[-8:]
        detail = ("\n  " + "\n  ".join(tail)) if tail else ""
        super().__init__(f"command failed ({self.reason}): {' '.join(self.argv)}{detail}")


def run_command(argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT, check: bool = True,
                input: str | None = None, env: Mapping[str, str] | None = None,
                cwd: str | None = None, new_session: bool = True,
                while_waiting: Callable[[int], object] | None = None,
                errors: str | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` (never through a shell) and return the completed process (text mode).

    Raises CommandError when the command is missing, times out, or (with ``check``) exits non-zero.
    ``new_session``: the command gets a session of its own (killed as a group on timeout); without,
    it stays in the caller's, so whoever bounds the caller's session bounds the command too.
    ``while_waiting``: called with the command's pid every 0.1 s until it ends.
    ``errors``: for a command whose output may not be text in the locale's encoding (PBS's clients
    print bytes that are not UTF-8): its output read as UTF-8 with this error handler ("replace":
    U+FFFD), line ends left as printed; None: the locale's text mode.
    """
    import subprocess

    argv = [str(a) for a in argv]
    raw = errors is not None             # bytes from the pipes, decoded here
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=not raw,
                                env=dict(env) if env is not None else None, cwd=cwd,
                                start_new_session=new_session)
    except FileNotFoundError:
        if cwd is not None and not os.path.isdir(cwd):      # Popen names the directory's absence the same way
            raise CommandError(argv, None, "", "", reason=f"working directory {cwd} does not exist",
                               kind="missing") from None
        raise CommandError(argv, None, "", "", reason=f"command not found: {argv[0]}", kind="missing") from None
    except OSError as exc:               # EACCES, not an executable (ENOEXEC), a path through a file (ENOTDIR)...
        raise CommandError(argv, None, "", "", reason=f"cannot execute {argv[0]}: {exc}", kind="missing") from None
    if raw and input is not None:
        input = input.encode("utf-8")
    try:
        if while_waiting is None:
            stdout, stderr = proc.communicate(input=input, timeout=timeout)
        else:
            deadline = time.monotonic() + timeout
            while True:
                try:      # a retried communicate loses no output (subprocess's documentation)
                    stdout, stderr = proc.communicate(input=input, timeout=min(0.1, max(deadline - time.monotonic(), 0)))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= deadline:
                        raise
                    input = None
                    while_waiting(proc.pid)
    except subprocess.TimeoutExpired:
        if new_session:
            _kill_group(proc)
        else:
            proc.kill()
        stdout, stderr = proc.communicate()
        if raw:
            stdout, stderr = stdout.decode("utf-8", errors), stderr.decode("utf-8", errors)
        raise CommandError(argv, None, stdout, stderr, reason=f"timed out after {timeout:g} s",
                           kind="timeout") from None
    if raw:
        stdout, stderr = stdout.decode("utf-8", errors), stderr.decode("utf-8", errors)
    if check and proc.returncode != 0:
        raise CommandError(argv, proc.returncode, stdout, stderr)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:              # a group with a member of another user's: the command itself
        try:
            proc.kill()
        except (ProcessLookupError, PermissionError):
            pass


class Completed:
    """What ``run_quick`` returns: a finished command's argv, exit code and output (the fields of
    ``subprocess.CompletedProcess`` tether reads)."""

    __slots__ = ("args", "returncode", "stdout", "stderr")

    def __init__(self, args: list[str], returncode: int, stdout: str, stderr: str):
        self.args, self.returncode, self.stdout, self.stderr = args, returncode, stdout, stderr


def _executable(name: str, env: Mapping[str, str] | None) -> str:
    """``name`` as ``subprocess`` finds it: a path as it is, a bare name on the PATH of the
    command's own environment (``env``; this process's without one) -- not posix_spawnp's, which
    searches this process's PATH. FileNotFoundError for a bare name found nowhere."""
    if "/" in name:
        return name
    for directory in os.get_exec_path(env):
        path = os.path.join(directory, name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    raise FileNotFoundError(name)


def _inherited_fds(keep: tuple[int, ...]) -> list[int]:
    """This process's descriptors above 2 a child would inherit (not close-on-exec), but ``keep``:
    what subprocess's close_fds closes (the task's PMI_FD, a descriptor passed to the runtime)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                if os.get_inheritable(fd):
                    found.append(fd)
            except OSError:                      # the listing's own descriptor, closed by now
                pass
    return found


def _kill_quick(pid: int) -> None:
    """SIGKILL to run_quick's command and its session's group (9: without the signal module)."""
    try:
        os.killpg(pid, 9)
    except ProcessLookupError:
        pass
    except PermissionError:                      # a group with a member of another user's: the command itself
        try:
            os.kill(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass


def run_quick(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              timeout: float = DEFAULT_TIMEOUT, check: bool = True) -> Completed:
    """``run_command`` for the container launcher (see the module docstring): ``argv`` with
    stdin from /dev/null, its output captured (UTF-8; bytes that are not, replaced) in a session of
    its own, killed as a group when ``timeout`` runs out -- or when this process stops waiting (an
    exception, Ctrl-C). As subprocess starts it: SIGPIPE and SIGXFSZ at their defaults (Python
    ignores both), no descriptor above 2 but its pipes. The same CommandError on a missing
    command, a timeout or (with ``check``) a non-zero exit."""
    import _signal
    import select

    argv = [str(a) for a in argv]
    try:
        executable = _executable(argv[0], env)
    except FileNotFoundError:
        raise CommandError(argv, None, "", "", reason=f"command not found: {argv[0]}", kind="missing") from None
    opened: list[int] = []
    try:
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        opened += (out_r, out_w)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        opened += (err_r, err_w)
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        opened.append(devnull)
        actions = [(os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2),
                   *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inherited_fds(tuple(opened)))]
        pid = os.posix_spawn(executable, argv, os.environ if env is None else env, setsid=True,
                             setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ), file_actions=actions)
    except OSError as exc:
        for fd in opened:
            os.close(fd)
        reason = (f"command not found: {argv[0]}" if isinstance(exc, FileNotFoundError)
                  else f"cannot execute {argv[0]}: {exc}")
        raise CommandError(argv, None, "", "", reason=reason, kind="missing") from None
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    for fd in (out_w, err_w, devnull):
        os.close(fd)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    poller = select.poll()
    for fd in chunks:
        poller.register(fd, select.POLLIN)
    open_fds, timed_out = set(chunks), False
    deadline = time.monotonic() + timeout
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                if timed_out:                    # killed, and still someone holds its output open
                    break
                timed_out = True
                _kill_quick(pid)
                deadline = time.monotonic() + 5  # what it printed before the kill, read to its end
                continue
            for fd, _ in poller.poll(max(1, int(left * 1000))):
                data = os.read(fd, 65536)
                if data:
                    chunks[fd].append(data)
                else:
                    poller.unregister(fd)
                    open_fds.discard(fd)
    except BaseException:                        # not waiting any more: neither is the command
        _kill_quick(pid)
        raise
    finally:
        for fd in chunks:
            os.close(fd)
        _, status = os.waitpid(pid, 0)
    stdout, stderr = (b"".join(chunks[fd]).decode("utf-8", "replace") for fd in (out_r, err_r))
    if timed_out:
        raise CommandError(argv, None, stdout, stderr, reason=f"timed out after {timeout:g} s", kind="timeout")
    code = os.waitstatus_to_exitcode(status)
    if check and code != 0:
        raise CommandError(argv, code, stdout, stderr)
    return Completed(argv, code, stdout, stderr)
