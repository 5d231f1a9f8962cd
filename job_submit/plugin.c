/*
 * tether job_submit plugin: the face slurmctld loads (job_submit_tether.so), built against the
 * installed Slurm's headers (22.05 to 24.11 tested; the differences are in one block below).
 *
 * It exports plugin_name/plugin_type/plugin_version, init, fini, job_submit and job_modify. A job without tether options never enters Python. For a tether job the request is
 * copied out of job_desc into a tether_job_t (bridge.h), answered from the cache (cache.c) or by the
 * Python handler on the worker thread (worker.c), and the answer is applied to job_desc here, on
 * the calling slurmctld thread, with Slurm's allocator.
 *
 * Every failure rejects tether jobs with "tether unavailable: <reason>" and lets other jobs pass
 * (or rejects all jobs while tether is unavailable, when the config says plugin.on_failure:
 * reject_all_jobs). Nothing here can make slurmctld exit.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
#include <slurm/spank.h> /* declares slurm_info/slurm_error/slurm_verbose/slurm_debug */

#include "bridge.h"
#include "cache.h"
#include "request.h"
#include "worker.h"

/* Slurm's allocator, exported by libslurmfull (not declared in the public headers). */
extern char *slurm_xstrdup(const char *str);
extern void slurm_xfree(void **item);
/* slurmctld exports these (job_mgr.c); job_record_t stays opaque here. */
struct job_record;
extern job_desc_msg_t *copy_job_record_to_job_desc(struct job_record *job_ptr);
extern void slurm_free_job_desc_msg(job_desc_msg_t *msg);

/* ---- Slurm releases: every difference this file builds against, from the headers ---------------- */
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(23, 11, 0)
typedef hostlist_t *tether_hostlist_t; /* 23.11 made hostlist_t the struct itself */
#else
typedef hostlist_t tether_hostlist_t;  /* up to 23.02: a pointer type */
#endif
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(25, 11, 0)
#define TETHER_JOB_ID(jd) ((jd)->step_id.job_id) /* 25.11: job_desc's ids became a slurm_step_id_t */
#else
#define TETHER_JOB_ID(jd) ((jd)->job_id)
#endif
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(23, 2, 0)
#define TETHER_MODIFY_ERR_MSG 1        /* job_modify() has err_msg: a refusal reaches the user */
#define TETHER_MODIFY_ARGS job_desc_msg_t *job_desc, struct job_record *job_ptr, uint32_t submit_uid, char **err_msg
#else
#define TETHER_MODIFY_ERR_MSG 0
#define TETHER_MODIFY_ARGS job_desc_msg_t *job_desc, struct job_record *job_ptr, uint32_t submit_uid
#endif

const char plugin_name[] = "tether: slots to GPU/CPU resources";
const char plugin_type[] = "job_submit/tether";
const uint32_t plugin_version = SLURM_VERSION_NUMBER;

#define TETHER_CALL_SECONDS 5 /* a handler call longer than this is abandoned */
#define TETHER_INIT_SECONDS 60

static int ready; /* init ran: the worker runs and the handler answered (or said why not) */

void tether_log(int level, const char *msg)
{
	if (level <= 0)
		slurm_error("job_submit/tether: %s", msg);
	else if (level == 1)
		slurm_info("job_submit/tether: %s", msg);
	else
		slurm_verbose("job_submit/tether: %s", msg);
}

/* ---- job_desc <-> tether_job_t ---------------------------------------------------------------- */

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

static int copy_env(tether_job_t *job, char **env, uint32_t size)
{
	if (size == 0 || env == NULL)
		return 0;
	job->spank_env = calloc(size, sizeof(char *));
	if (job->spank_env == NULL)
		return -1;
	for (uint32_t i = 0; i < size; i++) {
		if (env[i] == NULL)
			continue;
		job->spank_env[job->spank_env_size] = strdup(env[i]);
		if (job->spank_env[job->spank_env_size++] == NULL)
			return -1;
	}
	return 0;
}

/* How many nodes a --nodelist names (0: none or unreadable). */
static uint32_t node_count(const char *nodelist)
{
	tether_hostlist_t hl;
	uint32_t n;

	if (nodelist == NULL || nodelist[0] == '\0' || (hl = slurm_hostlist_create(nodelist)) == NULL)
		return 0;
	n = (uint32_t)slurm_hostlist_count(hl);
	slurm_hostlist_destroy(hl);
	return n;
}

