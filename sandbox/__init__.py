"""tether.sandbox: a real local Slurm cluster for tests and demos (cluster), and ``tether demo``."""
