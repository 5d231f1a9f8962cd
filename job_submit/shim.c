/*
 * tether job_submit plugin: the thin C face slurmctld loads (job_submit_tether.so, Slurm 22.05 ABI).
 *
 * It exports plugin_name/plugin_type/plugin_version, init, fini, job_submit and the three-argument
 * job_modify. A job without tether options never enters Python.
 *
 * For tether jobs the request is copied out of job_desc into a tether_job_t and handed to one
 * worker thread that keeps its Python thread state for the life of slurmctld (slurmctld runs each
 * RPC on a new thread; creating a Python thread state per call would cost more than the work).
 * The handler (tether.job_submit.handler) answers in the same struct; the calling slurmctld thread
 * applies the answer to job_desc with Slurm's allocator. Python never touches job_desc, so a call
 * that overruns its time limit is abandoned safely: the job is rejected and slurmctld moves on.
 *
 * Python is started here, isolated (explicit search paths, no site, no signal handlers), so a
 * broken installation can never exit() slurmctld. Every failure rejects tether jobs with
 * "tether unavailable: <reason>" and lets other jobs pass (or rejects all jobs while tether is
 * unavailable, when the config says plugin.on_failure: reject_all_jobs).
 *
 * Build-time values (@...@) are filled in by tether/job_submit/build.py.
 */
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/stat.h>
#include <time.h>

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
#include <slurm/spank.h> /* declares slurm_info/slurm_error/slurm_verbose/slurm_debug */

/* Slurm's allocator, exported by libslurmfull (not declared in the public headers). */
extern char *slurm_xstrdup(const char *str);
extern void slurm_xfree(void **item);
/* slurmctld exports these (job_mgr.c); job_record_t stays opaque here. */
struct job_record;
extern job_desc_msg_t *copy_job_record_to_job_desc(struct job_record *job_ptr);
extern void slurm_free_job_desc_msg(job_desc_msg_t *msg);

const char plugin_name[] = "tether: slots to GPU/CPU resources";
const char plugin_type[] = "job_submit/tether";
const uint32_t plugin_version = SLURM_VERSION_NUMBER;

/* What the Python handler answers (0 is never success: cffi returns 0 when its init failed). */
#define TETHER_ACCEPT 1
#define TETHER_REJECT 2
#define TETHER_TIMEOUT (-3)
#define TETHER_BUSY (-4)

#define TETHER_CALL_SECONDS 5    /* a handler call longer than this is abandoned */
#define TETHER_INIT_SECONDS 60

#define TETHER_STR 1024
#define TETHER_MSG 2048

/* The request as the handler sees it, and its answer: typedef tether_job_t, generated from
 * build.py's TETHER_JOB_FIELDS (the cffi cdef uses the same text, so the two cannot drift). */
/*@TETHER_JOB_T@*/

/* Implemented in Python (tether.job_submit.handler) through cffi's embedding API. */
int tether_py_init(void);
int tether_py_submit(tether_job_t *job, uint32_t submit_uid, int wanted);
int tether_py_modify(tether_job_t *update, tether_job_t *current, uint32_t submit_uid);

static const char *tether_module_paths[] = { @MODULE_PATHS@, NULL };
static const wchar_t *tether_python_home = L"@PYTHON_HOME@";

/* Health, set at init and by the handler (tether_set_health) on every config (re)load. */
static volatile int tether_ready;       /* the worker runs and the handler answered init */
static volatile int tether_reject_all;  /* plugin.on_failure: reject_all_jobs while broken */
static volatile int tether_broken = 1;
static char tether_reason[512] = "not initialized";
static pthread_mutex_t tether_reason_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- helpers the Python handler calls (declared in the cffi cdef) ----------------------- */

void tether_log(int level, const char *msg)
{
	if (level <= 0)
		slurm_error("job_submit/tether: %s", msg);
	else if (level == 1)
		slurm_info("job_submit/tether: %s", msg);
	else
		slurm_verbose("job_submit/tether: %s", msg);
}

