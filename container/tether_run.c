/*
 * tether-run: the container launcher slurmstepd hands each task of a container step to.
 *
 * The common case -- podman, a rootfs directory, no other container option, a Slurm rank -- is
 * planned and supervised here, in C: a Python launcher costs each rank ~12 ms of CPU before podman
 * starts (the interpreter's start alone ~7 ms on a 2-core node), which made a containerized step
 * 1.07x the same podman under srun. Everything else (registry images, imports, GPUs, MPI, mounts,
 * named containers, PBS, terminals, any error) goes to the Python launcher, `tether-run-py`, before
 * anything ran: this program then execs it with the same argv and environment, so a rank sees one
 * launcher whatever the path.
 *
 * The plan is container/runtimes/podman.py's `Podman.launch` for that case, baked: run at install
 * with placeholders for the rank's values (container/rank_launcher.py: RankTemplate), its argv, container
 * name, id file and cleanup marker are this program's templates, which it fills in (expand) -- it
 * decides only whether a rank is that case (tests/unit/test_rank_launcher.py compares the two over
 * many rank environments); the supervision
 * is container/launch.py's `_supervise`: the cleanup marker, podman as a child of this child
 * subreaper, the forwarded signals (in a Slurm step's cgroup to the container's first process),
 * conmon and whatever podman left reaped (never waited for: podman's pause process). A run that did not end cleanly -- a signal, podman's own
 * failure (exit 125-127, or 1 before it made the container), a process killed below it -- is
 * concluded by the Python launcher (TETHER_RUN_RESUME: what happened), which retries, removes the
 * container and says why, as it always did.
 *
 * The common enroot rank -- a squashfs file, no container option but the image, values enroot's
 * environment file carries, no terminal, PMI_FD or ROCm GPU -- runs here too (enroot_plan,
 * enroot_before): the step's enroot create on the node (create_ahead, by a child, under the
 * node's lock), the --conf script, the start turn, enroot start, supervised as podman
 * is: Enroot.launch's own, baked (rank_launcher.py: ahead_plan, start_plan). A create still
 * running after a second goes to the Python launcher, which tells it; a rank of its case that
 * needs more (a value with a line break, MPI's PMI_FD) gets the create ahead, then the Python
 * launcher, whose ~30 ms start then overlaps the unpacking.
 *
 * The configuration is baked in at install (tether_run_baked.h, written by
 * container/rank_launcher.py): the config file's identity is compared with the file's, and a
 * changed file sends every rank to the Python launcher, which reads it again, until `tether slurm
 * install` runs again.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tether_run_baked.h"

extern char **environ;

#define EXIT_LAUNCH_FAILED 125
#define MAX_ARGS 256
#define MAX_PIDS 1024

static const int FORWARDED[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM};
#define N_FORWARDED ((int)(sizeof(FORWARDED) / sizeof(FORWARDED[0])))

/* ---- the hand-over to the Python launcher ---- */

static char **self_argv;
static sigset_t original_mask;      /* the signal mask this launcher was started with */

/* Exec the Python launcher with this launcher's argv and environment (``resume``: what the run
 * here left for it to conclude, or NULL); exit 125 with the reason if even that fails. */
static void __attribute__((noreturn)) to_python(const char *why, const char *resume)
{
	sigprocmask(SIG_SETMASK, &original_mask, NULL);
	if (getenv(TETHER_ENV_RUN_WHY_PYTHON) != NULL)     /* the tests' question: which way, and why */
		fprintf(stderr, "tether-run: python: %s\n", why);
	if (resume)
		setenv(TETHER_ENV_RUN_RESUME, resume, 1);
	self_argv[0] = (char *)TR_PYTHON_LAUNCHER;
	execv(TR_PYTHON_LAUNCHER, self_argv);
	fprintf(stderr, "tether: cannot run tether's container launcher %s: %s\n", TR_PYTHON_LAUNCHER,
		strerror(errno));
	_exit(EXIT_LAUNCH_FAILED);
}

/* ---- small string helpers ---- */

static int starts_with(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* [A-Za-z_][A-Za-z0-9_]* (spec.py: is_env_name) */
static int env_name_ok(const char *s, size_t len)
{
	if (len == 0 || (s[0] >= '0' && s[0] <= '9'))
		return 0;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
			return 0;
	}
	return 1;
}

static int ascii_printable(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
			return 0;
	return 1;
}

/* A path the plan may use verbatim where Python joins it: absolute, printable ASCII, no empty,
 * "." or ".." component, no trailing slash, no ':' or ',' (podman's --volume separators). */
static int plain_path(const char *p)
{
	if (p == NULL || p[0] != '/' || !ascii_printable(p) || strpbrk(p, ":, ") != NULL || strlen(p) > 3000)
		return 0;
	if (strstr(p, "//") || strstr(p, "/./") || strstr(p, "/../"))
		return 0;
	size_t n = strlen(p);
	if (n < 2 || p[n - 1] == '/' || (n >= 2 && strcmp(p + n - 2, "/.") == 0) ||
	    (n >= 3 && strcmp(p + n - 3, "/..") == 0))
		return 0;
	return 1;
}

/* spec.py's _safe_id: letters, digits, '_.-'; others '_'; at most 40; "0" when empty. ASCII only
 * (a non-ASCII id goes to Python, whose slicing counts characters, not bytes). */
static int safe_id(const char *value, char *out, size_t size)
{
	size_t n = 0;

	for (const char *c = value; *c && n < 40 && n + 1 < size; c++) {
		unsigned char u = (unsigned char)*c;
		if (u >= 0x80)
			return -1;
		out[n++] = ((u >= 'A' && u <= 'Z') || (u >= 'a' && u <= 'z') || (u >= '0' && u <= '9') ||
			    u == '_' || u == '.' || u == '-') ? (char)u : '_';
	}
	out[n] = '\0';
	if (n == 0)
		snprintf(out, size, "0");
	return 0;
}

/* snprintf that says when it cut: 0, or -1 */
static int __attribute__((format(printf, 3, 4))) fmt(char *out, size_t size, const char *format, ...)
{
	va_list ap;
	int n;

	va_start(ap, format);
	n = vsnprintf(out, size, format, ap);
	va_end(ap);
	return n < 0 || (size_t)n >= size ? -1 : 0;
}

static const char *env_or(const char *name, const char *fallback)
{
	const char *v = getenv(name);
	return (v && *v) ? v : fallback;
}

/* ---- the plan ---- */

/* The variables only the launchers read (container/run.py pops them before planning). */
static int launcher_own(const char *entry)
{
	return starts_with(entry, TETHER_ENV_RUN_ARGV0 "=") || starts_with(entry, TETHER_ENV_RUN_SUBREAPER "=") ||
	       starts_with(entry, TETHER_ENV_RUN_RESUME "=");
}

struct plan {
	const char *argv[MAX_ARGS];
	int argc;
	char **envp;              /* podman's environment */
	int names_fd;             /* the --env-file memfd, or -1 */
	char *name;               /* the templates filled in (expand): tether-<job>-<step>-<rank> */
	char *created;            /* <rank dir>/.cid */
	char *marker;             /* <step dir>/.cleanup-<rank> */
	char *marker_data;
	char rank_dir[PATH_MAX];
	char store[PATH_MAX];     /* the user's podman store */
	char pause_pid[PATH_MAX]; /* podman's record of its pause process (podman.py: pause_pid_file) */
	/* an enroot rank run here (enroot_plan): its scripts, locks and root; ``marker`` is NULL */
	int enroot;
	char *conf_path, *conf_text, *node_lock, *start_lock, *root;
};

/* One of RankTemplate's templates with the rank's values: '\1' and a letter is the value at that
 * letter (rank_launcher.py: PLACEHOLDERS); NULL for a letter without one, or out of memory. */
static char *expand(const char *template, const char *const *values)
{
	size_t len = 0;
	char *out, *o;

	for (const char *t = template; *t; t++) {
		if (*t != '\001') {
			len++;
			continue;
		}
		if (t[1] == '\0' || values[(unsigned char)t[1] & 127] == NULL)
			return NULL;
		len += strlen(values[(unsigned char)*++t & 127]);
	}
	if ((out = malloc(len + 1)) == NULL)
		return NULL;
	for (o = out; *template; template++) {
		if (*template != '\001') {
			*o++ = *template;
			continue;
		}
		const char *v = values[(unsigned char)*++template & 127];
		size_t n = strlen(v);
		memcpy(o, v, n);
		o += n;
	}
	*o = '\0';
	return out;
}

static void add(struct plan *p, const char *arg, const char **why)
{
	if (p->argc >= MAX_ARGS - 1) {
		*why = "too many arguments for the fast path";
		return;
	}
	p->argv[p->argc++] = arg;
	p->argv[p->argc] = NULL;
}

/* The plan's argv: ``template`` filled in, the command at its placeholder; -1 with ``*why`` */
static int add_argv(struct plan *p, const char *const *template, char **command, const char *const *values,
		    const char **why)
{
	for (const char *const *a = template; *a && !*why; a++) {
		if (strcmp(*a, "\001C") == 0) {
			for (char **c = command; *c; c++)
				add(p, *c, why);
			continue;
		}
		char *arg = expand(*a, values);
		if (arg == NULL)
			*why = "a template the launcher cannot fill in";
		else
			add(p, arg, why);
	}
	return *why ? -1 : 0;
}

