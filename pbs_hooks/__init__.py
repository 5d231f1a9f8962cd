"""tether.pbs_hooks: tether's OpenPBS hooks.

handler (queuejob/modifyjob: slots -> select, place, Rerunable, umask, project, queue), the hook
file qmgr imports (tether_submit.py), and ``tether pbs install`` (install.py). The MoM hooks
(execjob_begin/launch/end) are not built yet.
"""
