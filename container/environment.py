"""The environment contract: which host variables enter a container, whatever the runtime.

One rule for apptainer, singularity, podman and enroot (each adapter only spells it differently),
in two modes the admin chooses (``container.environment``):

* **tether's values** win over everything: ``TMPDIR=/tmp`` and ``TETHER_WORK_DIR`` (the per-rank
  directories as seen inside), ``TETHER_CONTAINER=1``; host-only paths (``TETHER_RANK_DIR``, ...) are
  not passed.
* ``inherit`` (the default, what pyxis and Apptainer users know): **every variable of the job**
  enters with its host value (winning over the image's own value of the same name), **except**
  those where the image must win -- ``PATH``, the dynamic loader's ``LD_*``, ``HOME``,
  ``PYTHONHOME``/``PYTHONPATH``, shell start-up and bookkeeping (``BASH_ENV``, ``ENV``, ``PWD``,
  ``OLDPWD``, ``SHLVL``, ``_``), the host's ``TMPDIR``, the locale's ``LANG``, ``LANGUAGE`` and
  ``LC_ALL`` (as pyxis: a host locale the image lacks makes perl, bash and Python complain in every
  step) -- and the runtimes' own control variables.
* ``allowlist``: only the rank variables, the resource manager's (``SLURM_*``, ``PBS_*``), MPI/PMI
  launch variables, GPU selection, ``TETHER_*``, the locale's categories (``LC_*`` but ``LC_ALL``) and
  terminal enter; never one of the image's above.
* In both, a name listed in ``--container-env`` enters with the host's value even where the image
  would win (``--container-env=PATH``); the runtimes' control variables never enter.
* With ``--container-entrypoint`` (as pyxis): the image's entrypoint starts with the image's
  environment, the allowlist's variables and the ``--container-env`` names only; the job's other
  variables are set after it, just before the command, for the names it left unset -- what the
  entrypoint set or exported (and the image's ``ENV``) wins for the rest (:func:`entrypoint_split`).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

from ..hooks.surface import HOST_ONLY as _RANK_HOST_ONLY, BATCH_VAR, RANK_NAMES, RUN_ARGV0
from .spec import CONTAINER_TMP, CONTAINER_WORKDIR, is_env_name

if TYPE_CHECKING:
    from typing import Mapping

    from .spec import LaunchSpec

MODES = ("inherit", "allowlist")
DEFAULT_MODE = "inherit"

# allowlist mode: what enters besides --container-env
PASS_NAMES = RANK_NAMES + ("USER", "LOGNAME", "TERM", "TZ", "OMP_NUM_THREADS", "SLURMD_NODENAME")
PASS_PREFIXES = ("SLURM_", "PBS_", "PMI_", "PMIX_", "OMPI_", "I_MPI_", "MPICH_", "UCX_", "NCCL_",
                 "CUDA_", "ROCR_", "HIP_", "TETHER_", "LC_")
# inherit mode: where the image (or the runtime's default) must win -- host paths and start-up
# files that mean something else, or nothing, inside
IMAGE_NAMES = ("PATH", "HOME", "PYTHONHOME", "PYTHONPATH", "BASH_ENV", "ENV", "TMPDIR", "PWD", "OLDPWD",
               "SHLVL", "_", "LANG", "LANGUAGE", "LC_ALL")
IMAGE_PREFIXES = ("LD_",)
# The runtimes read these themselves; inside a container they mean nothing or something harmful.
RUNTIME_CONTROL = ("APPTAINER", "SINGULARITY", "ENROOT_", "CONTAINERS_", "PODMAN_", "BUILDAH_",
                   "_CONTAINERS_")
# ... and two of them by their whole name (XDG_RUNTIME_DIR_OLD is the job's, as pyxis passes it)
RUNTIME_CONTROL_NAMES = ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")
# Host-side paths of the per-rank directories: meaningless inside, replaced by OVERRIDES.
HOST_ONLY = _RANK_HOST_ONLY + (RUN_ARGV0, BATCH_VAR)


def overrides(spec: LaunchSpec) -> dict[str, str]:
    """tether's own values inside the container (plain values: safe on any command line)."""
    values = {"TETHER_CONTAINER": "1"}
    if spec.rank_dir:
        values.update(TMPDIR=CONTAINER_TMP, TETHER_WORK_DIR=CONTAINER_WORKDIR)
    return values


