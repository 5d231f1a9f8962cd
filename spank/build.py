"""Build ``spank_tether.so`` from this folder's C units and the shared ones of tether.native.

A plain C plugin (no Python linked in): srun, sbatch and each slurmstepd load it, and libpython in
it would cost every step several milliseconds even when no Python runs (bench/step.py measured
1.14 x a plugin-free step with libpython linked).

The image grammar (imageref.c), the option values' grammars (values.c), the job directories (jobdirs.c) and the generated names header
(tether_names.h) are tether.native's: other components link them too.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ..native import build as native
from ..system.toolchain import CBuild, Toolchain

SO_NAME = "spank_tether.so"
UNITS = ("dispatch.c", "options.c", "client.c", "stepd.c", "rankenv.c", "cgkeeper.c")
NATIVE_UNITS = ("imageref.c", "values.c", "option_values.c", "jobdirs.c")      # tether.native's, linked in
# What Slurm looks up in a SPANK plugin (SPANK_PLUGIN's four symbols and the callbacks); nothing
# else is exported, so no symbol of tether's can interpose on or be bound by another object.
EXPORTS = ("plugin_name", "plugin_type", "plugin_version", "spank_plugin_version", "slurm_spank_*")


def source_dir() -> Path:
    """Where this folder's C files are (installed as package data)."""
    return Path(str(resources.files("tether.spank")))


def objects(cbuild: CBuild, toolchain_include: str) -> list[Path]:
    """This folder's units and the shared ones it links, as object files."""
    shared = native.source_dir()
    return [cbuild.compile(source_dir() / unit, include_dirs=[toolchain_include, str(shared)], header_dirs=[shared])
            for unit in UNITS] + [cbuild.compile(shared / unit) for unit in NATIVE_UNITS]


def build(out_dir: Path, toolchain: Toolchain, cbuild: CBuild) -> Path:
    """Compile and link the SPANK plugin into ``out_dir``."""
    return cbuild.link(objects(cbuild, toolchain.include_dir), out_dir / SO_NAME, shared=True,
                       link_args=["-Wl,-z,nodelete"], exports=EXPORTS)