/* Two "NAME=value" entries by NAME (Python: sorted(names)) */
static int cmp_name(const void *a, const void *b)
{
	const char *x = *(const char *const *)a, *y = *(const char *const *)b;
	size_t nx = strcspn(x, "="), ny = strcspn(y, "=");
	int c = memcmp(x, y, nx < ny ? nx : ny);
	return c ? c : (nx > ny) - (nx < ny);
}

/* Is the name of ``len`` bytes at ``name`` (not NUL-terminated) in ``list``, or does it start
 * with one of its prefixes? Any length: a name as long as the kernel allows is a name too. */
static int name_in(const char *name, size_t len, const char *const *list)
{
	for (; *list; list++)
		if (strlen(*list) == len && memcmp(name, *list, len) == 0)
			return 1;
	return 0;
}

static int name_has_prefix_in(const char *name, size_t len, const char *const *list)
{
	for (; *list; list++) {
		size_t n = strlen(*list);
		if (n <= len && memcmp(name, *list, n) == 0)
			return 1;
	}
	return 0;
}

/* Is this environment entry one that goes into the container by name (environment.py:
 * passed_from_host; the rank's tether values and TETHER_RUN_* dropped already)? */
static int passed(const char *entry, size_t len)
{
	int image_wins;

	if (!env_name_ok(entry, len))
		return 0;
	if (name_in(entry, len, TR_OWN_NAMES) || name_in(entry, len, TR_HOST_ONLY) ||
	    name_has_prefix_in(entry, len, TR_RUNTIME_CONTROL) || name_in(entry, len, TR_RUNTIME_CONTROL_NAMES))
		return 0;
	image_wins = name_in(entry, len, TR_IMAGE_NAMES) || name_has_prefix_in(entry, len, TR_IMAGE_PREFIXES);
	if (TR_ENV_INHERIT)
		return !image_wins;
	return (name_in(entry, len, TR_PASS_NAMES) || name_has_prefix_in(entry, len, TR_PASS_PREFIXES)) && !image_wins;
}

/* The entries of ``host`` that go into the container (passed), sorted by name, in ``*count``;
 * NULL out of memory. */
static const char **passed_sorted(char **host, size_t *count)
{
	size_t n = 0, cap = 64;
	const char **items = malloc(cap * sizeof *items);

	if (items == NULL)
		return NULL;
	for (char **e = host; *e; e++) {
		const char *eq = strchr(*e, '=');
		if (eq == NULL || !passed(*e, (size_t)(eq - *e)))
			continue;
		if (n == cap) {
			const char **more = realloc(items, (cap *= 2) * sizeof *items);
			if (more == NULL) {
				free(items);
				return NULL;
			}
			items = more;
		}
		items[n++] = *e;
	}
	qsort(items, n, sizeof *items, cmp_name);
	*count = n;
	return items;
}

/* The memfd with the passed names, sorted, one per line, at fd 10 or above (podman.py:
 * env_names_fd); -1 with none; -2 on an error. */
static int names_memfd(char **host)
{
	size_t n;
	const char **names = passed_sorted(host, &n);
	int fd, high;

	if (names == NULL)
		return -2;
	if (n == 0) {
		free(names);
		return -1;
	}
	fd = memfd_create("tether-env-names", 0);
	if (fd < 0) {
		free(names);
		return -2;
	}
	for (size_t i = 0; i < n; i++) {
		size_t len = (size_t)(strchr(names[i], '=') - names[i]);
		if (dprintf(fd, "%.*s\n", (int)len, names[i]) < 0) {
			close(fd);
			free(names);
			return -2;
		}
	}
	free(names);
	high = fcntl(fd, F_DUPFD_CLOEXEC, 10);
	close(fd);
	return high < 0 ? -2 : high;
}

/* runtimes/__init__.py: own_directory -- a real directory of ``uid`` (not a symlink); ``private``:
 * and nobody else may enter it (made so when it is the user's own). */
static int own_directory(const char *path, uid_t uid, int private)
{
	struct stat st;

	if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != uid)
		return -1;
	if (private && (st.st_mode & 077) && chmod(path, 0700) < 0)
		return -1;
	return 0;
}

/* runtimes/__init__.py: store_directory (os.makedirs, then each directory from the first one named
 * after the user down is the user's own). */
