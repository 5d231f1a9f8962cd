"""tether.hooks: the scheduler-neutral request rewrite that the Slurm plugin and the PBS hooks call.

surface (every option, variable and resource name) -> config (schema, validation; configfile reads
the YAML) -> request (what the user asked) -> plan (docs/requirements.md's resource tables, pure) -> render
(Slurm options, #SBATCH/#PBS lines, PBS select) and header (a tether batch script's own options);
policy (the options tether controls), layout (the directories under job_storage_root), errors.
"""
