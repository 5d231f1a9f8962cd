"""tether.job_submit: the Slurm job_submit plugin (cffi C shim and Python handler). Not built yet."""