void tether_set_health(int broken, int reject_all, const char *reason)
{
	pthread_mutex_lock(&tether_reason_lock);
	tether_broken = broken;
	tether_reject_all = reject_all;
	snprintf(tether_reason, sizeof(tether_reason), "%s", reason ? reason : "");
	pthread_mutex_unlock(&tether_reason_lock);
}

/* ---- answers cache ------------------------------------------------------------------------
 * The answer to a request depends only on the request and the config, and sites submit the same
 * request many times (sweeps, retries): the last answers are kept here, keyed by everything the
 * handler reads, so a repeated request costs no Python at all. An answer is served only while the
 * config file on disk (stat()ed at most every TETHER_CONFIG_CHECK_NS) is the one the handler last
 * loaded; any change sends the next request to the handler, which reloads, and empties the cache. */
#define TETHER_CACHE_SLOTS 64
#define TETHER_CONFIG_CHECK_NS @CONFIG_CHECK_NS@L

struct tether_stamp {
	int exists;
	unsigned long long ino, size;
	long long mtime_ns;
};

struct tether_answer {
	char *key;                   /* malloc'd; NULL: empty slot */
	int rc;
	tether_job_t job;            /* only the out_* fields and msg are used */
};

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tether_answer cache[TETHER_CACHE_SLOTS];
static char config_path[4096];
static struct tether_stamp loaded_stamp; /* the file the handler's config came from */
static int loaded_known;
static struct tether_stamp seen_stamp;   /* the file on disk at the last check */
static struct timespec config_checked;

static void cache_flush_locked(void)
{
	for (int i = 0; i < TETHER_CACHE_SLOTS; i++) {
		free(cache[i].key);
		cache[i].key = NULL;
	}
}

/* The handler tells which file its config came from after every (re)load check. */
void tether_config_loaded(const char *path, int exists, unsigned long long ino,
			  unsigned long long size, long long mtime_ns)
{
	struct tether_stamp st = { exists, ino, size, mtime_ns };

	pthread_mutex_lock(&cache_lock);
	snprintf(config_path, sizeof(config_path), "%s", path ? path : "");
	if (!loaded_known || memcmp(&st, &loaded_stamp, sizeof(st)) != 0)
		cache_flush_locked();
	loaded_stamp = st;
	loaded_known = 1;
	seen_stamp = st;
	clock_gettime(CLOCK_MONOTONIC, &config_checked);
	pthread_mutex_unlock(&cache_lock);
}

/* Is the file on disk still the one the handler loaded? (locked; stat() at most every 0.2 s) */
static int cache_config_current_locked(void)
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

static void key_add(char **key, size_t *len, size_t *cap, const char *s)
{
	size_t n = s ? strlen(s) : 0;

	if (*key == NULL)
		return;
	if (*len + n + 2 > *cap) {
		char *bigger;
		*cap = (*len + n + 2) * 2;
		bigger = realloc(*key, *cap);
		if (bigger == NULL) {
			free(*key);
			*key = NULL;
			return;
		}
		*key = bigger;
	}
	memcpy(*key + *len, s ? s : "", n);
	*len += n;
	(*key)[(*len)++] = s ? '\x1f' : '\x1e'; /* separators that cannot occur in the fields */
	(*key)[*len] = '\0';
}

