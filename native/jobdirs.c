/*
 * tether's per-job and per-rank directories (see jobdirs.h): creation that never follows a symlink
 * and hands ownership over atomically, removal that never leaves the tree, and the cleanup run
 * for containers a step's end interrupted.
 *
 * Several daemons share one filesystem (and real clusters share job_storage_root): an entry another
 * node or step created first is used after the same checks; one removed under a starting step is
 * created again by the caller.
 */
#define _GNU_SOURCE /* renameat2, closefrom */
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
#include <sys/fsuid.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jobdirs.h"
#include "tether_names.h"

/* Directories removal keeps open at once; a deeper tree is flattened (see remove_at). */
#define TETHER_REMOVE_OPEN_LEVELS 48
/* How long the leftover cleanup may run before it is killed, with everything it started (a test
 * build shortens it). */
#ifndef TETHER_CLEANUP_SECONDS
#define TETHER_CLEANUP_SECONDS 120
#endif

__attribute__((format(printf, 2, 0))) static void vreport(enum tether_level level, const char *fmt,
							   va_list ap)
{
	char msg[1024];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	tether_report(level, msg);
}

void tether_fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vreport(TETHER_FAIL, fmt, ap);
	va_end(ap);
}

void tether_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vreport(TETHER_ERROR, fmt, ap);
	va_end(ap);
}

void tether_info(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vreport(TETHER_INFO, fmt, ap);
	va_end(ap);
}

int tether_path_join(char *out, size_t len, const char *a, const char *b)
{
	int n = snprintf(out, len, "%s/%s", a, b);

	if (n < 0 || (size_t)n >= len) {
		tether_fail("tether: the path %s/%s is too long", a, b);
		return -1;
	}
	return 0;
}

int tether_open_storage_root(const char *root)
{
	struct stat st;
	int fd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0) {
		tether_fail("tether: job_storage_root %s: %s (it must exist on every node: a root-owned "
			    "directory, mode 0755)", root, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) < 0 || st.st_uid != 0 || (st.st_mode & (S_IWGRP | S_IWOTH))) {
		tether_fail("tether: job_storage_root %s must be owned by root and not writable by group or "
			    "others (mode 0755): per-job directories are created there as root", root);
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
		tether_fail("tether: cannot create a directory next to %s: %s", shown, strerror(errno));
		return -1;
	}
	if (fchownat(dirfd, tmp, uid, gid, AT_SYMLINK_NOFOLLOW) < 0) {
		tether_fail("tether: cannot hand %s to uid %u: %s", shown, (unsigned)uid, strerror(errno));
		unlinkat(dirfd, tmp, AT_REMOVEDIR);
		return -1;
	}
	if (renameat2(dirfd, tmp, dirfd, name, RENAME_NOREPLACE) < 0) {
		int err = errno;

		unlinkat(dirfd, tmp, AT_REMOVEDIR);
		if (err != EEXIST) {
			tether_fail("tether: cannot create %s: %s", shown, strerror(err));
			return -1;
		}
	}
	return 0;
}

/*
 * As root, mkdirat() as the job user in a directory the user owns: setfsuid()/setfsgid() change
 * this thread's filesystem identity only (slurmstepd's other threads keep theirs), so the directory
 * is the user's from its first moment -- one metadata operation instead of create_owned_dir_at's
 * three -- and the kernel checks the user's permissions there, not root's. 0, or -1 with errno.
 */
static int mkdir_as_user_at(int dirfd, const char *name, mode_t mode, uid_t uid, gid_t gid)
{
	int old_gid = setfsgid(gid), old_uid = setfsuid(uid), rc = -1, err = EPERM;

	if ((uid_t)setfsuid((uid_t)-1) == uid && (gid_t)setfsgid((gid_t)-1) == gid) {
		rc = mkdirat(dirfd, name, mode);
		err = errno;
	}
	setfsuid((uid_t)old_uid);
	setfsgid((gid_t)old_gid);
	errno = err;
	return rc;
}

/* The fd of the existing directory ``name`` under ``dirfd`` when uid owns it, not following a
 * symlink; -1 (reported) or -2 (it is gone: removed under us). */
