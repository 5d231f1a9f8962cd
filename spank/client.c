/*
 * The SPANK plugin in srun, sbatch and salloc: apply the TETHER_<NAME> environment fallbacks (used
 * when the option is not given), then pyxis's PYXIS_CONTAINER_<NAME> (options.c), then forward every effective value to slurmctld with
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

/*
 * srun's option passes, kept for slurmstepd. Slurm 22.05 sends a step's SPANK options to every
 * component of a heterogeneous step alike (plugstack.c, spank_set_remote_options: the option
 * cache, one value per option, the last pass's), so `srun --container-image=X ./a : ./b` would
 * run ./b in X too, and `srun --het-group=0,1` in a batch script would give component 1 the
 * container of component 0's job. So srun writes each pass's own options (typed, not the
 * defaults taken from the job's environment) into its environment, which every task of the
 * step gets: TETHER_STEP_OPTIONS_<pass> ("name=value" joined by 0x1f), TETHER_STEP_PASSES, and
 * TETHER_STEP_DEFAULTS (the first pass's options from the job's environment: the batch script's
 * or salloc's job options, which are component 0's). slurmstepd gives each component of a
 * heterogeneous step its own pass's options (one pass for several components: that pass's),
 * plus the defaults for component 0 only (stepd.c, het_step_options). Only inside a
 * heterogeneous job, or from the second pass on.
 */
static char *first_pass, *first_defaults; /* pass 0's until we know the step is heterogeneous */

/* The options of this pass given on srun's command line (defaults: taken from the job's
 * environment), as "name=value" joined by 0x1f. */
static char *pass_options(int defaults)
{
	size_t len = 1;
	char *text;

	for (int i = 0; i < TETHER_NOPTS; i++)
		if (tether_opts[i].value && !tether_opts[i].from_env == !defaults)
			len += strlen(tether_opts[i].name) + strlen(tether_opts[i].value) + 2;
	text = calloc(1, len);
	if (text == NULL)
		return NULL;
	for (int i = 0; i < TETHER_NOPTS; i++) {
		if (!tether_opts[i].value || !tether_opts[i].from_env != !defaults)
			continue;
		if (text[0])
			strcat(text, "\x1f");
		strcat(text, tether_opts[i].name);
		strcat(text, "=");
		strcat(text, tether_opts[i].value);
	}
	return text;
}

static int put_pass(int pass, const char *text, const char *defaults)
{
	char name[64], count[16];

	snprintf(name, sizeof(name), TETHER_STEP_OPTIONS_PREFIX "%d", pass);
	snprintf(count, sizeof(count), "%d", pass + 1);
	if (setenv(name, text, 1) < 0 || setenv(TETHER_STEP_PASSES, count, 1) < 0 ||
	    (defaults && setenv(TETHER_STEP_DEFAULTS, defaults, 1) < 0)) {
		slurm_error("tether: cannot keep the options of this heterogeneous step's component %d", pass);
		return -1;
	}
	return 0;
}

static int record_step_options(void)
{
	char *text = pass_options(0), *defaults = tether_component == 0 ? pass_options(1) : NULL;
	int rc = 0;

	if (text == NULL || (tether_component == 0 && defaults == NULL)) {
		free(text);
		free(defaults);
		slurm_error("tether: out of memory");
		return -1;
	}
	if (tether_component == 0) {
		free(first_pass);
		free(first_defaults);
		first_pass = first_defaults = NULL;
		unsetenv(TETHER_STEP_PASSES); /* an outer srun's: this srun writes its own */
		unsetenv(TETHER_STEP_DEFAULTS);
		for (int pass = 0; pass < 1024; pass++) {
			char name[64];

			snprintf(name, sizeof(name), TETHER_STEP_OPTIONS_PREFIX "%d", pass);
			if (getenv(name) == NULL)
				break;
			unsetenv(name);
		}
		if (getenv("SLURM_HET_SIZE") == NULL) { /* perhaps `srun A : B`: known at pass 1 */
			first_pass = text;
			first_defaults = defaults;
			return 0;
		}
	} else if (tether_component == 1 && first_pass != NULL) {
		rc = put_pass(0, first_pass, first_defaults);
		free(first_pass);
		free(first_defaults);
		first_pass = first_defaults = NULL;
	}
	if (rc == 0)
		rc = put_pass(tether_component, text, defaults);
	free(text);
	free(defaults);
	return rc;
}

/* tether_env_getter over this process's environment (srun's, sbatch's, salloc's). */
static int process_env(void *ctx, const char *name, char *buf, size_t len)
{
	const char *value = getenv(name);

	(void)ctx;
	if (value == NULL)
		return 0;
	snprintf(buf, len, "%s", value);
	return 1;
}

/* A typed `--container-image=` (empty) runs a step of a job that has an image on the host. With
 * no image to leave (a job without one, or sbatch/salloc's own first component) it is a
 * mistake, as pyxis says for an image option without an argument: refused here, before the job
 * or step exists. */
static int empty_image_without_job_image(void)
{
	const struct tether_opt *image = &tether_opts[OPT_CONTAINER_IMAGE];
	const char *exported, *option;

	if (image->value == NULL || image->value[0] != '\0' || image->from_env || tether_component > 0)
		return 0;
	exported = getenv(TETHER_ENV_CONTAINER_IMAGE);
	option = tether_job_option_env(image);
	if (spank_context() == S_CTX_LOCAL && ((exported && exported[0]) || (option && option[0])))
		return 0;
	slurm_error("tether: --container-image= (empty): no image given. An empty image runs one step of a "
		    "job that has --container-image on the host; %s", spank_context() == S_CTX_LOCAL ?
		    "this job has none (give an image, or drop the option)" : "give an image, or drop the option");
	return -1;
}

int tether_client_post_opt(spank_t sp)
{
	char name[TETHER_MAX_NAME + 40];

	if (tether_component == 0 && tether_env_fallbacks(process_env, NULL) < 0)
		return -1;
	if (empty_image_without_job_image() < 0)
		return -1;
	if (spank_context() == S_CTX_LOCAL) {
		struct tether_opt *gw = &tether_opts[OPT_GATEWAYS];

		/* gateway nodes are a component of the job's allocation: srun cannot add them to a
		 * step; the allocation's own --gateways (from salloc's environment) means nothing here */
		if (gw->value != NULL && !gw->from_env) {
			slurm_error("tether: --gateways is an option of sbatch and salloc (a heterogeneous job's "
				    "component of gateway nodes), not of srun");
			return -1;
		}
		free(gw->value);
		gw->value = NULL;
		if (record_step_options() < 0)
			return -1;
	}
	/* TETHER_CONTAINER_* variables alone, with neither an image nor a name (a user's preference
	 * in their profile): no request of this job -- not forwarded, or slurmctld would refuse every
	 * job of the user ("--container-* options need --container-image"). Typed, they are refused. */
	if (tether_opts[OPT_CONTAINER_IMAGE].value == NULL && tether_opts[OPT_CONTAINER_NAME].value == NULL) {
		for (int i = OPT_CONTAINER_IMAGE + 1; i <= OPT_CONTAINER_BATCH; i++) {
			if (tether_opts[i].value != NULL && tether_opts[i].from_env) {
				free(tether_opts[i].value);
				tether_opts[i].value = NULL;
			}
		}
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
