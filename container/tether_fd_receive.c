/*
 * tether-fd-receive SOCKET FD PROGRAM [ARG...]
 *
 * Inside an enroot container: take one file descriptor from the rank's launcher over the Unix
 * socket SOCKET (SCM_RIGHTS), put it at number FD, then exec PROGRAM. Why: `enroot start`
 * closes every descriptor above 2 before the command runs (enroot-switchroot's closefrom), and
 * Slurm's mpi/pmi2 hands each task its PMI2 connection as a descriptor (PMI_FD); pyxis keeps it
 * because its tasks join the container's namespaces instead of starting through enroot. The
 * launcher (tether.container.runtimes.enroot) holds the descriptor and serves it once.
 *
 * Built static at install (`tether slurm install`, next to tether-run): it runs in any image,
 * whatever C library the image has. Exit 125 when the descriptor cannot be had, with a line that
 * says so: an MPI rank without its PMI2 connection would otherwise fail later, in other words.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define EXIT_NOT_STARTED 125

static int fail(const char *what, const char *detail)
{
	fprintf(stderr, "tether: PMI_FD (srun --mpi=pmi2) could not be handed into the container: %s%s%s\n",
		what, detail ? ": " : "", detail ? detail : "");
	return EXIT_NOT_STARTED;
}

int main(int argc, char **argv)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	char *end = NULL;
	long want;
	int sock, got = -1;

	if (argc < 4)
		return fail("usage: tether-fd-receive SOCKET FD PROGRAM [ARG...]", NULL);
	errno = 0;
	want = strtol(argv[2], &end, 10);
	if (errno || end == argv[2] || *end || want < 3 || want > 65535)
		return fail("not a descriptor number above 2", argv[2]);
	if (strlen(argv[1]) >= sizeof(addr.sun_path))
		return fail("socket path too long", argv[1]);
	strcpy(addr.sun_path, argv[1]);

	sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (sock < 0 || connect(sock, (struct sockaddr *)&addr, sizeof(addr)) < 0)
		return fail(argv[1], strerror(errno));

	char byte;
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} control;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
			      .msg_controllen = sizeof(control.buf) };
	ssize_t n;
	do
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return fail("receiving it", strerror(errno));
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
			memcpy(&got, CMSG_DATA(c), sizeof(int));
	close(sock);
	if (got < 0)
		return fail("the launcher sent none", NULL);
	/* dup2 leaves the new descriptor without close-on-exec: the program keeps it */
	if (got != want) {
		if (dup2(got, (int)want) < 0)
			return fail("dup2", strerror(errno));
		close(got);
	} else if (fcntl(got, F_SETFD, 0) < 0) {      /* received with close-on-exec: cleared */
		return fail("fcntl", strerror(errno));
	}
	execvp(argv[3], argv + 3);
	int saved = errno;      /* before fprintf, which may change it */
	fprintf(stderr, "tether: %s: %s\n", argv[3], strerror(saved));
	return saved == ENOENT ? 127 : 126;
}