static int store_directory(const char *template, uid_t uid, char *out, size_t size)
{
	const char *at = strstr(template, "{uid}");
	char path[PATH_MAX];
	int first = 0, parts = 0;

	if (at == NULL || strstr(at + 5, "{uid}") != NULL)
		return -1;                /* no {uid}, or two: Python's replace() and count() decide */
	if (at > template && at[-1] == '/' && (at[5] == '/' || at[5] == '\0')) {
		/* runtimes/__init__.py: _user_dir -- {uid} a whole component: the directory above it is
		 * root's, and root made <it>/<uid> for the user (else the Python launcher says why) */
		char base[PATH_MAX];
		struct stat st;

		if (snprintf(base, sizeof base, "%.*s", (int)(at - 1 - template), template) >= (int)sizeof base ||
		    base[0] != '/' || lstat(base, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0 ||
		    (st.st_mode & 022))
			return -1;
	}
	if (snprintf(path, sizeof path, "%.*s%u%s", (int)(at - template), template, (unsigned)uid, at + 5) >= (int)sizeof path)
		return -1;
	for (size_t n = strlen(path); n > 1 && path[n - 1] == '/'; n--)
		path[n - 1] = '\0';
	if (!plain_path(path))
		return -1;
	for (const char *c = template; c < at; c++)
		first += *c == '/';
	/* os.makedirs(path, 0o700, exist_ok=True) */
	for (char *c = path + 1;; c++) {
		if (*c == '/' || *c == '\0') {
			char keep = *c;
			*c = '\0';
			if (mkdir(path, 0700) < 0 && errno != EEXIST)
				return -1;
			*c = keep;
			if (keep == '\0')
				break;
		}
	}
	for (const char *c = path; *c; c++)
		parts += *c == '/';
	/* parts = len(path.split("/")) - 1; check "/".join(parts[:end]) for end in first+1 .. len */
	for (int end = first + 1; end <= parts + 1; end++) {
		char prefix[PATH_MAX];
		int seen = 0;
		size_t i = 0;
		for (; path[i]; i++) {
			if (path[i] == '/' && ++seen == end)
				break;
		}
		memcpy(prefix, path, i);
		prefix[i] = '\0';
		if (prefix[0] == '\0' || own_directory(prefix, uid, end == parts + 1) < 0)
			return -1;
	}
	snprintf(out, size, "%s", path);
	return 0;
}

/* Does the config file still have the identity baked in? */
static int config_current(void)
{
	struct stat st;

	if (!TR_HAS_IDENTITY)
		return stat(TR_CONFIG_PATH, &st) < 0;     /* baked without a file: still none */
	if (stat(TR_CONFIG_PATH, &st) < 0)
		return 0;
	return (unsigned long long)st.st_ino == TR_CONFIG_INO && (long long)st.st_size == TR_CONFIG_SIZE &&
	       (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec == TR_CONFIG_MTIME_NS;
}

static int lexists_in(const char *root, const char *rel)
{
	char path[PATH_MAX];
	struct stat st;

	if (snprintf(path, sizeof path, "%s/%s", root, rel) >= (int)sizeof path)
		return 0;
	return lstat(path, &st) == 0;
}

/* A Slurm task of a container step (not cleanup, gateways, a batch script or PBS): both of this
 * launcher's paths take only those. */
static int slurm_task(void)
{
	return getenv("SLURM_JOB_ID") != NULL && !getenv(TETHER_ENV_CLEANUP) && !getenv(TETHER_ENV_RUN_GATEWAYS) &&
	       !getenv(TETHER_ENV_RUN_BATCH) && !getenv("PBS_JOBID");
}

/* A container option in the environment besides the image (and ``also``, a whole entry, or NULL) */
static int other_container_option(const char *also)
{
	for (char **e = environ; *e; e++)
		if ((starts_with(*e, "TETHER_CONTAINER_") && !starts_with(*e, TR_IMAGE_VAR "=") &&
		     (also == NULL || strcmp(*e, also) != 0)) || starts_with(*e, "TETHER_NO_CONTAINER_"))
			return 1;
	return 0;
}

/* spec.py's job, step and rank ids, made safe (safe_id); -1 for a non-ASCII one */
static int rank_ids(char job[48], char step[48], char rank[48])
{
	return safe_id(env_or("SLURM_JOB_ID", env_or("PBS_JOBID", "0")), job, 48) < 0 ||
	       safe_id(env_or("SLURM_STEP_ID", env_or("PBS_TASKNUM", "0")), step, 48) < 0 ||
	       safe_id(env_or(TETHER_ENV_RANK, env_or("SLURM_PROCID", "0")), rank, 48) < 0 ? -1 : 0;
}

/* The plan, or NULL with ``*why`` saying why this rank goes to the Python launcher. */
static struct plan *make_plan(char **command, const char **why)
{
	static struct plan p;
	const char *image, *rank_dir, *value;
	char job[48], step[48], rank[48];
	struct stat st, mq, dev;
	uid_t uid = getuid();
	size_t envc = 0;
	int isatty_any = isatty(0) || isatty(1) || isatty(2);

#define NO(reason) do { *why = (reason); return NULL; } while (0)
	if (!TR_FAST)
		NO(TR_WHY_NOT_FAST);
	if (!config_current())
		NO("tether's configuration changed since the launcher was installed");
	if (command[0] == NULL || command[0][0] == '\0')
		NO("no command");
	if (!slurm_task())
		NO("not a Slurm task of a container step");
	value = getenv(TETHER_ENV_RUN_SUBREAPER);
	if (value && strcmp(value, "0") == 0)
		NO("not made a child subreaper by the SPANK plugin");
	if (uid == 0)
		NO("root");
	if (isatty_any)
		NO("a terminal");
	if (getenv("PMI_FD") || getenv("PMIX_SERVER_TMPDIR"))
		NO("MPI (PMI-2 or PMIx)");
	value = getenv(TETHER_ENV_SLOT_IDS);
	if (value && *value) {
		const char *type = env_or(TR_SLOT_TYPE_VAR, "cuda");
		if (strcmp(type, "cpu") != 0 && strspn(value, ",") != strlen(value))
			NO("GPUs");
	}
	if (other_container_option(NULL))
		NO("a container option besides the image");
	for (char **e = environ; *e; e++)
		envc++;
	image = getenv(TR_IMAGE_VAR);
	if (image == NULL || strlen(image) > TR_MAX_TEXT || !plain_path(image))   /* hooks/imageref.py: an absolute path of printable characters is a local image */
		NO("not a rootfs directory's plain path");
	rank_dir = getenv(TETHER_ENV_RANK_DIR);
	if (rank_dir == NULL || !plain_path(rank_dir) || strlen(rank_dir) > PATH_MAX - 64)
		NO("no rank directory");
	if (stat(image, &st) < 0 || !S_ISDIR(st.st_mode) || access(image, R_OK | X_OK) < 0)
		NO("the image is not a directory you can read");
	if (access(image, W_OK) < 0) {        /* shared: only as it is, when it has every mount target */
		for (const char *const *t = TR_ROOTFS_TARGETS; *t; t++)
			if (!lexists_in(image, *t))
				NO("a shared rootfs without podman's mount targets (imported)");
	}
	if (rank_ids(job, step, rank) < 0)
		NO("a non-ASCII id");
	if (fmt(p.rank_dir, sizeof p.rank_dir, "%s", rank_dir) < 0)
		NO("a path too long for the fast path");

	/* podman's run directory (podman.py: Podman.run_dir): a configured XDG_RUNTIME_DIR, else the
	 * user's own that root made -- never the task's XDG_RUNTIME_DIR, which a login node set */
	static char run_base[PATH_MAX], xdg_entry[PATH_MAX + 32];
	int xdg_configured = 0;
	for (const char *const *r = TR_RUNTIME_ENV; *r; r++)
		if (starts_with(*r, "XDG_RUNTIME_DIR=")) {
			xdg_configured = 1;
			if (fmt(run_base, sizeof run_base, "%s", *r + strlen("XDG_RUNTIME_DIR=")) < 0)
				NO("a path too long for the fast path");
		}
	if (!xdg_configured && fmt(run_base, sizeof run_base, "%s/%u", TR_USER_RUN_ROOT, (unsigned)uid) < 0)
		NO("a path too long for the fast path");
	if (fmt(xdg_entry, sizeof xdg_entry, "XDG_RUNTIME_DIR=%s", run_base) < 0)
		NO("a path too long for the fast path");
	if (fmt(p.pause_pid, sizeof p.pause_pid, "%s/%s", run_base, TR_PAUSE_PID_FILE) < 0)
		NO("a path too long for the fast path");

	/* podman's environment: the task's (less TETHER_RUN_* and XDG_RUNTIME_DIR), the configured
	 * runtime env, the run directory, and no TMPDIR unless configured (rootless podman keeps
	 * temporary files under $TMPDIR) */
	p.envp = calloc(envc + TR_RUNTIME_ENV_COUNT + 2, sizeof *p.envp);
	if (p.envp == NULL)
		NO("out of memory");
	size_t n = 0;
	for (char **e = environ; *e; e++) {
		const char *eq = strchr(*e, '=');
		int replaced = 0;
		if (eq == NULL || launcher_own(*e) || starts_with(*e, "XDG_RUNTIME_DIR="))
			continue;
		if (!TR_RUNTIME_ENV_HAS_TMPDIR && starts_with(*e, TETHER_ENV_TMPDIR "="))
			continue;
		for (const char *const *r = TR_RUNTIME_ENV; *r; r++)
			if (strncmp(*r, *e, (size_t)(eq - *e) + 1) == 0)
				replaced = 1;
		if (!replaced)
			p.envp[n++] = *e;
	}
	for (const char *const *r = TR_RUNTIME_ENV; *r; r++)
		p.envp[n++] = (char *)*r;
	if (!xdg_configured)
		p.envp[n++] = xdg_entry;
	p.envp[n] = NULL;

	/* the names into the container: from the task's environment (Python: host_env), not the
	 * runtime's additions; a configured runtime variable the task also has was replaced above,
	 * so look at the task's own entries */
	{
		char **host = calloc(envc + 1, sizeof *host);
		size_t h = 0;
		if (host == NULL)
			NO("out of memory");
		for (char **e = environ; *e; e++)
			if (!launcher_own(*e))
				host[h++] = *e;
		host[h] = NULL;
		p.names_fd = names_memfd(host);
		free(host);
		if (p.names_fd == -2)
			NO("cannot make the environment names file");
	}

	if (TR_STORE_TEMPLATE[0]) {
		if (store_directory(TR_STORE_TEMPLATE, uid, p.store, sizeof p.store) < 0)
			NO("the podman store needs a check the Python launcher makes");
		if (!plain_path(run_base))
			NO("an unusual run directory");
		if (own_directory(run_base, uid, 0) < 0)
			NO("podman's run directory is missing or not yours");
	}
	if (p.names_fd < 0)
		NO("no variable to pass into the container");

	/* Podman.launch's plan for this case (RankTemplate), filled in */
	{
		static char step_dir[PATH_MAX], fd_text[16];
		const char *values[128] = {0};
		const char *slash = strrchr(p.rank_dir, '/');
		/* the node's IPC namespace needs its /dev/mqueue (podman.py: node_has_mqueue) */
		int mqueue = stat("/dev/mqueue", &mq) == 0 && stat("/dev", &dev) == 0 && mq.st_dev != dev.st_dev;
		const char *const *template = mqueue ? TR_ARGV_MQUEUE : TR_ARGV_NO_MQUEUE;

		if (slash == NULL || slash == p.rank_dir || slash[1] == '\0' ||
		    fmt(step_dir, sizeof step_dir, "%.*s", (int)(slash - p.rank_dir), p.rank_dir) < 0)
			NO("a rank directory not below a step directory");
		fmt(fd_text, sizeof fd_text, "%d", p.names_fd);
		values['J'] = job;
		values['S'] = step;
		values['K'] = rank;
		values['D'] = step_dir;
		values['B'] = slash + 1;
		values['I'] = image;
		values['T'] = p.store;
		values['U'] = run_base;
		values['F'] = fd_text;
		if ((p.name = expand(TR_CONTAINER_TEMPLATE, values)) == NULL ||
		    (p.created = expand(TR_CREATED_TEMPLATE, values)) == NULL ||
		    (p.marker = expand(TR_MARKER_TEMPLATE, values)) == NULL ||
		    (p.marker_data = expand(TR_MARKER_DATA_TEMPLATE, values)) == NULL)
			NO("a template the launcher cannot fill in");
		if (add_argv(&p, template, command, values, why) < 0)
			return NULL;
	}
	return &p;
#undef NO
}

/* ---- the supervision (launch.py: _supervise) ---- */

static int read_small(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, size - 1);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = '\0';
	return (int)n;
}

/* The cgroup v1 freezer path of ``pid`` (0: this process) into ``out``; 0, or -1. */
static int freezer_of(pid_t pid, char *out, size_t size)
{
	char path[64], text[4096];

	if (pid)
		snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
	else
		snprintf(path, sizeof path, "/proc/self/cgroup");
	if (read_small(path, text, sizeof text) < 0)
		return -1;
	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (c2 == NULL)
			continue;
		*c2 = '\0';
		for (char *ctl = strtok(c1 + 1, ","); ctl; ctl = strtok(NULL, ","))
			if (strcmp(ctl, "freezer") == 0) {
				snprintf(out, size, "%s", c2 + 1);
				return 0;
			}
	}
	return -1;
}

/* launch.py: slurm_tracked_cgroup -- this process's freezer cgroup when it is a Slurm step's
 * (a component job_* followed by one step_*). */
static int tracked_cgroup(char *out, size_t size)
{
	char path[PATH_MAX];
	int after_job = 0;

	if (freezer_of(0, path, sizeof path) < 0)
		return 0;
	snprintf(out, size, "%s", path);
	for (const char *c = path;; c = strchr(c, '/') + 1) {
		if (after_job && starts_with(c, "step_"))
			return 1;
		after_job = starts_with(c, "job_");
		if (strchr(c, '/') == NULL)
			return 0;
	}
}

