"""Plan -> scheduler text: ``#SBATCH``/``#PBS`` header lines and argv words.

sbatch 22.05 reads ``#SBATCH`` lines with shell-like quoting (single quotes, double quotes with
backslash escapes, ``#`` inside quotes kept; checked on the real sbatch), so values are quoted with
``shlex.quote``. ``#PBS`` lines get double quotes, and a value that would need more than that is
refused rather than risked.
"""

from __future__ import annotations

import re
import shlex
from typing import Iterable

from .errors import RequestError
from .plan import Option, Plan

_SAFE = re.compile(r"[\w@%+=:,./-]+", re.ASCII)


def is_shell_safe(word: str) -> bool:
    """True if ``word`` needs no quoting in a POSIX shell (and in #SBATCH/#PBS lines)."""
    return bool(_SAFE.fullmatch(word))


def _quote_pbs(value: str) -> str:
    if is_shell_safe(value):
        return value
    if any(c in value for c in '"\\\n\r\0'):
        raise RequestError(f"qsub value {value!r} cannot be written into a #PBS line "
                           f"(it contains a quote, backslash or newline)")
    return f'"{value}"'


def option_words(options: Iterable[Option], scheduler: str) -> list[str]:
    """argv words for ``options`` (``--gpus=8``; ``-l select=2``) — for subprocess, not a shell."""
    words: list[str] = []
    for name, value in options:
        if value is None:
            words.append(name)
        elif scheduler == "slurm":
            words.append(f"{name}={value}")
        else:
            words += [name, value]
    return words


def directive_lines(options: Iterable[Option], scheduler: str) -> list[str]:
    """``#SBATCH --name=value`` / ``#PBS -x value`` lines, values quoted where needed."""
    lines = []
    for name, value in options:
        if scheduler == "slurm":
            text = name if value is None else f"{name}={shlex.quote(value)}"
            lines.append(f"#SBATCH {text}")
        else:
            text = name if value is None else f"{name} {_quote_pbs(value)}"
            lines.append(f"#PBS {text}")
    return lines


def plan_options(plan: Plan) -> list[Option]:
    """Every option of a tether batch script, in header order: resources, tether's own, pass-through."""
    return list(plan.resources) + list(plan.common) + list(plan.extra)


def plan_directives(plan: Plan) -> list[str]:
    """The header directives tether writes into a batch script for ``plan``."""
    return directive_lines(plan_options(plan), plan.scheduler)