/* Everything the handler reads, as one string (NULL when out of memory). */
static char *cache_key(const tether_job_t *job)
{
	char num[160];
	size_t len = 0, cap = 512;
	char *key = malloc(cap);

	if (key == NULL)
		return NULL;
	key[0] = '\0';
	snprintf(num, sizeof(num), "%u %u %u %u %u %u", job->user_id, job->min_nodes, job->max_nodes,
		 job->num_tasks, (unsigned)job->ntasks_per_node, (unsigned)job->cpus_per_task);
	key_add(&key, &len, &cap, num);
	key_add(&key, &len, &cap, job->partition);
	key_add(&key, &len, &cap, job->account);
	key_add(&key, &len, &cap, job->tres_per_job);
	key_add(&key, &len, &cap, job->tres_per_node);
	key_add(&key, &len, &cap, job->tres_per_task);
	key_add(&key, &len, &cap, job->tres_per_socket);
	for (uint32_t i = 0; i < job->spank_env_size; i++)
		key_add(&key, &len, &cap, job->spank_env[i]);
	return key;
}

static unsigned cache_slot(const char *key)
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

/* A cached answer for ``job`` (copied into its out_* fields), or 0. */
static int cache_lookup(tether_job_t *job, const char *key)
{
	int rc = 0;
	struct tether_answer *a;

	pthread_mutex_lock(&cache_lock);
	a = &cache[cache_slot(key)];
	if (cache_config_current_locked() && a->key && strcmp(a->key, key) == 0) {
		copy_answer(job, &a->job);
		rc = a->rc;
	}
	pthread_mutex_unlock(&cache_lock);
	return rc;
}

static void cache_store(const tether_job_t *job, const char *key, int rc)
{
	struct tether_answer *a;

	if (!job->cacheable || (rc != TETHER_ACCEPT && rc != TETHER_REJECT))
		return;
	pthread_mutex_lock(&cache_lock);
	if (cache_config_current_locked()) {
		a = &cache[cache_slot(key)];
		free(a->key);
		a->key = strdup(key);
		a->rc = rc;
		copy_answer(&a->job, job);
	}
	pthread_mutex_unlock(&cache_lock);
}

/* ---- the request snapshot --------------------------------------------------------------- */

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

static void tether_job_free(tether_job_t *job)
{
	if (job == NULL)
		return;
	free(job->job_id_str);
	free(job->partition);
	free(job->account);
	free(job->tres_per_job);
	free(job->tres_per_node);
	free(job->tres_per_task);
	free(job->tres_per_socket);
	for (uint32_t i = 0; i < job->spank_env_size; i++)
		free(job->spank_env[i]);
	free(job->spank_env);
	free(job);
}

/* Copy what the handler reads out of job_desc (NULL when out of memory). */
static tether_job_t *tether_job_from(const job_desc_msg_t *jd)
{
	tether_job_t *job = calloc(1, sizeof(*job));

	if (job == NULL)
		return NULL;
	job->job_id = jd->job_id;
	job->user_id = jd->user_id;
	job->min_nodes = jd->min_nodes;
	job->max_nodes = jd->max_nodes;
	job->num_tasks = jd->num_tasks;
	job->ntasks_per_node = jd->ntasks_per_node;
	job->cpus_per_task = jd->cpus_per_task;
	job->job_id_str = dup_or_null(jd->job_id_str);
	job->partition = dup_or_null(jd->partition);
	job->account = dup_or_null(jd->account);
	job->tres_per_job = dup_or_null(jd->tres_per_job);
	job->tres_per_node = dup_or_null(jd->tres_per_node);
	job->tres_per_task = dup_or_null(jd->tres_per_task);
	job->tres_per_socket = dup_or_null(jd->tres_per_socket);
	if (jd->spank_job_env_size && jd->spank_job_env) {
		job->spank_env = calloc(jd->spank_job_env_size, sizeof(char *));
		if (job->spank_env == NULL)
			goto fail;
		for (uint32_t i = 0; i < jd->spank_job_env_size; i++) {
			if (jd->spank_job_env[i] == NULL)
				continue;
			job->spank_env[job->spank_env_size] = strdup(jd->spank_job_env[i]);
			if (job->spank_env[job->spank_env_size++] == NULL)
				goto fail;
		}
	}
	if ((jd->job_id_str && !job->job_id_str) || (jd->partition && !job->partition) ||
	    (jd->account && !job->account) || (jd->tres_per_job && !job->tres_per_job) ||
	    (jd->tres_per_node && !job->tres_per_node) || (jd->tres_per_task && !job->tres_per_task) ||
	    (jd->tres_per_socket && !job->tres_per_socket))
		goto fail;
	return job;
fail:
	tether_job_free(job);
	return NULL;
}

