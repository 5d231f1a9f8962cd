/*
 * Preloaded (the node's /etc/ld.so.preload) into every program on a sandbox node: a TCP connect()
 * to a loopback address from a socket not yet bound leaves from the node's own address, as a
 * connection from a real host leaves from that host's. On one machine every loopback connection
 * would leave from 127.0.0.1, and Slurm answers a request at the address it came from (slurmstepd
 * connects back to srun there) -- while srun, with NoInAddrAny, listens at its own node's address
 * only. The node's address is in /run/tether-sandbox-node-address (each node has its own /run).
 * Test infrastructure; never installed on a site.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ADDRESS_FILE "/run/tether-sandbox-node-address"

static in_addr_t node_address(void)
{
	static int read_once;
	static in_addr_t address;	/* network order; 0: none */
	char text[32] = "";
	struct in_addr parsed;
	ssize_t n;
	int fd;

	if (read_once)
		return address;
	fd = open(ADDRESS_FILE, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd >= 0) {
		n = read(fd, text, sizeof text - 1);
		close(fd);
		if (n > 0) {
			text[n] = '\0';
			text[strcspn(text, "\n")] = '\0';
			if (inet_pton(AF_INET, text, &parsed) == 1 && (ntohl(parsed.s_addr) >> 24) == 127)
				address = parsed.s_addr;
		}
	}
	read_once = 1;
	return address;
}

int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	static int (*real_connect)(int, const struct sockaddr *, socklen_t);
	struct sockaddr_in to, self;
	socklen_t self_len = sizeof self;
	int type;
	socklen_t type_len = sizeof type;
	in_addr_t mine;

	if (!real_connect)
		real_connect = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
	if (addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		memcpy(&to, addr, sizeof to);
		if ((ntohl(to.sin_addr.s_addr) >> 24) == 127 && (mine = node_address()) != 0
		    && getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) == 0 && type == SOCK_STREAM
		    && getsockname(fd, (struct sockaddr *)&self, &self_len) == 0 && self.sin_family == AF_INET
		    && self.sin_addr.s_addr == htonl(INADDR_ANY) && self.sin_port == 0) {
			memset(&self, 0, sizeof self);
			self.sin_family = AF_INET;
			self.sin_addr.s_addr = mine;
			(void)bind(fd, (struct sockaddr *)&self, sizeof self);	/* else: as before */
		}
	}
	return real_connect(fd, addr, len);
}
