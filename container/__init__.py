"""tether.container: running ranks in containers, tightly integrated with the resource manager.

spec (the launch spec) -> environment (the contract) -> runtimes/<name> (one adapter per runtime:
argv, environment, preparation and cleanup) -> launch (exec in place, or supervise as a child
subreaper); run (the slurmstepd hand-off and ``tether run``), images (the Apptainer image cache),
scripts (per-node launch scripts for Slurm and PBS).
"""
