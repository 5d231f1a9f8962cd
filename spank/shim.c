/*
 * tether SPANK plugin: the C face that srun, sbatch, salloc and slurmstepd load.
 *
 * Client side (srun = local, sbatch/salloc = allocator): registers tether's options with
 * spank_option_register (the static spank_options[] table is not read in allocator context),
 * validates cheap things here with a clear message, applies the TETHER_<NAME> environment
 * fallbacks, and forwards every effective value to slurmctld with spank_job_control_setenv
 * (job_desc->spank_job_env gets TETHER_<NAME>=value, next to Slurm's own
 * _SLURM_SPANK_OPTION_tether_<name>=value for options given on the command line; prolog and
 * epilog see SPANK_TETHER_<NAME>).
 * It never starts Python in srun, sbatch or salloc.
 *
 * Remote side (slurmstepd): the options are registered so Slurm can hand their values over; the
 * per-rank work arrives with the run-side issue -- until then a step that asks for a container
 * fails with a message saying so, rather than running without one.
 *
 * The option table below is generated from tether/spank/options.py at build time.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(tether, 1);

/* Exported by libslurmfull (not declared in the public headers). */
extern void slurm_xfree(void **item);
extern char *slurm_conf_get_nodeaddr(const char *node_hostname);

/* plugstack.conf arguments (key=value); `tether slurm install` writes them from tether's config. */
static char *tether_job_storage_root = "/var/lib/tether/jobs";
static char *tether_launcher = NULL;   /* the container launcher (tether-run); NULL: no containers */

enum tether_kind { K_COUNT, K_SLOT_TYPE, K_NAME, K_RUNTIME, K_TEXT, K_ENV_NAMES, K_FLAG };

struct tether_opt {
	const char *name;      /* long option name, without "--" */
	const char *arginfo;   /* NULL for a flag */
	const char *usage;
	int kind;
	const char *env;       /* TETHER_<NAME> fallback */
	long minimum, maximum; /* K_COUNT bounds */
	char *value;           /* effective value (malloc'd), NULL when unset */
	int from_env;
};

/*@OPTION_TABLE@*/

#define TETHER_NOPTS ((int)(sizeof(tether_opts) / sizeof(tether_opts[0])))
#define TETHER_MAX_TEXT 4096
#define TETHER_MAX_NAME 128

static int one_of(const char *value, const char *const *choices)
{
	for (; *choices; choices++)
		if (strcmp(value, *choices) == 0)
			return 1;
	return 0;
}

/* NAME[,NAME...] where each NAME is a shell variable name. */
static int env_names_ok(const char *value)
{
	const char *p = value;

	if (strlen(value) > TETHER_MAX_TEXT)
		return 0;
	for (;;) {
		if (!(isalpha((unsigned char)*p) || *p == '_'))
			return 0;
		while (isalnum((unsigned char)*p) || *p == '_')
			p++;
		if (*p == '\0')
			return 1;
		if (*p != ',')
			return 0;
		p++;
	}
}

static int text_ok(const char *value)
{
	size_t n = strlen(value);

	if (n == 0 || n > TETHER_MAX_TEXT)
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)value[i] < 0x20 || value[i] == 0x7f)
			return 0;
	return 1;
}

/* Normalize a flag value (1/0, true/false, yes/no); returns "1", "0" or NULL. */
static const char *flag_value(const char *value)
{
	static const char *const yes[] = { "1", "true", "yes", "on", NULL };
	static const char *const no[] = { "0", "false", "no", "off", NULL };

	if (value == NULL || value[0] == '\0') /* slurmstepd hands a set flag over as "" */
		return "1";
	if (one_of(value, yes))
		return "1";
	if (one_of(value, no))
		return "0";
	return NULL;
}

/*
 * Validate ``value`` for option ``o``; on success returns 0 and a normalized copy in *out.
 * ``how`` is what the user typed ("--slots" or "TETHER_SLOTS") for the message.
 */
