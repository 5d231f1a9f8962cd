/*
 * tether's SPANK options: the table (generated from tether/hooks/surface.py into tether_names.h),
 * their values in this process, validation with a message naming what is accepted, registration
 * with Slurm, and the plugstack.conf arguments.
 */
#ifndef TETHER_OPTIONS_H
#define TETHER_OPTIONS_H

#include <slurm/spank.h>

#include "option_values.h" /* struct tether_opt */
#include "tether_names.h"


extern struct tether_opt tether_opts[TETHER_NOPTS];

/* A pyxis variable (PYXIS_CONTAINER_<NAME>) and the option it sets; for a flag, ``off`` is the
 * option a false value sets (-1: none). */
struct tether_pyxis_env {
	const char *name;
	int on, off;
};

/* Reads variable ``name`` of the job's environment into ``buf`` (``len`` bytes, truncated); 1 when
 * it is set, else 0. */
typedef int (*tether_env_getter)(void *ctx, const char *name, char *buf, size_t len);

/* plugstack.conf arguments (`tether slurm install` writes them from tether's config). */
extern const char *tether_job_storage_root;
extern const char *tether_launcher; /* the container launcher (tether-run); NULL: no containers */
extern const char *tether_gateway_partition; /* the config's gateways.partition; NULL: no gateways */
extern int tether_container_batch; /* the config's container.batch: a batch script in its container by default */
/* where root makes each user's own directory on the node (':'-separated; hooks/layout.py user_dir_bases) */
extern const char *tether_user_dirs;

/* The value of option ``id``, or NULL when it is not set. */
const char *tether_opt_value(enum tether_option id);

/* Any option set? (a tether step) */
int tether_any_option(void);

/* Validate ``value`` for option ``index`` and store it (the last call wins). ``how`` is what the
 * user typed ("--slots" or "TETHER_SLOTS"), for the message. 0 or -1 (reported with slurm_error). */
int tether_opt_set(int index, const char *value, const char *how, int from_env);

/* The environment fallbacks for options not given (hooks/surface.py, env_fallbacks): each
 * option's TETHER_<NAME>, then pyxis's PYXIS_CONTAINER_<NAME>, where neither the option nor its
 * partner of opposite meaning has a value yet; values from here are from_env. 0, or -1 at the first
 * value refused (reported with tether_fail, naming the variable). */
int tether_env_fallbacks(tether_env_getter get, void *ctx);

/* Has option ``i``'s partner of opposite meaning a value? */
int tether_partner_set(int i);

/* Register every option with Slurm (slurm_spank_init, local/allocator/remote contexts). */
int tether_register_options(spank_t sp);

/* Parse plugstack.conf's arguments; an unknown or malformed one fails the plugin load. */
int tether_parse_args(int ac, char **av);

/* srun/sbatch/salloc: how many components of a heterogeneous job were forwarded already (client.c). */
extern int tether_component;

/* Slurm's name for option ``o`` in the environment and spank_job_env:
 * _SLURM_SPANK_OPTION_tether_<name, '-' as '_'>. */
void tether_slurm_option_env(const struct tether_opt *o, char *buf, size_t len);

/* The job's value of option ``o`` as sbatch/salloc left it for the job's steps, in this process's
 * environment (SLURM_SPANK__SLURM_SPANK_OPTION_tether_<name>: getenv's own pointer), or NULL. */
const char *tether_job_option_env(const struct tether_opt *o);

/* Forget every value (slurm_spank_exit). */
void tether_opts_clear(void);

#endif
