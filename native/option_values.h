/*
 * An option's value as tether accepts it, in C (surface.normalize in Python): one check for the
 * SPANK plugin and the job_submit plugin.
 */
#ifndef TETHER_OPTION_VALUES_H
#define TETHER_OPTION_VALUES_H

#include <stddef.h>

#include "tether_names.h"

/* An option of tether_names.h's TETHER_OPTION_TABLE (the SPANK plugin keeps its value here too). */
struct tether_opt {
	const char *name;      /* long option name, without "--" */
	const char *arginfo;   /* NULL for a flag */
	const char *usage;
	enum tether_kind kind;
	const char *env;       /* TETHER_<NAME>: the environment fallback */
	const char *job_env;   /* TETHER_JOB_<NAME>: how a slot option is described to the ranks; NULL */
	long minimum, maximum; /* K_COUNT bounds */
	char *value;           /* effective value (malloc'd), NULL when unset */
	int from_env;
};

/* An option's value as the SPANK plugin and the job_submit handler accept it (surface.normalize,
 * of option kind ``kind``, ``minimum``..``maximum`` for a count, a name's shorter limit, 0: none):
 * the normalized value (a flag's "1" or "0", else ``value`` itself), or NULL. */
const char *tether_value_check(enum tether_kind kind, long minimum, long maximum, const char *value);

/* --container-unshare=NS[,NS...]: the first word that is no namespace tether unshares (pointing
 * into ``value``, ``*len`` its length; an empty word too), or NULL when every word is one. */
const char *tether_unknown_namespace(const char *value, size_t *len);

#endif
