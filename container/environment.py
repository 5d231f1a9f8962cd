"""The environment contract: which host variables enter a container, whatever the runtime.

One rule for apptainer, singularity, podman and enroot (each adapter only spells it differently):

* **tether's values** win over everything: ``TMPDIR=/tmp`` and ``TETHER_WORK_DIR`` (the per-rank
  directories as seen inside), ``TETHER_CONTAINER=1``; host-only paths (``TETHER_RANK_DIR``, ...) are
  not passed.
* **passed from the host** (and winning over the image's own values): the rank variables, the
  resource manager's (``SLURM_*``, ``PBS_*``), MPI/PMI launch variables, GPU selection, ``TETHER_*``,
  locale and terminal, plus every name the user lists in ``--container-env``.
* **never passed** (the image's own value, or the runtime's default, applies): everything else,
  notably ``PATH``, ``LD_LIBRARY_PATH``, ``LD_PRELOAD``, ``HOME``, ``PYTHON*`` and the runtimes' own
  control variables -- unless named in ``--container-env`` (the runtimes' control variables never).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

from ..hooks.surface import HOST_ONLY as _RANK_HOST_ONLY, RANK_NAMES, RUN_ARGV0
from .spec import CONTAINER_TMP, CONTAINER_WORKDIR, is_env_name

if TYPE_CHECKING:
    from typing import Mapping

    from .spec import LaunchSpec

PASS_NAMES = RANK_NAMES + ("USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "TZ", "OMP_NUM_THREADS",
                           "SLURMD_NODENAME")
PASS_PREFIXES = ("SLURM_", "PBS_", "PMI_", "PMIX_", "OMPI_", "I_MPI_", "MPICH_", "UCX_", "NCCL_",
                 "CUDA_", "ROCR_", "HIP_", "TETHER_", "LC_")
# The runtimes read these themselves; inside a container they mean nothing or something harmful.
RUNTIME_CONTROL = ("APPTAINER", "SINGULARITY", "ENROOT_", "CONTAINERS_", "PODMAN_", "BUILDAH_",
                   "_CONTAINERS_", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")
# Host-side paths of the per-rank directories: meaningless inside, replaced by OVERRIDES.
HOST_ONLY = _RANK_HOST_ONLY + (RUN_ARGV0,)


def overrides(spec: LaunchSpec) -> dict[str, str]:
    """tether's own values inside the container (plain values: safe on any command line)."""
    values = {"TETHER_CONTAINER": "1"}
    if spec.rank_dir:
        values.update(TMPDIR=CONTAINER_TMP, TETHER_WORK_DIR=CONTAINER_WORKDIR)
    return values


def _is_control(name: str) -> bool:
    return name.startswith(RUNTIME_CONTROL)


def passed_from_host(host: Mapping[str, str], spec: LaunchSpec) -> dict[str, str]:
    """The host variables that enter the container with their host values (see the module doc)."""
    own = overrides(spec)
    chosen = {}
    for name, value in host.items():
        if name in own or name in HOST_ONLY or not is_env_name(name) or _is_control(name):
            continue
        if name in PASS_NAMES or name.startswith(PASS_PREFIXES) or name in spec.env_names:
            chosen[name] = value
    return chosen


def contract_table() -> str:
    """The contract as a Markdown table (kept in the README, checked by the tests)."""
    rows = [
        "| variables | inside the container | precedence |",
        "|---|---|---|",
        f"| `TMPDIR`, `TETHER_WORK_DIR`, `TETHER_CONTAINER` | `{CONTAINER_TMP}`, `{CONTAINER_WORKDIR}` "
        "(the rank's own directories, in a tether step), `1` | tether's value, always |",
        "| " + ", ".join(f"`{n}`" for n in RANK_NAMES) + " | the rank's values | host value wins over the image's |",
        "| " + ", ".join(f"`{p}*`" for p in PASS_PREFIXES) + " | passed | host value wins over the image's |",
        "| " + ", ".join(f"`{n}`" for n in PASS_NAMES if n not in RANK_NAMES)
        + " | passed | host value wins over the image's |",
        "| names in `--container-env` | passed | host value wins over the image's |",
        "| " + ", ".join(f"`{n}`" for n in HOST_ONLY) + " | not passed (host paths) | — |",
        "| " + ", ".join(f"`{p}`" if p.isupper() and not p.endswith("_") and "_" in p else f"`{p}*`"
                         for p in RUNTIME_CONTROL)
        + " | never passed, even when named in `--container-env` | — |",
        "| everything else (`PATH`, `LD_LIBRARY_PATH`, `HOME`, `PYTHONPATH`, ...) | not passed | "
        "the image's own value (or the runtime's default) |",
    ]
    return "\n".join(rows) + "\n"
