/*
 * The cgroup keeper: a container step's processes stay in Slurm's own cgroups (cgroup v1).
 *
 * Slurm's task/cgroup hands a step's cgroups to the job's user (the directories, not their
 * cgroup.procs), so rootless podman's runc makes a child cgroup of its own below them
 * (.../step_0/task_0/<container id> in memory, .../step_0/<container id> in freezer) and starts the
 * container there. Limits and accounting are hierarchical and still hold, but Slurm reads some
 * things only from its own directories: 22.05's OOM detection reads `oom_kill` from the step's and
 * the tasks' memory.oom_control, which counts kills local to that cgroup (a container killed past
 * --mem ended FAILED 137, not OUT_OF_MEMORY), and proctrack/cgroup signals the pids listed in the
 * step's own cgroup.procs (Slurm's SIGTERM and SIGKILL did not reach the container's processes).
 *
 * So slurmstepd (root) runs this thread for a container step: it watches the step's cgroup
 * directories (inotify; cgroupfs reports mkdir) and moves every process that appears in a child
 * cgroup made by the user (its cgroup.procs is the user's; Slurm's own are root's) into the nearest
 * of Slurm's cgroups above it -- the cgroup it was started from. The processes never leave the
 * step: only the user's own child cgroups below it are read, and only Slurm's directories of this
 * step are written. A new child is drained every 10 ms until its first processes were moved, for
 * at most 3 s (runc writes its init process into the cgroup right after mkdir, before the
 * container's program runs; what that process starts is born in Slurm's cgroup), then every
 * 500 ms (a `podman exec` joins the container's cgroup: at most 500 ms outside Slurm's). When this
 * node's last task has exited, the keeping stops and the empty child cgroups are removed, before
 * Slurm removes its own (which it cannot while a child is left: they leaked).
 *
 * At most MAX_DIRS directories are watched (bounded memory). A user who makes more has the rest
 * swept instead: once a directory was not watched, every SWEEP_MS and when the keeping stops the
 * thread reads each process's cgroups in /proc and moves a process it finds below this step's
 * directory, in a cgroup of the user's, to the nearest of Slurm's directories above it -- no
 * number of directories lets a process outlive the step (Slurm signals only the pids its own
 * directories list). The sweep holds one file and at most two directories open at a time. The
 * unwatched directories, empty once swept, are removed at the end too (up to REMOVE_DEPTH levels
 * deep), so that Slurm can remove its own.
 *
 * The thread never logs (a fork of a task while it held the log lock would leave the task stuck):
 * it counts, and tether_cgkeeper_stop reports. Every descriptor is close-on-exec; all signals
 * are blocked in the thread; any error stops only the keeping, never the step.
 * Residual risk, stated: a pid read from a child's cgroup.procs could exit and be reused before
 * it is written to Slurm's cgroup.procs; that needs the whole pid space to wrap within microseconds.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "cgkeeper.h"

#define MAX_DIRS 512
#define FRESH_MS 3000
#define FAST_MS 10
#define SLOW_MS 500
#define SWEEP_MS 2000
#define REMOVE_DEPTH 32
#define MAX_HIERARCHIES 16

struct kdir {
	int fd;          /* the directory, -1 once gone */
	int wd;          /* inotify watch */
	int parent;      /* index of the directory it was found in, -1 for a step directory */
	int target;      /* user's child: index of Slurm's directory its processes go to; -1: Slurm's own */
	long long born;  /* ms, for a user's child */
	int settled;     /* a user's child whose first processes were moved: runc has put its init there */
	char name[256];
};

static struct {
	int started;
	pthread_t thread;
	int inotify_fd;
	int stop_pipe[2];
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int finished;    /* the thread has drained and removed: only closing its inotify instance is left */
	int ndirs;
	struct kdir dirs[MAX_DIRS];
	/* each hierarchy's step directory as /proc/<pid>/cgroup names it, for the sweep */
	int nhier;
	struct { char ctrl[64]; char path[512]; int index; } hier[MAX_HIERARCHIES];
	unsigned long moved, failed, removed, overflow, swept;
} keeper = { .inotify_fd = -1, .stop_pipe = { -1, -1 }, .lock = PTHREAD_MUTEX_INITIALIZER,
	     .cond = PTHREAD_COND_INITIALIZER };

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int watch(int fd)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	return inotify_add_watch(keeper.inotify_fd, path, IN_CREATE | IN_ONLYDIR);
}

