# tether's PBS server hook (events queuejob, modifyjob), imported by qmgr:
#   qmgr -c "import hook tether_submit application/x-python default tether_submit.py"
# Its JSON config (application/x-config) names tether's Python path and tether's config file.
import json
import sys

import pbs

e = pbs.event()
try:
    with open(pbs.hook_config_filename) as fh:
        settings = json.load(fh)
    sys.path[:0] = [p for p in settings.get("python_path", []) if p not in sys.path]
    from tether.pbs_hooks.handler import submit
except Exception as exc:  # tether not importable: refuse tether jobs only, with the reason
    if any(e.job.Resource_List[r] is not None for r in ("tether_slots", "tether_slots_per_node",
                                                       "tether_slot_type", "tether_gpu_type")):
        pbs.logmsg(pbs.LOG_ERROR, "tether: cannot load the hook: %s" % exc)
        e.reject("tether unavailable: the hook cannot load tether (details in the PBS server log)")
    e.accept()
submit(pbs, e, settings.get("config"))