static int open_owned_dir_at(int dirfd, const char *name, uid_t uid, const char *shown)
{
	struct stat st;
	int fd;

	fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return -2; /* removed under us (another step ended): the caller tries again */
		if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
			tether_fail("tether: %s is a symlink where tether's directory belongs; refusing to "
				    "follow it", shown);
		else
			tether_fail("tether: %s is not a directory tether can use: %s", shown, strerror(errno));
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

int tether_ensure_dir_at(int dirfd, const char *name, mode_t mode, uid_t uid, gid_t gid, const char *shown)
{
	struct stat st;

	if (geteuid() == 0 && uid != 0 && fstat(dirfd, &st) == 0 && st.st_uid == uid) {
		/* below the job's own directory: created as the user */
		if (mkdir_as_user_at(dirfd, name, mode, uid, gid) < 0 && errno != EEXIST) {
			tether_fail("tether: cannot create %s as uid %u: %s", shown, (unsigned)uid, strerror(errno));
			return -1;
		}
	} else if (geteuid() == 0 && uid != 0) {
		if (create_owned_dir_at(dirfd, name, mode, uid, gid, shown) < 0)
			return -1;
	} else if (mkdirat(dirfd, name, mode) < 0 && errno != EEXIST) {
		tether_fail("tether: cannot create %s: %s", shown, strerror(errno));
		return -1;
	}
	return open_owned_dir_at(dirfd, name, uid, shown);
}

int tether_ensure_child(int dirfd, const char *parent_shown, const char *name, uid_t uid, gid_t gid,
			char *shown, size_t len)
{
	if (tether_path_join(shown, len, parent_shown, name) < 0)
		return -1;
	return tether_ensure_dir_at(dirfd, name, 0700, uid, gid, shown);
}

int tether_claim_job_dir(int root_fd, const char *name, uid_t uid, gid_t gid, const char *shown)
{
	struct stat st;

	/* Only root creates entries in the root: one another uid owns is a leftover of an earlier job
	 * with this id (ids restart when the scheduler's state is cleared; no live job owns it). */
	if (fstatat(root_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
		if (st.st_uid != uid) {
			tether_info("tether: removing %s left by an earlier job of uid %u", shown, (unsigned)st.st_uid);
			tether_remove_tree_at(root_fd, name);
		} else {
			/* made by an earlier step of this job, or by another node sharing the root: opened
			 * as it is, without a directory made under a temporary name, handed over, renamed
			 * and dropped again only to find it exists (4 metadata operations per step) */
			int fd = open_owned_dir_at(root_fd, name, uid, shown);

			if (fd != -2)
				return fd;
		}
	}
	return tether_ensure_dir_at(root_fd, name, 0700, uid, gid, shown);
}

/*
 * An fd on the absolute path ``base``, walked from / one component at a time without following a
 * symlink; every component must be a directory owned by root that group and others cannot write
 * -- or, above ``base`` itself, one that is sticky, as /tmp is, where nobody can rename or remove
 * root's entries -- so nobody but root can put or swap anything on the way. A missing component
 * is made, root's, mode 0755. -1 (reported) otherwise.
 */
static int open_root_path(const char *base)
{
	char path[PATH_MAX], *save = NULL, *part;
	int fd;

	if (base[0] != '/' || base[strspn(base, "/")] == '\0' || strlen(base) >= sizeof(path)) {
		tether_fail("tether: %.200s is not an absolute path tether can use", base);
		return -1;
	}
	strcpy(path, base);
	fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		tether_fail("tether: cannot open /: %s", strerror(errno));
		return -1;
	}
	for (part = strtok_r(path, "/", &save); fd >= 0 && part != NULL; part = strtok_r(NULL, "/", &save)) {
		struct stat st;
		int next, made = 0, last, err;

		if (strcmp(part, ".") == 0 || strcmp(part, "..") == 0) {
			tether_fail("tether: %s: '.' and '..' are not accepted in this path", base);
			close(fd);
			return -1;
		}
		next = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0 && errno == ENOENT && (mkdirat(fd, part, 0755) == 0 || errno == EEXIST)) {
			made = 1;
			next = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		}
		err = errno;
		if (next < 0) {
			int link = fstatat(fd, part, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);

			tether_fail("tether: %s (at '%s'): %s; each user's directory on the node is made there as "
				    "root", base, part, link ? "a symlink, which root does not follow" : strerror(err));
			close(fd);
			return -1;
		}
		close(fd);
		last = save == NULL || save[strspn(save, "/")] == '\0';
		if (fstat(next, &st) < 0 || st.st_uid != 0 ||
		    ((st.st_mode & (S_IWGRP | S_IWOTH)) && (last || !(st.st_mode & S_ISVTX)))) {
			tether_fail("tether: %s (at '%s') must be owned by root and not writable by group or others: "
				    "each user's directory on the node is made there as root", base, part);
			close(next);
			return -1;
		}
		if (made && (st.st_mode & 07777) != 0755)
			fchmod(next, 0755);      /* not the daemon's umask: users enter it to reach their own */
		fd = next;
	}
	return fd;
}

