"""Build ``job_submit_tether.so``: this folder's C units, linked with cffi's embedding of the handler.

plugin.c (the Slurm ABI), cache.c (the answers cache, by request and by shape), worker.c (the
interpreter and its thread) and tether.native's imageref.c (the image grammar, the SPANK plugin's
too) are compiled on their own with tether's strict flags; cffi generates only the glue of the
embedding API and links them in. Its declarations (``cdef``) are read from bridge.h between the
markers, so the struct the C side fills is the one Python reads.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from ..native import build as native
from ..system.toolchain import CBuild, Toolchain, c_string, compile_cffi_plugin, define
from .handler import CONFIG_CHECK_SECONDS

SO_NAME = "job_submit_tether.so"
MODULE = "_tether_job_submit"
UNITS = ("plugin.c", "cache.c", "request.c", "worker.c")
NATIVE_UNITS = ("imageref.c", "values.c", "option_values.c")    # tether.native's grammars, linked in
BRIDGE = "bridge.h"
# What slurmctld looks up in a job_submit plugin (22.05 and later); nothing else is exported.
EXPORTS = ("plugin_name", "plugin_type", "plugin_version", "init", "fini", "job_submit", "job_modify")


def source_dir() -> Path:
    return Path(str(resources.files("tether.job_submit")))


def _between(text: str, marker: str) -> str:
    """The lines between the ``/* <marker>:begin`` and ``/* <marker>:end`` lines, without comments."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if f"/* {marker}:begin" in line)
    end = next(i for i, line in enumerate(lines) if f"/* {marker}:end" in line)
    return re.sub(r"/\*.*?\*/", "", "\n".join(lines[start + 1:end]), flags=re.S) + "\n"


def cdef() -> str:
    """bridge.h's declarations for cffi (array sizes taken from the compiled C: ``[...]``)."""
    text = (source_dir() / BRIDGE).read_text()
    body = re.sub(r"\[TETHER_(STR|MSG)\]", "[...]", _between(text, "cdef"))
    return "#define NO_VAL ...\n#define NO_VAL16 ...\n#define SLURM_VERSION_NUMBER ...\n" + body


def embedding_api() -> str:
    """The functions Python implements (bridge.h's embedding section)."""
    return _between((source_dir() / BRIDGE).read_text(), "embedding")


# Runs once, in the interpreter worker.c started, on the first call (from init()). Kept tiny and
# defensive: the extern functions exist even if importing the handler fails.
INIT_CODE = f"""
from {MODULE} import ffi, lib

try:
    from tether.job_submit import handler as _handler
    _handler.bind(ffi, lib)
    import sys as _sys
    _sys.setrecursionlimit(_handler.RECURSION_LIMIT)    # slurmctld's 1 MiB threads (worker.c)
except Exception as _exc:
    import traceback as _tb
    _handler = None
    lib.tether_set_health(1, 0, ("cannot import tether.job_submit.handler: %s" % (_exc,)).encode()[:500])
    for _line in _tb.format_exc().splitlines():
        lib.tether_log(0, _line.encode("utf-8", "replace"))


@ffi.def_extern(error=-1)
def tether_py_init():
    return _handler.call("init") if _handler else -1


@ffi.def_extern(error=-1)
def tether_py_submit(job, submit_uid, wanted):
    return _handler.call("submit", job, submit_uid, wanted) if _handler else -1


@ffi.def_extern(error=-1)
def tether_py_modify(update, current, submit_uid):
    return _handler.call("modify", update, current, submit_uid) if _handler else -1
"""

# The C glue's own source: the declarations cffi checks its cdef against.
GLUE = '#include <slurm/slurm.h>\n#include "bridge.h"\n'


def objects(cbuild: CBuild, toolchain: Toolchain) -> list[Path]:
    """The units as object files, with the build-time values worker.c and cache.c need."""
    defines = [define("TETHER_PYTHON_HOME", toolchain.python_home),
               "-DTETHER_MODULE_PATHS=" + ",".join(map(c_string, toolchain.module_paths)),
               define("TETHER_CONFIG_CHECK_NS", int(CONFIG_CHECK_SECONDS * 1e9)) + "L"]
    shared = native.source_dir()
    include = [toolchain.include_dir, toolchain.python_include, str(shared)]
    return [cbuild.compile(source_dir() / unit, include_dirs=include, defines=defines,
                           header_dirs=[shared]) for unit in UNITS] + [
        cbuild.compile(shared / unit) for unit in NATIVE_UNITS]


def build(out_dir: Path, toolchain: Toolchain, cbuild: CBuild, *, extra_init: str = "") -> Path:
    """Compile the job_submit plugin into ``out_dir``. ``extra_init`` is appended to the embedded
    init code (the tests use it to make the handler fail inside a real slurmctld)."""
    return compile_cffi_plugin(module=MODULE, glue=GLUE, cdef=cdef(), embedding_api=embedding_api(),
                               init_code=INIT_CODE + extra_init, objects=objects(cbuild, toolchain),
                               include_dirs=[str(source_dir())], target=out_dir / SO_NAME,
                               toolchain=toolchain, exports=EXPORTS, verbose=cbuild.verbose)