static int children_of(pid_t pid, pid_t *out, int have, int max)
{
	char path[96], text[8192];
	DIR *dir;
	struct dirent *d;

	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	if ((dir = opendir(path)) == NULL)
		return have;
	while ((d = readdir(dir)) != NULL) {
		if (d->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "/proc/%d/task/%.20s/children", (int)pid, d->d_name);
		if (read_small(path, text, sizeof text) < 0)
			continue;
		for (char *tok = strtok(text, " \n"); tok && have < max; tok = strtok(NULL, " \n")) {
			pid_t kid = (pid_t)atoi(tok);
			int seen = 0;
			for (int i = 0; i < have; i++)
				seen |= out[i] == kid;
			if (kid > 0 && !seen)
				out[have++] = kid;
		}
	}
	closedir(dir);
	return have;
}

static int comm_is(pid_t pid, const char *name)
{
	char path[64], text[64];

	snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
	if (read_small(path, text, sizeof text) < 0)
		return 0;
	text[strcspn(text, "\n")] = '\0';
	return strcmp(text, name) == 0;
}

/* Is ``pid`` named as podman's pause process is (podman.py: PAUSE_NAMES)? */
static int is_pause_name(pid_t pid)
{
	for (const char *const *name = TR_PAUSE_NAMES; *name; name++)
		if (comm_is(pid, *name))
			return 1;
	return 0;
}

/* podman's pause process (podman.py: PAUSE_NAMES, launch.py: runtime_own): the pid its record
 * ``path`` holds when that process is alive under one of the pause process's names, else 0 -- a
 * stale record whose pid went to another process names nothing. Never blocks, follows no symlink. */
static pid_t runtime_own(const char *path)
{
	char text[16];
	struct stat st;
	ssize_t n;
	long pid = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);

	if (fd < 0)
		return 0;
	n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read(fd, text, sizeof text - 1) : -1;
	close(fd);
	if (n <= 0)
		return 0;
	if (text[n - 1] == '\n')
		n--;
	if (n == 0 || n > 10)
		return 0;
	for (ssize_t i = 0; i < n; i++) {
		if (text[i] < '0' || text[i] > '9')
			return 0;
		pid = pid * 10 + (text[i] - '0');
	}
	if (pid <= 0 || pid > INT_MAX)
		return 0;
	return is_pause_name((pid_t)pid) ? (pid_t)pid : 0;
}

static pid_t child = -1;
static int tracked;
static char tracked_path[PATH_MAX];
static char received[64];      /* the signals forwarded, comma-separated */

/* launch.py: _supervise's forward */
static void forward(int signum)
{
	pid_t below[MAX_PIDS], first[MAX_PIDS], targets[MAX_PIDS];
	int nb = 0, nf = 0, nt = 0;
	size_t used = strlen(received);

	if (used + 5 < sizeof received)     /* each whole; past ~12 of them, the first ones say enough */
		snprintf(received + used, sizeof received - used, "%s%d", used ? "," : "", signum);
	/* every process below this one, nearest first, the runtime (our child) left out */
	nb = children_of(getpid(), below, 0, MAX_PIDS);
	for (int i = 0; i < nb; i++)
		nb = children_of(below[i], below, nb, MAX_PIDS);
	{
		int k = 0;
		for (int i = 0; i < nb; i++)
			if (below[i] != child)
				below[k++] = below[i];
		nb = k;
	}
	if (!tracked) {
		if (child > 0)
			targets[nt++] = child;
		for (int i = 0; i < nb && nt < MAX_PIDS; i++)
			targets[nt++] = below[i];
	} else {
		for (int i = 0; i < nb; i++)
			if (comm_is(below[i], "conmon"))
				nf = children_of(below[i], first, nf, MAX_PIDS);
		if (nf) {
			for (int i = 0; i < nf; i++)
				targets[nt++] = first[i];
		} else if (child > 0) {
			targets[nt++] = child;
		}
		for (int i = 0; i < nb && nt < MAX_PIDS; i++) {
			char cg[PATH_MAX];
			int in_first = 0;
			for (int j = 0; j < nf; j++)
				in_first |= first[j] == below[i];
			if (in_first)
				continue;
			if (freezer_of(below[i], cg, sizeof cg) < 0 || strcmp(cg, tracked_path) != 0)
				targets[nt++] = below[i];
		}
	}
	for (int i = 0; i < nt; i++)
		kill(targets[i], signum);
}

/* What is left until ``end`` (CLOCK_MONOTONIC) in ``left``; 0 when it has passed. */
static int time_left(const struct timespec *end, struct timespec *left)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	left->tv_sec = end->tv_sec - now.tv_sec;
	left->tv_nsec = end->tv_nsec - now.tv_nsec;
	if (left->tv_nsec < 0) {
		left->tv_sec--;
		left->tv_nsec += 1000000000L;
	}
	return left->tv_sec >= 0;
}

/* ---- the enroot create started ahead (rank_launcher.py: ahead_plan) ---- */

/* Python's os.path.dirname of an absolute path without a trailing slash */
static void dir_of(const char *path, char *out, size_t size)
{
	const char *slash = strrchr(path, '/');
	size_t n = slash == NULL ? 0 : (size_t)(slash - path);

	while (n > 1 && path[n - 1] == '/')
		n--;                 /* "/a/bin//enroot" -> "/a/bin" */
	if (n == 0)
		n = 1;               /* "/enroot" -> "/" */
	snprintf(out, size, "%.*s", (int)n, path);
}

/* Enroot.base_env: the task's environment (less the launcher's own variables), the configured
 * runtime env over it, an absolute binary's directory and its link target's first on PATH (moved
 * there if later on it) -- then the launch's additions (ENROOT_DATA_PATH and the like), which
 * Python sets only where unset: a task or configuration that sets one goes without the create
 * ahead (the Python launcher's own case). NULL with ``*why``. */
static char **ahead_env(const char *const *values, const char **why)
{
	static char path_entry[8192];
	size_t envc = 0, n = 0;
	char **envp;
	const char *old_path = NULL;

	for (char **e = environ; *e; e++)
		envc++;
	/* the launch's additions with the user's run directory (Enroot.own_run_dir), or without */
	const char *const *added = values['R'] ? TR_AHEAD_ADDED : TR_AHEAD_ADDED_WITHOUT_RUN_DIR;
	size_t addedc = 0;
	for (const char *const *a = added; *a; a++)
		addedc++;
	envp = calloc(envc + sizeof TR_AHEAD_RUNTIME_ENV / sizeof(char *) + addedc + 2, sizeof *envp);
	if (envp == NULL) {
		*why = "out of memory";
		return NULL;
	}
	int path_seen = 0;
	for (char **e = environ; *e; e++) {
		const char *eq = strchr(*e, '=');
		int replaced = 0;
		if (eq == NULL || launcher_own(*e))
			continue;
		if (starts_with(*e, "PATH=") && path_seen++)
			continue;             /* a second PATH: os.environ keeps the first */
		for (const char *const *r = TR_AHEAD_RUNTIME_ENV; *r; r++)
			if (strncmp(*r, *e, (size_t)(eq - *e) + 1) == 0)
				replaced = 1;
		if (!replaced)
			envp[n++] = *e;
	}
	for (const char *const *r = TR_AHEAD_RUNTIME_ENV; *r; r++)
		envp[n++] = (char *)*r;
	for (size_t i = 0; i < n; i++)
		if (starts_with(envp[i], "PATH="))
			old_path = envp[i] + 5;
	if (TR_AHEAD_BINARY[0] == '/') {
		char first[PATH_MAX], second[PATH_MAX], real[PATH_MAX], *o = path_entry, *end = path_entry + sizeof path_entry;
		const char *rest = (old_path && *old_path) ? old_path : "/bin:/usr/bin";     /* os.defpath */
		int len;

		if (realpath(TR_AHEAD_BINARY, real) == NULL) {
			*why = "the enroot binary cannot be resolved";
			return NULL;
		}
		dir_of(TR_AHEAD_BINARY, first, sizeof first);
		dir_of(real, second, sizeof second);
		len = strcmp(first, second) == 0 ? snprintf(o, (size_t)(end - o), "PATH=%s", first)
						 : snprintf(o, (size_t)(end - o), "PATH=%s:%s", first, second);
		if (len < 0 || len >= end - o) {
			*why = "a PATH too long";
			return NULL;
		}
		o += len;
		for (const char *d = rest;; ) {
			size_t dl = strcspn(d, ":");
			if (!((strlen(first) == dl && strncmp(d, first, dl) == 0) ||
			      (strlen(second) == dl && strncmp(d, second, dl) == 0))) {
				if (o + 1 + dl + 1 > end) {
					*why = "a PATH too long";
					return NULL;
				}
				*o++ = ':';
				memcpy(o, d, dl);
				o += dl;
				*o = '\0';
			}
			if (d[dl] == '\0')
				break;
			d += dl + 1;
		}
		size_t i;
		for (i = 0; i < n && !starts_with(envp[i], "PATH="); i++)
			;
		envp[i == n ? n++ : i] = path_entry;
	}
	for (const char *const *a = added; *a; a++) {
		size_t name_len = strcspn(*a, "=");
		for (size_t i = 0; i < n; i++)
			if (strncmp(envp[i], *a, name_len + 1) == 0) {
				*why = "the job or the configuration sets one of enroot's paths";
				return NULL;
			}
		if ((envp[n++] = expand(*a, values)) == NULL) {
			*why = "a template the launcher cannot fill in";
			return NULL;
		}
	}
	envp[n] = NULL;
	return envp;
}

