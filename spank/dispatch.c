/*
 * tether SPANK plugin (spank_tether.so): the Slurm-facing entry points, routed by context.
 *
 *   srun (local), sbatch/salloc (allocator)  options, environment fallbacks, forwarding: client.c
 *   slurmstepd (remote)                       directories, rank environment, containers: stepd.c
 *   slurmd's job epilog (job script)          this node's part of the job's directory: stepd.c
 *
 * The options (options.c) are registered in every context that uses them, inside
 * slurm_spank_init. Nothing here starts Python: a job that asks for nothing from tether costs
 * srun, sbatch and slurmstepd only this plugin's load.
 */
#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "client.h"
#include "options.h"
#include "stepd.h"

SPANK_PLUGIN(tether, 1);

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	if (tether_parse_args(ac, av) < 0)
		return -1;
	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
	case S_CTX_REMOTE:
		return tether_register_options(sp);
	default:
		return 0;
	}
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
		return tether_client_post_opt(sp);
	case S_CTX_REMOTE:
		return tether_stepd_post_opt(sp);
	default:
		return 0;
	}
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	return spank_context() == S_CTX_REMOTE ? tether_stepd_user_init(sp) : 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	return spank_context() == S_CTX_REMOTE ? tether_stepd_task_init(sp) : 0;
}

int slurm_spank_task_post_fork(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	return spank_context() == S_CTX_REMOTE ? tether_stepd_task_post_fork(sp) : 0;
}

int slurm_spank_task_exit(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	return spank_context() == S_CTX_REMOTE ? tether_stepd_task_exit(sp) : 0;
}

/* slurmd's job epilog on each node of an ended job (S_CTX_JOB_SCRIPT; slurm_spank_init is not
 * called there). Always 0: a failing epilog drains the node, and nothing here is worth that. */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	if (tether_parse_args(ac, av) == 0)
		tether_job_epilog(sp);
	return 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void)sp;
	(void)ac;
	(void)av;
	if (spank_context() == S_CTX_REMOTE)
		tether_stepd_exit();
	tether_opts_clear();
	return 0;
}
