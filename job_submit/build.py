"""Build ``job_submit_tether.so``: shim.c plus cffi's embedding of tether.job_submit.handler."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from tether.hooks.native import Toolchain, c_string, compile_plugin

SO_NAME = "job_submit_tether.so"
MODULE = "_tether_job_submit"

# What the C shim copies out of job_desc for the handler, and the handler's answer (tether_job_t).
TETHER_JOB_FIELDS = """
    /* in: copied from job_desc by the calling slurmctld thread */
    uint32_t job_id;
    uint32_t user_id;
    uint32_t min_nodes;
    uint32_t max_nodes;
    uint32_t num_tasks;
    uint16_t ntasks_per_node;
    uint16_t cpus_per_task;
    char *job_id_str;
    char *partition;
    char *account;
    char *tres_per_job;
    char *tres_per_node;
    char *tres_per_task;
    char *tres_per_socket;
    char **spank_env;
    uint32_t spank_env_size;
    /* out: applied to job_desc by the calling thread when the answer is TETHER_ACCEPT */
    int set_nodes;
    uint32_t out_min_nodes;
    uint32_t out_max_nodes;
    int set_num_tasks;
    uint32_t out_num_tasks;
    int set_ntasks_per_node;
    uint16_t out_ntasks_per_node;
    int set_cpus_per_task;
    uint16_t out_cpus_per_task;
    int set_requeue;
    uint16_t out_requeue;
    int set_tres_per_job;
    char out_tres_per_job[TETHER_STR];
    int set_tres_per_node;
    char out_tres_per_node[TETHER_STR];
    int set_tres_per_task;
    char out_tres_per_task[TETHER_STR];
    int set_partition;
    char out_partition[TETHER_STR];
    int set_wckey;
    char out_wckey[TETHER_STR];
    char msg[TETHER_MSG];   /* for the user: the reason of a rejection, or notes */
    int cacheable;          /* the answer depends only on the request and the config */
"""


def _cdef_fields() -> str:
    """The fields for cffi: array sizes are taken from the compiled C ([...])."""
    text = re.sub(r"/\*.*?\*/", "", TETHER_JOB_FIELDS)
    return re.sub(r"\[TETHER_(STR|MSG)\]", "[...]", text)


# The request snapshot the C shim hands the handler (cffi checks the layout against shim.c).
CDEF = """
#define NO_VAL ...
#define NO_VAL16 ...
#define SLURM_VERSION_NUMBER ...
typedef struct tether_job {""" + _cdef_fields() + """} tether_job_t;
void tether_log(int level, const char *msg);
void tether_set_health(int broken, int reject_all, const char *reason);
void tether_config_loaded(const char *path, int exists, unsigned long long ino,
                          unsigned long long size, long long mtime_ns);
"""

EMBEDDING_API = """
int tether_py_init(void);
int tether_py_submit(tether_job_t *job, uint32_t submit_uid, int wanted);
int tether_py_modify(tether_job_t *update, tether_job_t *current, uint32_t submit_uid);
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
def tether_py_submit(job, submit_uid, wanted):
    return _handler.call("submit", job, submit_uid, wanted) if _handler else -1


@ffi.def_extern(error=-1)
def tether_py_modify(update, current, submit_uid):
    return _handler.call("modify", update, current, submit_uid) if _handler else -1
"""


def source(toolchain: Toolchain) -> str:
    shim = resources.files("tether.job_submit").joinpath("shim.c").read_text()
    paths = ", ".join(c_string(p) for p in toolchain.module_paths)
    from tether.job_submit.handler import CONFIG_CHECK_SECONDS

    struct = "typedef struct tether_job {" + TETHER_JOB_FIELDS + "} tether_job_t;"
    return (shim.replace("/*@TETHER_JOB_T@*/", struct)
                .replace("@MODULE_PATHS@", paths)
                .replace('L"@PYTHON_HOME@"', "L" + c_string(toolchain.python_home))
                .replace("@CONFIG_CHECK_NS@", str(int(CONFIG_CHECK_SECONDS * 1e9))))


def build(out_dir: Path, toolchain: Toolchain, *, verbose: bool = False, extra_init: str = "") -> Path:
    """Compile the job_submit plugin into ``out_dir``. ``extra_init`` is appended to the embedded
    init code (the tests use it to make the handler fail inside a real slurmctld)."""
    return compile_plugin(module=MODULE, source=source(toolchain), target=out_dir / SO_NAME,
                          toolchain=toolchain, cdef=CDEF, embedding_api=EMBEDDING_API,
                          init_code=INIT_CODE + extra_init, verbose=verbose)