def is_control(name: str) -> bool:
    """A runtime's own control variable (never passed into a container)."""
    return name.startswith(RUNTIME_CONTROL) or name in RUNTIME_CONTROL_NAMES


def image_wins(name: str) -> bool:
    """In inherit mode: a variable whose host value is not passed (the image's own applies)."""
    return name in IMAGE_NAMES or name.startswith(IMAGE_PREFIXES)


def allowed(name: str) -> bool:
    """In allowlist mode: a variable passed without being named in --container-env."""
    return (name in PASS_NAMES or name.startswith(PASS_PREFIXES)) and not image_wins(name)


def passed_from_host(host: Mapping[str, str], spec: LaunchSpec, mode: str = DEFAULT_MODE) -> dict[str, str]:
    """The host variables that enter the container with their host values (see the module doc)."""
    if mode not in MODES:
        raise ValueError(f"container environment mode {mode!r}: expected one of {', '.join(MODES)}")
    own = overrides(spec)
    named = set(spec.env_names)
    inherit = mode == "inherit"
    chosen = {}
    for name, value in host.items():
        if name in own or name in HOST_ONLY or not is_env_name(name) or is_control(name):
            continue
        if name in named or (not image_wins(name) if inherit else allowed(name)):
            chosen[name] = value
    return chosen


def entrypoint_split(passed: Mapping[str, str], spec: LaunchSpec) -> tuple[dict[str, str], dict[str, str]]:
    """(what the image's entrypoint starts with, what is set after it for the names it left
    unset) of the ``passed`` variables. Without ``--container-entrypoint`` everything is passed at
    once. pyxis starts the entrypoint with the container's environment and the ``--container-env``
    names only (its suite: a job's ``DOCKER_TLS_VERIFY`` reaches docker's entrypoint only when
    named), then gives the task the job's variables the container's environment lacks."""
    if not spec.entrypoint:
        return dict(passed), {}
    named = set(spec.env_names)
    first = {n: v for n, v in passed.items() if n in named or allowed(n)}
    return first, {n: v for n, v in passed.items() if n not in first}


def _names(items) -> str:
    return ", ".join(f"`{n}`" for n in items)


def _prefix(prefix: str) -> str:
    """A passed prefix, with the image's names it covers named as exceptions (`LC_*` but `LC_ALL`)."""
    but = [n for n in IMAGE_NAMES if n.startswith(prefix)]
    return f"`{prefix}*`" + (f" but {_names(but)}" if but else "")


def contract_table() -> str:
    """The contract as a Markdown table (kept in the README, checked by the tests)."""
    control = ", ".join([f"`{p}*`" for p in RUNTIME_CONTROL] + [f"`{n}`" for n in RUNTIME_CONTROL_NAMES])
    rows = [
        "| variables | `inherit` (default) | `allowlist` |",
        "|---|---|---|",
        f"| `TMPDIR`, `TETHER_WORK_DIR`, `TETHER_CONTAINER` | `{CONTAINER_TMP}`, `{CONTAINER_WORKDIR}` "
        "(the rank's own directories, in a tether step), `1`: tether's value, always | the same |",
        f"| the rank's ({_names(RANK_NAMES)}) | the rank's values | the same |",
        f"| {', '.join(_prefix(p) for p in PASS_PREFIXES)}; "
        f"{_names(n for n in PASS_NAMES if n not in RANK_NAMES)} | passed | passed |",
        "| everything else the job has (`FOO`, `HF_HOME`, `OMP_PLACES`, ...) | passed | "
        "not passed, unless named in `--container-env` |",
        f"| {_names(IMAGE_NAMES)}, {', '.join(f'`{p}*`' for p in IMAGE_PREFIXES)} | not passed: the image's "
        "own value (or the runtime's default), unless named in `--container-env` | the same |",
        f"| {_names(HOST_ONLY)} | not passed (host paths) | the same |",
        f"| {control} | never passed, even when named in `--container-env` | the same |",
    ]
    return "\n".join(rows) + "\n"
