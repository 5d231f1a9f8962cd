#ifndef TETHER_CGKEEPER_H
#define TETHER_CGKEEPER_H

#include <stdint.h>

/* Keep a container step's processes in Slurm's own cgroups (cgroup v1): see cgkeeper.c.
 * start: once per slurmstepd, as root, after the step's cgroups exist (task_post_fork); 0 or -1
 * (nothing to keep: not cgroup v1, no step cgroups found, or no thread could start).
 * stop: once this node's last task has exited (and again, harmlessly, from slurm_spank_exit); removes
 * the child cgroups left empty below the step, before Slurm removes the step's own. */
int tether_cgkeeper_start(uint32_t job_id, const char *slurm_step);
void tether_cgkeeper_stop(void);

#endif
