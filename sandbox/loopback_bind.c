/*
 * LD_PRELOAD for a sandbox daemon that listens on every address and has no setting against it
 * (Slurm 24.11's slurmdbd: slurmdbd.conf has no NoInAddrAny, and it no longer takes slurm.conf's):
 * a bind() to the wildcard address binds to loopback instead. The sandbox's daemons listen on
 * loopback only. Test infrastructure; never installed on a site.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
	static int (*real_bind)(int, const struct sockaddr *, socklen_t);

	if (!real_bind)
		real_bind = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
	if (addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		struct sockaddr_in in;

		memcpy(&in, addr, sizeof in);
		if (in.sin_addr.s_addr == htonl(INADDR_ANY)) {
			in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
			return real_bind(fd, (const struct sockaddr *)&in, sizeof in);
		}
	} else if (addr && addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
		struct sockaddr_in6 in6;

		memcpy(&in6, addr, sizeof in6);
		if (memcmp(&in6.sin6_addr, &in6addr_any, sizeof in6addr_any) == 0) {
			in6.sin6_addr = in6addr_loopback;
			return real_bind(fd, (const struct sockaddr *)&in6, sizeof in6);
		}
	}
	return real_bind(fd, addr, len);
}
