"""What every fake executable shares: a strict option parser, the executables themselves, a call log.

A fake is a two-line Python script in a ``bin`` directory that calls ``tether.testing.<module>.main``
with its state directory baked in (so a runtime that clears the environment still finds it). Each
call is appended, as one JSON line, to ``<state>/calls.jsonl``; a test reads them with
``read_calls``. Options are parsed the way the real tool parses them (getopt_long for Slurm, PBS and
enroot's hand-written loop; pflag for Apptainer/Singularity) and **an option the real tool does not
know is refused** with the real tool's message: a wrong argv never passes silently.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Iterator, Mapping

NO_ARG, REQUIRED, OPTIONAL = 0, 1, 2


class UsageError(Exception):
    """A command line the real tool refuses (the message is what it prints)."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def getopt_long(prog: str, argv: list[str], long_opts: Mapping[str, int], short_opts: Mapping[str, int],
                *, short_names: Mapping[str, str] | None = None, permute: bool = False
                ) -> tuple[list[tuple[str, str | None]], list[str]]:
    """glibc getopt_long: ``--name=value``, ``--name value`` (required), ``-x value``, ``-xvalue``,
    unambiguous prefixes of long names, ``--`` ends options. ``short_names`` maps a short letter to
    its long name (options are reported by long name when there is one). Stops at the first
    operand unless ``permute``. Errors use glibc's wording: ``unrecognized option '--x'``,
    ``option '--x' requires an argument``, ``invalid option -- 'x'``. (One function, a little over
    60 lines: it follows glibc's own loop, long and short options side by side.)"""
    short_names = short_names or {}
    opts: list[tuple[str, str | None]] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest += argv[i + 1:]
            break
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if name not in long_opts:
                matches = [n for n in long_opts if n.startswith(name)] if name else []
                if len(matches) != 1:
                    if len(matches) > 1:
                        raise UsageError(f"{prog}: option '--{name}' is ambiguous")
                    raise UsageError(f"{prog}: unrecognized option '{arg}'")
                name = matches[0]
            kind = long_opts[name]
            if kind == NO_ARG and eq:
                raise UsageError(f"{prog}: option '--{name}' doesn't allow an argument")
            if kind == REQUIRED and not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{prog}: option '--{name}' requires an argument")
                i += 1
                value = argv[i]
            opts.append((name, value if (eq or kind == REQUIRED) else None))
        elif arg.startswith("-") and arg != "-":
            j = 1
            while j < len(arg):
                letter = arg[j]
                if letter not in short_opts:
                    raise UsageError(f"{prog}: invalid option -- '{letter}'")
                kind = short_opts[letter]
                name = short_names.get(letter, letter)
                if kind == NO_ARG:
                    opts.append((name, None))
                    j += 1
                    continue
                value = arg[j + 1:]
                if not value and kind == REQUIRED:
                    if i + 1 >= len(argv):
                        raise UsageError(f"{prog}: option requires an argument -- '{letter}'")
                    i += 1
                    value = argv[i]
                opts.append((name, value or None))
                break
        else:
            if not permute:
                rest += argv[i:]
                break
            rest.append(arg)
        i += 1
    return opts, rest


# ---- the executables ---------------------------------------------------------------------------
FAKE_SCRIPT = """#!{python}
# A fake {name} written by tether.testing ({module}); state: {state}
import sys
from tether.testing.{module} import main
sys.exit(main({name!r}, sys.argv[1:], {state!r}))
"""


def install_fakes(bin_dir: Path, module: str, names: Iterable[str], state_dir: Path, python: str | None = None) -> None:
    """Write one executable per name into ``bin_dir`` (created), each calling ``module``'s main with
    ``python`` (default: this interpreter; another where the fakes run in a Slurm root)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = bin_dir / name
        path.write_text(FAKE_SCRIPT.format(python=python or sys.executable, name=name, module=module, state=str(state_dir)))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH | stat.S_IRGRP | stat.S_IROTH)


def record_call(state_dir: str | Path, entry: dict) -> None:
    """Append one call to ``<state>/calls.jsonl`` (one write: concurrent callers do not interleave)."""
    line = (json.dumps(entry, sort_keys=True) + "\n").encode()
    fd = os.open(os.path.join(state_dir, "calls.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_calls(state_dir: str | Path) -> list[dict]:
    """Every recorded call, oldest first."""
    path = Path(state_dir) / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_main(prog: str, body, *, usage_hint: str | None = None) -> int:
    """Run a fake's body; a UsageError prints the real tool's message (and hint) on stderr."""
    try:
        return int(body() or 0)
    except UsageError as exc:
        sys.stderr.write(f"{exc}\n")
        if usage_hint:
            sys.stderr.write(usage_hint + "\n")
        return exc.status


class JobTable:
    """A fake scheduler's jobs in ``<state>/jobs.json``, changed under an exclusive lock (every
    command is its own process; several run at once)."""

    EMPTY: dict = {"next": 1, "jobs": {}}

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @contextlib.contextmanager
    def jobs(self) -> Iterator[dict]:
        """The table, locked for the duration and written back after (readable by the job users)."""
        with open(self.path / "jobs.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.path / "jobs.json"
            data = json.loads(path.read_text()) if path.exists() else json.loads(json.dumps(self.EMPTY))
            yield data
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.chmod(tmp, 0o666)
            os.replace(tmp, path)


class FakeCommands:
    """What every fake program set offers a test: its ``bin_dir``, an environment that finds it
    first, running one of its commands, and the calls recorded in ``state_dir``."""

    root: Path
    bin_dir: Path
    state_dir: Path

    @property
    def also_on_path(self) -> list[Path]:
        """Other fakes' bin directories, put on PATH right after this one's (tether.testing's
        plugin adds the fake runtimes' when a test uses both)."""
        return self.__dict__.setdefault("_also_on_path", [])

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with the fakes first on PATH."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = ":".join([str(self.bin_dir), *map(str, self.also_on_path), env.get("PATH", "/usr/bin:/bin")])
        return env

    @property
    def work_dir(self) -> Path:
        """Where the commands run unless told otherwise (``cwd=``): the fakes' own directory, so
        that a job's default output (``slurm-N.out``, ``NAME.oN``) never lands in the test's
        working directory."""
        path = self.root / "work"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def run(self, *argv: str, **kwargs) -> subprocess.CompletedProcess:
        """Run one of the fake commands (``argv[0]`` by name) with text output captured, in
        ``work_dir`` unless ``cwd`` says otherwise."""
        kwargs.setdefault("env", self.env())
        kwargs.setdefault("cwd", self.work_dir)
        return subprocess.run([str(self.bin_dir / argv[0]), *argv[1:]], capture_output=True, text=True,
                              timeout=kwargs.pop("timeout", 300), **kwargs)

    def calls(self) -> list[dict]:
        """Every recorded call, oldest first (``tool``, ``argv``, ...)."""
        return read_calls(self.state_dir)
