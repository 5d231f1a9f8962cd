/*
 * tether's PMI-2 check (srun --mpi=pmi2): every rank puts a greeting into the job's PMI-2 key-value
 * space through the PMI_FD socket slurmstepd gave it, all fence, rank 0 reads and prints them in
 * order. Built by the sandbox into its MPI image (Slurm's libpmi2).
 */
#include <stdio.h>
#include <slurm/pmi2.h>

int main(void)
{
	int spawned = 0, size = 0, rank = 0, appnum = 0, len = 0;
	char jobid[256] = "", key[64], value[256];

	if (PMI2_Init(&spawned, &size, &rank, &appnum) != PMI2_SUCCESS) {
		fprintf(stderr, "PMI2_Init failed\n");
		return 1;
	}
	if (PMI2_Job_GetId(jobid, sizeof(jobid)) != PMI2_SUCCESS)
		return 2;
	snprintf(key, sizeof(key), "tether-%d", rank);
	snprintf(value, sizeof(value), "rank %d of %d says hello", rank, size);
	if (PMI2_KVS_Put(key, value) != PMI2_SUCCESS || PMI2_KVS_Fence() != PMI2_SUCCESS)
		return 3;
	if (rank == 0) {
		for (int r = 0; r < size; r++) {
			snprintf(key, sizeof(key), "tether-%d", r);
			if (PMI2_KVS_Get(jobid, PMI2_ID_NULL, key, value, sizeof(value), &len) != PMI2_SUCCESS)
				return 4;
			printf("%s\n", value);
		}
		fflush(stdout);
	}
	PMI2_Finalize();
	return 0;
}
