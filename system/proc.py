"""The one subprocess entry point: argv lists, a timeout, one error type.

Every external command tether runs (scheduler commands, runtimes, apt, daemons) goes through
``run_command``; tests fake commands at this boundary. A command that times out has its whole
process group killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Callable, Mapping, Sequence

from ..hooks.errors import TetherError

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
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:              # a group with a member of another user's: the command itself
        try:
            proc.kill()
        except (ProcessLookupError, PermissionError):
            pass