/* os.makedirs(path, 0o700, exist_ok=True) for a path below ``base`` (which exists) */
static int make_below(const char *base, const char *path)
{
	char part[PATH_MAX];
	size_t b = strlen(base);

	if (strncmp(path, base, b) != 0 || path[b] != '/' || strlen(path) >= sizeof part)
		return -1;
	for (const char *s = path + b + 1;; s++) {
		if (*s != '/' && *s != '\0')
			continue;
		snprintf(part, sizeof part, "%.*s", (int)(s - path), path);
		if (mkdir(part, 0700) < 0 && errno != EEXIST)
			return -1;
		if (*s == '\0')
			return 0;
	}
}

/* Close every descriptor above 2 but ``keep`` (-1: none): close_range where the kernel has it
 * (by its number: a C library older than 2.34 has no wrapper), else what /proc/self/fd lists. */
static void close_above_2(int keep)
{
	DIR *dir;
	struct dirent *d;

#ifdef SYS_close_range
	if (keep < 0 ? syscall(SYS_close_range, 3U, ~0U, 0U) == 0
		     : (keep == 3 || syscall(SYS_close_range, 3U, (unsigned)keep - 1, 0U) == 0) &&
			       syscall(SYS_close_range, (unsigned)keep + 1, ~0U, 0U) == 0)
		return;
#endif
	if ((dir = opendir("/proc/self/fd")) == NULL)
		return;
	while ((d = readdir(dir)) != NULL) {
		int fd = atoi(d->d_name);
		if (fd > 2 && fd != keep && fd != dirfd(dir))
			close(fd);
	}
	closedir(dir);
}

/* stdin, stdout and stderr on /dev/null; -1 when it cannot be opened */
static int stdio_to_null(void)
{
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);

	return null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0 ? -1 : 0;
}

/* Run ``argv`` as run_quick does (its own session, stdin /dev/null, SIGPIPE and SIGXFSZ at their
 * defaults, no descriptor above 2) with its output discarded -- the Python launcher runs a failed
 * create again and tells its words; 0 when it exited 0 within ``seconds``, -1 when it failed or
 * took longer, -2 when the rank is over (``stop``, blocked here, came: SIGHUP from the rank's end,
 * SIGTERM or SIGINT) -- then its group is killed and nothing more is run. */
static int run_quietly(char *const *argv, char **envp, int seconds, const sigset_t *stop)
{
	struct timespec end, left;
	sigset_t wait_for = *stop;
	int status;
	pid_t pid = fork();

	if (pid < 0)
		return -1;
	if (pid == 0) {
		setsid();
		signal(SIGPIPE, SIG_DFL);
		signal(SIGXFSZ, SIG_DFL);
		sigprocmask(SIG_SETMASK, &original_mask, NULL);
		if (stdio_to_null() < 0)
			_exit(126);
		close_above_2(-1);
		environ = envp;
		execvp(argv[0], argv);
		_exit(127);
	}
	sigaddset(&wait_for, SIGCHLD);
	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += seconds;
	for (;;) {
		pid_t got = waitpid(pid, &status, WNOHANG);
		int sig;
		if (got == pid)
			return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
		if (got < 0 && errno != EINTR)
			return -1;
		/* every signal here is blocked (main, create_ahead's child) */
		sig = time_left(&end, &left) ? sigtimedwait(&wait_for, NULL, &left) : 0;
		if (sig == 0 || (sig > 0 && sig != SIGCHLD)) {     /* out of time, or the rank is over */
			kill(-pid, SIGKILL);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			return sig == 0 ? -1 : -2;
		}
	}
}

/* Does a name (PATH aside: ahead_env keeps its first, as os.environ does) come twice in the
 * task's environment? getenv and Python take the first, bash (enroot) the last: such a rank
 * is the Python launcher's. */
static int duplicate_name(void)
{
	size_t n = 0, envc = 0;
	const char **names;
	int twice = 0;

	for (char **e = environ; *e; e++)
		envc++;
	if ((names = malloc((envc + 1) * sizeof *names)) == NULL)
		return 1;
	for (char **e = environ; *e; e++)
		if (strchr(*e, '=') != NULL && !launcher_own(*e) && !starts_with(*e, "PATH="))
			names[n++] = *e;
	qsort(names, n, sizeof *names, cmp_name);
	for (size_t i = 1; i < n && !twice; i++)
		twice = cmp_name(&names[i - 1], &names[i]) == 0;
	free(names);
	return twice;
}

/* The common enroot rank's values (ahead_plan's and start_plan's case: a squashfs file, no
 * container option but the image -- or --container-runtime=enroot where enroot is not the default
 * --, a Slurm task, not root, the config as installed, a step directory of the user's): J S K D B I,
 * and R when the user's run directory on the node is theirs (runtimes/enroot.py: own_run_dir);
 * 0, or -1 with ``*why``. The environment's answers first: a podman rank asks for no file here. */
static int enroot_values(const char **values, const char **why)
{
	static char step_dir[PATH_MAX], run_dir[PATH_MAX], job[48], step[48], rank[48];
	const char *image, *rank_dir, *slash;
	struct stat st;

#define NOT(reason) do { *why = (reason); return -1; } while (0)
	if (!slurm_task())
		NOT("not a Slurm task of a container step");
	if (getuid() == 0)
		NOT("root");
	if (other_container_option(TR_RUNTIME_VAR "=enroot"))
		NOT("a container option besides the image (and --container-runtime=enroot)");
	if (!TR_AHEAD_DEFAULT && getenv(TR_RUNTIME_VAR) == NULL)
		NOT("the default runtime is not enroot");
	if (!config_current())
		NOT("tether's configuration changed since the launcher was installed");
	if (duplicate_name())
		NOT("a variable twice in the environment");
	image = getenv(TR_IMAGE_VAR);
	if (image == NULL || strlen(image) > TR_MAX_TEXT || !plain_path(image))
		NOT("not a squashfs file's plain path");
	if (stat(image, &st) < 0 || !S_ISREG(st.st_mode) || access(image, R_OK) < 0)
		NOT("the image is not a file you can read");
	rank_dir = getenv(TETHER_ENV_RANK_DIR);
	/* no backslash, no quote: the --conf script's mount lines hold the path as it is, where enroot.py
	 * escapes (fstab_escape) and quotes (conf_line) it */
	if (rank_dir == NULL || !plain_path(rank_dir) || strpbrk(rank_dir, "\\'") || strlen(rank_dir) > PATH_MAX - 256)
		NOT("no rank directory");
	slash = strrchr(rank_dir, '/');
	if (slash == rank_dir || fmt(step_dir, sizeof step_dir, "%.*s", (int)(slash - rank_dir), rank_dir) < 0)
		NOT("a rank directory not below a step directory");
	if (own_directory(step_dir, getuid(), 0) < 0)
		NOT("the step directory is not yours");
	if (rank_ids(job, step, rank) < 0)
		NOT("a non-ASCII id");
	values['J'] = job;
	values['S'] = step;
	values['K'] = rank;
	values['D'] = step_dir;
	values['B'] = slash + 1;
	values['I'] = image;
	if (fmt(run_dir, sizeof run_dir, "%s/%u", TR_USER_RUN_ROOT, (unsigned)getuid()) == 0 &&
	    own_directory(run_dir, getuid(), 0) == 0)
		values['R'] = run_dir;
	return 0;
#undef NOT
}

/* Start the step's enroot create on this node, ahead of the Python launcher, when this rank is
 * the common enroot case and no other rank or step holds the create's lock: a child of this
 * process takes the lock, creates the root under its own partial name and renames it into place
 * (CreateWhole), or removes what it made; the Python launcher waits for the lock and finds the
 * root (or, after a failure, makes it itself and tells why). 1 when started, else 0 with
 * ``*why``. */