static void set_str(char **field, const char *value)
{
	slurm_xfree((void **)field);
	*field = slurm_xstrdup(value);
}

/* Write the handler's answer into job_desc (Slurm's allocator for every string). */
static void tether_job_apply(const tether_job_t *job, job_desc_msg_t *jd)
{
	if (job->set_nodes) {
		jd->min_nodes = job->out_min_nodes;
		jd->max_nodes = job->out_max_nodes;
	}
	if (job->set_num_tasks)
		jd->num_tasks = job->out_num_tasks;
	if (job->set_ntasks_per_node)
		jd->ntasks_per_node = job->out_ntasks_per_node;
	if (job->set_cpus_per_task)
		jd->cpus_per_task = job->out_cpus_per_task;
	if (job->set_requeue)
		jd->requeue = job->out_requeue;
	if (job->set_tres_per_job)
		set_str(&jd->tres_per_job, job->out_tres_per_job);
	if (job->set_tres_per_node)
		set_str(&jd->tres_per_node, job->out_tres_per_node);
	if (job->set_tres_per_task)
		set_str(&jd->tres_per_task, job->out_tres_per_task);
	if (job->set_partition)
		set_str(&jd->partition, job->out_partition);
	if (job->set_wckey)
		set_str(&jd->wckey, job->out_wckey);
}

/* A tether job carries one of our options in spank_job_env: Slurm's
 * _SLURM_SPANK_OPTION_tether_<name> for options on the command line, and TETHER_<NAME> that the
 * SPANK plugin forwards with spank_job_control_setenv (prolog/epilog see SPANK_TETHER_<NAME>). */
static int tether_requested(const job_desc_msg_t *jd)
{
	static const char opt_prefix[] = "_SLURM_SPANK_OPTION_tether_";
	static const char ctl_prefix[] = "TETHER_";

	for (uint32_t i = 0; i < jd->spank_job_env_size; i++) {
		const char *e = jd->spank_job_env[i];
		if (e && (strncmp(e, opt_prefix, sizeof(opt_prefix) - 1) == 0 ||
			  strncmp(e, ctl_prefix, sizeof(ctl_prefix) - 1) == 0))
			return 1;
	}
	return 0;
}

/* ---- the worker thread ------------------------------------------------------------------ */

enum { OP_INIT, OP_SUBMIT, OP_MODIFY };

struct tether_call {
	int op;
	tether_job_t *job;
	tether_job_t *current;
	uint32_t uid;
	int wanted;
	int rc;
	int done;
	int abandoned; /* the caller gave up waiting: the worker frees the call */
};

static pthread_mutex_t worker_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t worker_wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t worker_done = PTHREAD_COND_INITIALIZER;
static struct tether_call *worker_pending;
static struct tether_call *worker_running;
static int worker_started;

static void tether_call_free(struct tether_call *call)
{
	tether_job_free(call->job);
	tether_job_free(call->current);
	free(call);
}

static void *tether_worker(void *unused)
{
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL); /* slurmctld's signals are for its own threads */
	/* Take a Python thread state and keep it (the counter stays above zero): every later call
	 * from this thread reuses it instead of creating and destroying one. */
	PyGILState_Ensure();
	PyEval_SaveThread();

	pthread_mutex_lock(&worker_lock);
	for (;;) {
		struct tether_call *call;
		int rc;

		while (worker_pending == NULL)
			pthread_cond_wait(&worker_wake, &worker_lock);
		call = worker_pending;
		worker_pending = NULL;
		worker_running = call;
		pthread_mutex_unlock(&worker_lock);

		if (call->op == OP_INIT)
			rc = tether_py_init();
		else if (call->op == OP_SUBMIT)
			rc = tether_py_submit(call->job, call->uid, call->wanted);
		else
			rc = tether_py_modify(call->job, call->current, call->uid);

		pthread_mutex_lock(&worker_lock);
		worker_running = NULL;
		call->rc = rc;
		call->done = 1;
		if (call->abandoned)
			tether_call_free(call);
		else
			pthread_cond_broadcast(&worker_done);
	}
	return NULL;
}

