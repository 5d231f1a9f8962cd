"""tether.cli: the ``tether`` command (users' and admins' subcommands)."""
