"""tether.pbs_hooks: tether's OpenPBS hooks, one module per side.

server (queuejob, modifyjob: slots -> select, place, Rerunable, umask, project, queue; container
variables checked), mom (execjob_begin, execjob_launch, execjob_end, execjob_abort: directories
through tether-jobdirs, the rank environment, containers for TM tasks, cleanup), the hook files
qmgr imports (tether_submit.py, tether_exec.py), tether-jobdirs' main (tether_jobdirs.c), and
tether's one PBS client (commands.py: qstat/pbsnodes/qdel for the launcher, the pilot, workflow
packs and the admin commands, which all sit on floors above this one).

PBS runs hooks in its own interpreter, which pbs_server finalizes and starts again (on a change of
the resource definitions, and to bound its memory): nothing the hooks import may be a C extension
that cannot live through that (pyyaml's cannot: "metaclass conflict"), so the hooks read JSON
configs that ``tether pbs install`` writes, never YAML.
"""