static int tether_validate(struct tether_opt *o, const char *value, const char *how, char **out)
{
	static const char *const slot_types[] = { "cuda", "rocm", "cpu", NULL };
	static const char *const runtimes[] = { "apptainer", "singularity", "podman", "enroot", NULL };
	const char *normalized = value;

	switch (o->kind) {
	case K_COUNT: {
		char *end = NULL;
		long n;

		if (value == NULL || !isdigit((unsigned char)value[0]))
			goto bad;
		errno = 0;
		n = strtol(value, &end, 10);
		if (errno || *end != '\0' || n < o->minimum || n > o->maximum)
			goto bad;
		break;
	}
	case K_SLOT_TYPE:
		if (value == NULL || !one_of(value, slot_types))
			goto bad;
		break;
	case K_RUNTIME:
		if (value == NULL || !one_of(value, runtimes))
			goto bad;
		break;
	case K_NAME:
		if (value == NULL || !name_ok(value, TETHER_MAX_NAME))
			goto bad;
		break;
	case K_ENV_NAMES:
		if (value == NULL || !env_names_ok(value))
			goto bad;
		break;
	case K_TEXT:
		if (value == NULL || !text_ok(value))
			goto bad;
		break;
	case K_FLAG:
		normalized = flag_value(value);
		if (normalized == NULL)
			goto bad;
		break;
	default:
		goto bad;
	}
	*out = strdup(normalized);
	if (*out == NULL) {
		slurm_error("tether: %s: out of memory", how);
		return -1;
	}
	return 0;

bad:
	switch (o->kind) {
	case K_COUNT:
		slurm_error("tether: %s=%s: expected a whole number from %ld to %ld", how,
			    value ? value : "", o->minimum, o->maximum);
		break;
	case K_SLOT_TYPE:
		slurm_error("tether: %s=%s: expected one of cuda, rocm, cpu", how, value ? value : "");
		break;
	case K_RUNTIME:
		slurm_error("tether: %s=%s: expected one of apptainer, singularity, podman, enroot",
			    how, value ? value : "");
		break;
	case K_NAME:
		slurm_error("tether: %s: expected a name of letters, digits, '.', '_', '-' "
			    "(at most %d characters)", how, TETHER_MAX_NAME);
		break;
	case K_ENV_NAMES:
		slurm_error("tether: %s: expected variable names separated by commas (NAME,NAME)", how);
		break;
	case K_FLAG:
		slurm_error("tether: %s=%s: expected 1/0, true/false or yes/no", how, value ? value : "");
		break;
	default:
		slurm_error("tether: %s: expected printable text of at most %d characters", how,
			    TETHER_MAX_TEXT);
	}
	return -1;
}

static int tether_set(int index, const char *value, const char *how, int from_env)
{
	struct tether_opt *o = &tether_opts[index];
	char *copy = NULL;

	if (tether_validate(o, value, how, &copy) < 0)
		return -1;
	free(o->value); /* Slurm may call us twice (script and command line): the last one wins */
	o->value = copy;
	o->from_env = from_env;
	return 0;
}

static int tether_option_cb(int val, const char *optarg, int remote)
{
	char how[TETHER_MAX_NAME + 3];

	if (val < 0 || val >= TETHER_NOPTS)
		return -1;
	snprintf(how, sizeof(how), "--%s", tether_opts[val].name);
	return tether_set(val, optarg, how, 0);
}

static int register_options(spank_t sp)
{
	for (int i = 0; i < TETHER_NOPTS; i++) {
		struct spank_option opt = {
			.name = (char *)tether_opts[i].name,
			.arginfo = (char *)tether_opts[i].arginfo,
			.usage = (char *)tether_opts[i].usage,
			.has_arg = tether_opts[i].arginfo != NULL,
			.val = i,
			.cb = tether_option_cb,
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

/* Parse the plugstack.conf arguments; an unknown or malformed one fails the plugin load. */
static int parse_args(int ac, char **av)
{
	for (int i = 0; i < ac; i++) {
		if (strncmp(av[i], "job_storage_root=", 17) == 0 && av[i][17] == '/' &&
		    strlen(av[i]) < 2048) {
			tether_job_storage_root = av[i] + 17;
			continue;
		}
		if (strncmp(av[i], "launcher=", 9) == 0 && av[i][9] == '/' && strlen(av[i]) < 2048) {
			tether_launcher = av[i] + 9;
			continue;
		}
		slurm_error("tether: plugstack.conf argument '%s' is not understood (accepted: "
			    "job_storage_root=/absolute/path, launcher=/absolute/path)", av[i]);
		return -1;
	}
	return 0;
}

/* The remote side (remote.c, appended at build time). */
static int remote_post_opt(spank_t sp);
static int remote_user_init(spank_t sp);
static int remote_task_init(spank_t sp);
static void remote_exit(void);

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	if (parse_args(ac, av) < 0)
		return -1;
	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
	case S_CTX_REMOTE:
		return register_options(sp);
	default:
		return 0;
	}
}

/* srun/sbatch/salloc: environment fallbacks, then forward the effective values to slurmctld. */
static int client_post_opt(spank_t sp)
{
	for (int i = 0; i < TETHER_NOPTS; i++) {
		struct tether_opt *o = &tether_opts[i];
		const char *env = getenv(o->env);

		if (o->value == NULL && env != NULL && tether_set(i, env, o->env, 1) < 0)
			return -1;
	}
	for (int i = 0; i < TETHER_NOPTS; i++) {
		struct tether_opt *o = &tether_opts[i];
		spank_err_t rc;

		if (o->value == NULL)
			continue;
		rc = spank_job_control_setenv(sp, o->env, o->value, 1);
		if (rc != ESPANK_SUCCESS) {
			slurm_error("tether: cannot forward --%s to slurmctld: %s", o->name,
				    spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
		return client_post_opt(sp);
	case S_CTX_REMOTE:
		return remote_post_opt(sp);
	default:
		return 0;
	}
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	return spank_context() == S_CTX_REMOTE ? remote_user_init(sp) : 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	return spank_context() == S_CTX_REMOTE ? remote_task_init(sp) : 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	if (spank_context() == S_CTX_REMOTE)
		remote_exit();
	for (int i = 0; i < TETHER_NOPTS; i++) {
		free(tether_opts[i].value);
		tether_opts[i].value = NULL;
	}
	return 0;
}
