"""tether's options on srun/sbatch/salloc (the user's surface, ../shared/DESIGN.md), as one table.

The C shim's option table is generated from this at build time, the job_submit plugin reads the
values back from ``spank_job_env`` with it, and the README's option table is checked against it.
Every option has a ``TETHER_<NAME>`` environment fallback (used when the option is not given).
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.hooks.request import MAX_SLOTS, MAX_SLOTS_PER_NODE

PLUGIN_NAME = "tether"  # SPANK_PLUGIN(tether, 1): option values travel as _SLURM_SPANK_OPTION_tether_<name>

# Value kinds, validated in C in the client (cheap checks, a clear message) and again in Python.
KINDS = ("count", "slot_type", "name", "runtime", "text", "env_names", "flag")


@dataclass(frozen=True)
class SpankOption:
    """One option: ``--name`` on the command line, ``TETHER_<NAME>`` in the environment."""

    name: str
    arginfo: str | None   # None: a flag without a value
    kind: str
    usage: str
    minimum: int = 0
    maximum: int = 0

    @property
    def env(self) -> str:
        return "TETHER_" + self.name.upper().replace("-", "_")

    @property
    def spank_env(self) -> str:
        """How Slurm forwards the option in job_desc->spank_job_env."""
        return f"_SLURM_SPANK_OPTION_{PLUGIN_NAME}_{self.name.replace('-', '_')}"

    @property
    def control_env(self) -> str:
        """How the plugin forwards the effective value (option or env) via spank_job_control_setenv:
        ``TETHER_<NAME>`` in spank_job_env (prolog/epilog see it as ``SPANK_TETHER_<NAME>``)."""
        return self.env


OPTIONS: tuple[SpankOption, ...] = (
    SpankOption("slots", "N", "count", "slots for the job (the seed's slots_per_trial); 0: an auxiliary task",
                0, MAX_SLOTS),
    SpankOption("slots-per-node", "N", "count", "slots each node must provide (slots_per_node)",
                1, MAX_SLOTS_PER_NODE),
    SpankOption("slot-type", "cuda|rocm|cpu", "slot_type", "what a slot is; overrides the partition's and the cluster's"),
    SpankOption("gpu-type", "TYPE", "name", "GPU gres type for --gpus/--gres (gpu_type)"),
    SpankOption("resource-pool", "NAME", "name", "partition to run in (resource_pool)"),
    SpankOption("container-image", "IMAGE", "text", "docker://..., a .sif, a squashfs or a rootfs directory"),
    SpankOption("container-runtime", "apptainer|singularity|podman|enroot", "runtime",
                "container runtime (default from the config)"),
    SpankOption("container-mounts", "SRC:DST[:ro],...", "text", "bind mounts into the container"),
    SpankOption("container-workdir", "DIR", "text", "working directory inside the container"),
    SpankOption("container-env", "NAME,...", "env_names", "host variables that win over the image's"),
    SpankOption("container-writable", None, "flag", "writable container filesystem where the runtime supports it"),
    SpankOption("container-name", "NAME", "name", "reuse one container across the job's steps"),
)

BY_NAME = {opt.name: opt for opt in OPTIONS}
# Options that make a job a tether job for the job_submit plugin (a slot request).
PLANNER_OPTIONS = ("slots", "slots-per-node", "slot-type", "gpu-type", "resource-pool")
# Options that make a step run its tasks in a container (validated at submit by the job_submit
# plugin, applied in slurmstepd by the SPANK plugin, launched by tether.container).
CONTAINER_OPTIONS = tuple(o.name for o in OPTIONS if o.name.startswith("container-"))


def options_reference() -> str:
    """The user options as a Markdown table (kept in the README, checked by the tests)."""
    rows = ["| option | environment | value | meaning |", "|---|---|---|---|"]
    for opt in OPTIONS:
        value = opt.arginfo or "(flag)"
        if opt.kind == "count":
            value += f" ({opt.minimum}..{opt.maximum})"
        value = value.replace("|", "\\|")   # a pipe would end the table cell
        rows.append(f"| `--{opt.name}` | `{opt.env}` | `{value}` | {opt.usage} |")
    return "\n".join(rows) + "\n"
