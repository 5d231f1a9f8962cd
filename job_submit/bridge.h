/*
 * The bridge between the job_submit plugin's C and its Python handler (tether/job_submit/handler.py):
 * the request snapshot the handler reads and answers in, the answer codes, and the calls each side
 * makes. cffi reads the declarations between the cdef markers (tether/job_submit/build.py), so the
 * C and the Python side cannot drift apart.
 */
#ifndef TETHER_BRIDGE_H
#define TETHER_BRIDGE_H

#include <stdint.h>

/* What the handler answers (0 is never success: cffi returns 0 when its init failed). */
#define TETHER_ACCEPT 1
#define TETHER_REJECT 2
/* The call ran on slurmctld's own thread (tether_job_t.direct) and its answer needs what may block
 * (an NSS lookup): ask again on the worker thread, which a time limit guards. */
#define TETHER_ON_WORKER 3

/* How a number of a shaped answer follows from the request's slot counts (handler.py: QUANTITY). */
#define TETHER_Q_SAME 0   /* as answered for the request that made the shape */
#define TETHER_Q_SLOTS 1  /* --slots */
#define TETHER_Q_SPN 2    /* --slots-per-node (1 when not given) */
#define TETHER_Q_NODES 3  /* --slots / --slots-per-node */

#define TETHER_STR 1024
#define TETHER_MSG 2048

/* cdef:begin */
typedef struct tether_job {
	/* in: copied from job_desc by the calling slurmctld thread */
	uint32_t job_id;
	uint32_t user_id;
	uint32_t min_nodes;
	uint32_t max_nodes;
	uint32_t num_tasks;
	uint16_t ntasks_per_node;
	uint16_t cpus_per_task;
	uint32_t req_node_count;    /* nodes in --nodelist (sbatch sets min_nodes from it); 0: none */
	uint32_t het_job_offset;    /* the component's index in a heterogeneous job; NO_VAL: not one */
	char *job_id_str;
	char *partition;
	char *account;
	char *tres_per_job;
	char *tres_per_node;
	char *tres_per_task;
	char *tres_per_socket;
	char *features;             /* --constraint */
	char **spank_env;
	uint32_t spank_env_size;
	int config_current;         /* the config file is still the one the handler last read (the
	                             * answers cache's check, at most 0.2 s old): no stat() needed */
	int direct;                 /* the handler runs on the calling slurmctld thread, not the worker:
	                             * it answers TETHER_ON_WORKER rather than do what may block */
	char *values;               /* the tether option values, read and checked in C (request.h):
	                             * "name\0value\0" per option; NULL: the handler reads spank_env */
	uint32_t values_size;
	int plain_mounts;           /* with values: their --container-mounts are plain bind mounts */
	/* out: applied to job_desc by the calling thread when the answer is TETHER_ACCEPT */
	int set_nodes;
	uint32_t out_min_nodes;
	uint32_t out_max_nodes;
	int set_num_tasks;
	uint32_t out_num_tasks;
	int set_ntasks_per_node;
	uint16_t out_ntasks_per_node;
	int set_cpus_per_task;
	uint16_t out_cpus_per_task;
	int set_requeue;
	uint16_t out_requeue;
	int set_tres_per_job;
	char out_tres_per_job[TETHER_STR];
	int set_tres_per_node;
	char out_tres_per_node[TETHER_STR];
	int set_tres_per_task;
	char out_tres_per_task[TETHER_STR];
	int set_partition;
	char out_partition[TETHER_STR];
	int set_wckey;
	char out_wckey[TETHER_STR];
	int set_features;
	char out_features[TETHER_STR];
	char msg[TETHER_MSG];   /* for the user: the reason of a rejection, or notes */
	int cacheable;          /* the answer depends only on the request and the config */
	/* out, for the shape cache (cache.h): the answer is every request's of its shape, its numbers
	 * following the slot counts as the q_* say (TETHER_Q_*; the tres strings end in theirs) */
	int shaped;
	uint8_t q_min_nodes;
	uint8_t q_max_nodes;
	uint8_t q_num_tasks;
	uint8_t q_ntasks_per_node;
	uint8_t q_cpus_per_task;
	uint8_t q_tres_per_job;
	uint8_t q_tres_per_task;
	uint8_t q_tres_per_node;
} tether_job_t;

/* Called by the handler: a line for slurmctld's log (0 error, 1 info, 2 verbose). */
void tether_log(int level, const char *msg);
/* Called by the handler: whether tether works now, and why not. */
void tether_set_health(int broken, int reject_all, const char *reason);
/* Called by the handler after every config (re)load check: which file its config came from. */
void tether_config_loaded(const char *path, int exists, unsigned long long ino,
			  unsigned long long size, long long mtime_ns);
/* Called by the handler when it read slurm.conf: that file, and its partitions' sizes
 * (job_submit/partitions.py partition_table: the default partition's name, then NAME COUNT lines). */
void tether_partitions_loaded(const char *path, int exists, unsigned long long ino,
			      unsigned long long size, long long mtime_ns, const char *table);
/* Called by the handler after it loaded a config: whether its answers depend on the submitting user
 * (job_project_source: user names the WCKey after them). When they do not, the answers cache keys
 * leave the user out: one user's answer, by request or by shape, is every user's. */
void tether_answers_per_user(int yes);
/* cdef:end */

/* embedding:begin -- implemented in Python (cffi's embedding API) */
int tether_py_init(void);
int tether_py_submit(tether_job_t *job, uint32_t submit_uid, int wanted);
int tether_py_modify(tether_job_t *update, tether_job_t *current, uint32_t submit_uid);
/* embedding:end */

#endif