/* Copy what the handler reads out of job_desc (NULL when out of memory). */
static tether_job_t *job_from(const job_desc_msg_t *jd)
{
	tether_job_t *job = calloc(1, sizeof(*job));

	if (job == NULL)
		return NULL;
	job->job_id = TETHER_JOB_ID(jd);
	job->user_id = jd->user_id;
	job->min_nodes = jd->min_nodes;
	job->max_nodes = jd->max_nodes;
	job->num_tasks = jd->num_tasks;
	job->ntasks_per_node = jd->ntasks_per_node;
	job->cpus_per_task = jd->cpus_per_task;
	job->req_node_count = node_count(jd->req_nodes);
	job->het_job_offset = jd->het_job_offset;
	job->job_id_str = dup_or_null(jd->job_id_str);
	job->partition = dup_or_null(jd->partition);
	job->account = dup_or_null(jd->account);
	job->tres_per_job = dup_or_null(jd->tres_per_job);
	job->tres_per_node = dup_or_null(jd->tres_per_node);
	job->tres_per_task = dup_or_null(jd->tres_per_task);
	job->tres_per_socket = dup_or_null(jd->tres_per_socket);
	job->features = dup_or_null(jd->features);
	if (copy_env(job, jd->spank_job_env, jd->spank_job_env_size) < 0 ||
	    (jd->job_id_str && !job->job_id_str) || (jd->partition && !job->partition) ||
	    (jd->account && !job->account) || (jd->tres_per_job && !job->tres_per_job) ||
	    (jd->tres_per_node && !job->tres_per_node) || (jd->tres_per_task && !job->tres_per_task) ||
	    (jd->tres_per_socket && !job->tres_per_socket) || (jd->features && !job->features)) {
		tether_job_free(job);
		return NULL;
	}
	return job;
}

static void set_str(char **field, const char *value)
{
	slurm_xfree((void **)field);
	*field = slurm_xstrdup(value);
}

/* Write the handler's answer into job_desc (Slurm's allocator for every string). */
static void apply(const tether_job_t *job, job_desc_msg_t *jd)
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
	if (job->set_features)
		set_str(&jd->features, job->out_features);
}

/* A tether job carries one of our options in spank_job_env: Slurm's
 * _SLURM_SPANK_OPTION_tether_<name> for options on the command line, and TETHER_<NAME> that the
 * SPANK plugin forwards with spank_job_control_setenv. */
static int requested(const job_desc_msg_t *jd)
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

/* ---- the plugin API --------------------------------------------------------------------------- */

static void log_unavailable(void)
{
	char why[512];

	tether_reason(why, sizeof(why));
	slurm_error("job_submit/tether: tether unavailable: %s", why);
}

int init(void)
{
	char why[512] = "";
	struct tether_call *call;
	int rc;

	/* A reconfigure that drops and re-adds the plugin calls init again: Python and the worker
	 * from the first init stay (the .so is linked -z nodelete). */
	if (!tether_worker_started() && tether_worker_start(why, sizeof(why)) != 0) {
		tether_set_health(1, 0, why);
		log_unavailable();
		return SLURM_SUCCESS; /* never fatal to slurmctld: tether jobs are rejected instead */
	}
	call = calloc(1, sizeof(*call));
	if (call == NULL)
		return SLURM_SUCCESS;
	call->op = TETHER_OP_INIT;
	rc = tether_run(call, TETHER_INIT_SECONDS);
	if (rc != TETHER_TIMEOUT)
		tether_call_free(call);
	if (rc != TETHER_ACCEPT && rc != TETHER_REJECT)
		tether_set_health(1, 0, "the Python handler failed to load (see slurmctld log)");
	if (rc != TETHER_ACCEPT)
		log_unavailable();
	ready = 1;
	return SLURM_SUCCESS;
}

int fini(void)
{
	/* Python and its worker stay (the .so is linked -z nodelete); nothing to release. */
	return SLURM_SUCCESS;
}

static int refuse(char **err_msg, const char *msg)
{
	if (err_msg)
		*err_msg = slurm_xstrdup(msg);
	slurm_info("job_submit/tether: rejected a job: %s", msg);
	return SLURM_ERROR;
}

static int unavailable(char **err_msg, const char *why)
{
	char reason[512], msg[600];

	if (why == NULL)
		tether_reason(reason, sizeof(reason));
	snprintf(msg, sizeof(msg), "tether unavailable: %s", why ? why : reason);
	return refuse(err_msg, msg);
}

static long us_between(const struct timespec *t0, const struct timespec *t1)
{
	return (long)((t1->tv_sec - t0->tv_sec) * 1000000L + (t1->tv_nsec - t0->tv_nsec) / 1000L);
}

