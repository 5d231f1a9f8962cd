/* tether's MPI check: every rank sends its rank and host to rank 0, which prints them in order. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	int rank, size;
	char host[256] = "", got[300];

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	gethostname(host, sizeof(host) - 1);
	if (rank == 0) {
		printf("rank 0 of %d\n", size);
		for (int r = 1; r < size; r++) {
			MPI_Recv(got, sizeof(got), MPI_CHAR, r, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			printf("%s\n", got);
		}
		fflush(stdout);
	} else {
		snprintf(got, sizeof(got), "rank %d of %d says hello", rank, size);
		MPI_Send(got, (int)strlen(got) + 1, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
	}
	MPI_Finalize();
	return 0;
}