int tether_ensure_user_dir(const char *base, uid_t uid, gid_t gid)
{
	char shown[PATH_MAX], name[16];
	struct stat st;
	int fd, user_fd;

	fd = open_root_path(base);
	if (fd < 0)
		return -1;
	snprintf(name, sizeof(name), "%u", (unsigned)uid);
	if (tether_path_join(shown, sizeof(shown), base, name) < 0) {
		close(fd);
		return -1;
	}
	/* the user's from an earlier step: nothing to make (one fstatat) */
	if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode) && st.st_uid == uid) {
		close(fd);
		return 0;
	}
	user_fd = tether_ensure_dir_at(fd, name, 0700, uid, gid, shown);
	close(fd);
	if (user_fd < 0) {
		if (user_fd == -2)
			tether_fail("tether: %s disappeared while it was made", shown);
		return -1;
	}
	close(user_fd);
	return 0;
}

int tether_ensure_user_dirs(const char *bases, uid_t uid, gid_t gid)
{
	char list[4096], *save = NULL, *base;

	if (bases == NULL || bases[0] == '\0')
		return 0;
	if (strlen(bases) >= sizeof(list)) {
		tether_fail("tether: user_dirs= is too long");
		return -1;
	}
	strcpy(list, bases);
	for (base = strtok_r(list, ":", &save); base != NULL; base = strtok_r(NULL, ":", &save))
		if (tether_ensure_user_dir(base, uid, gid) < 0)
			return -1;
	return 0;
}

int tether_make_rank_dirs(int step_fd, const char *step_shown, unsigned rank, uid_t uid, gid_t gid)
{
	static const char *const subdirs[] = { TETHER_RANK_TMP, TETHER_RANK_WORK };
	char name[32], shown[PATH_MAX], sub_shown[PATH_MAX];
	int rank_fd, sub_fd, rc = 0;

	snprintf(name, sizeof(name), TETHER_RANK_PREFIX "%u", rank);
	rank_fd = tether_ensure_child(step_fd, step_shown, name, uid, gid, shown, sizeof(shown));
	if (rank_fd < 0)
		return -1;
	for (size_t k = 0; k < sizeof(subdirs) / sizeof(subdirs[0]) && rc == 0; k++) {
		sub_fd = tether_ensure_child(rank_fd, shown, subdirs[k], uid, gid, sub_shown, sizeof(sub_shown));
		if (sub_fd < 0) {
			rc = -1;
			continue;
		}
		/* the rank's /tmp in a container is an image's /tmp: sticky and open to the image's own
		 * users (apt's _apt under --container-remap-root), as enroot leaves it. Nobody else on the
		 * node reaches it: the rank's directory above is the user's, mode 0700. */
		if (strcmp(subdirs[k], TETHER_RANK_TMP) == 0 && fchmod(sub_fd, 01777) < 0) {
			tether_fail("tether: cannot open %s to the container's own users: %s", sub_shown, strerror(errno));
			rc = -1;
		}
		close(sub_fd);
	}
	close(rank_fd);
	return rc;
}

/* ---- removal --------------------------------------------------------------------------------
 * Every level is opened relative to the level above with O_NOFOLLOW: a symlink is unlinked, never
 * entered. At most TETHER_REMOVE_OPEN_LEVELS levels are open at once (a job user can build a tree
 * deeper than any fd or stack limit): a directory found below that depth is moved up to the top of
 * the tree under a new name (renameat within the tree) and removed from there by the top's next pass.
 */
struct removal {
	int top_fd;        /* the tree's top directory */
	unsigned moved;    /* directories moved up so far (their new names) */
	int failed;
};

static void remove_at(struct removal *r, int parent, const char *name, int depth);

#ifndef STATX_ATTR_MOUNT_ROOT
#define STATX_ATTR_MOUNT_ROOT 0x00002000 /* Linux 5.8 */
#endif

