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

/* How many nodes partition ``name`` has (NULL or "": the default partition), as the handler read
 * slurm.conf; -1 when not known. */
long tether_partition_nodes(const char *name);

/* Everything the handler reads of ``job``, as one string (malloc'd; NULL when out of memory). */
char *tether_cache_key(const tether_job_t *job);

/* A cached answer for ``key`` copied into ``job``'s out_* fields and its code, or 0. */
int tether_cache_lookup(tether_job_t *job, const char *key);

/* How many times the tables were emptied: read when the handler's answer was made (worker.c), and
 * handed to the stores, which keep an answer only if the tables were not emptied since (a config
 * reload during another request's call) and its key is of the form the tables hold now. */
unsigned long tether_cache_generation(void);

/* Keep ``job``'s answer ``rc`` for ``key``, made in generation ``made_in`` (only cacheable accepts
 * and rejects). */
void tether_cache_store(const tether_job_t *job, const char *key, int rc, unsigned long made_in);

/*
 * By shape. A request's shape is the request with its slot counts (--slots, --slots-per-node) and
 * a valid container image standing for their class: a sweep over sizes and images is one shape.
 * The handler marks an answer that is every request's of its shape (``shaped``: accepted with no
 * note, its numbers following the counts by the row of the Slurm resource table of
 * docs/requirements.md, ``q_*``); a request of a known shape then gets it, its numbers computed
 * here, with no Python. Counts the handler would refuse are never answered here.
 */
struct tether_counts {
	int have_slots;      /* --slots given */
	unsigned long slots;
	int spn_given;       /* --slots-per-node given */
	unsigned long spn;   /* 1 when not given */
};

/* ``job``'s shape key and counts (malloc'd); NULL when the request has nothing a shape stands for,
 * or writes a count otherwise than the plain decimal the handler reads the same way. */
char *tether_shape_key(const tether_job_t *job, struct tether_counts *counts);

/* The answer of ``key``'s shape for ``job``'s counts copied into ``job``, or 0. */
int tether_shape_lookup(tether_job_t *job, const char *key, const struct tether_counts *counts);

/* Keep ``job``'s answer for its shape, made in generation ``made_in`` (only accepts the handler
 * marked ``shaped``). */
void tether_shape_store(const tether_job_t *job, const char *key, int rc, unsigned long made_in);

/* Is the config file still the one the handler last read (checked with stat() at most every
 * 0.2 s)? The handler then skips its own stat(). */
int tether_config_current(void);

#endif
