"""tether.pbs_hooks: tether's OpenPBS hooks.

handler (queuejob/modifyjob: slots -> select, place, Rerunable, umask, project, queue; container
variables checked), mom (execjob_begin/launch/end/abort: directories through the tether-jobdirs
helper, the rank environment, containers for TM tasks, cleanup), the hook files qmgr imports
(tether_submit.py, tether_exec.py), ``tether pbs install`` (install.py) and the qstat/pbsnodes/qdel
helpers (commands.py).
"""

# tether's custom PBS resources (``qsub -l tether_slots=8 …``): resource -> (the Request field it
# sets, its PBS type). `tether pbs install` creates them; the submit hook plans from them; the MoM
# hook describes them to the job as TETHER_JOB_<FIELD> (the Slurm side's names).
RESOURCES = {"tether_slots": ("slots", "long"), "tether_slots_per_node": ("slots_per_node", "long"),
             "tether_slot_type": ("slot_type", "string"), "tether_gpu_type": ("gpu_type", "string")}
