/*
 * tether-jobdirs: tether's per-job and per-rank directories for the PBS MoM hooks, with the same
 * code the SPANK plugin runs inside slurmstepd (native/jobdirs.c, linked in).
 * The hooks run as root in pbs_python; they call this helper so that no Python path ever creates
 * or removes a directory as root (no symlink followed, ownership handed over atomically).
 *
 *   tether-jobdirs begin ROOT JOB HOST UID GID              <ROOT>/<JOB>/<HOST>/
 *   tether-jobdirs task  ROOT JOB HOST TASK RANK UID GID    .../task-<TASK>/rank-<RANK>/{tmp,work};
 *                                                            prints the rank directory
 *   tether-jobdirs end   ROOT JOB HOST UID GID LAUNCHER|- [HOST…]
 *                       containers' leftover cleanup (as the user, LAUNCHER in cleanup mode; "-":
 *                       none), then removes <HOST>/ and <JOB>/ when empty. With the job's hosts
 *                       listed (the job's first host does that), whatever else the job left in
 *                       <JOB>/ goes too -- the other hosts' directories stay for their own end.
 *
 * Root only (it refuses otherwise). Exit 0: done; 1: refused, the reason on stderr's first line;
 * 2: bad usage. Directories are mode 0700 and owned by UID:GID.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#include "jobdirs.h"
#include "tether_names.h"

/* Every message to stderr (the hook relays its first line) and to syslog. */
void tether_report(enum tether_level level, const char *msg)
{
	fprintf(stderr, "%s\n", msg);
	syslog(level == TETHER_INFO ? LOG_INFO : LOG_ERR, "%s", msg);
}

static int parse_id(const char *text, unsigned long max, unsigned long *out)
{
	char *end;

	if (!isdigit((unsigned char)text[0]))
		return -1;
	errno = 0;
	*out = strtoul(text, &end, 10);
	return (errno || *end || *out > max) ? -1 : 0;
}

/* <ROOT>/<JOB>/<HOST>: open (creating what is missing, as UID's) and return the host dir's fd. */
static int open_host_dir(int root_fd, const char *root, const char *job, const char *host, uid_t uid,
			 gid_t gid, int fresh, char *shown, size_t len)
{
	char job_shown[PATH_MAX];
	int job_fd, host_fd;

	if (tether_path_join(job_shown, sizeof(job_shown), root, job) < 0)
		return -1;
	job_fd = fresh ? tether_claim_job_dir(root_fd, job, uid, gid, job_shown)
		       : tether_ensure_dir_at(root_fd, job, 0700, uid, gid, job_shown);
	if (job_fd < 0)
		return -1;
	host_fd = tether_ensure_child(job_fd, job_shown, host, uid, gid, shown, len);
	close(job_fd);
	return host_fd < 0 ? -1 : host_fd;
}

/* Do host names ``a`` and ``b`` name the same host: equal, or equal up to the first '.' (PBS may
 * spell a host short in exec_host and fully qualified as the MoM's node name, or the reverse)? */
static int same_host(const char *a, const char *b)
{
	size_t la = strcspn(a, "."), lb = strcspn(b, ".");

	return strcmp(a, b) == 0 || (la == lb && la > 0 && strncmp(a, b, la) == 0);
}

struct hosts {
	char **names;
	int count;
};

/* tether_remove_entries()'s filter at a job's end: another host's directory stays for its own end. */
static int is_job_host(const char *name, void *arg)
{
	const struct hosts *hosts = arg;

	for (int i = 0; i < hosts->count; i++)
		if (same_host(name, hosts->names[i]))
			return 1;
	return 0;
}

/* ``task``: <host>/task-<TASK>/rank-<RANK>/{tmp,work}; prints the rank directory. 0 or -1. */
static int make_task_dirs(int host_fd, const char *host_shown, unsigned long task, unsigned long rank,
			  uid_t uid, gid_t gid)
{
	char name[32], shown[PATH_MAX];
	int task_fd, rc;

	snprintf(name, sizeof(name), TETHER_TASK_PREFIX "%lu", task);
	task_fd = tether_ensure_child(host_fd, host_shown, name, uid, gid, shown, sizeof(shown));
	if (task_fd < 0)
		return -1;
	rc = tether_make_rank_dirs(task_fd, shown, (unsigned)rank, uid, gid);
	close(task_fd);
	if (rc == 0)
		printf("%s/" TETHER_RANK_PREFIX "%lu\n", shown, rank);
	return rc;
}

/* ``end``: the containers' leftover cleanup (as the user), this host's directory, with the job's
 * hosts listed whatever else the job left in its directory, and the job's directory when empty. */
