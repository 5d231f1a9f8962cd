/*
 * The answers cache of the job_submit plugin. The answer to a request depends only on the request
 * and the config, and sites submit the same request many times (sweeps, retries): the last answers
 * are kept, keyed by everything the handler reads, so a repeated request costs no Python at all.
 * An answer is served only while the config file on disk (stat()ed at most every
 * TETHER_CONFIG_CHECK_NS) is the one the handler last loaded; any change sends the next request to
 * the handler, which reloads, and empties the cache (tether_config_loaded, bridge.h).
 */
#ifndef TETHER_CACHE_H
#define TETHER_CACHE_H

#include "bridge.h"

/* Everything the handler reads of ``job``, as one string (malloc'd; NULL when out of memory). */
char *tether_cache_key(const tether_job_t *job);

/* A cached answer for ``key`` copied into ``job``'s out_* fields and its code, or 0. */
int tether_cache_lookup(tether_job_t *job, const char *key);

/* Keep ``job``'s answer ``rc`` for ``key`` (only cacheable accepts and rejects). */
void tether_cache_store(const tether_job_t *job, const char *key, int rc);

/* Is the config file still the one the handler last read (checked with stat() at most every
 * 0.2 s)? The handler then skips its own stat(). */
int tether_config_current(void);

#endif
