"""tether.hooks: the scheduler-neutral core.

config (schema, loader) -> Request (what the user asked) -> Plan (the seed's resource tables and
the option policy; pure, no I/O) -> renderers (Slurm options, #SBATCH/#PBS lines, PBS select).
Also the ``tether`` command line and the sandbox cluster used by tests and demos.
"""

__version__ = "0.1.0"
