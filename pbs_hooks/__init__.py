"""tether.pbs_hooks: tether's OpenPBS hooks.

handler (queuejob/modifyjob: slots -> select, place, Rerunable, umask, project, queue; container
variables checked), mom (execjob_begin/launch/end/abort: directories through the tether-jobdirs
helper, the rank environment, containers for TM tasks, cleanup), the hook files qmgr imports
(tether_submit.py, tether_exec.py), ``tether pbs install`` (install.py) and the qstat/pbsnodes/qdel
helpers (commands.py).
"""
