/*
 * The answers cache (see cache.h): by request and by shape. One lock guards both tables and the
 * config stamps; lookups and stores take it briefly on slurmctld's RPC threads.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cache.h"
#include "imageref.h"
#include "request.h"
#include "tether_names.h"
#include "values.h"

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
static struct answer shapes[TETHER_CACHE_SLOTS];

/* The files the handler's answers depend on: tether's config (its answers), and slurm.conf (the
 * partitions' sizes of the note at submit). An answer is served only while each is the one the
 * handler last read. */
enum { WATCH_CONFIG, WATCH_SLURM_CONF, WATCHES };
static struct watch {
	char path[4096];
	struct stamp loaded; /* the file the handler read */
	int known;
	struct stamp seen;   /* the file on disk at the last check */
} watches[WATCHES];
static struct timespec config_checked;
static char *partitions;  /* partition_table(): the default's name, then "NAME COUNT" lines */
/* Do the handler's answers depend on the submitting user (tether_answers_per_user)? Until a config
 * says they do not, they do. Read without the lock when keys are made: the tables are emptied
 * whenever this changes, and no answer is kept under a key of the other form (keepable_locked). */
static int per_user = 1;
#define ANY_USER "*" /* the user field of a key that holds for every user */

/* How many times the tables were emptied (tether_cache_generation). slurmctld makes a request's keys,
 * then the handler answers it, then the answer is kept; from 23.02 other requests are in the plugin
 * meanwhile. An answer is kept only if the tables were not emptied since it was made, under a key of
 * the form the tables hold now (with or without the uid): else an answer made under one config
 * could be kept under a key made under another, and served (another user's WCKey). */
static unsigned long generation;

static void flush_locked(void)
{
	__atomic_add_fetch(&generation, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < TETHER_CACHE_SLOTS; i++) {
		free(slots[i].key);
		slots[i].key = NULL;
		free(shapes[i].key);
		shapes[i].key = NULL;
	}
}

/* Field by field: memcmp would compare the struct's padding too, which nothing sets. */
static int same_stamp(const struct stamp *a, const struct stamp *b)
{
	return a->exists == b->exists && a->ino == b->ino && a->size == b->size && a->mtime_ns == b->mtime_ns;
}

static void loaded_locked(int which, const char *path, int exists, unsigned long long ino,
			  unsigned long long size, long long mtime_ns)
{
	struct stamp st = { exists, ino, size, mtime_ns };
	struct watch *w = &watches[which];

	snprintf(w->path, sizeof(w->path), "%s", path ? path : "");
	if (!w->known || !same_stamp(&st, &w->loaded))
		flush_locked();
	w->loaded = st;
	w->known = 1;
	w->seen = st;
	clock_gettime(CLOCK_MONOTONIC, &config_checked);
}

void tether_config_loaded(const char *path, int exists, unsigned long long ino, unsigned long long size,
			  long long mtime_ns)
{
	pthread_mutex_lock(&lock);
	loaded_locked(WATCH_CONFIG, path, exists, ino, size, mtime_ns);
	pthread_mutex_unlock(&lock);
}

void tether_answers_per_user(int yes)
{
	pthread_mutex_lock(&lock);
	if (!yes != !__atomic_load_n(&per_user, __ATOMIC_RELAXED)) {
		flush_locked();
		__atomic_store_n(&per_user, yes ? 1 : 0, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&lock);
}

void tether_partitions_loaded(const char *path, int exists, unsigned long long ino, unsigned long long size,
			      long long mtime_ns, const char *table)
{
	char *copy = table ? strdup(table) : NULL;

	pthread_mutex_lock(&lock);
	loaded_locked(WATCH_SLURM_CONF, path, exists, ino, size, mtime_ns);
	free(partitions);
	partitions = copy;
	pthread_mutex_unlock(&lock);
}

static void stat_into(const char *path, struct stamp *out)
{
	struct stat st;

	memset(out, 0, sizeof(*out));
	if (stat(path, &st) == 0) {
		out->exists = 1;
		out->ino = st.st_ino;
		out->size = st.st_size;
		out->mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
	}
}

/* Is each file on disk still the one the handler read? (locked; stat() at most every 0.2 s) */
static int config_current_locked(void)
{
	struct timespec now;

	if (!watches[WATCH_CONFIG].known)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &now);
	if ((now.tv_sec - config_checked.tv_sec) * 1000000000L + (now.tv_nsec - config_checked.tv_nsec) >=
	    TETHER_CONFIG_CHECK_NS) {
		config_checked = now;
		for (int i = 0; i < WATCHES; i++)
			if (watches[i].known)
				stat_into(watches[i].path, &watches[i].seen);
	}
	for (int i = 0; i < WATCHES; i++)
		if (watches[i].known && !same_stamp(&watches[i].seen, &watches[i].loaded))
			return 0;
	return 1;
}

