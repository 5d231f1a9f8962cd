"""Build ``job_submit_tether.so``: shim.c plus cffi's embedding of tether.job_submit.handler."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from tether.hooks.native import Toolchain, c_string, compile_plugin

SO_NAME = "job_submit_tether.so"
MODULE = "_tether_job_submit"

# The part of job_desc_msg_t the handler touches; "...;" lets cffi take offsets from slurm.h.
CDEF = """
#define NO_VAL ...
#define NO_VAL16 ...
#define SLURM_VERSION_NUMBER ...
typedef struct job_descriptor {
    char *account;
    uint32_t job_id;
    char *job_id_str;
    char *partition;
    char *wckey;
    uint16_t requeue;
    uint32_t min_nodes;
    uint32_t max_nodes;
    uint32_t num_tasks;
    uint16_t ntasks_per_node;
    uint16_t cpus_per_task;
    char *tres_per_job;
    char *tres_per_node;
    char *tres_per_socket;
    char *tres_per_task;
    char **spank_job_env;
    uint32_t spank_job_env_size;
    uint32_t user_id;
    ...;
} job_desc_msg_t;
void tether_set_str(char **field, const char *value);
void tether_log(int level, const char *msg);
void tether_set_health(int broken, int reject_all, const char *reason);
"""

EMBEDDING_API = """
int tether_py_init(void);
int tether_py_submit(job_desc_msg_t *job_desc, uint32_t submit_uid, int wanted, char *msg, int msg_len);
int tether_py_modify(job_desc_msg_t *update, job_desc_msg_t *current, uint32_t submit_uid, char *msg,
                     int msg_len);
"""

# Runs once, in the interpreter shim.c started, on the first call (from init()). Kept tiny and
# defensive: the extern functions exist even if importing the handler fails.
INIT_CODE = f"""
from {MODULE} import ffi, lib

try:
    from tether.job_submit import handler as _handler
    _handler.bind(ffi, lib)
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
def tether_py_submit(job_desc, submit_uid, wanted, msg, msg_len):
    return _handler.call("submit", job_desc, submit_uid, wanted, msg, msg_len) if _handler else -1


@ffi.def_extern(error=-1)
def tether_py_modify(update, current, submit_uid, msg, msg_len):
    return _handler.call("modify", update, current, submit_uid, msg, msg_len) if _handler else -1
"""


def source(toolchain: Toolchain) -> str:
    shim = resources.files("tether.job_submit").joinpath("shim.c").read_text()
    paths = ", ".join(c_string(p) for p in toolchain.module_paths)
    return (shim.replace("@MODULE_PATHS@", paths)
                .replace('L"@PYTHON_HOME@"', "L" + c_string(toolchain.python_home)))


def build(out_dir: Path, toolchain: Toolchain, *, verbose: bool = False, extra_init: str = "") -> Path:
    """Compile the job_submit plugin into ``out_dir``. ``extra_init`` is appended to the embedded
    init code (the tests use it to make the handler fail inside a real slurmctld)."""
    return compile_plugin(module=MODULE, source=source(toolchain), target=out_dir / SO_NAME,
                          toolchain=toolchain, cdef=CDEF, embedding_api=EMBEDDING_API,
                          init_code=INIT_CODE + extra_init, verbose=verbose)
