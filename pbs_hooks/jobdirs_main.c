/*
 * tether-jobdirs: tether's per-job and per-rank directories for the PBS MoM hooks, with the same
 * code the SPANK plugin runs inside slurmstepd (spank/jobdirs.c, compiled in before this file).
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
#include <syslog.h>

static void vreport(int priority, const char *fmt, va_list ap)
{
	char msg[1024];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	fprintf(stderr, "%s\n", msg);
	syslog(priority, "%s", msg);
}

static void tether_fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vreport(LOG_ERR, fmt, ap);
	va_end(ap);
}

static void tether_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vreport(LOG_ERR, fmt, ap);
	va_end(ap);
}

static void tether_info(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vreport(LOG_INFO, fmt, ap);
	va_end(ap);
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
	char host_shown[PATH_MAX];
	struct stat st;
	int job_fd, host_fd;

	if (path_join(shown, len, root, job) < 0 || path_join(host_shown, sizeof(host_shown), shown, host) < 0)
		return -1;
	if (fresh && fstatat(root_fd, job, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode) &&
	    st.st_uid != uid) {
		/* only root creates entries in ROOT: a leftover of an earlier job with this id */
		tether_info("tether: removing %s left by an earlier job of uid %u", shown, (unsigned)st.st_uid);
		remove_tree_at(root_fd, job, 0);
	}
	job_fd = ensure_dir_at(root_fd, job, 0700, uid, gid, shown);
	if (job_fd < 0)
		return -1;
	host_fd = ensure_dir_at(job_fd, host, 0700, uid, gid, host_shown);
	close(job_fd);
	snprintf(shown, len, "%s", host_shown);
	return host_fd < 0 ? -1 : host_fd;
}

/* Do host names ``a`` and ``b`` name the same host: equal, or equal up to the first '.' (PBS may
 * spell a host short in exec_host and fully qualified as the MoM's node name, or the reverse)? */
static int same_host(const char *a, const char *b)
{
	size_t la = strcspn(a, "."), lb = strcspn(b, ".");

	return strcmp(a, b) == 0 || (la == lb && la > 0 && strncmp(a, b, la) == 0);
}

/* Remove every entry of ``dir_fd`` that is not one of the hosts in ``keep`` (never following a
 * symlink). */
static void remove_all_but(int dir_fd, char **keep, int nkeep)
{
	int fd = dup(dir_fd);
	struct dirent *e;
	DIR *dir;

	if (fd < 0 || (dir = fdopendir(fd)) == NULL) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((e = readdir(dir)) != NULL) {
		int kept = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;

		for (int i = 0; i < nkeep && !kept; i++)
			kept = same_host(e->d_name, keep[i]);
		if (!kept)
			remove_tree_at(dir_fd, e->d_name, 0);
	}
	closedir(dir);
}

static int usage(void)
{
	fprintf(stderr, "usage: tether-jobdirs begin ROOT JOB HOST UID GID\n"
			"       tether-jobdirs task ROOT JOB HOST TASK RANK UID GID\n"
			"       tether-jobdirs end ROOT JOB HOST UID GID LAUNCHER|- [HOST...]\n");
	return 2;
}

int main(int argc, char **argv)
{
	unsigned long uid, gid, task = 0, rank = 0;
	char shown[PATH_MAX], task_shown[PATH_MAX], name[32];
	const char *cmd, *root, *job, *host, *launcher = NULL;
	int ids, root_fd, host_fd, task_fd, rc;

	openlog("tether-jobdirs", LOG_PID, LOG_DAEMON);
	if (argc < 2)
		return usage();
	cmd = argv[1];
	if (strcmp(cmd, "begin") == 0 && argc == 7)
		ids = 5;
	else if (strcmp(cmd, "task") == 0 && argc == 9)
		ids = 7;
	else if (strcmp(cmd, "end") == 0 && argc >= 8)
		ids = 5;
	else
		return usage();
	root = argv[2];
	job = argv[3];
	host = argv[4];
	if (parse_id(argv[ids], (uid_t)-2, &uid) < 0 || parse_id(argv[ids + 1], (gid_t)-2, &gid) < 0 ||
	    (ids == 7 && (parse_id(argv[5], 0xffffffffUL, &task) < 0 || parse_id(argv[6], 0xffffffffUL, &rank) < 0)))
		return usage();
	if (!name_ok(job, 200) || !name_ok(host, 200)) {
		tether_fail("tether: %s / %s cannot be a job or host directory name", job, host);
		return 1;
	}
	if (root[0] != '/') {
		tether_fail("tether: job_storage_root %s must be an absolute path", root);
		return 1;
	}
	if (geteuid() != 0) {
		tether_fail("tether-jobdirs runs as root (from the PBS MoM hooks)");
		return 1;
	}
	if (strcmp(cmd, "end") == 0 && strcmp(argv[7], "-") != 0) {
		launcher = argv[7];
		if (launcher[0] != '/') {
			tether_fail("tether: the launcher %s must be an absolute path", launcher);
			return 1;
		}
	}
	root_fd = open_storage_root(root);
	if (root_fd < 0)
		return 1;

	if (strcmp(cmd, "end") == 0) {
		int job_fd = openat(root_fd, job, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

		if (job_fd >= 0) {
			char job_shown[PATH_MAX];

			if (launcher && has_leftovers(job_fd, host, 1) &&
			    path_join(job_shown, sizeof(job_shown), root, job) == 0 &&
			    path_join(shown, sizeof(shown), job_shown, host) == 0) {
				char what[300];

				snprintf(what, sizeof(what), "job %s on %s", job, host);
				run_leftover_cleanup(launcher, shown, (uid_t)uid, (gid_t)gid, what);
			}
			remove_tree_at(job_fd, host, 0);
			if (argc > 8)
				remove_all_but(job_fd, argv + 8, argc - 8);
			close(job_fd);
		}
		unlinkat(root_fd, job, AT_REMOVEDIR); /* only when no other host uses it any more */
		close(root_fd);
		return 0;
	}

	host_fd = open_host_dir(root_fd, root, job, host, (uid_t)uid, (gid_t)gid, strcmp(cmd, "begin") == 0,
				shown, sizeof(shown));
	close(root_fd);
	if (host_fd < 0)
		return 1;
	if (strcmp(cmd, "begin") == 0) {
		close(host_fd);
		return 0;
	}
	snprintf(name, sizeof(name), "task-%lu", task);
	if (path_join(task_shown, sizeof(task_shown), shown, name) < 0) {
		close(host_fd);
		return 1;
	}
	task_fd = ensure_dir_at(host_fd, name, 0700, (uid_t)uid, (gid_t)gid, task_shown);
	close(host_fd);
	if (task_fd < 0)
		return 1;
	rc = make_rank_dirs(task_fd, task_shown, (unsigned)rank, (uid_t)uid, (gid_t)gid);
	close(task_fd);
	if (rc < 0)
		return 1;
	printf("%s/rank-%lu\n", task_shown, rank);
	return 0;
}
