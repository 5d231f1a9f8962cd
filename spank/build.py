"""Build ``spank_tether.so``: spank/shim.c + remote.c with the option table from options.py.

A plain C plugin (no Python linked in): srun, sbatch and each slurmstepd load it, and libpython in
it would cost every step several milliseconds even when no Python runs (bench/step.py measured
1.14 x a plugin-free step with libpython linked). Python work a step may need later goes into a
separate helper loaded only by steps that need it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from tether.hooks.native import Toolchain, c_string, compile_c_plugin

from .options import KINDS, OPTIONS

SO_NAME = "spank_tether.so"
_C_KINDS = {kind: f"K_{kind.upper()}" for kind in KINDS}


def option_table_c() -> str:
    """The C initializer of ``tether_opts[]`` generated from OPTIONS."""
    rows = []
    for opt in OPTIONS:
        arginfo = c_string(opt.arginfo) if opt.arginfo is not None else "NULL"
        rows.append(f"\t{{ {c_string(opt.name)}, {arginfo}, {c_string('[tether] ' + opt.usage)}, "
                    f"{_C_KINDS[opt.kind]}, {c_string(opt.env)}, {opt.minimum}L, {opt.maximum}L, NULL, 0 }},")
    return "static struct tether_opt tether_opts[] = {\n" + "\n".join(rows) + "\n};"


def source() -> str:
    files = resources.files("tether.spank")
    shim = "\n".join(files.joinpath(name).read_text() for name in ("jobdirs.c", "shim.c", "remote.c"))
    return shim.replace("/*@OPTION_TABLE@*/", option_table_c())


def build(out_dir: Path, toolchain: Toolchain, *, verbose: bool = False) -> Path:
    """Compile the SPANK plugin into ``out_dir``."""
    return compile_c_plugin(source=source(), target=out_dir / SO_NAME, toolchain=toolchain,
                            verbose=verbose)
