"""tether.spank: the SPANK plugin, in C (dispatch, options, client, stepd, rankenv, cgkeeper; tether.native's
imageref and jobdirs linked in) and its build."""
