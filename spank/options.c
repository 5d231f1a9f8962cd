/*
 * tether's SPANK options: values, validation, registration, plugstack.conf arguments.
 *
 * Options are registered with spank_option_register() inside slurm_spank_init (the static
 * spank_options[] table is not read in allocator context). Values are checked here, cheaply and
 * with a clear message, in srun/sbatch/salloc and again when slurmstepd receives them; slurmctld
 * and the launcher check them once more where they are used.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "imageref.h"
#include "jobdirs.h"
#include "option_values.h"
#include "options.h"
#include "values.h"

struct tether_opt tether_opts[TETHER_NOPTS] = TETHER_OPTION_TABLE;
static const int partners[TETHER_NOPTS] = TETHER_PARTNERS;
static const struct tether_pyxis_env pyxis_env[TETHER_PYXIS_NENV] = TETHER_PYXIS_ENV_TABLE;

const char *tether_job_storage_root = TETHER_DEFAULT_JOB_STORAGE_ROOT;
const char *tether_launcher;
const char *tether_gateway_partition;
int tether_container_batch;
const char *tether_user_dirs = TETHER_DEFAULT_USER_DIRS;

const char *tether_opt_value(enum tether_option id)
{
	return tether_opts[id].value;
}

int tether_any_option(void)
{
	for (int i = 0; i < TETHER_NOPTS; i++)
		if (tether_opts[i].value)
			return 1;
	return 0;
}

/* Is ``value`` valid for ``o``? The normalized value, or NULL (option_values.c: tether_value_check). */
static const char *check_value(const struct tether_opt *o, const char *value)
{
	if (o->kind == K_FLAG && value == NULL) /* slurmstepd hands a set flag over as "" or NULL */
		return "1";
	if (o->kind == K_IMAGE && value == NULL) /* slurmstepd may hand an empty argument over so */
		return "";
	if (value == NULL)
		return NULL;
	return tether_value_check(o->kind, o->minimum, o->maximum, value);
}

/* The message for a value ``o`` refused (tether_fail: in slurmstepd the step fails with it). */
static void report_bad(const struct tether_opt *o, const char *value, const char *how)
{
	const char *shown = value ? value : "";

	switch (o->kind) {
	case K_COUNT:
		tether_fail("tether: %s=%.40s: expected a whole number from %ld to %ld", how, shown,
			    o->minimum, o->maximum);
		break;
	case K_SLOT_TYPE:
		tether_fail("tether: %s=%.40s: expected one of %s", how, shown, TETHER_SLOT_TYPES_TEXT);
		break;
	case K_RUNTIME:
		tether_fail("tether: %s=%.40s: expected one of %s", how, shown, TETHER_RUNTIMES_TEXT);
		break;
	case K_NAME:
		tether_fail("tether: %s: expected a name of letters, digits, '.', '_', '-' (at most %ld "
			    "characters)", how, o->maximum > 0 ? o->maximum : (long)TETHER_MAX_NAME);
		break;
	case K_CONTAINER_NAME:
		tether_fail("tether: %s: expected NAME[:FLAG]: a name of letters, digits, '.', '_', '-' (at most "
			    "%ld characters), FLAG one of %s", how, o->maximum > 0 ? o->maximum : (long)TETHER_MAX_NAME,
			    TETHER_CONTAINER_NAME_FLAGS_TEXT);
		break;
	case K_ENV_NAMES:
		tether_fail("tether: %s: expected variable names separated by commas (NAME,NAME)", how);
		break;
	case K_FLAG:
		tether_fail("tether: %s=%.40s: expected 1/0, true/false or yes/no", how, shown);
		break;
	case K_IMAGE:
		tether_fail("tether: %s=%.60s: expected %s%s", how, shown, TETHER_IMAGE_FORMS,
			    tether_image_looks_local(shown) ? " (a local image: its path, absolute or starting with ./)" : "");
		break;
	case K_NAMESPACES: {
		size_t n = 0;
		const char *word = tether_unknown_namespace(shown, &n);

		if (word != NULL && n == 0)
			tether_fail("tether: %s=%.60s: empty namespace argument (expected namespaces separated by "
				    "commas, of %s)", how, shown, TETHER_UNSHARE_NAMESPACES_TEXT);
		else
			tether_fail("tether: %s=%.60s: unknown namespace '%.*s' (expected namespaces separated by "
				    "commas, of %s)", how, shown, (int)(n > 40 ? 40 : n), word ? word : "",
				    TETHER_UNSHARE_NAMESPACES_TEXT);
		break;
	}
	default:
		tether_fail("tether: %s: expected printable text of at most %d characters", how,
			    TETHER_MAX_TEXT);
	}
}

