/*
 * tether's per-job and per-rank directories under job_storage_root: one implementation for the
 * SPANK plugin (inside slurmstepd) and for the tether-jobdirs helper the PBS MoM hooks run.
 *
 * Every path is created and opened relative to a directory fd with O_NOFOLLOW: no symlink is ever
 * followed, by root or by the user; a symlink (or a foreign or non-directory entry) where tether
 * expects its own directory is refused with a message naming the path. Several daemons share one
 * filesystem (and real clusters share job_storage_root): an entry another node or step created
 * first is used (after the same checks). Removal is fd-relative and never enters a symlink.
 *
 * The file these functions are compiled with defines tether_report(), where their messages go:
 * TETHER_FAIL (a reason the job cannot run, shown to the user), TETHER_ERROR and TETHER_INFO (the
 * daemon's log).
 */
#define _GNU_SOURCE /* renameat2, closefrom */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define TETHER_REMOVE_DEPTH 256

enum tether_level { TETHER_FAIL, TETHER_ERROR, TETHER_INFO };

static void tether_report(enum tether_level level, const char *msg);

__attribute__((format(printf, 2, 0)))
static void tether_vreport(enum tether_level level, const char *fmt, va_list ap)
{
	char msg[1024];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	tether_report(level, msg);
}

#define TETHER_REPORTER(fn, level)                                                  \
	__attribute__((format(printf, 1, 2))) static void fn(const char *fmt, ...) \
	{                                                                           \
		va_list ap;                                                         \
		va_start(ap, fmt);                                                  \
		tether_vreport(level, fmt, ap);                                     \
		va_end(ap);                                                         \
	}
TETHER_REPORTER(tether_fail, TETHER_FAIL)
TETHER_REPORTER(tether_error, TETHER_ERROR)
TETHER_REPORTER(tether_info, TETHER_INFO)

/* A name tether may use as one path component: [A-Za-z0-9][A-Za-z0-9._-]*, at most ``max``. */
static int name_ok(const char *value, size_t max)
{
	size_t n = strlen(value);

	if (n == 0 || n > max || !isalnum((unsigned char)value[0]))
		return 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = value[i];
		if (!isalnum(c) && c != '.' && c != '_' && c != '-')
			return 0;
	}
	return 1;
}

/* ``a``/``b`` into ``out``; -1 (and a message) when it does not fit. */
static int path_join(char *out, size_t len, const char *a, const char *b)
{
	int n = snprintf(out, len, "%s/%s", a, b);

	if (n < 0 || (size_t)n >= len) {
		tether_fail("tether: the path %s/%s is too long", a, b);
		return -1;
	}
	return 0;
}

/* Open the job storage root; it must be a root-owned directory others cannot write to. */
static int open_storage_root(const char *root)
{
	struct stat st;
	int fd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0) {
		tether_fail("tether: job_storage_root %s: %m (it must exist on every node: a root-owned "
			    "directory, mode 0755)", root);
		return -1;
	}
	if (fstat(fd, &st) < 0 || st.st_uid != 0 || (st.st_mode & (S_IWGRP | S_IWOTH))) {
		tether_fail("tether: job_storage_root %s must be owned by root and not writable by group or "
			    "others (mode 0755): per-job directories are created there as root",
			    root);
		close(fd);
		return -1;
	}
	return fd;
}

/*
 * As root, create ``name`` under ``dirfd`` already owned by uid:gid, atomically: a directory made
 * under a temporary name, handed over, then renamed into place without replacing anything. Other
 * nodes starting the same job at the same moment never see it root-owned; if one of them won, its
 * directory is kept and ours dropped. 0 when ``name`` exists now (ours or theirs), -1 on error.
 */
static int create_owned_dir_at(int dirfd, const char *name, mode_t mode, uid_t uid, gid_t gid,
			       const char *shown)
{
	char tmp[NAME_MAX + 1], host[64] = "";

	gethostname(host, sizeof(host) - 1);
	for (char *c = host; *c; c++)
		if (*c == '/')
			*c = '_';
	snprintf(tmp, sizeof(tmp), ".%.32s.%.40s.%d", name, host, (int)getpid());
	if (mkdirat(dirfd, tmp, mode) < 0) {
		tether_fail("tether: cannot create a directory next to %s: %m", shown);
		return -1;
	}
	if (fchownat(dirfd, tmp, uid, gid, AT_SYMLINK_NOFOLLOW) < 0) {
		tether_fail("tether: cannot hand %s to uid %u: %m", shown, (unsigned)uid);
		unlinkat(dirfd, tmp, AT_REMOVEDIR);
		return -1;
	}
	if (renameat2(dirfd, tmp, dirfd, name, RENAME_NOREPLACE) < 0) {
		int err = errno;

		unlinkat(dirfd, tmp, AT_REMOVEDIR);
		if (err != EEXIST) {
			errno = err;
			tether_fail("tether: cannot create %s: %m", shown);
			return -1;
		}
	}
	return 0;
}