static int create_ahead(const char **why)
{
	const char *values[128] = {0};
	char root[PATH_MAX], lock_dir[PATH_MAX];
	char *name, *data, *lock, **envp;
	struct stat st;
	int fd;
	pid_t pid, parent;

#define NOT(reason) do { *why = (reason); return 0; } while (0)
	if (!TR_AHEAD)
		NOT(TR_WHY_NOT_AHEAD);
	if (enroot_values(values, why) < 0)
		return 0;
	if ((name = expand(TR_AHEAD_NAME_TEMPLATE, values)) == NULL || (data = expand(TR_AHEAD_DATA_TEMPLATE, values)) == NULL ||
	    (lock = expand(TR_AHEAD_LOCK_TEMPLATE, values)) == NULL)
		NOT("a template the launcher cannot fill in");
	if (fmt(root, sizeof root, "%s/%s", data, name) < 0)
		NOT("a path too long");
	if (stat(root, &st) == 0)
		NOT("the step's container root is there");
	if ((envp = ahead_env(values, why)) == NULL)
		return 0;
#ifdef TETHER_RUN_PLAN_ONLY
	{
		/* the tests' build: the create's plan, as make_plan's (NUL-terminated items) */
		const char *const *lists[] = {TR_AHEAD_ARGV, TR_AHEAD_REMOVE};
		const char *labels[] = {"argv", "remove"};
		size_t envc = 0;
		values['Q'] = "PID";
		values['P'] = expand(TR_AHEAD_PARTIAL_TEMPLATE, values);
		for (int l = 0; l < 2; l++) {
			int count = 0;
			for (const char *const *a = lists[l]; *a; a++)
				count++;
			printf("%s%c%d%c", labels[l], 0, count, 0);
			for (const char *const *a = lists[l]; *a; a++)
				printf("%s%c", expand(*a, values), 0);
		}
		for (char **e = envp; *e; e++)
			envc++;
		printf("env%c%zu%c", 0, envc, 0);
		for (char **e = envp; *e; e++)
			printf("%s%c", *e, 0);
		printf("paths%c3%c%s%c%s%c%s%c", 0, 0, name, 0, data, 0, lock, 0);
		exit(0);
	}
#endif
	dir_of(lock, lock_dir, sizeof lock_dir);
	if (make_below(values['D'], lock_dir) < 0 || make_below(values['D'], data) < 0)
		NOT("cannot make enroot's directories in the step directory");
	fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		NOT("cannot open the create's lock");
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int busy = errno == EWOULDBLOCK;
		close(fd);
		NOT(busy ? "another rank holds the create's lock" : "cannot lock the create's lock");
	}
	if (stat(root, &st) == 0) {            /* made while this rank looked */
		close(fd);
		NOT("the step's container root is there");
	}
	parent = getpid();
	pid = fork();
	if (pid < 0) {
		close(fd);
		NOT("cannot fork");
	}
	if (pid == 0) {
		/* the lock is this child's (a descriptor of it stays open here until the end); nothing
		 * else of the task's is (its output, a PMI_FD): a rank that ends early leaves no holder
		 * of them behind -- and ends this child too (SIGHUP when the rank's process is gone;
		 * SIGTERM, SIGINT: the step's end), which kills the create and leaves its partial root
		 * to the step directory's removal */
		sigset_t stop;
		if (stdio_to_null() < 0)
			_exit(0);
		close_above_2(fd);
		sigemptyset(&stop);
		sigaddset(&stop, SIGHUP);
		sigaddset(&stop, SIGTERM);
		sigaddset(&stop, SIGINT);
		sigprocmask(SIG_BLOCK, &stop, NULL);
		if (prctl(PR_SET_PDEATHSIG, SIGHUP, 0, 0, 0) < 0 || getppid() != parent)
			_exit(0);
		char pid_text[16], from[PATH_MAX], *partial;
		char *argv[32], *remove[32];
		size_t a = 0;

		fmt(pid_text, sizeof pid_text, "%d", (int)getpid());
		values['Q'] = pid_text;
		if ((partial = expand(TR_AHEAD_PARTIAL_TEMPLATE, values)) == NULL ||
		    fmt(from, sizeof from, "%s/%s", data, partial) < 0)
			_exit(0);
		values['P'] = partial;
		for (const char *const *t = TR_AHEAD_ARGV; *t; t++)
			if (a >= 31 || (argv[a++] = expand(*t, values)) == NULL)
				_exit(0);
		argv[a] = NULL;
		a = 0;
		for (const char *const *t = TR_AHEAD_REMOVE; *t; t++)
			if (a >= 31 || (remove[a++] = expand(*t, values)) == NULL)
				_exit(0);
		remove[a] = NULL;
		int created = run_quietly(argv, envp, TR_AHEAD_TIMEOUT_S, &stop);
		if ((created == 0 && rename(from, root) == 0) || created == -2)
			_exit(0);
		run_quietly(remove, envp, TR_AHEAD_REMOVE_TIMEOUT_S, &stop);
		_exit(0);
	}
	close(fd);
	return 1;
#undef NOT
}

/* ---- the common enroot rank, run here (rank_launcher.py: start_plan) ---- */

/* enroot.py: carried -- can enroot's environment file carry ``v`` unchanged (no line break, no
 * pair of quotes around the whole value, which enroot's envfmt strips)? */
static int carried(const char *v)
{
	size_t n = strlen(v);

	if (strpbrk(v, "\n\r") != NULL)
		return 0;
	while (n > 0 && strchr(" \t\v\f", v[n - 1]) != NULL)
		n--;
	return !(n >= 2 && strchr("\"'", v[0]) != NULL && strchr("\"'", v[n - 1]) != NULL);
}

/* write_environ_conf's lines of the job's variables: ``printf '%s\n' 'NAME=value'\n`` for each
 * passed one, sorted by name (environment.py: passed_from_host), quoted as enroot.py's conf_line
 * quotes; NULL with ``*why`` when one cannot be carried (the Python launcher leaves it out with a
 * word, or writes it to a file of its own). A name twice was refused before (duplicate_name). */
#define CONF_LINE_START "printf '%s\\n' '"

static char *environ_lines(const char **why)
{
	size_t n = 0, envc = 0, size = 1;
	char **host, *out, *o;
	const char **items;

	for (char **e = environ; *e; e++)
		envc++;
	if ((host = calloc(envc + 1, sizeof *host)) == NULL) {
		*why = "out of memory";
		return NULL;
	}
	for (char **e = environ; *e; e++)
		if (!launcher_own(*e))
			host[n++] = *e;
	items = passed_sorted(host, &n);
	free(host);
	if (items == NULL) {
		*why = "out of memory";
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		if (!carried(strchr(items[i], '=') + 1))
			*why = "a value enroot's environment file cannot carry";
		size += sizeof CONF_LINE_START + 4 * strlen(items[i]) + 2;
	}
	if (*why || (out = malloc(size)) == NULL) {
		free(items);
		if (!*why)
			*why = "out of memory";
		return NULL;
	}
	o = out;
	for (size_t i = 0; i < n; i++) {
		memcpy(o, CONF_LINE_START, sizeof CONF_LINE_START - 1);
		o += sizeof CONF_LINE_START - 1;
		for (const char *c = items[i]; *c; c++) {
			if (*c == '\'') {          /* ended, escaped, begun again */
				memcpy(o, "'\\''", 4);
				o += 4;
			} else {
				*o++ = *c;
			}
		}
		*o++ = '\'';
		*o++ = '\n';
	}
	*o = '\0';
	free(items);
	return out;
}

/* The plan of an enroot rank run here -- a squashfs file, no container option but the image (and
 * --container-runtime=enroot), a Slurm task without a terminal or PMI_FD, no GPU or CUDA's, the
 * config as installed: Enroot.launch's start, its scripts, locks and root (start_plan, baked);
 * NULL with ``*why`` for the Python launcher's. */
static struct plan *enroot_plan(char **command, const char **why)
{
	static struct plan p;
	const char *values[128] = {0};
	const char *value, *conf_template = TR_START_CONF_TEMPLATE;
	char *name, *data;

#define NO(reason) do { *why = (reason); return NULL; } while (0)
	if (!TR_START)
		NO(TR_WHY_NOT_START);
	if (command[0] == NULL || command[0][0] == '\0')
		NO("no command");
	value = getenv(TETHER_ENV_RUN_SUBREAPER);
	if (value && strcmp(value, "0") == 0)
		NO("not made a child subreaper by the SPANK plugin");
	if (isatty(0) || isatty(1) || isatty(2))
		NO("a terminal");
	if (getenv("PMI_FD"))
		NO("MPI's PMI_FD (PMI-2)");
	value = getenv(TETHER_ENV_SLOT_IDS);
	if (value && strspn(value, ",") != strlen(value)) {       /* spec.gpus; Runtime.gpu_kind */
		const char *type = env_or(TR_SLOT_TYPE_VAR, "cuda");
		if (strcmp(type, "rocm") == 0)
			NO("ROCm GPUs");
		if (strcmp(type, "cpu") != 0)
			conf_template = TR_START_CONF_CUDA_TEMPLATE;
	}
	if (enroot_values(values, why) < 0)
		return NULL;
	if ((p.envp = ahead_env(values, why)) == NULL)
		return NULL;
	if ((values['E'] = environ_lines(why)) == NULL)
		return NULL;
	if ((p.conf_text = expand(conf_template, values)) == NULL || (p.conf_path = expand(TR_START_CONF_PATH_TEMPLATE, values)) == NULL ||
	    (p.created = expand(TR_START_CREATED_TEMPLATE, values)) == NULL ||
	    (p.start_lock = expand(TR_START_START_LOCK_TEMPLATE, values)) == NULL ||
	    (p.node_lock = expand(TR_AHEAD_LOCK_TEMPLATE, values)) == NULL ||
	    (name = expand(TR_AHEAD_NAME_TEMPLATE, values)) == NULL || (data = expand(TR_AHEAD_DATA_TEMPLATE, values)) == NULL)
		NO("a template the launcher cannot fill in");
	if ((p.root = malloc(strlen(data) + strlen(name) + 2)) == NULL)
		NO("out of memory");
	sprintf(p.root, "%s/%s", data, name);
	if (add_argv(&p, TR_START_ARGV, command, values, why) < 0)
		return NULL;
	if (fmt(p.rank_dir, sizeof p.rank_dir, "%s/%s", values['D'], values['B']) < 0)
		NO("a path too long for the fast path");
	p.names_fd = -1;
	p.enroot = 1;
	return &p;
#undef NO
}

