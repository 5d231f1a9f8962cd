/*
 * The rank environment slurmstepd gives a tether step's tasks, computed without Slurm: pure C
 * over the numbers stepd.c reads (no SPANK call), so tests/unit/test_rankenv.py compiles it into a
 * harness and holds it equal to tether/hooks/rankenv.py's slurm_rank_env over many steps and tasks.
 * The names are TETHER_ENV_<key> of the generated tether_names.h.
 */
#ifndef TETHER_RANKENV_H
#define TETHER_RANKENV_H

#include <stdint.h>

/* What slurmstepd knows of the step on its node. */
struct tether_rank_step {
	uint32_t job_id, step_id;
	uint32_t ntasks, nlocal, nnodes; /* Slurm's counts (for the batch script: whatever Slurm says) */
	const char *job_dir, *step_dir;
	int het;                         /* a component of a heterogeneous step (srun --het-group=0,1) */
	uint32_t het_component, het_components, het_leader;
};

/* One task: Slurm's ids of it; in a heterogeneous step the whole step's numbers from its
 * environment (SLURM_PROCID, SLURM_NTASKS, SLURM_NODEID, SLURM_STEP_NUM_NODES; -1 when missing). */
struct tether_rank_task {
	uint32_t global_id, node_id; /* S_TASK_GLOBAL_ID, S_JOB_NODEID */
	int local_id;                /* S_TASK_ID */
	long procid, ntasks, node_index, nnodes;
	const char *slot_type;       /* --slot-type, or NULL */
	const char *gpus;            /* CUDA_VISIBLE_DEVICES, or NULL when unset */
};

/* Sets one variable; 0, or -1 to stop (the caller said why). */
typedef int (*tether_set_fn)(void *ctx, const char *name, const char *value);

/* The step's local task count as tether counts it: the batch script is one task. */
uint32_t tether_rank_local_tasks(const struct tether_rank_step *s);

/* The step-wide part (user_init): sizes, directories, MASTER_PORT, the heterogeneous step's. */
int tether_rank_step_env(const struct tether_rank_step *s, tether_set_fn set, void *ctx);

/* One task's part (task_init), over the step's: its ranks, directories and slots. */
int tether_rank_task_env(const struct tether_rank_step *s, const struct tether_rank_task *t, tether_set_fn set,
			 void *ctx);

#endif
