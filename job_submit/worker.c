/*
 * The worker thread and the embedded interpreter of the job_submit plugin (see worker.h).
 *
 * One worker thread keeps its Python thread state for the life of slurmctld and runs the handler's
 * calls that may block (a config to read, an NSS lookup) one at a time, within a time limit. Python
 * never touches job_desc (plugin.c copies what the handler reads and applies its answer), so a
 * call that overruns its time limit is abandoned safely. A submission that needs neither runs on
 * the calling thread (run_here): the hand-over costs more than the handler.
 *
 * Build-time values (build.py passes them with -D): TETHER_PYTHON_HOME, TETHER_MODULE_PATHS.
 */
#define _GNU_SOURCE
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cache.h"
#include "worker.h"

#ifndef TETHER_PYTHON_HOME
#define TETHER_PYTHON_HOME "" /* not configured: tether_worker_start refuses */
#endif
#ifndef TETHER_MODULE_PATHS
#define TETHER_MODULE_PATHS NULL
#endif

static const char *module_paths[] = { TETHER_MODULE_PATHS, NULL };

/* ---- health ---------------------------------------------------------------------------------- */
static volatile int broken = 1;
static volatile int reject_all;
static char reason[512] = "not initialized";
static pthread_mutex_t reason_lock = PTHREAD_MUTEX_INITIALIZER;

void tether_set_health(int is_broken, int rejects_all, const char *why)
{
	pthread_mutex_lock(&reason_lock);
	broken = is_broken;
	reject_all = rejects_all;
	snprintf(reason, sizeof(reason), "%s", why ? why : "");
	pthread_mutex_unlock(&reason_lock);
}

int tether_is_broken(void)
{
	return broken;
}

int tether_rejects_all(void)
{
	return broken && reject_all;
}

void tether_reason(char *buf, size_t len)
{
	pthread_mutex_lock(&reason_lock);
	snprintf(buf, len, "%s", reason);
	pthread_mutex_unlock(&reason_lock);
}

/* ---- calls ----------------------------------------------------------------------------------- */
static pthread_mutex_t worker_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t worker_wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t worker_done = PTHREAD_COND_INITIALIZER;
static struct tether_call *pending;
static struct tether_call *running;
static int started;

void tether_job_free(tether_job_t *job)
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
	free(job->features);
	for (uint32_t i = 0; i < job->spank_env_size; i++)
		free(job->spank_env[i]);
	free(job->spank_env);
	free(job->values);
	free(job);
}

void tether_call_free(struct tether_call *call)
{
	tether_job_free(call->job);
	tether_job_free(call->current);
	free(call);
}

static int dispatch(struct tether_call *call)
{
	switch (call->op) {
	case TETHER_OP_INIT:
		return tether_py_init();
	case TETHER_OP_SUBMIT:
		return tether_py_submit(call->job, call->uid, call->wanted);
	default:
		return tether_py_modify(call->job, call->current, call->uid);
	}
}

static void *worker(void *unused)
{
	sigset_t all;

	(void)unused;
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

		while (pending == NULL)
			pthread_cond_wait(&worker_wake, &worker_lock);
		call = pending;
		pending = NULL;
		running = call;
		pthread_mutex_unlock(&worker_lock);

		clock_gettime(CLOCK_MONOTONIC, &call->t_start);
		rc = dispatch(call);
		/* the cache's tables are emptied only by the handler's calls, one at a time, here: this
		 * is the generation the answer was made in */
		call->generation = tether_cache_generation();
		clock_gettime(CLOCK_MONOTONIC, &call->t_end);

		pthread_mutex_lock(&worker_lock);
		running = NULL;
		call->rc = rc;
		call->done = 1;
		if (call->abandoned)
			tether_call_free(call);
		/* the caller of this call, and any caller waiting for its turn */
		pthread_cond_broadcast(&worker_done);
	}
	return NULL;
}

/* The stack a call on slurmctld's thread must have left: Slurm gives its RPC threads 1 MiB
 * (macros.h, slurm_thread_create). On Python 3.11 the recursion limit is what bounds a recursion
 * through C (RECURSION_LIMIT, handler.py: 250 frames fit in about half of it; Python's default let
 * it overflow the stack); 3.12 and later also bound C recursion on their own, by a count this
 * limit does not lower. */
#define TETHER_DIRECT_STACK (512 * 1024)

