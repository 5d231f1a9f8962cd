# tether's PBS MoM hook (events execjob_begin, execjob_launch, execjob_end, execjob_abort), imported by qmgr:
#   qmgr -c "import hook tether_exec application/x-python default tether_exec.py"
# Its JSON config (application/x-config), written by `tether pbs install`, names tether's Python
# path, job_storage_root, and the tether-jobdirs helper and container launcher on every host. When
# tether cannot load, jobs that ask for tether (resources named tether_*, a container image) cannot
# start here; every other job is untouched.
import json
import sys

import pbs

e = pbs.event()
try:
    with open(pbs.hook_config_filename) as fh:
        settings = json.load(fh)
    sys.path[:0] = [p for p in settings.get("python_path", []) if p not in sys.path]
    from tether.pbs_hooks.mom import handle
except Exception as exc:  # tether not loadable: tether jobs cannot start here, others are untouched
    job = e.job
    wanted = job is not None and (
        any(str(name).startswith("tether_") for name in job.Resource_List.keys())
        or "TETHER_CONTAINER_IMAGE" in (job.Variable_List or {}))
    if wanted:
        pbs.logmsg(pbs.LOG_ERROR, "tether: cannot load the hook: %s" % exc)
        if e.type in (pbs.EXECJOB_BEGIN, pbs.EXECJOB_LAUNCH):
            e.reject("tether unavailable: the hook cannot load tether (details in the MoM log)")
    e.accept()
handle(pbs, e, settings)