/*
 * Make sure ``name`` under ``dirfd`` is a directory owned by ``uid`` (creating it with ``mode``
 * when missing; as root, also handing it to uid:gid) and return an fd on it (O_NOFOLLOW: a symlink
 * there is refused, never followed). ``shown`` is the full path, for messages.
 */
static int ensure_dir_at(int dirfd, const char *name, mode_t mode, uid_t uid, gid_t gid,
			 const char *shown)
{
	struct stat st;
	int fd;

	if (geteuid() == 0 && uid != 0) {
		if (create_owned_dir_at(dirfd, name, mode, uid, gid, shown) < 0)
			return -1;
	} else if (mkdirat(dirfd, name, mode) < 0 && errno != EEXIST) {
		tether_fail("tether: cannot create %s: %m", shown);
		return -1;
	}
	fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return -2; /* removed under us (another step ended): the caller tries again */
		if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
			tether_fail("tether: %s is a symlink where tether's directory belongs; refusing to "
				    "follow it", shown);
		else
			tether_fail("tether: %s is not a directory tether can use: %m", shown);
		return -1;
	}
	if (fstat(fd, &st) < 0 || st.st_uid != uid) {
		tether_fail("tether: %s exists but is owned by uid %u, not the job's uid %u; refusing "
			    "to use it", shown, (unsigned)st.st_uid, (unsigned)uid);
		close(fd);
		return -1;
	}
	return fd;
}

static void remove_tree_at(int parent, const char *name, int depth);

/* Remove the entries of the directory ``fd`` (its own fd: closed here) that ``keep`` (when given)
 * does not keep, whole trees included, never following a symlink. */
static void remove_entries(int fd, int depth, int (*keep)(const char *name, void *arg), void *arg)
{
	struct dirent *e;
	DIR *dir = fdopendir(fd);

	if (dir == NULL) {
		close(fd);
		return;
	}
	while ((e = readdir(dir)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 || (keep && keep(e->d_name, arg)))
			continue;
		if (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN)
			remove_tree_at(dirfd(dir), e->d_name, depth + 1);
		else
			unlinkat(dirfd(dir), e->d_name, 0);
	}
	closedir(dir);
}

/* Remove ``name`` under ``parent`` and everything below it, never following a symlink (each
 * level is opened O_NOFOLLOW relative to the level above; a symlink is unlinked, not entered). */
static void remove_tree_at(int parent, const char *name, int depth)
{
	int fd;

	if (depth > TETHER_REMOVE_DEPTH)
		return;
	fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOTDIR || errno == ELOOP)
			unlinkat(parent, name, 0); /* a file or a symlink: the link itself goes */
		return;
	}
	remove_entries(fd, depth, NULL, NULL);
	unlinkat(parent, name, AT_REMOVEDIR);
}

/*
 * The job's directory ``name`` under the storage root ``root_fd`` (``shown``: its path), for
 * uid:gid; its fd, or -1 (reported). Only root creates entries in the root, so one that another
 * uid owns is a leftover of an earlier job with this id (ids restart when the scheduler's state is
 * cleared; no live job owns it): it is removed first.
 */
static int claim_job_dir(int root_fd, const char *name, uid_t uid, gid_t gid, const char *shown)
{
	struct stat st;

	if (fstatat(root_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode) && st.st_uid != uid) {
		tether_info("tether: removing %s left by an earlier job of uid %u", shown, (unsigned)st.st_uid);
		remove_tree_at(root_fd, name, 0);
	}
	return ensure_dir_at(root_fd, name, 0700, uid, gid, shown);
}


/*
 * One rank's directories below its step (Slurm) or task (PBS) directory ``step_fd`` (shown as
 * ``step_shown``): rank-<rank>/{tmp,work}, mode 0700, owned by uid:gid. 0 or -1 (reported).
 */
static int make_rank_dirs(int step_fd, const char *step_shown, unsigned rank, uid_t uid, gid_t gid)
{
	char name[32], shown[PATH_MAX], sub_shown[PATH_MAX];
	int rank_fd, sub_fd;

	snprintf(name, sizeof(name), "rank-%u", rank);
	if (path_join(shown, sizeof(shown), step_shown, name) < 0)
		return -1;
	rank_fd = ensure_dir_at(step_fd, name, 0700, uid, gid, shown);
	if (rank_fd < 0)
		return -1;
	for (int k = 0; k < 2; k++) {
		const char *sub = k ? "work" : "tmp";

		if (path_join(sub_shown, sizeof(sub_shown), shown, sub) < 0) {
			close(rank_fd);
			return -1;
		}
		sub_fd = ensure_dir_at(rank_fd, sub, 0700, uid, gid, sub_shown);
		if (sub_fd < 0) {
			close(rank_fd);
			return -1;
		}
		close(sub_fd);
	}
	close(rank_fd);
	return 0;
}

