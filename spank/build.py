"""Build ``spank_tether.so``: the C shim of spank/shim.c with its option table from options.py."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from tether.hooks.native import Toolchain, c_string, compile_plugin

from .options import CONTAINERS_UNAVAILABLE, KINDS, OPTIONS

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
    shim = resources.files("tether.spank").joinpath("shim.c").read_text()
    return (shim.replace("/*@OPTION_TABLE@*/", option_table_c())
                .replace("/*@CONTAINERS_UNAVAILABLE@*/",
                         f"#define TETHER_CONTAINERS_UNAVAILABLE {c_string(CONTAINERS_UNAVAILABLE)}"))


def build(out_dir: Path, toolchain: Toolchain, *, verbose: bool = False) -> Path:
    """Compile the SPANK plugin into ``out_dir``."""
    return compile_plugin(module="_tether_spank", source=source(), target=out_dir / SO_NAME,
                          toolchain=toolchain, verbose=verbose)