/* Is ``fd`` the root of a mount (statx's attribute: 0 on a kernel that cannot tell)? */
static int is_mount_root(int fd)
{
	struct statx stx;

	/* AT_STATX_DONT_SYNC: a FUSE file system mounted there is never asked (its daemon could stall) */
	if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW | AT_STATX_DONT_SYNC, 0, &stx) < 0)
		return 0;
	return (stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) && (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT);
}

/* Detach, topmost first, whatever this mount namespace has mounted at ``name`` below ``parent``, so
 * that a removal never enters a mount: a user's FUSE file system, or the bind of a step's enroot
 * directory that a killed slurmstepd left (spank/stepd.c: bind_enroot_dir). Through an fd opened
 * without following a symlink, never a path. -1 when something stays mounted there. */
static int detach_mounts_at(int parent, const char *name)
{
	for (int n = 0; n < 64; n++) {
		char self[64];
		int fd = openat(parent, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), rc;

		if (fd < 0)
			return 0; /* gone, or not a directory: the removal sees which */
		if (!is_mount_root(fd)) {
			close(fd);
			return 0;
		}
		snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
		rc = umount2(self, MNT_DETACH);
		close(fd);
		if (rc < 0)
			return -1;
	}
	return -1;
}

/* Remove what ``fd`` (a directory at ``depth``; closed here) holds that ``keep`` does not keep. */
static void remove_contents(struct removal *r, int fd, int depth, int (*keep)(const char *, void *),
			    void *arg)
{
	struct dirent *e;
	DIR *dir = fdopendir(fd);

	if (dir == NULL) {
		close(fd);
		r->failed = 1;
		return;
	}
	while ((e = readdir(dir)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 || (keep && keep(e->d_name, arg)))
			continue;
		if (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN)
			remove_at(r, dirfd(dir), e->d_name, depth + 1);
		else if (unlinkat(dirfd(dir), e->d_name, 0) < 0 && errno != ENOENT)
			r->failed = 1;
	}
	closedir(dir);
}

