"""tether.spank: the SPANK plugin, in C (dispatch, options, client, stepd, jobdirs) and its build."""