static void end_on_host(int root_fd, const char *root, const char *job, const char *host, uid_t uid,
			gid_t gid, const char *launcher, struct hosts *hosts)
{
	char job_shown[PATH_MAX], host_shown[PATH_MAX], what[300];
	int job_fd = openat(root_fd, job, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (job_fd >= 0) {
		if (launcher && tether_has_leftovers(job_fd, host, 1) && tether_path_join(job_shown, sizeof(job_shown), root, job) == 0 &&
		    tether_path_join(host_shown, sizeof(host_shown), job_shown, host) == 0) {
			snprintf(what, sizeof(what), "job %s on %s", job, host);
			tether_run_leftover_cleanup(launcher, host_shown, uid, gid, what);
		}
		tether_remove_tree_at(job_fd, host);
		if (hosts->count > 0) {
			int fd = dup(job_fd);

			if (fd >= 0)
				tether_remove_entries(fd, is_job_host, hosts);
		}
		close(job_fd);
	}
	unlinkat(root_fd, job, AT_REMOVEDIR); /* only when no other host uses it any more */
}

static int usage(void)
{
	fprintf(stderr, "usage: tether-jobdirs begin ROOT JOB HOST UID GID\n"
			"       tether-jobdirs task ROOT JOB HOST TASK RANK UID GID\n"
			"       tether-jobdirs end ROOT JOB HOST UID GID LAUNCHER|- [HOST...]\n"
			"       tether-jobdirs user BASE[:BASE...] UID GID\n");
	return 2;
}

/* A command line, parsed. */
struct command {
	const char *cmd, *root, *job, *host, *launcher;
	unsigned long uid, gid, task, rank;
	struct hosts hosts; /* end: the job's hosts (given on its first host) */
};

/* Parse and check the command line: 0, 2 (usage; printed) or 1 (refused; reported). */
static int parse_command(int argc, char **argv, struct command *c)
{
	int ids;

	if (argc < 2)
		return usage();
	c->cmd = argv[1];
	if (strcmp(c->cmd, "user") == 0) {   /* the user's own directories on this host (user_dirs) */
		if (argc != 5 || parse_id(argv[3], (uid_t)-2, &c->uid) < 0 || parse_id(argv[4], (gid_t)-2, &c->gid) < 0)
			return usage();
		c->root = argv[2];
		return 0;
	}
	if (strcmp(c->cmd, "begin") == 0 && argc == 7)
		ids = 5;
	else if (strcmp(c->cmd, "task") == 0 && argc == 9)
		ids = 7;
	else if (strcmp(c->cmd, "end") == 0 && argc >= 8)
		ids = 5;
	else
		return usage();
	c->root = argv[2];
	c->job = argv[3];
	c->host = argv[4];
	if (parse_id(argv[ids], (uid_t)-2, &c->uid) < 0 || parse_id(argv[ids + 1], (gid_t)-2, &c->gid) < 0 ||
	    (ids == 7 && (parse_id(argv[5], 0xffffffffUL, &c->task) < 0 ||
			  parse_id(argv[6], 0xffffffffUL, &c->rank) < 0)))
		return usage();
	if (!tether_name_ok(c->job, 200) || !tether_name_ok(c->host, 200)) {
		tether_fail("tether: %s / %s cannot be a job or host directory name", c->job, c->host);
		return 1;
	}
	if (c->root[0] != '/') {
		tether_fail("tether: job_storage_root %s must be an absolute path", c->root);
		return 1;
	}
	if (strcmp(c->cmd, "end") == 0) {
		c->launcher = strcmp(argv[7], "-") != 0 ? argv[7] : NULL;
		c->hosts.names = argv + 8;
		c->hosts.count = argc - 8;
		if (c->launcher && c->launcher[0] != '/') {
			tether_fail("tether: the launcher %s must be an absolute path", c->launcher);
			return 1;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct command c = { 0 };
	char shown[PATH_MAX];
	int root_fd, host_fd, rc;

	openlog("tether-jobdirs", LOG_PID, LOG_DAEMON);
	rc = parse_command(argc, argv, &c);
	if (rc != 0)
		return rc;
	if (geteuid() != 0) {
		tether_fail("tether-jobdirs runs as root (from the PBS MoM hooks)");
		return 1;
	}
	if (strcmp(c.cmd, "user") == 0)
		return tether_ensure_user_dirs(c.root, (uid_t)c.uid, (gid_t)c.gid) < 0 ? 1 : 0;
	root_fd = tether_open_storage_root(c.root);
	if (root_fd < 0)
		return 1;
	if (strcmp(c.cmd, "end") == 0) {
		end_on_host(root_fd, c.root, c.job, c.host, (uid_t)c.uid, (gid_t)c.gid, c.launcher, &c.hosts);
		close(root_fd);
		return 0;
	}
	host_fd = open_host_dir(root_fd, c.root, c.job, c.host, (uid_t)c.uid, (gid_t)c.gid,
				strcmp(c.cmd, "begin") == 0, shown, sizeof(shown));
	close(root_fd);
	if (host_fd < 0)
		return 1;
	rc = strcmp(c.cmd, "task") == 0 ? make_task_dirs(host_fd, shown, c.task, c.rank, (uid_t)c.uid, (gid_t)c.gid)
				      : 0;
	close(host_fd);
	return rc < 0 ? 1 : 0;
}
