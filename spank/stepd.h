/*
 * The SPANK plugin in slurmstepd (remote context): a tether step's directories, rank environment,
 * container hand-off and cleanup. C only, so a step costs no Python.
 */
#ifndef TETHER_STEPD_H
#define TETHER_STEPD_H

#include <slurm/spank.h>

int tether_stepd_post_opt(spank_t sp);  /* root, before the user's part; never fails */
int tether_stepd_user_init(spank_t sp); /* as the user, before the tasks fork; never fails */
int tether_stepd_task_init(spank_t sp); /* in each task, as the user, just before exec */
int tether_stepd_task_post_fork(spank_t sp); /* root, in slurmstepd, once each task is forked */
int tether_stepd_task_exit(spank_t sp);      /* root, in slurmstepd, as each task exits */
void tether_stepd_exit(void);           /* root, when the step has ended */
void tether_job_epilog(spank_t sp);     /* root, slurmd's job epilog on each node; never fails */

#endif