/* Run a call on the worker; waits at most ``seconds``. The caller frees the call unless the
 * answer is TETHER_TIMEOUT (then the worker does, when it finishes). */
static int tether_run(struct tether_call *call, int seconds)
{
	struct timespec deadline;
	int rc;

	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += seconds;
	pthread_mutex_lock(&worker_lock);
	if (worker_running || worker_pending) { /* calls are serialized: this one is stuck */
		pthread_mutex_unlock(&worker_lock);
		return TETHER_BUSY;
	}
	worker_pending = call;
	pthread_cond_signal(&worker_wake);
	while (!call->done) {
		if (pthread_cond_timedwait(&worker_done, &worker_lock, &deadline) == ETIMEDOUT)
			break;
	}
	if (call->done) {
		rc = call->rc;
	} else if (worker_pending == call) { /* never started: take it back */
		worker_pending = NULL;
		rc = TETHER_BUSY;
	} else {
		call->abandoned = 1;
		rc = TETHER_TIMEOUT;
	}
	pthread_mutex_unlock(&worker_lock);
	return rc;
}

/* ---- the interpreter -------------------------------------------------------------------- */

static int tether_start_python(char *why, size_t why_len)
{
	struct sigaction saved[NSIG];
	PyConfig config;
	PyStatus status;
	Dl_info info;
	pthread_t thread;
	pthread_attr_t attr;
	int rc = -1;

	if (Py_IsInitialized()) {
		snprintf(why, why_len, "another plugin already started Python in this process");
		return -1;
	}
	/* Slurm dlopen()s plugins RTLD_LOCAL: promote libpython so extension modules resolve. */
	if (dladdr((void *)&Py_IsInitialized, &info) == 0 || info.dli_fname == NULL ||
	    dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD) == NULL) {
		snprintf(why, why_len, "cannot promote libpython to global symbols: %s", dlerror());
		return -1;
	}
	for (int s = 1; s < NSIG; s++)
		sigaction(s, NULL, &saved[s]);

	PyConfig_InitIsolatedConfig(&config);
	config.site_import = 0;
	config.install_signal_handlers = 0;
	config.write_bytecode = 0;
	config.user_site_directory = 0;
	config.parse_argv = 0;
	config.buffered_stdio = 0;
	status = PyConfig_SetString(&config, &config.home, tether_python_home);
	if (PyStatus_Exception(status))
		goto out;
	status = PyConfig_SetString(&config, &config.program_name, L"slurmctld-tether");
	if (PyStatus_Exception(status))
		goto out;
	config.module_search_paths_set = 1;
	for (const char **p = tether_module_paths; *p; p++) {
		wchar_t *w = Py_DecodeLocale(*p, NULL);
		if (w == NULL) {
			status = PyStatus_NoMemory();
			goto out;
		}
		status = PyWideStringList_Append(&config.module_search_paths, w);
		PyMem_RawFree(w);
		if (PyStatus_Exception(status))
			goto out;
	}
	status = Py_InitializeFromConfig(&config);
	if (PyStatus_Exception(status))
		goto out;
	PyEval_SaveThread(); /* release the GIL: the worker thread takes it */

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&thread, &attr, tether_worker, NULL) != 0) {
		pthread_attr_destroy(&attr);
		snprintf(why, why_len, "cannot start the handler thread: %s", strerror(errno));
		rc = -2;
		goto out;
	}
	pthread_attr_destroy(&attr);
	worker_started = 1;
	rc = 0;