int tether_opt_set(int index, const char *value, const char *how, int from_env)
{
	struct tether_opt *o = &tether_opts[index];
	const char *normalized = check_value(o, value);
	char *copy;

	if (normalized == NULL) {
		report_bad(o, value, how);
		return -1;
	}
	copy = strdup(normalized);
	if (copy == NULL) {
		tether_fail("tether: %s: out of memory", how);
		return -1;
	}
	free(o->value); /* Slurm may call us twice (script and command line): the last one wins */
	o->value = copy;
	o->from_env = from_env;
	return 0;
}

/* Has option ``i`` or its partner of opposite meaning a value? */
static int taken(int i)
{
	return i >= 0 && (tether_opts[i].value != NULL || (partners[i] >= 0 && tether_opts[partners[i]].value != NULL));
}

int tether_partner_set(int i)
{
	return partners[i] >= 0 && tether_opts[partners[i]].value != NULL;
}

int tether_env_fallbacks(tether_env_getter get, void *ctx)
{
	static const char *const yes[] = { TETHER_PYXIS_TRUE, NULL };
	static const char *const no[] = { TETHER_PYXIS_FALSE, NULL };
	char value[TETHER_MAX_TEXT + 2];

	for (int i = 0; i < TETHER_NOPTS; i++) {
		if (taken(i) || !get(ctx, tether_opts[i].env, value, sizeof(value)))
			continue;
		if (tether_opt_set(i, value, tether_opts[i].env, 1) < 0)
			return -1;
	}
	for (int v = 0; v < TETHER_PYXIS_NENV; v++) {
		const struct tether_pyxis_env *p = &pyxis_env[v];
		int rc = 0;

		if (taken(p->on) || taken(p->off) || !get(ctx, p->name, value, sizeof(value)) || value[0] == '\0')
			continue; /* an empty one is ignored, as pyxis does */
		if (tether_opts[p->on].kind != K_FLAG)
			rc = tether_opt_set(p->on, value, p->name, 1);
		else if (tether_one_of(value, yes))
			rc = tether_opt_set(p->on, "1", p->name, 1);
		else if (tether_one_of(value, no))
			rc = p->off >= 0 ? tether_opt_set(p->off, "1", p->name, 1) : 0;
		else
			rc = tether_opt_set(p->on, value, p->name, 1); /* refused, naming the variable */
		if (rc < 0)
			return -1;
	}
	return 0;
}

int tether_component;

void tether_slurm_option_env(const struct tether_opt *o, char *buf, size_t len)
{
	snprintf(buf, len, "_SLURM_SPANK_OPTION_tether_%s", o->name);
	for (char *c = buf; *c; c++)
		if (*c == '-')
			*c = '_';
}

const char *tether_job_option_env(const struct tether_opt *o)
{
	char env[TETHER_MAX_NAME + 60];

	memcpy(env, "SLURM_SPANK_", 12);
	tether_slurm_option_env(o, env + 12, sizeof(env) - 12);
	return getenv(env);
}

