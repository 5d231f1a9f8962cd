"""tether.pbs_hooks: the OpenPBS hook handlers and the hook files qmgr imports. Not built yet."""