out:
	if (rc == -1)
		snprintf(why, why_len, "Python did not start: %s",
			 status.err_msg ? status.err_msg : "unknown error");
	PyConfig_Clear(&config);
	for (int s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP)
			sigaction(s, &saved[s], NULL);
	return rc;
}

int init(void)
{
	char why[512] = "";
	struct tether_call *call;
	int rc;

	/* A reconfigure that drops and re-adds the plugin calls init again: Python and the worker
	 * from the first init stay (the .so is linked -z nodelete). */
	if (!worker_started && tether_start_python(why, sizeof(why)) != 0) {
		tether_set_health(1, 0, why);
		slurm_error("job_submit/tether: tether unavailable: %s", why);
		return SLURM_SUCCESS; /* never fatal to slurmctld: tether jobs are rejected instead */
	}
	call = calloc(1, sizeof(*call));
	if (call == NULL)
		return SLURM_SUCCESS;
	call->op = OP_INIT;
	rc = tether_run(call, TETHER_INIT_SECONDS);
	if (rc != TETHER_TIMEOUT)
		tether_call_free(call);
	if (rc != TETHER_ACCEPT && rc != TETHER_REJECT)
		tether_set_health(1, 0, "the Python handler failed to load (see slurmctld log)");
	if (rc != TETHER_ACCEPT) {
		pthread_mutex_lock(&tether_reason_lock);
		slurm_error("job_submit/tether: tether unavailable: %s", tether_reason);
		pthread_mutex_unlock(&tether_reason_lock);
	}
	tether_ready = 1;
	return SLURM_SUCCESS;
}

int fini(void)
{
	/* Python and its worker stay (the .so is linked -z nodelete); nothing to release. */
	return SLURM_SUCCESS;
}

static int tether_refuse(char **err_msg, const char *msg)
{
	if (err_msg)
		*err_msg = slurm_xstrdup(msg);
	slurm_info("job_submit/tether: rejected a job: %s", msg);
	return SLURM_ERROR;
}

static int tether_unavailable(char **err_msg, const char *why)
{
	char msg[sizeof(tether_reason) + 64];

	pthread_mutex_lock(&tether_reason_lock);
	snprintf(msg, sizeof(msg), "tether unavailable: %s", why ? why : tether_reason);
	pthread_mutex_unlock(&tether_reason_lock);
	return tether_refuse(err_msg, msg);
}

static long elapsed_us(const struct timespec *t0)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (long)((t1.tv_sec - t0->tv_sec) * 1000000L + (t1.tv_nsec - t0->tv_nsec) / 1000L);
}

