/*
 * The SPANK plugin in srun, sbatch and salloc: apply the TETHER_<NAME> environment fallbacks (used
 * when the option is not given), then forward every effective value to slurmctld with
 * spank_job_control_setenv: job_desc->spank_job_env gets TETHER_<NAME>=value, next to Slurm's own
 * _SLURM_SPANK_OPTION_tether_<name>=value for options given on the command line (prolog and epilog
 * see SPANK_TETHER_<NAME>). The job_submit plugin reads them there.
 *
 * A heterogeneous job (sbatch/salloc/srun with `hetjob` or ` : `) goes through here once per
 * component, after that component's options (Slurm 22.05, sbatch.c: one option pass and one
 * spank_init_post_opt per component). Two things of Slurm's are job-wide, not per component:
 * the job control environment (opt.spank_job_env is never reset between components) and the
 * option cache behind _SLURM_SPANK_OPTION_* (an option found in component 0 stays "found" and is
 * set again for every later component). So each component forwards only the options it was given
 * itself, and takes back what an earlier component left in the job control environment; the
 * TETHER_<NAME> environment fallbacks apply to the first component only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "client.h"
#include "options.h"

int tether_client_post_opt(spank_t sp)
{
	char name[TETHER_MAX_NAME + 40];

	for (int i = 0; tether_component == 0 && i < TETHER_NOPTS; i++) {
		const char *env = getenv(tether_opts[i].env);

		if (tether_opts[i].value == NULL && env != NULL && tether_opt_set(i, env, tether_opts[i].env, 1) < 0)
			return -1;
	}
	for (int i = 0; i < TETHER_NOPTS; i++) {
		const struct tether_opt *o = &tether_opts[i];
		spank_err_t rc;

		if (o->value == NULL) {
			if (tether_component > 0) { /* an earlier component's: not this one's */
				tether_slurm_option_env(o, name, sizeof(name));
				spank_job_control_unsetenv(sp, o->env);
				spank_job_control_unsetenv(sp, name);
			}
			continue;
		}
		rc = spank_job_control_setenv(sp, o->env, o->value, 1);
		if (rc != ESPANK_SUCCESS) {
			slurm_error("tether: cannot forward --%s to slurmctld: %s", o->name, spank_strerror(rc));
			return -1;
		}
	}
	slurm_verbose("tether: options of component %d forwarded", tether_component);
	tether_opts_clear(); /* the next component starts from its own options */
	tether_component++;
	return 0;
}