/* Does ``name`` under ``dirfd`` hold cleanup markers a launcher left (".cleanup-<rank>"), directly
 * or -- with depth 2, for a job directory -- in <node>/step-<id>/ below it? Never follows symlinks. */
static int has_leftovers(int parent, const char *name, int depth)
{
	int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct dirent *e;
	DIR *dir;
	int found = 0;

	if (fd < 0 || (dir = fdopendir(fd)) == NULL) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	while (!found && (e = readdir(dir)) != NULL) {
		if (e->d_name[0] == '.')
			found = depth == 0 && strncmp(e->d_name, ".cleanup-", 9) == 0;
		else if (depth > 0 && (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN))
			found = has_leftovers(dirfd(dir), e->d_name, depth - 1);
	}
	closedir(dir);
	return found;
}

/*
 * A container step whose end killed its launchers' own cleanup (a time limit or scancel signals
 * every process of the step, podman's `rm` included) left markers saying what is still to do.
 * Now that no process of the step is left, run the launcher once more, as the job user, in cleanup
 * mode (TETHER_CLEANUP=<step or job dir>). It must not be part of the step any more -- the daemon kills
 * whatever is left in the step after KillWait, and podman's rm of a killed container can take
 * that long -- so it is double-forked away from this the daemon (no longer a subreaper) and
 * bounded by alarm(120). We only wait until it has read the markers (it closes fd 3), so that the
 * step's directory can go.
 */
static void run_leftover_cleanup(const char *launcher, const char *where, uid_t job_uid, gid_t job_gid,
				 const char *what)
{
	char env_cleanup[PATH_MAX + 32], env_home[PATH_MAX + 8], env_user[300], buf[4096];
	struct passwd pw, *pwp = NULL;
	struct pollfd pfd;
	gid_t groups[256];
	int ngroups = 256, status, fds[2];
	pid_t pid;

	/* Everything that reads NSS happens here, before fork(): the daemon has threads. */
	if (getpwuid_r(job_uid, &pw, buf, sizeof(buf), &pwp) != 0 || pwp == NULL ||
	    getgrouplist(pw.pw_name, job_gid, groups, &ngroups) < 0) {
		tether_error("tether: cleanup after %s: cannot look up uid %u and its groups", what,
			     (unsigned)job_uid);
		return;
	}
	snprintf(env_cleanup, sizeof(env_cleanup), "TETHER_CLEANUP=%s", where);
	snprintf(env_home, sizeof(env_home), "HOME=%s", pw.pw_dir);
	snprintf(env_user, sizeof(env_user), "USER=%s", pw.pw_name);
	if (pipe2(fds, O_CLOEXEC) < 0) {
		tether_error("tether: cleanup after %s: pipe: %m", what);
		return;
	}
	tether_info("tether: %s ended with its containers' cleanup unfinished; running %s as uid %u",
		    what, launcher, (unsigned)job_uid);
	prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0); /* the cleanup may outlive the step: let it go */
	pid = fork();
	if (pid < 0) {
		tether_error("tether: cleanup after %s: fork: %m", what);
		close(fds[0]);
		close(fds[1]);
		return;
	}
	if (pid == 0) {
		char *argv[] = { (char *)launcher, NULL };
		char *envp[] = { env_cleanup, env_home, env_user, "TETHER_CLEANUP_FD=3",
				 "PATH=/usr/local/bin:/usr/bin:/bin", NULL };

		int null_fd;

		setsid();
		if (fork() != 0)
			_exit(0);  /* the grandchild is re-parented to init: outside the step */
		/* fd 3: the pipe (without close-on-exec); 0-2: /dev/null; nothing else of the daemon's
		 * (its sockets and the step's I/O pipes) may stay open in a process that outlives it */
		if (fds[1] == 3 ? fcntl(3, F_SETFD, 0) != 0 : dup2(fds[1], 3) != 3)
			_exit(126);
		null_fd = open("/dev/null", O_RDWR);
		if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(null_fd, 1) < 0 || dup2(null_fd, 2) < 0)
			_exit(126);
		closefrom(4);
		if (setgroups((size_t)ngroups, groups) != 0 || setgid(job_gid) != 0 ||
		    setuid(job_uid) != 0 || setuid(0) == 0 || chdir("/") != 0)
			_exit(126);
		alarm(120);
		execve(launcher, argv, envp);
		_exit(127);
	}
	close(fds[1]);
	waitpid(pid, &status, 0);
	pfd.fd = fds[0];
	pfd.events = POLLIN;
	if (poll(&pfd, 1, 10000) == 0)
		tether_error("tether: cleanup after %s did not read its markers within 10 s", what);
	close(fds[0]);
}

