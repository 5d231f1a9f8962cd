"""Per-node launch scripts: one container per node (docs/requirements.md, "One container per
node"), for jobs tether writes itself.

Slurm: ``srun`` one task per node running ``tether run``. PBS: for each unique host of
``$PBS_NODEFILE`` a background ``pbs_tmrsh HOST /usr/bin/env TETHER_RUN_ENV_FILE=F NODE_RANK=N …
tether run ...``, ``wait``, and the first failing host ends the job. TM tasks do not inherit the
script's variables (OpenPBS's pbs_tmrsh.c: ``tm_spawn(…, NULL, …)``, no environment) and pbs_tmrsh
waits on the first host for as long as its task runs, its command line readable by every user
there: the job's variables go into a file only its user may read (F, JSON), which ``tether run``
reads (:func:`read_env_file`). Every value from users is shell-quoted; the tests run ``bash -n``
and execute both with fakes.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from importlib import resources
from typing import Mapping, Sequence

from ..hooks.rankenv import master_port_shell
from ..hooks.surface import BY_NAME, RANK_VAR, STARTED_MARK, USER_DIRS_VAR
from .spec import LaunchError, check_container_options, is_env_name


@dataclass(frozen=True)
class _Option:
    name: str
    value: str

    @property
    def env(self) -> str:
        return BY_NAME[self.name].env

    @property
    def arg(self) -> str:
        return f"--{self.name}" if BY_NAME[self.name].kind == "flag" else f"--{self.name}={self.value}"


ENV_FILE_VAR = "TETHER_RUN_ENV_FILE"
# what the PBS script sets for each host itself: the job's variables of the same names do not replace them
PER_HOST_VARS = tuple(RANK_VAR[key] for key in ("NODE_RANK", "TETHER_NNODES", "MASTER_ADDR", "MASTER_PORT"))


def read_env_file(path: str) -> dict[str, str]:
    """The job's variables from the PBS launch script's file (a JSON object of names to strings),
    or a LaunchError saying what is wrong with it."""
    import json
    import stat

    try:
        # O_NONBLOCK: a FIFO (or device) at the path is refused below instead of waiting forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, encoding="utf-8") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise LaunchError(f"the job's variables in {path} are not what tether wrote (not a regular file)")
            data = json.load(fh)
    except OSError as exc:
        raise LaunchError(f"cannot read the job's variables from {path}: {exc.strerror} (the PBS launch script "
                          f"writes them there: every host of the job must see that directory)") from None
    except ValueError as exc:
        raise LaunchError(f"the job's variables in {path} are not what tether wrote: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and is_env_name(k) and isinstance(v, str)
                                             for k, v in data.items()):
        raise LaunchError(f"the job's variables in {path} are not what tether wrote (names to strings)")
    return data


def _render(template: str, command: Sequence[str], options: Mapping[str, str], env: Mapping[str, str],
            tether: str, default_runtime: str, env_dir: str | None = None) -> str:
    import json

    import jinja2

    if not command:
        raise LaunchError("a launch script needs a command")
    check_container_options(options, default_runtime)
    for name in env:
        if not is_env_name(name):
            raise LaunchError(f"environment variable name {name!r} is not valid in a launch script")
    # bash's ${#array[@]} would open a Jinja comment: comments get a spelling bash never uses
    jenv = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, keep_trailing_newline=True,
                              autoescape=False, comment_start_string="{##", comment_end_string="##}")
    jenv.filters["sh"] = lambda v: shlex.quote(str(v))
    text = resources.files("tether.container").joinpath(template).read_text()
    opts = [_Option(k, v) for k, v in options.items() if BY_NAME[k].kind != "flag" or v]
    return jenv.from_string(text).render(command=list(command), options=opts, env=sorted(env.items()),
                                         env_json=json.dumps(dict(sorted(env.items()))), env_dir=env_dir,
                                         tether=tether, master_port=master_port_shell, var=RANK_VAR,
                                         user_dirs_var=USER_DIRS_VAR, started_mark=STARTED_MARK)


def slurm_launch_script(command: Sequence[str], options: Mapping[str, str], env: Mapping[str, str], *,
                        tether: str = "tether", default_runtime: str = "apptainer") -> str:
    """The Slurm per-node launch script (the body of a batch script)."""
    return _render("slurm-launch.sh.j2", command, options, env, tether, default_runtime)


def pbs_launch_script(command: Sequence[str], options: Mapping[str, str], env: Mapping[str, str], *,
                      tether: str = "tether", default_runtime: str = "apptainer", env_dir: str | None = None) -> str:
    """The PBS per-host launch script (the body of a batch script). ``env_dir``: where the job's
    variables are put for its hosts (a directory every host sees; default ``$HOME/.tether/env``)."""
    return _render("pbs-launch.sh.j2", command, options, env, tether, default_runtime, env_dir)


def compose_batch_script(directives: Sequence[str], body: str) -> str:
    """A whole batch script: the body's shebang, the directives, then the rest of the body."""
    lines = body.splitlines()
    shebang, rest = (lines[0], lines[1:]) if lines and lines[0].startswith("#!") else ("#!/bin/bash", lines)
    return "\n".join([shebang, *directives, *rest]) + "\n"


def host_script(command: Sequence[str], env: Mapping[str, str]) -> str:
    """The body of a batch script that runs ``command`` itself (no container), with ``env``."""
    if not command:
        raise LaunchError("a batch script needs a command")
    for name in env:
        if not is_env_name(name):
            raise LaunchError(f"environment variable name {name!r} is not valid in a batch script")
    exports = [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]
    return "\n".join(["#!/bin/bash", "# Generated by tether; values are shell-quoted.", "set -u", *exports,
                      "exec " + " ".join(shlex.quote(w) for w in command)]) + "\n"