/* runtimes/__init__.py: write_private -- ``text`` in a file of mode 0600 at ``path``, its
 * directory (below ``base``) made 0700, never through a symlink, never blocking on a FIFO */
static int write_private(const char *base, const char *path, const char *text)
{
	char dir[PATH_MAX];
	size_t len = strlen(text);
	int fd;

	dir_of(path, dir, sizeof dir);
	if (make_below(base, dir) < 0)
		return -1;
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
	if (fd < 0)
		return -1;
	if (write(fd, text, len) != (ssize_t)len) {
		close(fd);
		return -1;
	}
	return close(fd);
}

/* Take the flock of ``fd`` within ``ms`` milliseconds (-1: no limit); 0 when taken, 1 when the
 * time ran out, 2 when flock failed otherwise. A forwarded signal meanwhile -- no runtime is
 * there to get it -- ends this launcher as it ends the Python one there (the default action);
 * SIGCHLD (create_ahead's child) is left for the supervision to reap. */
static int lock_within(int fd, long ms, const sigset_t *mask)
{
	struct timespec end, left, tick = {0, 5 * 1000000L};

	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += ms / 1000;
	end.tv_nsec += (ms % 1000) * 1000000L;
	if (end.tv_nsec >= 1000000000L) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000L;
	}
	for (;;) {
		siginfo_t info;
		int sig;
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			return 0;
		if (errno != EWOULDBLOCK && errno != EINTR)
			return 2;
		if (ms >= 0 && !time_left(&end, &left))
			return 1;
		sig = sigtimedwait(mask, &info, &tick);
		if (sig > 0 && sig != SIGCHLD) {
			sigset_t one;
			sigemptyset(&one);
			sigaddset(&one, sig);
			signal(sig, SIG_DFL);
			sigprocmask(SIG_UNBLOCK, &one, NULL);
			raise(sig);
			_exit(128 + sig);
		}
	}
}

/* launch.py: run_before for the enroot rank run here -- its script written, the step's root made
 * on the node (create_ahead, or another rank's) under the node's lock, then this rank's turn to
 * start the shared root (enroot.py: take_start_turn), held until its command runs: the turn's
 * descriptor. A create that takes longer than TR_START_QUIET_MS, one that failed, and every error
 * go to the Python launcher, which waits, tells and makes again as it always did. */
