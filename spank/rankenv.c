/*
 * The rank environment's values (rankenv.h): the same rules as tether/hooks/rankenv.py, which the
 * PBS MoM hook, the launch scripts and the fakes use; a test holds the two equal.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <slurm/slurm.h>

#include "rankenv.h"
#include "tether_names.h"

static int set_u(tether_set_fn set, void *ctx, const char *name, unsigned long value)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%lu", value);
	return set(ctx, name, buf);
}

uint32_t tether_rank_local_tasks(const struct tether_rank_step *s)
{
	return s->step_id == SLURM_BATCH_SCRIPT ? 1 : s->nlocal;
}

/* base + (job mod jobs) * 16 + (step mod 16); 15 for the batch script and the other special steps */
static unsigned long master_port(uint32_t job, uint32_t step)
{
	return TETHER_MASTER_PORT_BASE + (unsigned long)(job % TETHER_MASTER_PORT_JOBS) * TETHER_MASTER_PORT_STEPS +
	       (step < SLURM_MAX_NORMAL_STEP_ID ? step % TETHER_MASTER_PORT_STEPS : TETHER_MASTER_PORT_STEPS - 1);
}

int tether_rank_step_env(const struct tether_rank_step *s, tether_set_fn set, void *ctx)
{
	int batch = s->step_id == SLURM_BATCH_SCRIPT; /* the batch script is one task on one node */
	uint32_t ntasks = batch ? 1 : s->ntasks, nnodes = batch ? 1 : s->nnodes;
	uint32_t port_job = s->job_id;

	if (s->het) { /* one world across the components: the job's first id's port (sizes: task_init) */
		port_job = s->het_leader;
		if (set_u(set, ctx, TETHER_ENV_HET_COMPONENT, s->het_component) ||
		    set_u(set, ctx, TETHER_ENV_HET_COMPONENTS, s->het_components) ||
		    set_u(set, ctx, TETHER_ENV_HET_SIZE, ntasks))
			return -1;
	}
	/* Every rank of a step derives the same port; concurrent steps of a job (and jobs with
	 * neighbouring ids) get different ones, below Linux's ephemeral ports, which an outgoing
	 * connection of the master node may hold at the moment the rank binds (surface.py). */
	return set(ctx, TETHER_ENV_JOB_DIR, s->job_dir) || set(ctx, TETHER_ENV_STEP_DIR, s->step_dir) ||
	       set_u(set, ctx, TETHER_ENV_WORLD_SIZE, ntasks) ||
	       set_u(set, ctx, TETHER_ENV_LOCAL_WORLD_SIZE, tether_rank_local_tasks(s)) ||
	       set_u(set, ctx, TETHER_ENV_NNODES, nnodes) ||
	       set_u(set, ctx, TETHER_ENV_MASTER_PORT, master_port(port_job, s->step_id)) ? -1 : 0;
}

int tether_rank_task_env(const struct tether_rank_step *s, const struct tether_rank_task *t, tether_set_fn set,
			 void *ctx)
{
	int batch = s->step_id == SLURM_BATCH_SCRIPT;
	uint32_t global = batch ? 0 : t->global_id, node = batch ? 0 : t->node_id;
	char rank_dir[PATH_MAX + 32], path[PATH_MAX + 40];

	/* named by Slurm's id of the task in its component (a heterogeneous step's ranks: below) */
	snprintf(rank_dir, sizeof(rank_dir), "%s/" TETHER_RANK_PREFIX "%u", s->step_dir, global);
	if (s->het && t->procid >= (long)global && t->ntasks > t->procid && t->node_index >= 0 &&
	    t->nnodes > t->node_index) { /* the whole step's numbers, as Slurm gives them to each task */
		if (set_u(set, ctx, TETHER_ENV_HET_OFFSET, (unsigned long)t->procid - global) ||
		    set_u(set, ctx, TETHER_ENV_WORLD_SIZE, (unsigned long)t->ntasks) ||
		    set_u(set, ctx, TETHER_ENV_NNODES, (unsigned long)t->nnodes))
			return -1;
		global = (uint32_t)t->procid;
		node = (uint32_t)t->node_index;
	}
	if (set_u(set, ctx, TETHER_ENV_RANK, global) || set_u(set, ctx, TETHER_ENV_LOCAL_RANK, (unsigned long)t->local_id) ||
	    set_u(set, ctx, TETHER_ENV_NODE_RANK, node) || set(ctx, TETHER_ENV_RANK_DIR, rank_dir))
		return -1;
	snprintf(path, sizeof(path), "%s/" TETHER_RANK_TMP, rank_dir);
	if (set(ctx, TETHER_ENV_TMPDIR, path))
		return -1;
	snprintf(path, sizeof(path), "%s/" TETHER_RANK_WORK, rank_dir);
	if (set(ctx, TETHER_ENV_WORK_DIR, path))
		return -1;
	/* the slots this rank got: its GPUs as Slurm bound them (--slot-type=cpu: none) */
	if (t->gpus == NULL || (t->slot_type && strcmp(t->slot_type, "cpu") == 0))
		return 0;
	if (set(ctx, TETHER_ENV_SLOT_IDS, t->gpus))
		return -1;
	if (t->slot_type && strcmp(t->slot_type, "rocm") == 0 && set(ctx, TETHER_ENV_ROCR_VISIBLE_DEVICES, t->gpus))
		return -1;
	return 0;
}
