# tether's PBS server hook (events queuejob, modifyjob), imported by qmgr:
#   qmgr -c "import hook tether_submit application/x-python default tether_submit.py"
# Its JSON config (application/x-config), written by `tether pbs install`, holds tether's Python
# path and the validated tether configuration. This file stays small: when tether cannot load, it
# refuses jobs that ask for tether (resources named tether_*, TETHER_CONTAINER_* variables) and lets
# every other job through.
import json
import sys

import pbs

e = pbs.event()
try:
    with open(pbs.hook_config_filename) as fh:
        settings = json.load(fh)
    sys.path[:0] = [p for p in settings.get("python_path", []) if p not in sys.path]
    from tether.pbs_hooks.server import submit
except Exception as exc:  # tether not loadable: refuse tether jobs only, with the reason
    job = e.job
    wanted = any(str(name).startswith("tether_") for name in job.Resource_List.keys()) or any(
        str(name).startswith("TETHER_CONTAINER_") for name in (job.Variable_List or {}))
    if wanted:
        pbs.logmsg(pbs.LOG_ERROR, "tether: cannot load the hook: %s" % exc)
        e.reject("tether unavailable: the hook cannot load tether (details in the PBS server log)")
    e.accept()
submit(pbs, e, settings)