static void scan(int index);

/* A slot for one more directory: a new one, or one whose directory is gone and that no live
 * directory was found in (so that long steps with many containers do not run out). -1: none. */
static int free_slot(void)
{
	for (int i = 0; i < keeper.ndirs; i++) {
		int used = keeper.dirs[i].fd >= 0 || keeper.dirs[i].parent < 0; /* a step directory's: the sweep's */

		for (int j = 0; j < keeper.ndirs && !used; j++)
			used = keeper.dirs[j].fd >= 0 && (keeper.dirs[j].parent == i || keeper.dirs[j].target == i);
		if (!used)
			return i;
	}
	return keeper.ndirs < MAX_DIRS ? keeper.ndirs : -1;
}

/* A directory found in dirs[parent] (or a step directory: parent -1, fd given); its index, or -1. */
static int add_dir(int parent, const char *name, int fd)
{
	struct stat st;
	struct kdir *d;
	int index;

	if (fd < 0)
		fd = openat(keeper.dirs[parent].fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	index = free_slot();
	if (index < 0 || fstatat(fd, "cgroup.procs", &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
		keeper.overflow += index < 0;
		close(fd);
		return -1;
	}
	if (index == keeper.ndirs)
		keeper.ndirs++;
	d = &keeper.dirs[index];
	d->fd = fd;
	d->parent = parent;
	d->settled = 0;
	snprintf(d->name, sizeof(d->name), "%s", name);
	if (parent < 0 || st.st_uid == 0) {
		d->target = -1;           /* Slurm's: a step or task directory */
	} else {
		struct kdir *p = &keeper.dirs[parent];
		d->target = p->target < 0 ? parent : p->target;
		d->born = now_ms();
	}
	d->wd = watch(fd);            /* before the scan: nothing made in between is missed */
	scan(index);
	return index;
}

static void scan(int index)
{
	/* a new open file, not a dup: a dup shares the offset, which the first scan left at the end,
	 * so a second scan (after an inotify overflow) read nothing */
	int fd = openat(keeper.dirs[index].fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *dir;
	struct dirent *e;

	if (fd < 0)
		return;
	dir = fdopendir(fd);
	if (dir == NULL) {
		close(fd);
		return;
	}
	while ((e = readdir(dir)) != NULL) {
		if (e->d_type != DT_DIR || e->d_name[0] == '.')
			continue;
		int known = 0;
		for (int i = 0; i < keeper.ndirs && !known; i++)
			known = keeper.dirs[i].parent == index && strcmp(keeper.dirs[i].name, e->d_name) == 0 &&
				keeper.dirs[i].fd >= 0;
		if (!known)
			add_dir(index, e->d_name, -1);
	}
	closedir(dir);
}

/* The pids in a cgroup.procs (at most what fits: the rest is read on the next round). */
static size_t read_pids(int dirfd, char *buf, size_t len)
{
	int fd = openat(dirfd, "cgroup.procs", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	size_t have = 0;
	ssize_t n;

	if (fd < 0)
		return 0;
	while (have < len - 1 && (n = read(fd, buf + have, len - 1 - have)) > 0)
		have += (size_t)n;
	close(fd);
	while (have > 0 && buf[have - 1] != '\n')   /* whole lines only */
		have--;
	buf[have] = '\0';
	return have;
}

/* Every process in a user's child cgroup goes to its Slurm directory; returns whether any is fresh. */
static int drain(void)
{
	static char buf[65536];
	long long now = now_ms();
	int fresh = 0;

	for (int i = 0; i < keeper.ndirs; i++) {
		struct kdir *d = &keeper.dirs[i];
		char *save = NULL;
		int out = -1;

		if (d->fd < 0 || d->target < 0)
			continue;
		if (read_pids(d->fd, buf, sizeof(buf)) == 0) {
			fresh |= !d->settled && now - d->born < FRESH_MS;
			continue;
		}
		d->settled = 1;
		for (char *pid = strtok_r(buf, "\n", &save); pid; pid = strtok_r(NULL, "\n", &save)) {
			if (pid[strspn(pid, "0123456789")] != '\0' || strlen(pid) > 10)
				continue;
			if (out < 0)
				out = openat(keeper.dirs[d->target].fd, "cgroup.procs", O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
			if (out < 0)
				break;
			if (write(out, pid, strlen(pid)) >= 0)
				keeper.moved++;
			else if (errno != ESRCH)
				keeper.failed++;
		}
		if (out >= 0)
			close(out);
	}
	return fresh;
}

/* Is ``fd``'s cgroup.procs Slurm's (root's), not a user's? */
static int slurms(int fd)
{
	struct stat st;

	return fstatat(fd, "cgroup.procs", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0;
}

/* Process ``pid`` is in ``rest`` below hierarchy ``h``'s step directory: if that is a cgroup of the
 * user's, move it to the deepest of Slurm's directories on the way (opened level by level from the
 * step's, O_NOFOLLOW; at most two open at a time). */
static void sweep_one(int h, const char *pid, char *rest)
{
	int target = dup(keeper.dirs[keeper.hier[h].index].fd), users = 0;
	char *save = NULL;

	for (char *name = strtok_r(rest, "/", &save); name && target >= 0; name = strtok_r(NULL, "/", &save)) {
		int fd = openat(target, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

		if (fd < 0 || !slurms(fd)) {
			users = fd >= 0;
			if (fd >= 0)
				close(fd);
			break;
		}
		close(target);
		target = fd;
	}
	if (target >= 0 && users) {
		int out = openat(target, "cgroup.procs", O_WRONLY | O_NOFOLLOW | O_CLOEXEC);

		if (out >= 0) {
			if (write(out, pid, strlen(pid)) >= 0)
				keeper.swept++;
			else if (errno != ESRCH)
				keeper.failed++;
			close(out);
		}
	}
	if (target >= 0)
		close(target);
}

/* One line of /proc/<pid>/cgroup ("<id>:<controllers>:<path>"): sweep ``pid`` if the path is
 * below this step's directory in that hierarchy. */
static void sweep_line(char *line, const char *pid)
{
	char *ctrl = strchr(line, ':'), *cg;

	if (ctrl == NULL || (cg = strchr(++ctrl, ':')) == NULL)
		return;
	*cg++ = '\0';
	for (int h = 0; h < keeper.nhier; h++) {
		size_t len = strlen(keeper.hier[h].path);

		if (strcmp(keeper.hier[h].ctrl, ctrl) == 0 && strncmp(cg, keeper.hier[h].path, len) == 0 &&
		    cg[len] == '/' && keeper.dirs[keeper.hier[h].index].fd >= 0) {
			sweep_one(h, pid, cg + len + 1);
			return;
		}
	}
}

/* Every process of the node in a user's cgroup below this step's directories (see the top). Each
 * line is read whole up to 4 KiB and cut there: a user's cgroups nested deep make a line longer,
 * but the first of the user's directories, all sweep_one needs, comes long before. */
static void sweep(void)
{
	static char line[4096], chunk[4096];
	DIR *proc = opendir("/proc");
	struct dirent *e;

	if (proc == NULL)
		return;
	while ((e = readdir(proc)) != NULL) {
		char path[64];
		size_t len = 0;
		ssize_t n;
		int fd;

		if (e->d_name[0] < '1' || e->d_name[0] > '9' || strlen(e->d_name) > 10)
			continue;
		snprintf(path, sizeof(path), "%s/cgroup", e->d_name);
		fd = openat(dirfd(proc), path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		while ((n = read(fd, chunk, sizeof(chunk))) > 0)
			for (ssize_t i = 0; i < n; i++) {
				if (chunk[i] != '\n') {
					if (len < sizeof(line) - 1)
						line[len++] = chunk[i];
					continue;
				}
				line[len] = '\0';
				sweep_line(line, e->d_name);
				len = 0;
			}
		close(fd);
		if (len > 0) {
			line[len] = '\0';
			sweep_line(line, e->d_name);
		}
	}
	closedir(proc);
}

/* The user's empty cgroups below ``fd`` (directories not watched: past MAX_DIRS), children first,
 * at most REMOVE_DEPTH levels down (one directory open per level). */
static void remove_unwatched(int fd, int depth)
{
	int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* its own offset, as in scan() */
	DIR *dir = dfd >= 0 ? fdopendir(dfd) : NULL;
	struct dirent *e;

	if (dir == NULL) {
		if (dfd >= 0)
			close(dfd);
		return;
	}
	while ((e = readdir(dir)) != NULL) {
		int child, users;

		if (e->d_type != DT_DIR || e->d_name[0] == '.')
			continue;
		child = openat(dirfd(dir), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (child < 0)
			continue;
		users = !slurms(child);
		if (depth < REMOVE_DEPTH)
			remove_unwatched(child, depth + 1);
		close(child);
		if (users && unlinkat(dirfd(dir), e->d_name, AT_REMOVEDIR) == 0)
			keeper.removed++;
	}
	closedir(dir);
}

static int find_wd(int wd)
{
	for (int i = 0; i < keeper.ndirs; i++)
		if (keeper.dirs[i].wd == wd && keeper.dirs[i].fd >= 0)
			return i;
	return -1;
}

static void read_events(void)
{
	char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
	ssize_t n = read(keeper.inotify_fd, buf, sizeof(buf));

	for (char *p = buf; n > 0 && p < buf + n;) {
		struct inotify_event *ev = (struct inotify_event *)p;
		int index = find_wd(ev->wd);

		if (ev->mask & IN_Q_OVERFLOW) {         /* events were lost: look again everywhere */
			for (int i = 0; i < keeper.ndirs; i++)
				if (keeper.dirs[i].fd >= 0)
					scan(i);
		} else if (index >= 0 && (ev->mask & IN_IGNORED)) {
			close(keeper.dirs[index].fd);       /* the directory is gone */
			keeper.dirs[index].fd = -1;
		} else if (index >= 0 && (ev->mask & IN_CREATE) && (ev->mask & IN_ISDIR) && ev->len) {
			add_dir(index, ev->name, -1);
		}
		p += sizeof(struct inotify_event) + ev->len;
	}
}

static void *keep(void *arg)
{
	sigset_t all;
	struct pollfd fds[2];
	int fresh = 1;
	long long swept_at = 0;

	(void)arg;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	fds[0].fd = keeper.inotify_fd;
	fds[0].events = POLLIN;
	fds[1].fd = keeper.stop_pipe[0];
	fds[1].events = POLLIN;
	for (;;) {
		int rc = poll(fds, 2, fresh ? FAST_MS : SLOW_MS);

		if (rc < 0 && errno != EINTR)
			break;
		if (rc > 0 && fds[1].revents)
			break;
		if (rc > 0 && (fds[0].revents & POLLIN))
			read_events();
		fresh = drain();
		if (keeper.overflow && now_ms() - swept_at >= SWEEP_MS) {
			sweep();
			swept_at = now_ms();
		}
	}
	drain();
	if (keeper.overflow)
		sweep();
	/* the user's empty child cgroups (rmdir refuses one with processes or children; a reused slot
	 * may hold a child before its parent: a second pass takes the parents) */
	for (int pass = 0; pass < 2; pass++)
		for (int i = keeper.ndirs - 1; i >= 0; i--) {
			struct kdir *d = &keeper.dirs[i];

			if (d->fd >= 0 && d->target >= 0 && keeper.dirs[d->parent].fd >= 0 &&
			    unlinkat(keeper.dirs[d->parent].fd, d->name, AT_REMOVEDIR) == 0) {
				keeper.removed++;
				close(d->fd);
				d->fd = -1;
			}
		}
	for (int h = 0; keeper.overflow && h < keeper.nhier; h++)
		if (keeper.dirs[keeper.hier[h].index].fd >= 0)
			remove_unwatched(keeper.dirs[keeper.hier[h].index].fd, 0);
	pthread_mutex_lock(&keeper.lock);
	keeper.finished = 1;
	pthread_cond_signal(&keeper.cond);
	pthread_mutex_unlock(&keeper.lock);
	/* Closing an inotify instance waits for an SRCU grace period (fsnotify_destroy_group): 5-13 ms
	 * here. Only this thread waits, while slurmstepd tells srun and slurmctld. Closed by
	 * tether_cgkeeper_stop it delayed those messages; left to slurmstepd's exit it delayed srun's
	 * end as much (the step's I/O connections close only after it). */
	close(keeper.inotify_fd);
	return NULL;
}

/* The step's directory in each cgroup v1 hierarchy: Slurm's <prefix>/job_<id>/step_<name>. The
 * prefix (e.g. /slurm_n1/uid_1001) is read from slurmstepd's own /proc/self/cgroup, where some
 * hierarchy has it (memory, freezer); slurmstepd itself is not in every one (not in cpuacct), so
 * each hierarchy listed there is then tried with it. */
static int open_step_dirs(uint32_t job_id, const char *slurm_step)
{
	char lines[16][512], job[40], prefix[512] = "", path[2048];
	int n = 0, found = 0;
	FILE *fh = fopen("/proc/self/cgroup", "re");

	if (fh == NULL)
		return 0;
	snprintf(job, sizeof(job), "/job_%u", job_id);
	while (n < 16 && fgets(lines[n], sizeof(lines[n]), fh)) {
		char *cg = strchr(lines[n], ':'), *at;
		size_t jl = strlen(job);

		lines[n][strcspn(lines[n], "\n")] = '\0';
		if (cg && (cg = strchr(cg + 1, ':')) != NULL && !prefix[0]) {
			for (at = strstr(cg + 1, job); at && at[jl] != '\0' && at[jl] != '/'; at = strstr(at + 1, job))
				;
			if (at && (size_t)(at + jl - (cg + 1)) < sizeof(prefix))
				snprintf(prefix, sizeof(prefix), "%.*s", (int)(at + jl - (cg + 1)), cg + 1);
		}
		n++;
	}
	fclose(fh);
	if (!prefix[0] || strstr(prefix, ".."))
		return 0;
	for (int i = 0; i < n; i++) {
		char *ctrl = strchr(lines[i], ':'), *end;
		int fd;

		if (ctrl == NULL || (end = strchr(++ctrl, ':')) == NULL)
			continue;
		*end = '\0';
		if (*ctrl == '\0' || strncmp(ctrl, "name=", 5) == 0 || strchr(ctrl, '/') || strstr(ctrl, ".."))
			continue;   /* cgroup v2, or a named hierarchy: nothing Slurm limits there */
		if (snprintf(path, sizeof(path), "/sys/fs/cgroup/%s%s/%s", ctrl, prefix, slurm_step) >= (int)sizeof(path))
			continue;
		fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0) {
			int index = add_dir(-1, slurm_step, fd);

			if (index >= 0 && keeper.nhier < MAX_HIERARCHIES &&
			    snprintf(keeper.hier[keeper.nhier].ctrl, sizeof(keeper.hier[0].ctrl), "%s", ctrl) <
				    (int)sizeof(keeper.hier[0].ctrl) &&
			    snprintf(keeper.hier[keeper.nhier].path, sizeof(keeper.hier[0].path), "%s/%s", prefix,
				     slurm_step) < (int)sizeof(keeper.hier[0].path))
				keeper.hier[keeper.nhier++].index = index;
			found++;
		}
	}
	return found;
}

int tether_cgkeeper_start(uint32_t job_id, const char *slurm_step)
{
	if (keeper.started)
		return 0;
	keeper.started = -1;   /* tried: never twice */
	keeper.inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (keeper.inotify_fd < 0 || pipe2(keeper.stop_pipe, O_CLOEXEC) != 0)
		goto fail;
	if (open_step_dirs(job_id, slurm_step) == 0)
		goto fail;
	if (pthread_create(&keeper.thread, NULL, keep, NULL) != 0)
		goto fail;
	keeper.started = 1;
	return 0;
fail:
	for (int i = 0; i < keeper.ndirs; i++)
		if (keeper.dirs[i].fd >= 0)
			close(keeper.dirs[i].fd);
	keeper.ndirs = 0;
	if (keeper.inotify_fd >= 0)
		close(keeper.inotify_fd);
	keeper.inotify_fd = -1;
	return -1;
}

void tether_cgkeeper_stop(void)
{
	if (keeper.started != 1)
		return;
	keeper.started = -1;
	if (write(keeper.stop_pipe[1], "x", 1) != 1) {
		slurm_error("tether: the cgroup keeper did not stop");
		return;
	}
	pthread_mutex_lock(&keeper.lock);
	while (!keeper.finished)
		pthread_cond_wait(&keeper.cond, &keeper.lock);
	pthread_mutex_unlock(&keeper.lock);
	pthread_detach(keeper.thread);
	if (keeper.moved || keeper.failed || keeper.overflow)
		slurm_info("tether: kept %lu container process(es) in the step's cgroups (%lu failed, %lu "
			   "cgroup(s) not watched, %lu process(es) swept from those), removed %lu empty child cgroup(s)",
			   keeper.moved, keeper.failed, keeper.overflow, keeper.swept, keeper.removed);
	for (int i = 0; i < keeper.ndirs; i++)
		if (keeper.dirs[i].fd >= 0)
			close(keeper.dirs[i].fd);
	close(keeper.stop_pipe[0]);
	close(keeper.stop_pipe[1]);
}
