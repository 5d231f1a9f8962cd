/*
 * The SPANK plugin in srun, sbatch and salloc: apply the TETHER_<NAME> environment fallbacks (used
 * when the option is not given), then forward every effective value to slurmctld with
 * spank_job_control_setenv: job_desc->spank_job_env gets TETHER_<NAME>=value, next to Slurm's own
 * _SLURM_SPANK_OPTION_tether_<name>=value for options given on the command line (prolog and epilog
 * see SPANK_TETHER_<NAME>). The job_submit plugin reads them there.
 */
#include <stdlib.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "client.h"
#include "options.h"

int tether_client_post_opt(spank_t sp)
{
	for (int i = 0; i < TETHER_NOPTS; i++) {
		const char *env = getenv(tether_opts[i].env);

		if (tether_opts[i].value == NULL && env != NULL && tether_opt_set(i, env, tether_opts[i].env, 1) < 0)
			return -1;
	}
	for (int i = 0; i < TETHER_NOPTS; i++) {
		const struct tether_opt *o = &tether_opts[i];
		spank_err_t rc;

		if (o->value == NULL)
			continue;
		rc = spank_job_control_setenv(sp, o->env, o->value, 1);
		if (rc != ESPANK_SUCCESS) {
			slurm_error("tether: cannot forward --%s to slurmctld: %s", o->name, spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}