static void remove_at(struct removal *r, int parent, const char *name, int depth)
{
	int fd;

	if (depth >= TETHER_REMOVE_OPEN_LEVELS && r->top_fd >= 0) {
		char moved[64];
		int rc, tries = 0;

		do { /* a name the job may have taken already is skipped, never replaced */
			snprintf(moved, sizeof(moved), ".tether-removing-%u", r->moved++);
			rc = renameat2(parent, name, r->top_fd, moved, RENAME_NOREPLACE);
		} while (rc < 0 && errno == EEXIST && ++tries < 1000);
		if (rc == 0)
			return; /* the top's next pass removes it */
		r->failed = 1;
		return;
	}
	if (detach_mounts_at(parent, name) < 0) {
		r->failed = 1;
		return;
	}
	fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		if ((errno == ENOTDIR || errno == ELOOP) && unlinkat(parent, name, 0) == 0)
			return; /* a file or a symlink: the link itself goes */
		if (errno != ENOENT)
			r->failed = 1;
		return;
	}
	remove_contents(r, fd, depth, NULL, NULL);
	if (unlinkat(parent, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		r->failed = 1;
}

/* Passes over the top directory ``fd`` until nothing moved up is left (each pass is bounded). */
static int remove_within(int fd, int (*keep)(const char *, void *), void *arg)
{
	struct removal r = { .top_fd = fd };
	unsigned before;

	do {
		int pass_fd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		before = r.moved;
		if (pass_fd < 0)
			return -1;
		remove_contents(&r, pass_fd, 0, keep, arg);
	} while (r.moved != before && !r.failed);
	return r.failed ? -1 : 0;
}

int tether_remove_entries(int fd, int (*keep)(const char *name, void *arg), void *arg)
{
	int rc = remove_within(fd, keep, arg);

	close(fd);
	return rc;
}

int tether_remove_tree_at(int parent, const char *name)
{
	int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	int rc;

	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		if ((errno == ENOTDIR || errno == ELOOP) && unlinkat(parent, name, 0) == 0)
			return 0;
		tether_error("tether: cannot remove %s: %s", name, strerror(errno));
		return -1;
	}
	rc = remove_within(fd, NULL, NULL);
	close(fd);
	if (unlinkat(parent, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		rc = -1;
	if (rc < 0)
		tether_error("tether: %s could not be removed completely", name);
	return rc;
}

int tether_has_leftovers(int parent, const char *name, int depth)
{
	int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
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
			found = depth == 0 && strncmp(e->d_name, TETHER_CLEANUP_MARKER,
						      strlen(TETHER_CLEANUP_MARKER)) == 0;
		else if (depth > 0 && (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN))
			found = tether_has_leftovers(dirfd(dir), e->d_name, depth - 1);
	}
	closedir(dir);
	return found;
}

/* ---- the leftover cleanup ---------------------------------------------------------------------
 * A container step whose end killed its launchers' own cleanup (a time limit or scancel signals
 * every process of the step, podman's `rm` included) left markers saying which containers are still
 * to remove. Once no process of the step is left, the launcher runs once more, as the job user, in
 * cleanup mode (TETHER_CLEANUP=<step or job dir>); it removes only containers of this job, with
 * commands it builds from tether's own config (never from a marker). It must not be part of the step
 * any more -- the daemon kills whatever is left in the step after KillWait, and podman's rm of a
 * killed container can take that long -- so it runs in a session of its own, away from the daemon,
 * with the signal mask and dispositions reset (the daemon blocks several signals) and the resource
 * limits of a new login; a watcher in that session kills the whole session after
 * TETHER_CLEANUP_SECONDS. The daemon waits only until the markers are read (fd 3 closes).
 */
struct cleanup_env {
	char cleanup[PATH_MAX + 32], home[PATH_MAX + 8], user[300];
	/* the cgroup.procs of each cgroup v1 hierarchy's root where the daemon sits in a job's
	 * cgroup (see job_cgroup_exits) */
	char exits[16][128];
	int nexits;
};

/*
 * Where the cleanup leaves the job's cgroups. proctrack/cgroup keeps slurmstepd itself in the
 * job's freezer cgroup (.../job_<id>, not the step's), so a process it forks starts there; the
 * cleanup outlives the step by design, and Slurm's end of the job's last step (which moves
 * slurmstepd to the hierarchy's root first) then could not remove job_<id> while the cleanup ran,
 * and never tried again: an empty job_<id> stayed on the node for most container jobs ended by their
 * time limit or with their launchers killed. The cleanup therefore moves to the root of each
 * hierarchy in which the daemon is in a job's cgroup (a "job_<digits>" level, as Slurm names them),
 * as Slurm moves slurmstepd. Read here, before fork(); written by the child, still root.
 */
static void job_cgroup_exits(struct cleanup_env *env)
{
	char line[512];
	FILE *fh = fopen("/proc/self/cgroup", "re");

	env->nexits = 0;
	if (fh == NULL)
		return;
	while (env->nexits < 16 && fgets(line, sizeof(line), fh)) {
		char *ctrl = strchr(line, ':'), *path, *job;

		if (ctrl == NULL || (path = strchr(++ctrl, ':')) == NULL)
			continue;
		*path++ = '\0';
		path[strcspn(path, "\n")] = '\0';
		if (*ctrl == '\0' || strncmp(ctrl, "name=", 5) == 0 || strchr(ctrl, '/') || strstr(ctrl, ".."))
			continue;   /* cgroup v2 (Slurm's own removal differs there), or a named hierarchy */
		for (job = strstr(path, "/job_"); job; job = strstr(job + 1, "/job_")) {
			size_t digits = strspn(job + 5, "0123456789");

			if (digits > 0 && (job[5 + digits] == '/' || job[5 + digits] == '\0'))
				break;
		}
		if (job && snprintf(env->exits[env->nexits], sizeof(env->exits[0]), "/sys/fs/cgroup/%s/cgroup.procs",
				    ctrl) < (int)sizeof(env->exits[0]))
			env->nexits++;
	}
	fclose(fh);
}

static volatile sig_atomic_t cleanup_timed_out;

static void on_cleanup_alarm(int sig)
{
	(void)sig;
	cleanup_timed_out = 1;
}

/* In the new session, as the user: start the launcher and kill the session when it overruns. */
__attribute__((noreturn)) static void cleanup_watcher(const char *launcher, struct cleanup_env *env)
{
	char *argv[] = { (char *)launcher, NULL };
	char *envp[] = { env->cleanup, env->home, env->user, TETHER_ENV_CLEANUP_FD "=3",
			 "PATH=/usr/local/bin:/usr/bin:/bin", NULL };
	struct sigaction sa = { .sa_handler = on_cleanup_alarm };
	int status;
	pid_t pid = fork();

	if (pid < 0)
		_exit(126);
	if (pid == 0) {
		execve(launcher, argv, envp);
		_exit(127);
	}
	close(3); /* only the launcher holds the markers' pipe now */
	sigaction(SIGALRM, &sa, NULL);
	alarm(TETHER_CLEANUP_SECONDS);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR && !cleanup_timed_out)
		;
	if (cleanup_timed_out)
		kill(0, SIGKILL); /* the launcher and everything it started in this session, us too */
	_exit(0);
}