int job_submit(job_desc_msg_t *job_desc, uint32_t submit_uid, char **err_msg)
{
	int wanted = tether_requested(job_desc);
	struct tether_call *call;
	struct timespec t0;
	char *key;
	int rc;

	if (!wanted && !(tether_broken && tether_reject_all))
		return SLURM_SUCCESS; /* not ours: untouched, no Python */
	if (!tether_ready || !worker_started)
		return tether_unavailable(err_msg, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	call = calloc(1, sizeof(*call));
	if (call == NULL || (call->job = tether_job_from(job_desc)) == NULL) {
		free(call);
		return tether_unavailable(err_msg, "out of memory");
	}
	call->op = OP_SUBMIT;
	call->uid = submit_uid;
	call->wanted = wanted;
	key = wanted && !tether_broken ? cache_key(call->job) : NULL;
	rc = key ? cache_lookup(call->job, key) : 0;
	if (rc) {
		slurm_debug("job_submit/tether: cached answer took %ld us", elapsed_us(&t0));
	} else {
		rc = tether_run(call, TETHER_CALL_SECONDS);
		slurm_debug("job_submit/tether: handler took %ld us", elapsed_us(&t0));
		if (key && rc != TETHER_TIMEOUT)
			cache_store(call->job, key, rc);
	}
	free(key);
	switch (rc) {
	case TETHER_ACCEPT:
		tether_job_apply(call->job, job_desc);
		if (call->job->msg[0] && err_msg)
			*err_msg = slurm_xstrdup(call->job->msg); /* notes for the user */
		rc = SLURM_SUCCESS;
		break;
	case TETHER_REJECT:
		rc = tether_refuse(err_msg, call->job->msg);
		break;
	case TETHER_TIMEOUT:
		return tether_unavailable(err_msg, "the job_submit handler did not answer in time");
	case TETHER_BUSY:
		rc = tether_unavailable(err_msg, "the job_submit handler is still busy with an earlier job");
		break;
	default: /* one job's failure does not mark tether broken: the next job is tried again */
		slurm_error("job_submit/tether: internal error in the Python handler (see above)");
		rc = tether_unavailable(err_msg, "internal error in the job_submit handler (the slurmctld "
					"log has the details)");
	}
	tether_call_free(call);
	return rc;
}

/*
 * Free what copy_job_record_to_job_desc() returned. Its environment comes from get_job_env(): one
 * buffer (environment[0]) that all entries point into, not one allocation per entry, so it must be
 * released as such before slurm_free_job_desc_msg() (which would free every entry: a double free
 * that aborts slurmctld -- seen on 22.05.8).
 */
static void tether_free_job_copy(job_desc_msg_t *copy)
{
	if (copy->environment) {
		slurm_xfree((void **)&copy->environment[0]);
		slurm_xfree((void **)&copy->environment);
	}
	copy->env_size = 0;
	slurm_free_job_desc_msg(copy);
}

/* Does an update touch what tether controls (node/task layout, GPUs/CPUs, partition)? */
static int tether_update_relevant(const job_desc_msg_t *u)
{
	return u->min_nodes != NO_VAL || u->max_nodes != NO_VAL || u->num_tasks != NO_VAL ||
	       u->ntasks_per_node != NO_VAL16 || u->cpus_per_task != NO_VAL16 ||
	       u->tres_per_job || u->tres_per_node || u->tres_per_task || u->tres_per_socket ||
	       u->partition;
}

int job_modify(job_desc_msg_t *job_desc, struct job_record *job_ptr, uint32_t submit_uid)
{
	struct tether_call *call;
	job_desc_msg_t *copy;
	int tether_job, rc;

	if (!tether_update_relevant(job_desc))
		return SLURM_SUCCESS;
	copy = copy_job_record_to_job_desc(job_ptr);
	if (copy == NULL)
		return SLURM_SUCCESS;
	tether_job = tether_requested(copy);
	call = tether_job ? calloc(1, sizeof(*call)) : NULL;
	if (call) {
		call->job = tether_job_from(job_desc);
		call->current = tether_job_from(copy);
	}
	tether_free_job_copy(copy);
	if (!tether_job)
		return SLURM_SUCCESS; /* not a tether job */
	if (!tether_ready || !worker_started || !call || !call->job || !call->current) {
		if (call)
			tether_call_free(call);
		slurm_error("job_submit/tether: update of a tether job refused: tether unavailable");
		return ESLURM_NOT_SUPPORTED;
	}
	call->op = OP_MODIFY;
	call->uid = submit_uid;
	rc = tether_run(call, TETHER_CALL_SECONDS);
	if (rc == TETHER_ACCEPT)
		tether_job_apply(call->job, job_desc);
	else if (rc != TETHER_REJECT)
		slurm_error("job_submit/tether: update of a tether job refused: the handler failed (%d)", rc);
	if (rc != TETHER_TIMEOUT)
		tether_call_free(call);
	return rc == TETHER_ACCEPT ? SLURM_SUCCESS : ESLURM_NOT_SUPPORTED;
}
