/*
 * The grammars of option values that more than one component checks in C: the SPANK plugin's
 * option checks (spank/options.c, as tether/hooks/surface.py's normalize), the job_submit plugin's
 * shape cache (job_submit/cache.c: a value it takes out of the key must be one the handler
 * accepts) and the job directories' names (jobdirs.c, tether-jobdirs).
 */
#ifndef TETHER_VALUES_H
#define TETHER_VALUES_H

#include <stddef.h>

/* Is ``value`` one of the NULL-ended ``choices``? */
int tether_one_of(const char *value, const char *const *choices);

/* A name tether may use as one path component: [A-Za-z0-9][A-Za-z0-9._-]*, at most ``max``. */
int tether_name_ok(const char *value, size_t max);

/* NAME[,NAME...], each an ASCII shell variable name, at most TETHER_MAX_TEXT bytes (surface's
 * env_names). */
int tether_env_names_ok(const char *value);

/* --container-name's NAME[:FLAG] (pyxis's spelling): a tether_name_ok name of at most ``max``
 * (and TETHER_MAX_NAME) characters, FLAG one of TETHER_CONTAINER_NAME_FLAGS (surface's
 * container_name). */
int tether_container_name_ok(const char *value, size_t max);

#endif