int tether_config_current(void)
{
	int rc;

	pthread_mutex_lock(&lock);
	rc = config_current_locked();
	pthread_mutex_unlock(&lock);
	return rc;
}

long tether_partition_nodes(const char *name)
{
	const char *line, *end;
	size_t len;
	long count = -1;

	pthread_mutex_lock(&lock);
	if (partitions == NULL)
		goto out;
	end = strchr(partitions, '\n');
	if (end == NULL)
		goto out;
	if (name == NULL || name[0] == '\0') { /* the default partition, named on the first line */
		name = partitions;
		len = (size_t)(end - partitions);
	} else {
		len = strlen(name);
	}
	for (line = end + 1; *line; line = end + 1) {
		end = strchr(line, '\n');
		if (end == NULL)
			break;
		if (len > 0 && (size_t)(end - line) > len && strncmp(line, name, len) == 0 && line[len] == ' ') {
			count = strtol(line + len + 1, NULL, 10);
			break;
		}
	}
out:
	pthread_mutex_unlock(&lock);
	return count;
}

struct key {
	char *text;
	size_t len, cap;
};

/*
 * One field of a key: a tag, the field's length in decimal, ':' and its bytes ("-" for a field that
 * is not set). Every field says where it ends, so no byte inside one (a raw libslurm client can
 * put any but NUL into a spank_job_env entry) makes two requests one key; the tag keeps what a
 * request spelled ('v') apart from the class a shape key puts in its place ('c').
 */
static void key_put(struct key *k, char tag, const char *s)
{
	size_t n = s ? strlen(s) : 0;
	char head[32];
	int h = s ? snprintf(head, sizeof(head), "%c%zu:", tag, n) : snprintf(head, sizeof(head), "%c-", tag);

	if (k->text == NULL)
		return;
	if (k->len + (size_t)h + n + 1 > k->cap) {
		char *bigger;

		k->cap = (k->len + (size_t)h + n + 1) * 2;
		bigger = realloc(k->text, k->cap);
		if (bigger == NULL) {
			free(k->text);
			k->text = NULL;
			return;
		}
		k->text = bigger;
	}
	memcpy(k->text + k->len, head, (size_t)h);
	k->len += (size_t)h;
	memcpy(k->text + k->len, s ? s : "", n);
	k->len += n;
	k->text[k->len] = '\0';
}

static void key_add(struct key *k, const char *s)
{
	key_put(k, 'v', s);
}

/* The fields of ``job`` the handler reads, but spank_env. */
static void key_fields(struct key *k, const tether_job_t *job)
{
	char num[160];

	/* the user, where the answers depend on them; else ANY_USER, which no uid is */
	if (__atomic_load_n(&per_user, __ATOMIC_RELAXED))
		snprintf(num, sizeof(num), "%u", job->user_id);
	else
		snprintf(num, sizeof(num), "%s", ANY_USER);
	key_add(k, num);
	snprintf(num, sizeof(num), "%u %u %u %u %u %u %u", job->min_nodes, job->max_nodes, job->num_tasks,
		 (unsigned)job->ntasks_per_node, (unsigned)job->cpus_per_task, job->req_node_count,
		 job->het_job_offset);
	key_add(k, num);
	key_add(k, job->partition);
	key_add(k, job->account);
	key_add(k, job->tres_per_job);
	key_add(k, job->tres_per_node);
	key_add(k, job->tres_per_task);
	key_add(k, job->tres_per_socket);
	key_add(k, job->features);
}