/* The bytes of this thread's stack below the current frame (it grows down), or 0 when not known. */
static size_t stack_left(void)
{
	pthread_attr_t attr;
	void *low = NULL;
	size_t size = 0;
	char here;

	if (pthread_getattr_np(pthread_self(), &attr) != 0)
		return 0;
	if (pthread_attr_getstack(&attr, &low, &size) != 0)
		size = 0;
	pthread_attr_destroy(&attr);
	if (size == 0 || &here < (char *)low || &here >= (char *)low + size)
		return 0;
	return (size_t)(&here - (char *)low);
}

/*
 * A submission whose answer needs only the handler's memory runs on the calling slurmctld thread
 * itself, when no other call is in the handler: handing it to the worker and waking the caller
 * again cost more than the handler's own work (~60 us of slurmctld's locks in bench/submit.py's
 * debug round; 24 against 10 us for a trivial call, measured beside worker.c). The config must be
 * current (no file to read), the handler not broken and the thread's stack deep enough; the
 * handler answers TETHER_ON_WORKER for anything else that may block (a user's name, from NSS),
 * and the call goes to the worker as any other. Each slurmctld RPC is a thread of its own: cffi's
 * entry makes a Python thread state on the thread's first call and keeps it until the thread ends
 * (then the next thread's first call drops it; its frame chunk comes back to arena_alloc's).
 * Returns the answer, or TETHER_ON_WORKER when the call is the worker's (also when busy).
 */
static int run_here(struct tether_call *call)
{
	int rc;

	if (call->op != TETHER_OP_SUBMIT || !call->job->config_current || tether_is_broken() ||
	    stack_left() < TETHER_DIRECT_STACK)
		return TETHER_ON_WORKER;
	pthread_mutex_lock(&worker_lock);
	if (running || pending) {
		pthread_mutex_unlock(&worker_lock);
		return TETHER_ON_WORKER;
	}
	running = call; /* later callers wait for its end, as for the worker's */
	pthread_mutex_unlock(&worker_lock);

	call->job->direct = 1;
	clock_gettime(CLOCK_MONOTONIC, &call->t_start);
	call->t_signal = call->t_start;
	rc = dispatch(call);
	call->generation = tether_cache_generation();
	clock_gettime(CLOCK_MONOTONIC, &call->t_end);
	call->job->direct = 0;

	pthread_mutex_lock(&worker_lock);
	running = NULL;
	pthread_cond_broadcast(&worker_done);
	pthread_mutex_unlock(&worker_lock);
	return rc;
}

int tether_run(struct tether_call *call, int seconds)
{
	struct timespec deadline;
	int rc;

	rc = run_here(call);
	if (rc != TETHER_ON_WORKER) {
		call->done = 1;
		call->direct = 1;
		call->rc = rc;
		return rc;
	}
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += seconds;
	pthread_mutex_lock(&worker_lock);
	/* Calls are serialized. From Slurm 23.02 slurmctld calls job_submit plugins under a read lock,
	 * so another submission may be in the handler now: wait for its end, within this call's own
	 * time. */
	while (running || pending) {
		/* a call whose caller gave up is still running: the worker is stuck, and waiting
		 * would only hold slurmctld's locks longer (busy at once, as before) */
		if ((running && running->abandoned) ||
		    pthread_cond_timedwait(&worker_done, &worker_lock, &deadline) == ETIMEDOUT) {
			pthread_mutex_unlock(&worker_lock);
			return TETHER_BUSY;
		}
	}
	pending = call;
	clock_gettime(CLOCK_MONOTONIC, &call->t_signal);
	pthread_cond_signal(&worker_wake);
	while (!call->done) {
		if (pthread_cond_timedwait(&worker_done, &worker_lock, &deadline) == ETIMEDOUT)
			break;
	}
	if (call->done) {
		rc = call->rc;
	} else if (pending == call) { /* never started: take it back, and let the next caller in */
		pending = NULL;
		rc = TETHER_BUSY;
		pthread_cond_broadcast(&worker_done);
	} else {
		call->abandoned = 1;
		rc = TETHER_TIMEOUT;
		pthread_cond_broadcast(&worker_done); /* those waiting for their turn: busy now */
	}
	pthread_mutex_unlock(&worker_lock);
	return rc;
}

int tether_worker_started(void)
{
	return started;
}

/* ---- the interpreter ------------------------------------------------------------------------- */