static long elapsed_us(const struct timespec *t0)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	return us_between(t0, &t1);
}

/* The answer for a submission: by its shape, from the cache, or from the handler (then kept for its
 * shape and in the cache when it can be). */
static int answer(struct tether_call *call)
{
	struct tether_counts counts;
	struct timespec t0;
	char *key, *shape;
	int cached, rc;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	cached = call->wanted && !tether_is_broken();
	shape = cached ? tether_shape_key(call->job, &counts) : NULL;
	rc = shape ? tether_shape_lookup(call->job, shape, &counts) : 0;
	if (rc) {
		slurm_debug("job_submit/tether: answer by its shape took %ld us", elapsed_us(&t0));
		free(shape);
		return rc;
	}
	key = cached ? tether_cache_key(call->job) : NULL;
	rc = key ? tether_cache_lookup(call->job, key) : 0;
	if (rc) {
		slurm_debug("job_submit/tether: cached answer took %ld us", elapsed_us(&t0));
	} else {
		call->job->config_current = tether_config_current();
		if (call->wanted) /* a tether job (not one reject-all mode sends to the handler) */
			tether_request_values(call->job);
		rc = tether_run(call, TETHER_CALL_SECONDS);
		/* where the time goes (bench/submit.py reads it): the Python handler on this thread; or
		 * handing the call to the worker thread, the handler there, and waking this thread again */
		if (call->direct)
			slurm_debug("job_submit/tether: handler took %ld us (on this thread, Python %ld)",
				    elapsed_us(&t0), us_between(&call->t_start, &call->t_end));
		else if (rc != TETHER_TIMEOUT && rc != TETHER_BUSY)
			slurm_debug("job_submit/tether: handler took %ld us (hand-off %ld, Python %ld, back %ld)",
				    elapsed_us(&t0), us_between(&call->t_signal, &call->t_start),
				    us_between(&call->t_start, &call->t_end), elapsed_us(&call->t_end));
		else
			slurm_debug("job_submit/tether: handler took %ld us", elapsed_us(&t0));
		if (key && rc != TETHER_TIMEOUT)
			tether_cache_store(call->job, key, rc, call->generation);
		if (shape && rc != TETHER_TIMEOUT)
			tether_shape_store(call->job, shape, rc, call->generation);
	}
	free(key);
	free(shape);
	return rc;
}

/*
 * A job tether planned on more nodes than its partition has waits forever (Reason
 * PartitionNodeLimit) and Slurm says nothing at submit: a note says so, from the partitions' sizes
 * the handler read of slurm.conf (a partition of unknown size says nothing). Here, after the
 * answer, so an answer by shape or from the cache gets it too.
 */
