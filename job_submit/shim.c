/*
 * tether job_submit plugin: the thin C face slurmctld loads (job_submit_tether.so, Slurm 22.05 ABI).
 *
 * It exports plugin_name/plugin_type/plugin_version, init, fini, job_submit and the three-argument
 * job_modify. A job without tether options never enters Python. For tether jobs it calls the
 * Python handler (tether.job_submit.handler) in an interpreter this shim starts itself, isolated
 * (explicit search paths, no site, no signal handlers), so a broken Python installation can never
 * exit() slurmctld. Every failure rejects tether jobs with "tether unavailable: <reason>" and lets
 * other jobs pass (or rejects all jobs, when the last good config says plugin.on_failure is
 * reject_all_jobs). Strings written into job_desc or *err_msg come from Slurm's allocator.
 *
 * Build-time values (@...@) are filled in by tether/job_submit/build.py.
 */
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdint.h>

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
#include <slurm/spank.h> /* declares slurm_info/slurm_error/slurm_verbose */

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

#define TETHER_MSG_LEN 2048

/* Implemented in Python (tether.job_submit.handler) through cffi's embedding API. */
int tether_py_init(void);
int tether_py_submit(job_desc_msg_t *job_desc, uint32_t submit_uid, int wanted, char *msg, int msg_len);
int tether_py_modify(job_desc_msg_t *update, job_desc_msg_t *current, uint32_t submit_uid, char *msg,
		     int msg_len);

static const char *tether_module_paths[] = { @MODULE_PATHS@, NULL };
static const wchar_t *tether_python_home = L"@PYTHON_HOME@";

/* Health, set at init and by the handler (tether_set_health) on every config (re)load. */
static volatile int tether_ready;      /* 1: the handler answered init */
static volatile int tether_reject_all; /* plugin.on_failure: reject_all_jobs while broken */
static volatile int tether_broken = 1;
static char tether_reason[512] = "not initialized";
static pthread_mutex_t tether_reason_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- helpers the Python handler calls (declared in the cffi cdef) ----------------------- */

/* Replace a job_desc string field with a copy from Slurm's allocator (NULL clears it). */
void tether_set_str(char **field, const char *value)
{
	slurm_xfree((void **)field);
	if (value != NULL)
		*field = slurm_xstrdup(value);
}

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

/* ---- the interpreter -------------------------------------------------------------------- */

static int tether_start_python(char *why, size_t why_len)
{
	struct sigaction saved[NSIG];
	PyConfig config;
	PyStatus status;
	Dl_info info;
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
	PyEval_SaveThread(); /* release the GIL: RPC threads take it through cffi */
	rc = 0;
out:
	if (rc != 0)
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
	int rc;

	if (tether_start_python(why, sizeof(why)) != 0) {
		tether_set_health(1, 0, why);
		slurm_error("job_submit/tether: tether unavailable: %s", why);
		return SLURM_SUCCESS; /* never fatal to slurmctld: tether jobs are rejected instead */
	}
	rc = tether_py_init();
	if (rc != TETHER_ACCEPT) {
		if (rc != TETHER_REJECT)
			tether_set_health(1, 0, "the Python handler failed to load (see slurmctld log)");
		pthread_mutex_lock(&tether_reason_lock);
		slurm_error("job_submit/tether: tether unavailable: %s", tether_reason);
		pthread_mutex_unlock(&tether_reason_lock);
	}
	tether_ready = 1;
	return SLURM_SUCCESS;
}

int fini(void)
{
	/* Python stays initialized (the .so is linked -z nodelete); nothing to release. */
	return SLURM_SUCCESS;
}

/*
 * A tether job carries one of our options in spank_job_env: Slurm's _SLURM_SPANK_OPTION_tether_<name>
 * for options on the command line, and TETHER_<NAME> that the SPANK plugin forwards with
 * spank_job_control_setenv (the SPANK_ prefix is only added for prolog/epilog).
 */
static int tether_requested(const job_desc_msg_t *job_desc)
{
	static const char opt_prefix[] = "_SLURM_SPANK_OPTION_tether_";
	static const char ctl_prefix[] = "TETHER_";

	for (uint32_t i = 0; i < job_desc->spank_job_env_size; i++) {
		const char *e = job_desc->spank_job_env[i];
		if (e && (strncmp(e, opt_prefix, sizeof(opt_prefix) - 1) == 0 ||
			  strncmp(e, ctl_prefix, sizeof(ctl_prefix) - 1) == 0))
			return 1;
	}
	return 0;
}

static int tether_unavailable(char **err_msg)
{
	char msg[TETHER_MSG_LEN];

	pthread_mutex_lock(&tether_reason_lock);
	snprintf(msg, sizeof(msg), "tether unavailable: %s", tether_reason);
	pthread_mutex_unlock(&tether_reason_lock);
	if (err_msg)
		*err_msg = slurm_xstrdup(msg);
	slurm_info("job_submit/tether: rejected a job: %s", msg);
	return SLURM_ERROR;
}

static int tether_answer(int rc, const char *msg, char **err_msg)
{
	if (rc == TETHER_ACCEPT) {
		if (msg[0] && err_msg)
			*err_msg = slurm_xstrdup(msg); /* notes for the user */
		return SLURM_SUCCESS;
	}
	if (rc == TETHER_REJECT) {
		if (err_msg)
			*err_msg = slurm_xstrdup(msg);
		return SLURM_ERROR;
	}
	/* One job's failure does not mark tether broken; this job is refused, the next one tried. */
	if (err_msg)
		*err_msg = slurm_xstrdup("tether unavailable: internal error in the job_submit handler "
					 "(the slurmctld log has the details)");
	slurm_error("job_submit/tether: rejected a job: internal error in the Python handler");
	return SLURM_ERROR;
}

int job_submit(job_desc_msg_t *job_desc, uint32_t submit_uid, char **err_msg)
{
	char msg[TETHER_MSG_LEN] = "";
	int wanted = tether_requested(job_desc);

	if (!wanted && !(tether_broken && tether_reject_all))
		return SLURM_SUCCESS; /* not ours: untouched, no Python */
	if (!tether_ready || !Py_IsInitialized())
		return tether_unavailable(err_msg);
	return tether_answer(tether_py_submit(job_desc, submit_uid, wanted, msg, sizeof(msg)), msg,
			     err_msg);
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
	char msg[TETHER_MSG_LEN] = "";
	job_desc_msg_t *current;
	int rc;

	if (!tether_update_relevant(job_desc))
		return SLURM_SUCCESS;
	current = copy_job_record_to_job_desc(job_ptr);
	if (current == NULL)
		return SLURM_SUCCESS;
	if (!tether_requested(current)) {
		tether_free_job_copy(current);
		return SLURM_SUCCESS; /* not a tether job */
	}
	if (!tether_ready || !Py_IsInitialized()) {
		tether_free_job_copy(current);
		slurm_error("job_submit/tether: update of tether job %u refused: tether unavailable",
			    job_desc->job_id);
		return ESLURM_NOT_SUPPORTED;
	}
	rc = tether_py_modify(job_desc, current, submit_uid, msg, sizeof(msg));
	tether_free_job_copy(current);
	if (rc == TETHER_ACCEPT)
		return SLURM_SUCCESS;
	if (rc != TETHER_REJECT)
		slurm_error("job_submit/tether: update of job %u refused: internal error (see above)",
			    job_desc->job_id);
	return ESLURM_NOT_SUPPORTED;
}