/*
 * Python's arenas, with the 16 KiB chunks of its frame stacks kept for the next thread state. Each
 * RPC thread that calls the handler (run_here) gets a thread state of its own, dropped after the
 * thread ended; its first frame maps a 16 KiB chunk, and dropping it unmaps it again -- in a
 * process of many threads an unmap shoots down every core's TLB: 27 us a call against 5 us with
 * the chunk kept (measured beside worker.c, 500 threads, a thread state made and dropped per
 * call). Everything else is mapped and unmapped as Python's own allocator does.
 */
#define FRAME_CHUNK_BYTES 16384 /* CPython's DATA_STACK_CHUNK_SIZE */
#define FRAME_CHUNKS_KEPT 4
static void *frame_chunks[FRAME_CHUNKS_KEPT];
static int frame_chunks_kept;
static pthread_mutex_t frame_chunks_lock = PTHREAD_MUTEX_INITIALIZER;

static void *arena_alloc(void *ctx, size_t size)
{
	void *p = NULL;

	(void)ctx;
	if (size == FRAME_CHUNK_BYTES) {
		pthread_mutex_lock(&frame_chunks_lock);
		if (frame_chunks_kept > 0)
			p = frame_chunks[--frame_chunks_kept];
		pthread_mutex_unlock(&frame_chunks_lock);
		if (p)
			return p;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static void arena_free(void *ctx, void *ptr, size_t size)
{
	(void)ctx;
	if (size == FRAME_CHUNK_BYTES) {
		pthread_mutex_lock(&frame_chunks_lock);
		if (frame_chunks_kept < FRAME_CHUNKS_KEPT) {
			frame_chunks[frame_chunks_kept++] = ptr;
			ptr = NULL;
		}
		pthread_mutex_unlock(&frame_chunks_lock);
		if (ptr == NULL)
			return;
	}
	munmap(ptr, size);
}

/* The isolated configuration: explicit search paths, no site, no signal handlers, no bytecode. */
static PyStatus configure(PyConfig *config)
{
	PyStatus status;

	PyConfig_InitIsolatedConfig(config);
	config->site_import = 0;
	config->install_signal_handlers = 0;
	config->write_bytecode = 0;
	config->user_site_directory = 0;
	config->parse_argv = 0;
	config->buffered_stdio = 0;
	status = PyConfig_SetBytesString(config, &config->home, TETHER_PYTHON_HOME);
	if (PyStatus_Exception(status))
		return status;
	status = PyConfig_SetString(config, &config->program_name, L"slurmctld-tether");
	if (PyStatus_Exception(status))
		return status;
	config->module_search_paths_set = 1;
	for (const char **p = module_paths; *p; p++) {
		wchar_t *w = Py_DecodeLocale(*p, NULL);

		if (w == NULL)
			return PyStatus_NoMemory();
		status = PyWideStringList_Append(&config->module_search_paths, w);
		PyMem_RawFree(w);
		if (PyStatus_Exception(status))
			return status;
	}
	return PyStatus_Ok();
}

int tether_worker_start(char *why, size_t why_len)
{
	struct sigaction saved[NSIG];
	PyConfig config;
	PyStatus status;
	Dl_info info;
	pthread_t thread;
	pthread_attr_t attr;
	int rc = -1;

	if (TETHER_PYTHON_HOME[0] == '\0' || module_paths[0] == NULL) {
		snprintf(why, why_len, "the plugin was built without its Python paths (run `tether slurm build`)");
		return -1;
	}
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
	{
		PyObjectArenaAllocator arenas = { NULL, arena_alloc, arena_free };

		PyObject_SetArenaAllocator(&arenas); /* before any arena: each is freed as it was made */
	}
	status = configure(&config);
	if (!PyStatus_Exception(status))
		status = Py_InitializeFromConfig(&config);
	PyConfig_Clear(&config);
	if (PyStatus_Exception(status)) {
		snprintf(why, why_len, "Python did not start: %s", status.err_msg ? status.err_msg : "unknown error");
		goto out;
	}
	PyEval_SaveThread(); /* release the GIL: the worker thread takes it */
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&thread, &attr, worker, NULL) != 0) {
		snprintf(why, why_len, "cannot start the handler thread: %s", strerror(errno));
	} else {
		started = 1;
		rc = 0;
	}
	pthread_attr_destroy(&attr);
out:
	for (int s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP)
			sigaction(s, &saved[s], NULL);
	return rc;
}
