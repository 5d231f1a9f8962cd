"""Plan -> scheduler text, the only place it is made: options, ``#SBATCH``/``#PBS`` lines, ``select``.

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
from .header import Header
from .plan import ROWS, PbsResources, Plan, SlurmResources
from .policy import SLURM_FIELD_OPTIONS

Option = tuple[str, "str | None"]
_SAFE = re.compile(r"[\w@%+=:,./-]+", re.ASCII)


def is_shell_safe(word: str) -> bool:
    """True if ``word`` needs no quoting in a POSIX shell (and in #SBATCH/#PBS lines)."""
    return bool(_SAFE.fullmatch(word))


# ---- resources ---------------------------------------------------------------------------------
def slurm_options(res: SlurmResources, row: str) -> list[Option]:
    """The sbatch options for a Slurm plan's resources, in the order of its table row."""
    def typed(count: int | None, prefix: str = "") -> str | None:
        return None if count is None else f"{prefix}{res.gpu_type + ':' if res.gpu_type else ''}{count}"

    values = {
        "--nodes": f"{res.min_nodes}" if res.min_nodes == res.max_nodes else f"{res.min_nodes}-{res.max_nodes}",
        "--ntasks": res.ntasks, "--tasks-per-node": res.tasks_per_node,
        "--cpus-per-task": res.cpus_per_task, "--gpus": typed(res.gpus),
        "--gpus-per-task": typed(res.gpus_per_task), "--gres": typed(res.gpus_per_node, "gpu:"),
    }
    order = dict.fromkeys(SLURM_FIELD_OPTIONS[field] for field, _, _ in ROWS[row].sets)
    return [(name, str(values[name])) for name in order if values[name] is not None]


def pbs_select(res: PbsResources) -> str:
    """``select=`` value: ``2:ngpus=4:mem=10gb``."""
    return ":".join([str(res.chunks)] + [f"{k}={v}" for k, v in res.chunk])


def pbs_place(res: PbsResources) -> str:
    """``place=`` value: ``scatter`` (one chunk per host) plus the user's sharing/grouping."""
    return ":".join(res.place)


def resource_options(plan: Plan) -> list[Option]:
    """The plan's resource request as scheduler options."""
    if plan.slurm is not None:
        return slurm_options(plan.slurm, plan.row)
    assert plan.pbs is not None
    return [("-l", f"select={pbs_select(plan.pbs)}"), ("-l", f"place={pbs_place(plan.pbs)}")]


# ---- a batch script's header --------------------------------------------------------------------
def header_options(plan: Plan, header: Header) -> list[Option]:
    """The options tether controls in its own batch scripts (docs/requirements.md, "Common Slurm
    options", "Common PBS options")."""
    if plan.scheduler == "slurm":
        out: list[Option] = [("--job-name", header.job_name)]
        if plan.partition:
            out.append(("--partition", plan.partition))
        if plan.project:
            out.append(("--wckey", plan.project))
        return out + [("--no-requeue", None), ("--output", header.output), ("--error", header.error)]
    out = [("-N", header.job_name)]
    if plan.partition:
        out.append(("-q", plan.partition))
    out += [("-e", header.error), ("-o", header.output), ("-V", None), ("-r", "n"), ("-W", "umask=0022")]
    if plan.project:
        out.append(("-P", plan.project))
    return out


def script_options(plan: Plan, header: Header) -> list[Option]:
    """Every option of a tether batch script, in header order: resources, tether's own, pass-through."""
    return (resource_options(plan) + header_options(plan, header)
            + [(a.name, a.value) for a in plan.extra_args])


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


def script_directives(plan: Plan, header: Header) -> list[str]:
    """The header directives tether writes into a batch script for ``plan``."""
    return directive_lines(script_options(plan, header), plan.scheduler)
