/*
 * The answers cache (see cache.h). One lock guards the slots and the config stamps; lookups and
 * stores take it briefly on slurmctld's RPC threads.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cache.h"

#define TETHER_CACHE_SLOTS 64
#ifndef TETHER_CONFIG_CHECK_NS
#define TETHER_CONFIG_CHECK_NS 200000000L /* build.py passes the handler's CONFIG_CHECK_SECONDS */
#endif

struct stamp {
	int exists;
	unsigned long long ino, size;
	long long mtime_ns;
};

struct answer {
	char *key; /* malloc'd; NULL: empty slot */
	int rc;
	tether_job_t job; /* only the out_* fields and msg are used */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct answer slots[TETHER_CACHE_SLOTS];
static char config_path[4096];
static struct stamp loaded_stamp; /* the file the handler's config came from */
static int loaded_known;
static struct stamp seen_stamp;   /* the file on disk at the last check */
static struct timespec config_checked;

static void flush_locked(void)
{
	for (int i = 0; i < TETHER_CACHE_SLOTS; i++) {
		free(slots[i].key);
		slots[i].key = NULL;
	}
}

void tether_config_loaded(const char *path, int exists, unsigned long long ino, unsigned long long size,
			  long long mtime_ns)
{
	struct stamp st = { exists, ino, size, mtime_ns };

	pthread_mutex_lock(&lock);
	snprintf(config_path, sizeof(config_path), "%s", path ? path : "");
	if (!loaded_known || memcmp(&st, &loaded_stamp, sizeof(st)) != 0)
		flush_locked();
	loaded_stamp = st;
	loaded_known = 1;
	seen_stamp = st;
	clock_gettime(CLOCK_MONOTONIC, &config_checked);
	pthread_mutex_unlock(&lock);
}

/* Is the file on disk still the one the handler loaded? (locked; stat() at most every 0.2 s) */
static int config_current_locked(void)
{
	struct timespec now;
	struct stat st;

	if (!loaded_known)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &now);
	if ((now.tv_sec - config_checked.tv_sec) * 1000000000L + (now.tv_nsec - config_checked.tv_nsec) >=
	    TETHER_CONFIG_CHECK_NS) {
		config_checked = now;
		memset(&seen_stamp, 0, sizeof(seen_stamp));
		if (stat(config_path, &st) == 0) {
			seen_stamp.exists = 1;
			seen_stamp.ino = st.st_ino;
			seen_stamp.size = st.st_size;
			seen_stamp.mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
		}
	}
	return memcmp(&seen_stamp, &loaded_stamp, sizeof(seen_stamp)) == 0;
}

int tether_config_current(void)
{
	int rc;

	pthread_mutex_lock(&lock);
	rc = config_current_locked();
	pthread_mutex_unlock(&lock);
	return rc;
}

struct key {
	char *text;
	size_t len, cap;
};

static void key_add(struct key *k, const char *s)
{
	size_t n = s ? strlen(s) : 0;

	if (k->text == NULL)
		return;
	if (k->len + n + 2 > k->cap) {
		char *bigger;

		k->cap = (k->len + n + 2) * 2;
		bigger = realloc(k->text, k->cap);
		if (bigger == NULL) {
			free(k->text);
			k->text = NULL;
			return;
		}
		k->text = bigger;
	}
	memcpy(k->text + k->len, s ? s : "", n);
	k->len += n;
	k->text[k->len++] = s ? '\x1f' : '\x1e'; /* separators that cannot occur in the fields */
	k->text[k->len] = '\0';
}

char *tether_cache_key(const tether_job_t *job)
{
	char num[160];
	struct key k = { malloc(512), 0, 512 };

	if (k.text == NULL)
		return NULL;
	k.text[0] = '\0';
	snprintf(num, sizeof(num), "%u %u %u %u %u %u %u %u", job->user_id, job->min_nodes, job->max_nodes,
		 job->num_tasks, (unsigned)job->ntasks_per_node, (unsigned)job->cpus_per_task, job->req_node_count,
		 job->het_job_offset);
	key_add(&k, num);
	key_add(&k, job->partition);
	key_add(&k, job->account);
	key_add(&k, job->tres_per_job);
	key_add(&k, job->tres_per_node);
	key_add(&k, job->tres_per_task);
	key_add(&k, job->tres_per_socket);
	key_add(&k, job->features);
	for (uint32_t i = 0; i < job->spank_env_size; i++)
		key_add(&k, job->spank_env[i]);
	return k.text;
}

static unsigned slot_of(const char *key)
{
	unsigned h = 2166136261u; /* FNV-1a */

	for (const unsigned char *p = (const unsigned char *)key; *p; p++)
		h = (h ^ *p) * 16777619u;
	return h % TETHER_CACHE_SLOTS;
}

static void copy_answer(tether_job_t *to, const tether_job_t *from)
{
	size_t start = offsetof(tether_job_t, set_nodes);

	memcpy((char *)to + start, (const char *)from + start, sizeof(tether_job_t) - start);
}

int tether_cache_lookup(tether_job_t *job, const char *key)
{
	struct answer *a;
	int rc = 0;

	pthread_mutex_lock(&lock);
	a = &slots[slot_of(key)];
	if (config_current_locked() && a->key && strcmp(a->key, key) == 0) {
		copy_answer(job, &a->job);
		rc = a->rc;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

void tether_cache_store(const tether_job_t *job, const char *key, int rc)
{
	struct answer *a;

	if (!job->cacheable || (rc != TETHER_ACCEPT && rc != TETHER_REJECT))
		return;
	pthread_mutex_lock(&lock);
	if (config_current_locked()) {
		a = &slots[slot_of(key)];
		free(a->key);
		a->key = strdup(key);
		a->rc = rc;
		copy_answer(&a->job, job);
	}
	pthread_mutex_unlock(&lock);
}