static int enroot_before(const struct plan *p, const sigset_t *mask)
{
	const char *why_not = NULL;
	char step_dir[PATH_MAX];
	struct stat st;
	int ahead, node_fd, start_fd;

	dir_of(p->rank_dir, step_dir, sizeof step_dir);
	if (write_private(step_dir, p->conf_path, p->conf_text) < 0)
		to_python("cannot write enroot's --conf script (the Python launcher says why)", NULL);
	if (stat(p->root, &st) < 0) {
		/* the root is made whole or not at all (renamed into place): once there, no rank needs
		 * the node's lock for it -- the rank that waits only for its start turn waits there */
		int got;
		ahead = create_ahead(&why_not);
		if (ahead)
			setenv(TETHER_ENV_RUN_AHEAD, "1", 1);        /* for the Python launcher, if it comes to that */
		node_fd = open(p->node_lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
		if (node_fd < 0)
			to_python("cannot open the node's enroot lock (the Python launcher says why)", NULL);
		got = lock_within(node_fd, TR_START_QUIET_MS, mask);
		if (got == 1)
			to_python("the step's container root takes a while (the Python launcher tells)", NULL);
		if (got != 0)
			to_python("cannot take the node's enroot lock (the Python launcher says why)", NULL);
		if (stat(p->root, &st) < 0)
			to_python("the step's container root was not made (the Python launcher makes it and says why)", NULL);
		close(node_fd);
		unsetenv(TETHER_ENV_RUN_AHEAD);
	}
	start_fd = open(p->start_lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
	if (start_fd < 0 || lock_within(start_fd, -1, mask) != 0)
		to_python("cannot take the container's start lock (the Python launcher says why)", NULL);
	return start_fd;
}

/* launch.py: _end_runtime_own -- the pause process this rank's podman made, which the step's end
 * would kill anyway: SIGKILLed and reaped here, within a second (``mask`` blocks SIGCHLD), so that
 * Slurm's proctrack/cgroup finds the step empty (a process left there costs the step a second: it
 * kills it, then looks again a second later). 1 when it was reaped. */
static int end_runtime_own(pid_t pid, const sigset_t *mask)
{
	struct timespec end, left;
	siginfo_t info;

	kill(pid, SIGKILL);
	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += 1;
	for (;;) {
		pid_t got = waitpid(pid, NULL, WNOHANG);
		if (got == pid || (got < 0 && errno == ECHILD))
			return got == pid;
		if (!time_left(&end, &left))
			return 0;
		int sig = sigtimedwait(mask, &info, &left);
		if (sig > 0 && sig != SIGCHLD)
			forward(sig);
		else if (sig < 0 && errno == EAGAIN)
			return 0;
	}
}

static void remove_file(const char *path)
{
	(void)unlink(path);
}

static int write_marker(const struct plan *p)
{
	char tmp[PATH_MAX + 32];
	int fd;
	size_t len = strlen(p->marker_data);

	if (fmt(tmp, sizeof tmp, "%s.%d", p->marker, (int)getpid()) < 0)
		return -1;
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	if (write(fd, p->marker_data, len) != (ssize_t)len || close(fd) < 0 || rename(tmp, p->marker) < 0) {
		unlink(tmp);
		return -1;
	}
	return 0;
}

struct dirstamp {
	int valid;
	ino_t ino;
	struct timespec mtime, ctime;
};

/* system/dirstamp.py */
static void stamp_take(struct dirstamp *s, const char *path)
{
	struct stat st;

	memset(s, 0, sizeof *s);
	s->valid = stat(path, &st) == 0 && (st.st_mtim.tv_nsec || st.st_ctim.tv_nsec);
	if (s->valid) {
		s->ino = st.st_ino;
		s->mtime = st.st_mtim;
		s->ctime = st.st_ctim;
	}
}

/* 1 changed, 0 not, -1 unknown */
static int stamp_changed(const struct dirstamp *s, const char *path)
{
	struct stat st;

	if (!s->valid)
		return -1;
	if (stat(path, &st) < 0)
		return 1;
	return st.st_ino != s->ino || st.st_mtim.tv_sec != s->mtime.tv_sec || st.st_mtim.tv_nsec != s->mtime.tv_nsec ||
	       st.st_ctim.tv_sec != s->ctime.tv_sec || st.st_ctim.tv_nsec != s->ctime.tv_nsec;
}

int main(int argc, char **argv)
{
	const char *why = NULL, *argv0 = getenv(TETHER_ENV_RUN_ARGV0);
	char **command;
	struct plan *p;
	sigset_t mask;
	posix_spawnattr_t attr;
	posix_spawn_file_actions_t actions;
	struct dirstamp stamp;
	char created_dir[PATH_MAX];
	struct timespec turn_end;
	int status = 0, monitor_killed = 0, others_killed = 0, start_fd = -1;

	self_argv = argv;
	/* the signals to forward wait from here until podman exists (sigwaitinfo below): none is lost,
	 * none is fatal; the Python launcher gets the mask this launcher was started with */
	sigemptyset(&mask);
	for (int i = 0; i < N_FORWARDED; i++)
		sigaddset(&mask, FORWARDED[i]);
	sigaddset(&mask, SIGCHLD);
	sigprocmask(SIG_BLOCK, &mask, &original_mask);
	signal(SIGCHLD, SIG_DFL);            /* an inherited SIG_IGN would reap podman behind our back */
	unsetenv(TETHER_ENV_RUN_RESUME);       /* only ever this launcher's word to the Python one */
	unsetenv(TETHER_ENV_RUN_AHEAD);
	if (argc < 1 || argv0 == NULL)
		to_python("not handed a task", NULL);
	/* container/run.py: task_command -- argv[1:] where Slurm prepended the launcher, else argv0 first */
	command = calloc((size_t)argc + 1, sizeof *command);
	if (command == NULL)
		to_python("out of memory", NULL);
	{
		int n = 0;
		if (argv0[0])
			command[n++] = (char *)argv0;
		for (int i = 1; i < argc; i++)
			command[n++] = argv[i];
		command[n] = NULL;
	}
	p = make_plan(command, &why);
	if (p == NULL) {
		const char *why_not_ahead = NULL, *why_not_here = NULL;
		p = enroot_plan(command, &why_not_here);
		if (p == NULL) {
			if (getenv(TETHER_ENV_RUN_WHY_PYTHON) != NULL)
				fprintf(stderr, "tether-run: no enroot run here: %s\n", why_not_here);
			if (create_ahead(&why_not_ahead))
				setenv(TETHER_ENV_RUN_AHEAD, "1", 1);
			else if (getenv(TETHER_ENV_RUN_WHY_PYTHON) != NULL)
				fprintf(stderr, "tether-run: no enroot create ahead: %s\n", why_not_ahead);
			to_python(why, NULL);
		}
	}
#ifdef TETHER_RUN_PLAN_ONLY
	/* the tests' build: the plan instead of the run, as NUL-terminated items: a section's name,
	 * its count of items, the items */
	{
		char names[65536];
		ssize_t n = 0;
		size_t envc = 0;
		for (char **e = p->envp; *e; e++)
			envc++;
		/* the command and its environment: "argv"/"env", an enroot rank's "start-argv"/"start-env" */
		const char *prefix = p->enroot ? "start-" : "";
		printf("%sargv%c%d%c", prefix, 0, p->argc, 0);
		for (int i = 0; i < p->argc; i++)
			printf("%s%c", p->argv[i], 0);
		printf("%senv%c%zu%c", prefix, 0, envc, 0);
		for (char **e = p->envp; *e; e++)
			printf("%s%c", *e, 0);
		if (p->enroot) {
			/* the enroot rank's plan, then the create ahead's (it exits) if this rank would start one */
			const char *why_not_ahead = NULL;
			printf("conf%c1%c%s%c", 0, 0, p->conf_text, 0);
			printf("start-paths%c5%c%s%c%s%c%s%c%s%c%s%c", 0, 0, p->conf_path, 0, p->created, 0,
			       p->start_lock, 0, p->node_lock, 0, p->root, 0);
			fflush(stdout);
			create_ahead(&why_not_ahead);
			return 0;
		}
		if (p->names_fd >= 0) {
			lseek(p->names_fd, 0, SEEK_SET);
			n = read(p->names_fd, names, sizeof names - 1);
		}
		names[n > 0 ? n : 0] = '\0';
		printf("names%c1%c%s%c", 0, 0, names, 0);
		printf("marker%c2%c%s%c%s%c", 0, 0, p->marker, 0, p->marker_data, 0);
		printf("created%c1%c%s%c", 0, 0, p->created, 0);
		return 0;
	}
#endif
	/* the SPANK plugin made this process a child subreaper; a second call costs nothing */
	prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
	tracked = tracked_cgroup(tracked_path, sizeof tracked_path);
	if (p->enroot) {
		start_fd = enroot_before(p, &mask);
		clock_gettime(CLOCK_MONOTONIC, &turn_end);
		turn_end.tv_sec += 3600;            /* take_start_turn's bound */
	} else if (write_marker(p) < 0) {
		to_python("cannot write the cleanup marker", NULL);
	}
	remove_file(p->created);            /* podman refuses to overwrite a --cidfile */
	dir_of(p->created, created_dir, sizeof created_dir);
	stamp_take(&stamp, created_dir);

	posix_spawnattr_init(&attr);
	posix_spawn_file_actions_init(&actions);
	{
		sigset_t defaults;
		sigemptyset(&defaults);
		for (int i = 0; i < N_FORWARDED; i++)
			sigaddset(&defaults, FORWARDED[i]);
		sigaddset(&defaults, SIGPIPE);
		sigaddset(&defaults, SIGXFSZ);
		sigaddset(&defaults, SIGCHLD);
		posix_spawnattr_setsigdefault(&attr, &defaults);
		posix_spawnattr_setsigmask(&attr, &original_mask);
		posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
	}
	if (p->names_fd >= 0)
		posix_spawn_file_actions_adddup2(&actions, p->names_fd, p->names_fd);   /* clears close-on-exec */
	if (posix_spawnp(&child, p->argv[0], &actions, &attr, (char *const *)p->argv, p->envp) != 0) {
		if (p->marker)
			remove_file(p->marker);
		to_python("the runtime cannot be started (the Python launcher says why)", NULL);
	}

	/* launch.py: _wait_for, with the forwarding of _supervise */
	for (int done = 0; !done;) {
		siginfo_t info;
		int sig;
		if (start_fd >= 0) {
			/* the start turn: held until the command in the container runs (take_start_turn) */
			struct timespec tick = {0, 20 * 1000000L}, left;
			sig = sigtimedwait(&mask, &info, &tick);
			if (access(p->created, F_OK) == 0 || !time_left(&turn_end, &left)) {
				close(start_fd);
				start_fd = -1;
			}
		} else {
			sig = sigwaitinfo(&mask, &info);
		}
		if (sig < 0)
			continue;
		if (sig != SIGCHLD) {
			forward(sig);
			continue;
		}
		for (;;) {
			siginfo_t w;
			int st;
			pid_t pid;
			int is_conmon, is_pause;
			memset(&w, 0, sizeof w);
			if (waitid(P_ALL, 0, &w, WEXITED | WNOHANG | WNOWAIT) < 0) {
				if (errno == ECHILD)    /* no child left at all (launch.py's _wait_for: status 0) */
					done = 1;
				break;
			}
			if (w.si_pid == 0)
				break;
			is_conmon = comm_is(w.si_pid, "conmon");
			is_pause = is_pause_name(w.si_pid);
			pid = waitpid(w.si_pid, &st, 0);
			if (pid < 0)
				continue;
			if (pid == child) {
				status = st;
				done = 1;
				break;
			}
			if (WIFSIGNALED(st)) {
				if (is_conmon && !monitor_killed)
					monitor_killed = WTERMSIG(st);
				else if (!is_pause)      /* a podman that lost the race to make one kills its own */
					others_killed++;
			}
		}
	}

	{
		/* signals that came while podman ended: forwarded as they would have been, and counted */
		struct timespec now = {0, 0};
		siginfo_t info;
		int sig;
		while ((sig = sigtimedwait(&mask, &info, &now)) > 0)
			if (sig != SIGCHLD)
				forward(sig);
	}
	if (start_fd >= 0)
		close(start_fd);
	{
		int exited = WIFEXITED(status), code = exited ? WEXITSTATUS(status) : -1;
		struct stat st;
		int written = stat(p->created, &st) == 0 ? 1 : stamp_changed(&stamp, created_dir);
		/* podman: its own failures (125-127, 1 before the container) are concluded in Python; enroot:
		 * those before the command started (launch.py: _never_started), else its code is the command's */
		int clean = exited && received[0] == '\0' && !monitor_killed && !others_killed &&
			    (p->enroot ? !(written == 0 && (code == 1 || (code >= 125 && code <= 127)))
				       : code < 125 && !(code == 1 && written == 0));
		if (!clean) {
			/* launch.py concludes: the retry, the removal, the messages (status;written;received;
			 * monitor signal;others killed;the runtime it ran) */
			char resume[160];
			snprintf(resume, sizeof resume, "%d;%d;%s;%d;%d;%s", status, written, received, monitor_killed,
				 others_killed, p->enroot ? "enroot" : "podman");
			to_python("the run did not end cleanly", resume);
		}
		remove_file(p->created);
		if (p->marker)
			remove_file(p->marker);
		/* launch.py: _reap_descendants -- what podman left (conmon finishing), for at most its
		 * GRACE_SECONDS (TR_GRACE_MS); never podman's pause process, which is podman's, not the
		 * rank's (the step's end ends it) */
		{
			struct timespec end;
			int reaped = 0, ran_out = 0, ended;
			pid_t own = 0, left_running = 0;
			clock_gettime(CLOCK_MONOTONIC, &end);
			end.tv_sec += TR_GRACE_MS / 1000;
			end.tv_nsec += (long)(TR_GRACE_MS % 1000) * 1000000L;
			if (end.tv_nsec >= 1000000000L) {
				end.tv_sec++;
				end.tv_nsec -= 1000000000L;
			}
			for (;;) {
				siginfo_t info;
				struct timespec left;
				pid_t pid, kids[MAX_PIDS];
				int nk, others = 0;
				while ((pid = waitpid(-1, NULL, WNOHANG)) > 0)
					reaped++;
				if (pid < 0 && errno == ECHILD) {
					left_running = 0;
					break;
				}
				nk = children_of(getpid(), kids, 0, MAX_PIDS);
				own = nk ? runtime_own(p->pause_pid) : 0;
				left_running = 0;
				for (int i = 0; i < nk; i++) {
					if (own && kids[i] == own)
						left_running = own;
					else
						others++;
				}
				if (!others)
					break;
				if (!time_left(&end, &left)) {
					ran_out = 1;
					break;
				}
				int sig = sigtimedwait(&mask, &info, &left);
				if (sig > 0 && sig != SIGCHLD) {
					forward(sig);
				} else if (sig < 0 && errno == EAGAIN) {
					ran_out = 1;
					break;
				}
			}
			ended = left_running ? end_runtime_own(left_running, &mask) : 0;
			if (getenv(TETHER_ENV_RUN_TELL_REAPING) != NULL) {   /* the tests' question: what was waited for */
				char kept[16] = "none";
				if (left_running)
					snprintf(kept, sizeof kept, "%d", (int)left_running);
				fprintf(stderr, "tether-run: after the runtime: launcher=c reaped=%d runtime_own=%s "
					"ended=%d grace_ran_out=%d\n", reaped, kept, ended, ran_out);
			}
		}
		return code;
	}
}