char *tether_cache_key(const tether_job_t *job)
{
	struct key k = { malloc(512), 0, 512 };

	if (k.text == NULL)
		return NULL;
	k.text[0] = '\0';
	key_fields(&k, job);
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

/* The answer kept in ``table`` for ``key`` copied into ``job``, or 0. */
static int lookup_in(struct answer *table, tether_job_t *job, const char *key)
{
	struct answer *a;
	int rc = 0;

	pthread_mutex_lock(&lock);
	a = &table[slot_of(key)];
	if (config_current_locked() && a->key && strcmp(a->key, key) == 0) {
		copy_answer(job, &a->job);
		rc = a->rc;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

int tether_cache_lookup(tether_job_t *job, const char *key)
{
	return lookup_in(slots, job, key);
}

unsigned long tether_cache_generation(void)
{
	return __atomic_load_n(&generation, __ATOMIC_RELAXED);
}

/* May an answer made in ``made_in`` be kept under ``key`` now: the tables not emptied since, and
 * the key of the form they hold (its first field ANY_USER, as key_fields writes it, exactly when
 * per_user is 0)? */
static int keepable_locked(const char *key, unsigned long made_in)
{
	char head[16];
	int n = snprintf(head, sizeof(head), "v%zu:%s", strlen(ANY_USER), ANY_USER); /* key_put's form */
	int userless = strncmp(key, head, (size_t)n) == 0;

	return made_in == __atomic_load_n(&generation, __ATOMIC_RELAXED) &&
	       userless == !__atomic_load_n(&per_user, __ATOMIC_RELAXED);
}

static void store_in(struct answer *table, const tether_job_t *job, const char *key, int rc,
		     unsigned long made_in)
{
	struct answer *a;

	pthread_mutex_lock(&lock);
	if (config_current_locked() && keepable_locked(key, made_in)) {
		a = &table[slot_of(key)];
		free(a->key);
		a->key = strdup(key);
		a->rc = rc;
		copy_answer(&a->job, job);
	}
	pthread_mutex_unlock(&lock);
}

void tether_cache_store(const tether_job_t *job, const char *key, int rc, unsigned long made_in)
{
	if (job->cacheable && (rc == TETHER_ACCEPT || rc == TETHER_REJECT))
		store_in(slots, job, key, rc, made_in);
}

/* ---- by shape ---- */

/* The spank_env entries the shape key stands for by their class, and what each is. */
enum { COUNT_SLOTS, COUNT_SPN, IMAGE, ENV_NAMES, MOUNTS, WORKDIR, NAME, SAVE };
static const struct {
	const char *name;
	int what;
	int forwarded; /* TETHER_<NAME>: the plugin's effective value, which wins (handler.tether_values) */
} shape_entries[] = {
	{ TETHER_ENV_SLOTS, COUNT_SLOTS, 1 },
	{ TETHER_SPANK_ENV_SLOTS, COUNT_SLOTS, 0 },
	{ TETHER_ENV_SLOTS_PER_NODE, COUNT_SPN, 1 },
	{ TETHER_SPANK_ENV_SLOTS_PER_NODE, COUNT_SPN, 0 },
	{ TETHER_ENV_CONTAINER_IMAGE, IMAGE, 1 },
	{ TETHER_SPANK_ENV_CONTAINER_IMAGE, IMAGE, 0 },
	{ TETHER_ENV_CONTAINER_ENV, ENV_NAMES, 1 },
	{ TETHER_SPANK_ENV_CONTAINER_ENV, ENV_NAMES, 0 },
	{ TETHER_ENV_CONTAINER_MOUNTS, MOUNTS, 1 },
	{ TETHER_SPANK_ENV_CONTAINER_MOUNTS, MOUNTS, 0 },
	{ TETHER_ENV_CONTAINER_WORKDIR, WORKDIR, 1 },
	{ TETHER_SPANK_ENV_CONTAINER_WORKDIR, WORKDIR, 0 },
	{ TETHER_ENV_CONTAINER_NAME, NAME, 1 },
	{ TETHER_SPANK_ENV_CONTAINER_NAME, NAME, 0 },
	{ TETHER_ENV_CONTAINER_SAVE, SAVE, 1 },
	{ TETHER_SPANK_ENV_CONTAINER_SAVE, SAVE, 0 },
};
#define SHAPE_ENTRIES (sizeof(shape_entries) / sizeof(shape_entries[0]))

/* A count written as the handler reads it the same way: "0", or digits without a leading zero up to
 * ``max``; -1 for anything else (the handler then answers that request itself). */
static long count_of(const char *s, unsigned long max)
{
	unsigned long v = 0;

	if (s[0] == '0')
		return s[1] ? -1 : 0;
	if (s[0] == '\0')
		return -1;
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		v = v * 10 + (unsigned long)(*p - '0');
		if (v > max)
			return -1;
	}
	return (long)v;
}

char *tether_shape_key(const tether_job_t *job, struct tether_counts *counts)
{
	long seen[2][2] = { { -1, -1 }, { -1, -1 } }; /* [slots|spn][spank|forwarded]; -1: none */
	int abstracted = 0;
	struct key k = { malloc(512), 0, 512 };

	if (k.text == NULL)
		return NULL;
	k.text[0] = '\0';
	key_fields(&k, job);
	for (uint32_t i = 0; i < job->spank_env_size && k.text; i++) {
		const char *entry = job->spank_env[i], *value = NULL;
		size_t e, n = 0;
		char class[160];

		for (e = 0; entry && e < SHAPE_ENTRIES; e++) {
			n = strlen(shape_entries[e].name);
			if (strncmp(entry, shape_entries[e].name, n) == 0 && entry[n] == '=') {
				value = entry + n + 1;
				break;
			}
		}
		if (value == NULL) {
			key_add(&k, entry);
			continue;
		}
		if (shape_entries[e].what == IMAGE) {
			if (value[0] == '\0' || !tether_image_ok(value)) { /* "": no container; a bad one: */
				key_add(&k, entry);                        /* the handler's to answer */
				continue;
			}
			snprintf(class, sizeof(class), "%s=#image", shape_entries[e].name);
		} else if (shape_entries[e].what == ENV_NAMES) {
			/* which names they are changes no answer of the handler (surface.normalize, kind
			 * env_names): requests that differ in them are one shape */
			if (!tether_env_names_ok(value)) { /* the handler's to answer (and refuse) */
				key_add(&k, entry);
				continue;
			}
			snprintf(class, sizeof(class), "%s=#names", shape_entries[e].name);
		} else if (shape_entries[e].what == NAME) {
			/* --container-name=NAME[:FLAG]: which name it is changes no answer of the handler (it
			 * checks the grammar, and that a runtime keeps named containers): the flag stays */
			const char *colon = strchr(value, ':');

			if (!tether_container_name_ok(value, TETHER_MAX_CONTAINER_NAME)) {
				key_add(&k, entry); /* the handler's to answer (and refuse) */
				continue;
			}
			snprintf(class, sizeof(class), "%s=#name%s", shape_entries[e].name, colon ? colon : "");
		} else if (shape_entries[e].what == SAVE) {
			/* which file it is changes no answer of the handler (spec.save_path; the runtime's
			 * refusal of a save is the runtime's, which stays in the key) */
			if (!tether_save_plain(value)) { /* the handler's to answer */
				key_add(&k, entry);
				continue;
			}
			snprintf(class, sizeof(class), "%s=#save", shape_entries[e].name);
		} else if (shape_entries[e].what == MOUNTS || shape_entries[e].what == WORKDIR) {
			int mounts = shape_entries[e].what == MOUNTS;

			if (!(mounts ? tether_mounts_plain(value) : tether_workdir_plain(value))) { /* the handler's to answer */
				key_add(&k, entry);
				continue;
			}
			snprintf(class, sizeof(class), "%s=#%s", shape_entries[e].name, mounts ? "mounts" : "dir");
		} else {
			int what = shape_entries[e].what, fwd = shape_entries[e].forwarded;
			long v = count_of(value, what == COUNT_SLOTS ? TETHER_MAX_SLOTS : TETHER_MAX_SLOTS_PER_NODE);

			if (v < 0 || (what == COUNT_SPN && v == 0) || seen[what][fwd] >= 0) {
				/* written otherwise, out of range or given twice: the handler's to answer */
				free(k.text);
				return NULL;
			}
			seen[what][fwd] = v;
			snprintf(class, sizeof(class), "%s=#%s", shape_entries[e].name, v ? "N" : "0");
		}
		key_put(&k, 'c', class);
		abstracted = 1;
	}
	if (!abstracted) { /* nothing a shape stands for: the request is its own shape */
		free(k.text);
		return NULL;
	}
	memset(counts, 0, sizeof(*counts));
	counts->have_slots = seen[COUNT_SLOTS][1] >= 0 || seen[COUNT_SLOTS][0] >= 0;
	counts->slots = (unsigned long)(seen[COUNT_SLOTS][1] >= 0 ? seen[COUNT_SLOTS][1] : seen[COUNT_SLOTS][0]);
	counts->spn_given = seen[COUNT_SPN][1] >= 0 || seen[COUNT_SPN][0] >= 0;
	counts->spn = counts->spn_given ? (unsigned long)(seen[COUNT_SPN][1] >= 0 ? seen[COUNT_SPN][1]
										   : seen[COUNT_SPN][0])
					: 1;
	return k.text;
}

/* The number quantity ``q`` stands for; ``same`` for TETHER_Q_SAME. */
static unsigned long quantity(int q, const struct tether_counts *c, unsigned long same)
{
	switch (q) {
	case TETHER_Q_SLOTS:
		return c->slots;
	case TETHER_Q_SPN:
		return c->spn;
	case TETHER_Q_NODES:
		return c->slots / c->spn;
	default:
		return same;
	}
}

/* A tres string's trailing count replaced by ``value`` (a shaped answer's strings end in theirs). */
static int put_count(char *text, unsigned long value)
{
	size_t n = strlen(text);

	while (n > 0 && text[n - 1] >= '0' && text[n - 1] <= '9')
		n--;
	if (n == 0 || n == strlen(text) || text[n - 1] != ':')
		return 0;
	return snprintf(text + n, TETHER_STR - n, "%lu", value) < (int)(TETHER_STR - n);
}

/* ``job``'s numbers for its own counts, by the shape's quantities; 0 when one does not fit. */
static int fill_counts(tether_job_t *job, const struct tether_counts *c)
{
	unsigned long v;

	if (!c->have_slots)
		return !(job->q_min_nodes | job->q_max_nodes | job->q_num_tasks | job->q_ntasks_per_node |
			 job->q_cpus_per_task | job->q_tres_per_job | job->q_tres_per_task | job->q_tres_per_node);
	job->out_min_nodes = (uint32_t)quantity(job->q_min_nodes, c, job->out_min_nodes);
	job->out_max_nodes = (uint32_t)quantity(job->q_max_nodes, c, job->out_max_nodes);
	job->out_num_tasks = (uint32_t)quantity(job->q_num_tasks, c, job->out_num_tasks);
	v = quantity(job->q_ntasks_per_node, c, job->out_ntasks_per_node);
	if (v >= 0xfffe) /* NO_VAL16 */
		return 0;
	job->out_ntasks_per_node = (uint16_t)v;
	v = quantity(job->q_cpus_per_task, c, job->out_cpus_per_task);
	if (v >= 0xfffe)
		return 0;
	job->out_cpus_per_task = (uint16_t)v;
	if (job->q_tres_per_job && !put_count(job->out_tres_per_job, quantity(job->q_tres_per_job, c, 0)))
		return 0;
	if (job->q_tres_per_task && !put_count(job->out_tres_per_task, quantity(job->q_tres_per_task, c, 0)))
		return 0;
	if (job->q_tres_per_node && !put_count(job->out_tres_per_node, quantity(job->q_tres_per_node, c, 0)))
		return 0;
	return 1;
}

int tether_shape_lookup(tether_job_t *job, const char *key, const struct tether_counts *counts)
{
	tether_job_t answer;
	int rc;

	/* counts the handler refuses (more slots per node than slots, or not a divisor) are its to
	 * answer, with its message */
	if (counts->have_slots && counts->slots > 0 &&
	    (counts->spn > counts->slots || counts->slots % counts->spn != 0))
		return 0;
	memcpy(&answer, job, sizeof(answer));
	rc = lookup_in(shapes, &answer, key);
	if (rc == 0 || !fill_counts(&answer, counts))
		return 0;
	memcpy(job, &answer, sizeof(answer));
	return rc;
}

void tether_shape_store(const tether_job_t *job, const char *key, int rc, unsigned long made_in)
{
	if (job->shaped && job->cacheable && rc == TETHER_ACCEPT)
		store_in(shapes, job, key, rc, made_in);
}
