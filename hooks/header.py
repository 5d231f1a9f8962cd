"""The header of a batch script tether writes itself: the options tether controls there.

docs/requirements.md, "Common Slurm options" (``--job-name``, ``--partition``, ``--wckey``,
``--no-requeue``, ``--output``, ``--error``) and "Common PBS options" (``-N``, ``-q``,
``-e``/``-o``, ``-V``, ``-r n``, ``-W umask=0022``, ``-P``). The job_submit plugin and the PBS hooks
do not use it: a user's own ``sbatch``/``qsub`` keeps its name and logs.

Logs go into ``log_dir`` when one is given (the launcher's job directory), else next to where the
script is submitted from (``<job name>.out``/``.err``, like Slurm's own ``slurm-<id>.out``), so a
printed header works as it is.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .request import Request

JOB_NAME_PREFIX = "tether_"


@dataclass(frozen=True)
class Header:
    """What a tether batch script says about itself, besides its resources."""

    job_name: str
    output: str
    error: str


def job_name(request: Request) -> str:
    """``tether_<job type>-<job id>`` (a fixed prefix, the job type and an id, as
    docs/requirements.md asks); an id derived from the request when it has none."""
    job_id = request.job_id or hashlib.sha256(repr(request).encode()).hexdigest()[:16]
    return f"{JOB_NAME_PREFIX}{request.job_type}-{job_id}"


def batch_header(request: Request, log_dir: str | None = None) -> Header:
    """The header for ``request``: its job name; logs in ``log_dir`` or the submission directory."""
    name = job_name(request)
    if log_dir:
        base = log_dir.rstrip("/") or "/"
        return Header(name, f"{base}/job.out", f"{base}/job.err")
    return Header(name, f"{name}.out", f"{name}.err")
