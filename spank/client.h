/*
 * The SPANK plugin in srun, sbatch and salloc (local and allocator contexts): environment
 * fallbacks and forwarding the effective values to slurmctld. Never starts Python.
 */
#ifndef TETHER_CLIENT_H
#define TETHER_CLIENT_H

#include <slurm/spank.h>

int tether_client_post_opt(spank_t sp);

#endif
