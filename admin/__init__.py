"""tether.admin: what a site admin runs to install tether: the Slurm plugins (slurm) and the PBS
hooks (pbs), each built, installed and configured the same way on every host."""