/* The forked child of the daemon: leave its session, reset what the daemon set, drop to the user. */
__attribute__((noreturn)) static void cleanup_child(const char *launcher, int pipe_fd, uid_t uid, gid_t gid,
						    gid_t *groups, int ngroups, struct cleanup_env *env)
{
	struct rlimit unlimited = { RLIM_INFINITY, RLIM_INFINITY };
	sigset_t none;
	int null_fd;

	setsid();
	if (fork() != 0)
		_exit(0); /* the grandchild is re-parented to init: outside the step */
	for (int i = 0; i < env->nexits; i++) { /* and outside the job's cgroups (job_cgroup_exits) */
		int fd = open(env->exits[i], O_WRONLY | O_NOFOLLOW | O_CLOEXEC);

		if (fd >= 0) {
			ssize_t moved = write(fd, "0", 1); /* "0": the writer; a failure leaves it where it was */

			(void)moved;
			close(fd);
		}
	}
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	for (int s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP)
			signal(s, SIG_DFL);
	/* the step's limits (a user's ulimit -t, -v) must not break the cleanup; RLIMIT_NPROC etc. stay */
	setrlimit(RLIMIT_CPU, &unlimited);
	setrlimit(RLIMIT_AS, &unlimited);
	/* fd 3: the pipe (without close-on-exec); 0-2: /dev/null; nothing else of the daemon's
	 * (its sockets and the step's I/O pipes) may stay open in a process that outlives it */
	if (pipe_fd == 3 ? fcntl(3, F_SETFD, 0) != 0 : dup2(pipe_fd, 3) != 3)
		_exit(126);
	null_fd = open("/dev/null", O_RDWR);
	if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(null_fd, 1) < 0 || dup2(null_fd, 2) < 0)
		_exit(126);
	closefrom(4);
	if (setgroups((size_t)ngroups, groups) != 0 || setgid(gid) != 0 || setuid(uid) != 0 ||
	    (uid != 0 && setuid(0) == 0) || chdir("/") != 0)
		_exit(126);
	prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
	cleanup_watcher(launcher, env);
}

void tether_run_leftover_cleanup(const char *launcher, const char *where, uid_t uid, gid_t gid,
				 const char *what)
{
	struct cleanup_env env;
	struct passwd pw, *pwp = NULL;
	struct pollfd pfd;
	gid_t groups[256];
	int ngroups = 256, status, fds[2];
	char buf[4096];
	pid_t pid;

	/* Everything that reads NSS happens here, before fork(): the daemon has threads. */
	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &pwp) != 0 || pwp == NULL ||
	    getgrouplist(pw.pw_name, gid, groups, &ngroups) < 0) {
		tether_error("tether: cleanup after %s: cannot look up uid %u and its groups", what, (unsigned)uid);
		return;
	}
	snprintf(env.cleanup, sizeof(env.cleanup), TETHER_ENV_CLEANUP "=%s", where);
	snprintf(env.home, sizeof(env.home), "HOME=%s", pw.pw_dir);
	snprintf(env.user, sizeof(env.user), "USER=%s", pw.pw_name);
	job_cgroup_exits(&env);
	if (pipe2(fds, O_CLOEXEC) < 0) {
		tether_error("tether: cleanup after %s: pipe: %s", what, strerror(errno));
		return;
	}
	tether_info("tether: %s ended with its containers' cleanup unfinished; running %s as uid %u",
		    what, launcher, (unsigned)uid);
	prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0); /* the cleanup may outlive the step: let it go */
	pid = fork();
	if (pid < 0) {
		tether_error("tether: cleanup after %s: fork: %s", what, strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return;
	}
	if (pid == 0)
		cleanup_child(launcher, fds[1], uid, gid, groups, ngroups, &env);
	close(fds[1]);
	waitpid(pid, &status, 0);
	pfd.fd = fds[0];
	pfd.events = POLLIN;
	if (poll(&pfd, 1, 10000) == 0)
		tether_error("tether: cleanup after %s did not read its markers within 10 s", what);
	close(fds[0]);
}