static void partition_note(tether_job_t *job, const job_desc_msg_t *jd)
{
	char names[512], *save = NULL, *name;
	long most = -1, n;
	size_t used;

	if (!job->set_nodes || jd->min_nodes == NO_VAL || jd->min_nodes == 0)
		return;
	snprintf(names, sizeof(names), "%s", jd->partition ? jd->partition : "");
	if (names[0] == '\0') {
		most = tether_partition_nodes(NULL);
	} else {
		for (name = strtok_r(names, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
			if ((n = tether_partition_nodes(name)) < 0)
				return;
			if (n > most)
				most = n;
		}
		snprintf(names, sizeof(names), "%s", jd->partition);
	}
	if (most < 0 || (unsigned long)most >= jd->min_nodes)
		return;
	used = strlen(job->msg);
	snprintf(job->msg + used, sizeof(job->msg) - used,
		 "%stether: note: tether planned %u nodes for this job, and %s%s %s %ld (slurm.conf): the job "
		 "will pend (Reason PartitionNodeLimit) until the partition has %u; a larger --slots-per-node needs fewer "
		 "nodes", used ? "\n" : "", jd->min_nodes,
		 names[0] ? (strchr(names, ',') ? "partitions " : "partition ") : "its partition", names,
		 strchr(names, ',') ? "have at most" : "has", most, jd->min_nodes);
}

int job_submit(job_desc_msg_t *job_desc, uint32_t submit_uid, char **err_msg)
{
	int wanted = requested(job_desc);
	struct tether_call *call;
	int rc;

	if (!wanted && !tether_rejects_all())
		return SLURM_SUCCESS; /* not ours: untouched, no Python */
	if (!ready || !tether_worker_started())
		return unavailable(err_msg, NULL);
	call = calloc(1, sizeof(*call));
	if (call == NULL || (call->job = job_from(job_desc)) == NULL) {
		free(call);
		return unavailable(err_msg, "out of memory");
	}
	call->op = TETHER_OP_SUBMIT;
	call->uid = submit_uid;
	call->wanted = wanted;
	rc = answer(call);
	switch (rc) {
	case TETHER_ACCEPT:
		apply(call->job, job_desc);
		partition_note(call->job, job_desc);
		if (call->job->msg[0] && err_msg)
			*err_msg = slurm_xstrdup(call->job->msg); /* notes for the user */
		rc = SLURM_SUCCESS;
		break;
	case TETHER_REJECT:
		rc = refuse(err_msg, call->job->msg);
		break;
	case TETHER_TIMEOUT:
		return unavailable(err_msg, "the job_submit handler did not answer in time");
	case TETHER_BUSY:
		rc = unavailable(err_msg, "the job_submit handler is still busy with an earlier job");
		break;
	default: /* one job's failure does not mark tether broken: the next job is tried again */
		slurm_error("job_submit/tether: internal error in the Python handler (see above)");
		rc = unavailable(err_msg, "internal error in the job_submit handler (the slurmctld log has "
				 "the details)");
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
static void free_job_copy(job_desc_msg_t *copy)
{
	if (copy->environment) {
		slurm_xfree((void **)&copy->environment[0]);
		slurm_xfree((void **)&copy->environment);
	}
	copy->env_size = 0;
	slurm_free_job_desc_msg(copy);
}

/* Does an update touch what tether controls (node/task layout, GPUs/CPUs, partition)? */
static int update_relevant(const job_desc_msg_t *u)
{
	return u->min_nodes != NO_VAL || u->max_nodes != NO_VAL || u->num_tasks != NO_VAL ||
	       u->ntasks_per_node != NO_VAL16 || u->cpus_per_task != NO_VAL16 ||
	       u->tres_per_job || u->tres_per_node || u->tres_per_task || u->tres_per_socket ||
	       u->partition;
}

/*
 * scontrol update of a job. From Slurm 23.02 job_modify has an err_msg, which slurmctld sends back
 * and scontrol prints (`scontrol: error: tether: ...`). 22.05 has none: a refusal reaches the user
 * as "Requested operation not supported on this system", and the handler logs the reason at info
 * level for the admin (the README says where to look).
 */
int job_modify(TETHER_MODIFY_ARGS)
{
	struct tether_call *call;
	job_desc_msg_t *copy;
	int tether_job, rc;
	const char *why = NULL;

	if (!update_relevant(job_desc))
		return SLURM_SUCCESS;
	copy = copy_job_record_to_job_desc(job_ptr);
	if (copy == NULL)
		return SLURM_SUCCESS;
	tether_job = requested(copy);
	call = tether_job ? calloc(1, sizeof(*call)) : NULL;
	if (call) {
		call->job = job_from(job_desc);
		call->current = job_from(copy);
		/* 24.11: the update's job_desc carries no job id (the handler logged "job None"): the job's */
		if (call->job && call->current && (call->job->job_id == 0 || call->job->job_id == NO_VAL))
			call->job->job_id = call->current->job_id;
	}
	free_job_copy(copy);
	if (!tether_job)
		return SLURM_SUCCESS; /* not a tether job */
	if (!ready || !tether_worker_started() || !call || !call->job || !call->current) {
		if (call)
			tether_call_free(call);
		slurm_error("job_submit/tether: update of a tether job refused: tether unavailable");
		why = "tether: update refused: tether unavailable (the slurmctld log has the details)";
		rc = TETHER_REJECT;
		call = NULL;
	} else {
		call->op = TETHER_OP_MODIFY;
		call->uid = submit_uid;
		rc = tether_run(call, TETHER_CALL_SECONDS);
		if (rc == TETHER_ACCEPT)
			apply(call->job, job_desc);
		else if (rc == TETHER_REJECT)
			why = call->job->msg[0] ? call->job->msg : NULL;
		else {
			slurm_error("job_submit/tether: update of a tether job refused: the handler failed (%d)", rc);
			why = "tether: update refused: the job_submit handler failed (the slurmctld log has the details)";
		}
	}
#if TETHER_MODIFY_ERR_MSG
	if (rc != TETHER_ACCEPT && why && err_msg)
		*err_msg = slurm_xstrdup(why);
#else
	(void)why; /* logged by the handler; 22.05 cannot pass it on */
#endif
	if (call && rc != TETHER_TIMEOUT)
		tether_call_free(call); /* after why (it may point into call) was copied */
	return rc == TETHER_ACCEPT ? SLURM_SUCCESS : ESLURM_NOT_SUPPORTED;
}
