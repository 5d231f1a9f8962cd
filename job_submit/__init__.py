"""tether.job_submit: the Slurm job_submit plugin: C units (plugin, cache, worker), the bridge to the
Python handler, the handler, and its build."""
