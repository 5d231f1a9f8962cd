"""Per-node launch scripts (seed 000): one container per node, for jobs tether writes itself.

Slurm: ``srun`` one task per node running ``tether run``. PBS: for each unique host of
``$PBS_NODEFILE`` a background ``pbs_tmrsh HOST /usr/bin/env NAME=VALUE... tether run ...`` (TM tasks
do not inherit the script's variables), ``wait``, and the first failing host ends the job. Every
value from users is shell-quoted; the tests run ``bash -n`` and execute both with fakes.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from importlib import resources
from typing import Mapping, Sequence

from ..hooks.surface import BY_NAME
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


def _render(template: str, command: Sequence[str], options: Mapping[str, str], env: Mapping[str, str],
            tether: str, default_runtime: str) -> str:
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
                                         tether=tether)


def slurm_launch_script(command: Sequence[str], options: Mapping[str, str], env: Mapping[str, str], *,
                        tether: str = "tether", default_runtime: str = "apptainer") -> str:
    """The Slurm per-node launch script (the body of a batch script)."""
    return _render("slurm-launch.sh.j2", command, options, env, tether, default_runtime)


def pbs_launch_script(command: Sequence[str], options: Mapping[str, str], env: Mapping[str, str], *,
                      tether: str = "tether", default_runtime: str = "apptainer") -> str:
    """The PBS per-host launch script (the body of a batch script)."""
    return _render("pbs-launch.sh.j2", command, options, env, tether, default_runtime)