static int option_cb(int val, const char *optarg, int remote)
{
	char how[TETHER_MAX_NAME + 3];
	int rc;

	if (val < 0 || val >= TETHER_NOPTS)
		return remote ? 0 : -1;
	if (!remote && optarg != NULL) {
		/* A later component of a heterogeneous job: sbatch put each earlier component's job
		 * control environment into its own as SLURM_SPANK_<name> (sbatch.c, _set_spank_env),
		 * and its next option pass applies every option found there again
		 * (plugstack.c, spank_process_env_options, passing getenv()'s own pointer): not this
		 * component's options. In the first component (srun in a batch script or salloc) they
		 * are the job's own options: defaults, as the TETHER_<NAME> environment fallbacks. */
		if (optarg == tether_job_option_env(&tether_opts[val])) {
			if (tether_component > 0)
				return 0;
			snprintf(how, sizeof(how), "--%s", tether_opts[val].name);
			return tether_opt_set(val, optarg, how, 1);
		}
	}
	snprintf(how, sizeof(how), "--%s", tether_opts[val].name);
	rc = tether_opt_set(val, optarg, how, 0);
	/* In slurmstepd a refused value fails the step's tasks (kept by tether_fail); failing here
	 * would fail slurmstepd's own start, which drains the node for a batch job. */
	return remote ? 0 : rc;
}

int tether_register_options(spank_t sp)
{
	for (int i = 0; i < TETHER_NOPTS; i++) {
		struct spank_option opt = {
			.name = (char *)tether_opts[i].name,
			.arginfo = (char *)tether_opts[i].arginfo,
			.usage = (char *)tether_opts[i].usage,
			.has_arg = tether_opts[i].arginfo != NULL,
			.val = i,
			.cb = option_cb,
		};
		spank_err_t rc = spank_option_register(sp, &opt);

		if (rc != ESPANK_SUCCESS) {
			slurm_error("tether: cannot register --%s: %s", tether_opts[i].name,
				    spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}

/* ``arg`` is ``key=/absolute/path``: the path, or NULL. */
static const char *path_arg(const char *arg, const char *key)
{
	size_t n = strlen(key);

	if (strncmp(arg, key, n) != 0 || arg[n] != '=' || arg[n + 1] != '/' || strlen(arg) > 2048)
		return NULL;
	return arg + n + 1;
}

/* ``user_dirs=`` is absolute paths separated by ':', of characters a plain path has. */
static int user_dirs_ok(const char *value)
{
	if (value[0] != '/' || strlen(value) > 2048)
		return 0;
	for (const char *c = value; *c; c++) {
		if (*c == ':' && c[1] != '/')
			return 0;
		if (!(isalnum((unsigned char)*c) || strchr("/:._-", *c)))
			return 0;
	}
	return 1;
}

int tether_parse_args(int ac, char **av)
{
	for (int i = 0; i < ac; i++) {
		const char *path;

		if ((path = path_arg(av[i], "job_storage_root")) != NULL)
			tether_job_storage_root = path;
		else if ((path = path_arg(av[i], "launcher")) != NULL)
			tether_launcher = path;
		else if (strncmp(av[i], "gateway_partition=", 18) == 0 && tether_name_ok(av[i] + 18, TETHER_MAX_NAME))
			tether_gateway_partition = av[i] + 18;
		else if (strncmp(av[i], "user_dirs=", 10) == 0 && user_dirs_ok(av[i] + 10))
			tether_user_dirs = av[i] + 10;
		else if (strcmp(av[i], "container_batch=1") == 0 || strcmp(av[i], "container_batch=0") == 0)
			tether_container_batch = av[i][16] == '1';
		else {
			slurm_error("tether: plugstack.conf argument '%s' is not understood (accepted: "
				    "job_storage_root=/absolute/path, launcher=/absolute/path, "
				    "gateway_partition=NAME, user_dirs=/absolute/path[:/absolute/path...], "
				    "container_batch=0|1)", av[i]);
			return -1;
		}
	}
	return 0;
}

void tether_opts_clear(void)
{
	for (int i = 0; i < TETHER_NOPTS; i++) {
		free(tether_opts[i].value);
		tether_opts[i].value = NULL;
		tether_opts[i].from_env = 0;
	}
}
