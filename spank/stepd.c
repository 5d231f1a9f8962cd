/*
 * tether SPANK plugin, remote side (slurmstepd): per-job and per-rank directories, the rank
 * environment, the container hand-off, and cleanup. Layout: tether/hooks/layout.py.
 *
 * No setup failure ever fails slurmstepd's own part of a step. A plugin error in init_post_opt or
 * user_init makes slurmd report a launch failure: for a batch job that drains the node ("batch job
 * complete failure") and leaves the job COMPLETED 0:0; srun even exits 0. So the first reason a step
 * cannot run is kept, and every task of the step fails with it in task_init -- as the user, with
 * the message on the task's stderr (the job's output) -- and exits 1: the job or step fails,
 * visibly, and the node stays in service.
 *
 * Nothing the job's environment says decides where root writes: the job's directory is named by
 * S_JOB_ID, this node's by slurmd's own name (SLURMD_NODENAME in slurmstepd's environment, set from
 * slurmd's config -- not the job's), the step's by S_JOB_STEPID.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "cgkeeper.h"
#include "jobdirs.h"
#include "options.h"
#include "rankenv.h"
#include "stepd.h"

/* Exported by libslurmfull (not declared in the public headers). */
extern void slurm_xfree(void **item);
extern char *slurm_conf_get_nodeaddr(const char *node_hostname);
extern char *slurm_conf_get_address(const char *node_name);

/* ---- Slurm releases: every difference this file builds against, from the headers ---------------- */
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(23, 11, 0)
typedef hostlist_t *tether_hostlist_t; /* 23.11 made hostlist_t the struct itself */
#define TETHER_PREPEND_ARGV 1          /* spank_prepend_task_argv() exists (task_init) */
#else
typedef hostlist_t tether_hostlist_t;  /* up to 23.02: a pointer type */
#define TETHER_PREPEND_ARGV 0
#endif

static struct {
	int tether;                /* this step carries tether options */
	int container;             /* ... and its tasks run in a container */
	uid_t uid;
	gid_t gid;
	uint32_t job_id, step_id;
	char node[256];            /* slurmd's node name */
	char step_name[64];        /* step-0, step-batch, step-extern, ... */
	char job_dir[PATH_MAX];    /* <root>/<jobid> */
	char step_dir[PATH_MAX];   /* <root>/<jobid>/<node>/<step> */
	char failure[1024];        /* why this step cannot run (the first reason) */
	int enroot_bound;          /* the step's enroot directory is bound onto itself (bind_enroot_dir) */
	int enroot_mount_fd;       /* ... and this is its mount, for the unmount at the step's end */
	long enroot_mount_id;      /* ... whose id it is (the fd's number not reused: checked first) */
	/* a step of a heterogeneous job across components (srun --het-group=0,1): Slurm 22.05 runs
	 * one step per component job, each numbering its tasks from 0, and gives every task the
	 * whole step's SLURM_PROCID / SLURM_NTASKS / SLURM_NODEID (see het_step) */
	int het;                   /* this step is one component of a multi-component step */
	uint32_t het_component, het_components, het_leader;
	int het_world;             /* a component of a heterogeneous step of which some are tether's */
} step;

/* Where jobdirs.c's messages go (and options.c's, in every context): slurmd's log or the user's
 * terminal; in slurmstepd a TETHER_FAIL is also kept for the tasks to fail with. */
void tether_report(enum tether_level level, const char *msg)
{
	if (level == TETHER_INFO) {
		slurm_info("%s", msg);
		return;
	}
	slurm_error("%s", msg);
	if (level == TETHER_FAIL && spank_context() == S_CTX_REMOTE && !step.failure[0])
		snprintf(step.failure, sizeof(step.failure), "%s", msg);
}

static void step_label(uint32_t id, char *buf, size_t len)
{
	if (id == SLURM_BATCH_SCRIPT)
		snprintf(buf, len, TETHER_STEP_PREFIX "batch");
	else if (id == SLURM_EXTERN_CONT)
		snprintf(buf, len, TETHER_STEP_PREFIX "extern");
	else if (id == SLURM_INTERACTIVE_STEP)
		snprintf(buf, len, TETHER_STEP_PREFIX "interactive");
	else
		snprintf(buf, len, TETHER_STEP_PREFIX "%u", id);
}

static int get_env(spank_t sp, const char *name, char *buf, int len)
{
	return spank_getenv(sp, name, buf, len) == ESPANK_SUCCESS;
}

static int set_env(spank_t sp, const char *name, const char *value)
{
	spank_err_t rc = spank_setenv(sp, name, value, 1);

	if (rc != ESPANK_SUCCESS) {
		tether_fail("tether: cannot set %s: %s", name, spank_strerror(rc));
		return -1;
	}
	return 0;
}

static int set_env_u(spank_t sp, const char *name, unsigned long value)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%lu", value);
	return set_env(sp, name, buf);
}

/*
 * The TETHER_<NAME> fallbacks, from the job's environment: Slurm hands slurmstepd only the options
 * given on a command line or in #SBATCH lines, so a step asked for with `TETHER_CONTAINER_IMAGE=IMG
 * srun ...` (or a job script exporting it; or pyxis's PYXIS_CONTAINER_IMAGE) is recognised here,
 * exactly as the option would be.
 */
/* tether_env_getter over the job's environment (a value too long for any option is not read) */
static int job_env(void *sp, const char *name, char *buf, size_t len)
{
	return get_env(sp, name, buf, (int)len);
}

static void env_fallbacks(spank_t sp)
{
	tether_env_fallbacks(job_env, sp); /* a bad value is kept as the failure */
}

static void het_step(spank_t sp);
static long env_number(spank_t sp, const char *name);

/* Is the variable set to a non-empty value? */
static int env_nonempty(spank_t sp, const char *name)
{
	char one[2];
	spank_err_t rc = spank_getenv(sp, name, one, sizeof(one));

	return rc == ESPANK_NOSPACE || (rc == ESPANK_SUCCESS && one[0] != '\0');
}

/* Set the options of a record "name=value<0x1f>name=value" (client.c); a bad value is kept as
 * the failure, as any option's. */
static void set_recorded(spank_t sp, const char *var)
{
	size_t len = (size_t)TETHER_NOPTS * (TETHER_MAX_TEXT + TETHER_MAX_NAME + 2) + 1;
	char *text = malloc(len), *entry, *next;

	if (text == NULL) {
		tether_fail("tether: out of memory");
		return;
	}
	if (!get_env(sp, var, text, (int)len))
		text[0] = '\0';
	for (entry = text; *entry; entry = next) {
		char *eq;

		next = strchr(entry, '\x1f');
		if (next)
			*next++ = '\0';
		else
			next = entry + strlen(entry);
		eq = strchr(entry, '=');
		if (eq == NULL)
			continue;
		*eq = '\0';
		for (int i = 0; i < TETHER_NOPTS; i++) {
			if (strcmp(tether_opts[i].name, entry) == 0 && tether_opts[i].value == NULL) {
				char how[TETHER_MAX_NAME + 3];

				snprintf(how, sizeof(how), "--%s", entry);
				tether_opt_set(i, eq + 1, how, 0);
				break;
			}
		}
	}
	free(text);
}

/*
 * A component of a heterogeneous step takes its own srun pass's options (spank/client.c): Slurm
 * sends the same option values to every component. One pass for several components
 * (`srun --het-group=0,1`): that pass's options for each. The job's defaults (TETHER_STEP_DEFAULTS,
 * then the TETHER_<NAME> fallbacks in env_fallbacks) go to component 0 only. Without the record
 * (an srun without tether's plugin cannot reach here: the plugin is required), Slurm's values stay.
 */
static void het_step_options(spank_t sp)
{
	char name[64];
	long passes = env_number(sp, TETHER_STEP_PASSES);

	if (passes < 1)
		return;
	/* Is any component of the step a tether one (a pass with options, or the job's defaults)?
	 * Then every component's ranks get the one rank world, plain ones too. */
	step.het_world = env_nonempty(sp, TETHER_STEP_DEFAULTS);
	for (long pass = 0; pass < passes && pass < 1024 && !step.het_world; pass++) {
		snprintf(name, sizeof(name), TETHER_STEP_OPTIONS_PREFIX "%ld", pass);
		step.het_world = env_nonempty(sp, name);
	}
	tether_opts_clear();
	snprintf(name, sizeof(name), TETHER_STEP_OPTIONS_PREFIX "%ld", passes == 1 ? 0L : (long)step.het_component);
	set_recorded(sp, name);                   /* this component's own options first */
	if (step.het_component == 0)
		set_recorded(sp, TETHER_STEP_DEFAULTS); /* then the job's, where it gave none */
}

/* This node's Slurm name: slurmd's own (see the top of this file), usable as a directory name. */
static int this_node(void)
{
	const char *name = getenv("SLURMD_NODENAME");

	if (name == NULL || !tether_name_ok(name, sizeof(step.node) - 1)) {
		tether_fail("tether: cannot tell this node's name (slurmstepd has no usable SLURMD_NODENAME)");
		return -1;
	}
	snprintf(step.node, sizeof(step.node), "%s", name);
	return 0;
}

/* The new mount API (Linux 5.2): the clone of a directory, attached onto it, is a mount we hold an
 * fd of -- unmounted through that fd, never through a path the job user could change meanwhile. */
#if defined(SYS_open_tree) && defined(SYS_move_mount)
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif
#ifndef MOVE_MOUNT_T_EMPTY_PATH
#define MOVE_MOUNT_T_EMPTY_PATH 0x00000040
#endif
#define TETHER_BIND_SELF 1
#else
#define TETHER_BIND_SELF 0
#endif

/* The mount id of what ``fd`` is (/proc/self/fdinfo), or -1. */
static long mount_id(int fd)
{
	char path[64], line[128];
	long id = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	if ((f = fopen(path, "re")) == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "mnt_id: %ld", &id) == 1)
			break;
	fclose(f);
	return id;
}

/* Is ``name`` below ``dir_fd`` (not following a symlink) the mount ``tree`` is of? */
static int mounted_at(int dir_fd, const char *name, int tree)
{
	int fd = openat(dir_fd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	long want = mount_id(tree), got;

	if (fd < 0)
		return 0;
	got = mount_id(fd);
	close(fd);
	return want >= 0 && got == want;
}

/* The step's enroot directory's mount gone, through its fd (MNT_DETACH: a process of the step still
 * in it keeps its view until it ends). umount2 of the fd's link reaches the topmost mount there: a
 * mount the user put over it (FUSE) goes first, then the bind; the link then points into a detached
 * tree (EINVAL: done). */
static void unbind_enroot_dir(void)
{
	char self[64];
	int n = 0;

	if (!step.enroot_bound)
		return;
	step.enroot_bound = 0;
	/* the fd still the bind's (nothing in slurmstepd closed it and reused its number): else the
	 * step directory's removal detaches the bind (jobdirs.c: detach_mounts_at) */
	if (step.enroot_mount_id < 0 || mount_id(step.enroot_mount_fd) != step.enroot_mount_id)
		return;
	snprintf(self, sizeof(self), "/proc/self/fd/%d", step.enroot_mount_fd);
	while (n < 64 && umount2(self, MNT_DETACH) == 0)
		n++;
	if (n == 64 || n == 0 || errno != EINVAL) /* none (another step's stacked on it took it), or stuck */
		slurm_debug("tether: the bind mount of %s/%s: %s", step.step_dir, TETHER_STEP_ENROOT,
			    n == 64 ? "64 mounts on it" : strerror(errno));
	close(step.enroot_mount_fd);
}

/*
 * enroot start looks for the mount point above a container's root with one `mountpoint` process
 * per path component (enroot's common::mountpoint, ~2.5 ms each): a root 10 components below /
 * (<job storage root>/<job>/<node>/<step>/enroot/data/<name>) cost ~20 ms a start that pyxis's
 * roots in /tmp do not pay. The step's enroot directory (ENROOT_DATA_PATH's parent:
 * container/runtimes/enroot.py), bound onto itself here as root, is that mount point 2 components
 * up. Only that directory: a rename between it and the rest of the step (EXDEV across mounts)
 * is nothing enroot or a job does. Made for a container step whose runtime may be enroot (none
 * named: the config's default); unmounted at the step's end (tether_stepd_exit), and one that a
 * killed slurmstepd left is detached by the removal that meets it (jobdirs.c: detach_mounts_at). Without
 * the mount (an old kernel, a refusal) enroot only walks further: never a failure.
 */
static void bind_enroot_dir(int step_fd)
{
#if TETHER_BIND_SELF
	const char *runtime = tether_opt_value(OPT_CONTAINER_RUNTIME);
	char shown[PATH_MAX];
	int dir_fd, tree;

	if (runtime != NULL && runtime[0] != '\0' && strcmp(runtime, "enroot") != 0)
		return;
	dir_fd = tether_ensure_child(step_fd, step.step_dir, TETHER_STEP_ENROOT, step.uid, step.gid, shown,
				     sizeof(shown));
	if (dir_fd < 0)
		return; /* said why (a symlink the user put there: the step fails, as for any of its directories) */
	tree = (int)syscall(SYS_open_tree, dir_fd, "", OPEN_TREE_CLONE | O_CLOEXEC | AT_EMPTY_PATH);
	if (tree >= 0 && syscall(SYS_move_mount, tree, "", dir_fd, "", MOVE_MOUNT_F_EMPTY_PATH |
				 MOVE_MOUNT_T_EMPTY_PATH) == 0) {
		step.enroot_bound = 1;
		step.enroot_mount_fd = tree;
		step.enroot_mount_id = mount_id(tree);
		/* the directory the user could have renamed away meanwhile: the mount is then elsewhere
		 * in their tree, where nothing would detach it after a killed slurmstepd -- undone */
		if (!mounted_at(step_fd, TETHER_STEP_ENROOT, tree)) {
			slurm_debug("tether: %s moved while it was bound; not bound", shown);
			unbind_enroot_dir();
		}
	} else {
		slurm_debug("tether: %s not bound onto itself (enroot walks further up): %s", shown, strerror(errno));
		if (tree >= 0)
			close(tree);
	}
	close(dir_fd);
#else
	(void)step_fd;
#endif
}

/* <job>/<node>/<step> below the open job directory, each made for the job's uid when missing
 * (fd-relative, never following a symlink: tether_ensure_child); the step directory's fd, -1
 * (failed, and said why) or -2 (a level was removed under us: the caller may try again). */
static int open_node_and_step(int job_fd)
{
	char shown[PATH_MAX];
	int node_fd, step_fd;

	node_fd = tether_ensure_child(job_fd, step.job_dir, step.node, step.uid, step.gid, shown, sizeof(shown));
	if (node_fd < 0)
		return node_fd;
	step_fd = tether_ensure_child(node_fd, shown, step.step_name, step.uid, step.gid, step.step_dir,
				      sizeof(step.step_dir));
	close(node_fd);
	return step_fd;
}

int tether_stepd_post_opt(spank_t sp)
{
	char name[32];
	const char *image, *named, *batch, *host_batch;
	int root_fd, fd;

	if (spank_get_item(sp, S_JOB_ID, &step.job_id) == ESPANK_SUCCESS &&
	    spank_get_item(sp, S_JOB_STEPID, &step.step_id) == ESPANK_SUCCESS)
		het_step(sp);
	/* The TETHER_<NAME> fallbacks describe the first component of a heterogeneous step, as in
	 * srun (client.c): a later component takes only the options it was given itself. */
	if (step.het)
		het_step_options(sp);
	if (!step.het || step.het_component == 0)
		env_fallbacks(sp);
	step.tether = tether_any_option() || step.het_world;
	if (spank_get_item(sp, S_JOB_UID, &step.uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &step.gid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ID, &step.job_id) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step.step_id) != ESPANK_SUCCESS) {
		if (step.tether)
			tether_fail("tether: cannot read the job's uid, gid, id or step id");
		step.tether = 0;
		step.job_id = 0;
		return 0;
	}
	if (!step.tether) {
		/* a launch script's step runs tether's launcher itself: the user's own directories, as
		 * for a container step (nothing else; a user who asks gets only their own made) */
		char asked[4];

		if (step.step_id < SLURM_MAX_NORMAL_STEP_ID &&
		    get_env(sp, TETHER_ENV_RUN_USER_DIRS, asked, sizeof(asked)) && strcmp(asked, "1") == 0)
			tether_ensure_user_dirs(tether_user_dirs, step.uid, step.gid);
		return 0; /* not a tether step: nothing (but its end, for a batch step: tether_stepd_exit) */
	}
	step_label(step.step_id, step.step_name, sizeof(step.step_name));
	if (this_node() < 0)
		return 0;
	/* The tasks of an ordinary step run in the container; the batch script (unless
	 * --container-batch, or the admin's container_batch=1 as pyxis's sbatch_support),
	 * salloc's interactive step and the extern step stay on the host (so srun works inside a
	 * batch script). */
	image = tether_opt_value(OPT_CONTAINER_IMAGE);
	named = tether_opt_value(OPT_CONTAINER_NAME);
	batch = tether_opt_value(OPT_CONTAINER_BATCH);
	host_batch = tether_opt_value(OPT_NO_CONTAINER_BATCH);
	/* --container-image= (empty): this step on the host; --container-name alone: the job's
	 * container of that name, made by an earlier step with an image (as pyxis) */
	step.container = (image != NULL ? image[0] != '\0' : named != NULL && named[0] != '\0') &&
			 (step.step_id < SLURM_MAX_NORMAL_STEP_ID ||
			  (step.step_id == SLURM_BATCH_SCRIPT &&
			   (batch != NULL && strcmp(batch, "1") == 0 ? 1
			    : host_batch != NULL && strcmp(host_batch, "1") == 0 ? 0 : tether_container_batch)));
	/* Other container options typed for a step without an image or a name would be ignored,
	 * the step on the host: refused instead (pyxis runs such a step on the host and says it
	 * ignores them). Values from the environment (TETHER_CONTAINER_*: defaults, a user's
	 * preference in their profile) only apply to container steps: no error. */
	if (!step.container && image == NULL && step.step_id < SLURM_MAX_NORMAL_STEP_ID) {
		for (int i = OPT_CONTAINER_IMAGE + 1; i <= OPT_CONTAINER_BATCH; i++) {
			const struct tether_opt *o = &tether_opts[i];

			if (i == OPT_CONTAINER_NAME || o->value == NULL || o->from_env)
				continue;
			tether_fail("tether: --%s needs --container-image or --container-name: without either "
				    "this step would run on the host without it", o->name);
			return 0;
		}
	}
	if (step.container && tether_launcher == NULL) {
		tether_fail("tether: --container-image: containers are not set up on this cluster "
			    "(plugstack.conf has no launcher=; an admin runs `tether slurm install --write`)");
		return 0;
	}
	/* Keep everything a container step starts inside the step: a runtime that double-forks
	 * (podman's conmon) is caught by the launcher, itself a child subreaper; should the launcher
	 * die (SIGKILL, the OOM killer), its orphans re-parent to this slurmstepd instead of init, so
	 * process tracking still signals and kills them with the step (slurmstepd's wait3() loop
	 * reaps pids that are not tasks without complaint). */
	if (step.container && prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
		tether_error("tether: prctl(PR_SET_CHILD_SUBREAPER): %s", strerror(errno));
	/* The user's own directories on this node for the runtimes' stores and run state, made here
	 * as root in places only root writes: a user-made one in a shared place (/var/tmp, /tmp) could
	 * be taken first by another user, who could then deny or change this user's containers. */
	if (step.container && tether_ensure_user_dirs(tether_user_dirs, step.uid, step.gid) < 0)
		return 0;
	root_fd = tether_open_storage_root(tether_job_storage_root);
	if (root_fd < 0)
		return 0;
	snprintf(name, sizeof(name), "%u", step.job_id);
	snprintf(step.job_dir, sizeof(step.job_dir), "%s/%s", tether_job_storage_root, name);
	fd = tether_claim_job_dir(root_fd, name, step.uid, step.gid, step.job_dir);
	close(root_fd);
	if (fd >= 0) { /* -2 (removed under us) cannot happen here: only root removes it */
		/* This node's and this step's directories too, now, as root: a job directory (or node
		 * directory) holding them is never empty, so a step of the same job ending on another
		 * node sharing the job storage root (one host here, a shared filesystem at a site), or
		 * on this node, cannot remove it before this step's tasks fill it (the tasks, running as
		 * the user, could not make the job directory again in the root-owned storage root). */
		int step_fd = open_node_and_step(fd);

		if (step_fd >= 0) {
			if (step.container)
				bind_enroot_dir(step_fd);
			close(step_fd);
		}
		close(fd);
	}
	return 0;
}

/* The n-th node of the step's (or, for the batch step, the job's) node list, from the job's
 * environment: used only for MASTER_ADDR, a value of the user's own tasks. */
static char *nth_node(spank_t sp, uint32_t n)
{
	char nodelist[8192] = "";
	tether_hostlist_t hl;
	char *host = NULL;

	if (!get_env(sp, "SLURM_STEP_NODELIST", nodelist, sizeof(nodelist)) &&
	    !get_env(sp, "SLURM_JOB_NODELIST", nodelist, sizeof(nodelist)))
		return NULL;
	hl = slurm_hostlist_create(nodelist);
	if (hl == NULL)
		return NULL;
	for (uint32_t i = 0; i <= n; i++) {
		free(host);
		host = slurm_hostlist_shift(hl);
		if (host == NULL)
			break;
	}
	slurm_hostlist_destroy(hl);
	return host;
}

/*
 * MASTER_ADDR: the address (NodeAddr) of the step's first node, or its name. By NodeName first
 * (slurm_conf_get_address, 22.05 to 26.05): slurm_conf_get_nodeaddr looks in the table hashed by
 * NodeHostname, so up to 24.11 it misses a node whose NodeName is not its hostname -- the sandbox's
 * n1 (NodeHostname=localhost) gave MASTER_ADDR=n1, a name its hosts cannot resolve.
 */
static int set_master_addr(spank_t sp)
{
	char *first = nth_node(sp, 0), *addr;
	int rc;

	if (first == NULL)
		return 0;
	addr = slurm_conf_get_address(first);
	if (addr == NULL || addr[0] == '\0') {
		slurm_xfree((void **)&addr);
		addr = slurm_conf_get_nodeaddr(first);
	}
	rc = set_env(sp, TETHER_ENV_MASTER_ADDR, addr ? addr : first);
	slurm_xfree((void **)&addr);
	free(first);
	return rc;
}

/* <job>/<node>/<step>/ as the user, and each local rank's directories; 0 or -1 (kept as the failure). */
static int make_step_dirs(spank_t sp, uint32_t nlocal)
{
	int job_fd, step_fd = -2, rc = -1;

	job_fd = open(step.job_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (job_fd < 0) {
		tether_fail("tether: cannot open %s: %s", step.job_dir, strerror(errno));
		return -1;
	}
	/* a node or step directory removed under us (another step of this job ended) is made again */
	for (int attempt = 0; attempt < 3 && step_fd == -2; attempt++)
		step_fd = open_node_and_step(job_fd);
	if (step_fd == -2)
		tether_fail("tether: %s kept disappearing while this step created it", step.step_dir);
	if (step_fd < 0)
		goto out;
	for (uint32_t local = 0; local < nlocal; local++) {
		uint32_t global = 0;

		if (spank_get_item(sp, S_JOB_LOCAL_TO_GLOBAL_ID, local, &global) != ESPANK_SUCCESS)
			global = local;
		if (tether_make_rank_dirs(step_fd, step.step_dir, global, step.uid, step.gid) < 0)
			goto out;
	}
	rc = 0;
out:
	if (step_fd >= 0)
		close(step_fd);
	close(job_fd);
	return rc;
}

/* An unsigned number from the job's environment (the user's: only their own ranks' values come
 * from it), or -1 when absent or not a plain number below 2^31. */
static long env_number(spank_t sp, const char *name)
{
	char buf[32], *end;
	unsigned long value;

	if (!get_env(sp, name, buf, sizeof(buf)) || buf[0] < '0' || buf[0] > '9')
		return -1;
	errno = 0;
	value = strtoul(buf, &end, 10);
	return (errno || *end || value > 0x7fffffffUL) ? -1 : (long)value;
}

/* Which component of a heterogeneous job this step's job is: the k whose SLURM_JOB_ID_HET_GROUP_k
 * is this component's own job id (S_JOB_ID); -1 outside one. ``leader``: the job's first id. */
static long het_component(spank_t sp, long *size, long *leader)
{
	char name[64];

	*size = env_number(sp, "SLURM_HET_SIZE");
	*leader = env_number(sp, "SLURM_JOB_ID");
	if (*size < 2 || *size > 1024 || *leader < 0)
		return -1;
	for (long k = 0; k < *size; k++) {
		snprintf(name, sizeof(name), "SLURM_JOB_ID_HET_GROUP_%ld", k);
		if (env_number(sp, name) == (long)step.job_id)
			return k;
	}
	return -1;
}

/* Is this step one component of a heterogeneous step (srun --het-group=0,1)? Which one (above).
 * The step's own job environment does not always say how many tasks the earlier components have
 * (with --slots in component 0, SLURM_NTASKS_HET_GROUP_0 is missing); each task's does
 * (SLURM_PROCID, SLURM_NTASKS, SLURM_NODEID: the whole step's), so the ranks are completed in
 * task_init. */
static void het_step(spank_t sp)
{
	long size, leader, k = het_component(sp, &size, &leader);

	step.het = 0;
	if (k < 0 || step.step_id >= SLURM_MAX_NORMAL_STEP_ID)
		return;
	step.het = 1;
	step.het_component = (uint32_t)k;
	step.het_components = (uint32_t)size;
	step.het_leader = (uint32_t)leader;
}

/*
 * SLURM_CPUS_PER_TASK, as sbatch and srun set it for --cpus-per-task (issue 45): tether's plan gives
 * a job its CPUs per task in slurmctld (CPU slots: slots_per_node), which neither client sees, so
 * the batch script and the ranks had no SLURM_CPUS_PER_TASK (OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
 * broke). Set when the job's environment has none: with --slot-type=cpu the plan's CPUs per task;
 * otherwise the step's, when more than one (the job's for the batch script, whose srun steps
 * inherit the variable; Slurm sets nothing where nobody asked for CPUs per task).
 */
static int set_cpus_per_task(spank_t sp)
{
	char name[64] = "SLURM_CPUS_PER_TASK";
	uint32_t cpus = 0;
	long size, leader, k;
	const char *type = tether_opt_value(OPT_SLOT_TYPE), *per_node = tether_opt_value(OPT_SLOTS_PER_NODE);

	/* The batch script of a heterogeneous job gets it as Slurm sets it there (sbatch -c2 : -n1):
	 * SLURM_CPUS_PER_TASK_HET_GROUP_<its component>, never plain -- srun applies a plain one to
	 * every component it starts (Slurm >= 23.11 reads it), and `srun --het-group=0,1` then asked
	 * component 1 for CPUs it never had and waited for ever ("step creation temporarily
	 * disabled"). */
	if (step.step_id == SLURM_BATCH_SCRIPT && (k = het_component(sp, &size, &leader)) >= 0)
		snprintf(name, sizeof(name), "SLURM_CPUS_PER_TASK_HET_GROUP_%ld", k);
	if (env_nonempty(sp, name) || env_nonempty(sp, "SLURM_CPUS_PER_TASK"))
		return 0;
	if (type != NULL && strcmp(type, "cpu") == 0) /* the plan's (hooks/plan.py, slurm-cpu): slots_per_node,
							 * 1 unless given -- also where srun made the
							 * allocation, whose step has 1 CPU per task */
		return set_env(sp, name, per_node ? per_node : "1");
	if (spank_get_item(sp, S_STEP_CPUS_PER_TASK, &cpus) != ESPANK_SUCCESS || cpus <= 1 || cpus > 65535)
		return 0;
	return set_env_u(sp, name, cpus);
}

/* rankenv.c's setter: spank_setenv, a failure kept as the step's */
static int set_rank_env(void *sp, const char *name, const char *value)
{
	return set_env(sp, name, value);
}

/* What this file knows of the step, for rankenv.c (the counts: user_init's). */
static struct tether_rank_step rank_step(void)
{
	struct tether_rank_step s = {
		.job_id = step.job_id, .step_id = step.step_id, .job_dir = step.job_dir, .step_dir = step.step_dir,
		.het = step.het, .het_component = step.het_component, .het_components = step.het_components,
		.het_leader = step.het_leader,
	};

	return s;
}

/* The step-wide part of the rank environment (rankenv.c; MASTER_ADDR, SLURM_CPUS_PER_TASK), and the
 * options the step's ranks see. */
static int set_step_env(spank_t sp, const struct tether_rank_step *rs)
{
	int rc = 0;

	if (tether_rank_step_env(rs, set_rank_env, sp) || set_cpus_per_task(sp) || set_master_addr(sp) < 0)
		return -1;
	for (int i = 0; i < TETHER_NOPTS && rc == 0; i++) {
		const struct tether_opt *o = &tether_opts[i];

		if (o->value && o->job_env) /* a slot option: described as TETHER_JOB_<NAME> */
			rc = set_env(sp, o->job_env, o->value);
		else if (o->value) /* a container option: the launcher reads TETHER_CONTAINER_*; in a
				    * batch script they are the defaults srun picks up for the job's steps */
			rc = set_env(sp, o->env, o->value);
		else if (tether_partner_set(i) && spank_unsetenv(sp, o->env) != ESPANK_SUCCESS)
			rc = -1; /* the job's own fallback its partner overrode (--container-readonly
				  * over an exported TETHER_CONTAINER_WRITABLE=1): not for the launcher */
	}
	return rc;
}

int tether_stepd_user_init(spank_t sp)
{
	struct tether_rank_step rs;

	if (!step.tether || step.failure[0])
		return 0; /* the tasks fail with the reason (see the top of this file) */
	rs = rank_step();
	spank_get_item(sp, S_JOB_TOTAL_TASK_COUNT, &rs.ntasks);
	spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &rs.nlocal);
	spank_get_item(sp, S_JOB_NNODES, &rs.nnodes);
	if (make_step_dirs(sp, tether_rank_local_tasks(&rs)) == 0)
		set_step_env(sp, &rs);
	return 0;
}

/*
 * Make the task exec tether's container launcher instead of its command; the launcher execs (or,
 * for runtimes that fork daemons, supervises) the container runtime, so the rank stays
 * slurmstepd's child. From Slurm 23.11, spank_prepend_task_argv() puts the launcher in front of the
 * task's argv, and TETHER_RUN_ARGV0 is set empty to say so. Slurm 22.05 has no way to insert, but
 * S_JOB_ARGV gives the array the task is about to exec (this is the forked task process, so only
 * the task sees the change): argv[0] becomes the launcher and the original argv[0] travels in
 * TETHER_RUN_ARGV0; argv[1..] stay. Either way the launcher's command is the task's.
 */
static int hand_to_launcher(spank_t sp, int gateways)
{
	int argc = 0;
	char **argv = NULL;
	char *launcher;

	if (tether_launcher == NULL) { /* gateways only: a container step failed in post_opt */
		slurm_error("tether: this job's gateway nodes need tether's launcher, which is not set up on "
			    "this cluster (plugstack.conf has no launcher=; an admin runs `tether slurm install --write`)");
		return -1;
	}

	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1 ||
	    argv == NULL || argv[0] == NULL) {
		slurm_error("tether: cannot read the task's command to run it in the container");
		return -1;
	}
#if TETHER_PREPEND_ARGV
	{
		const char *front[] = {tether_launcher, NULL};

		if (spank_prepend_task_argv(sp, 1, front) != ESPANK_SUCCESS ||
		    set_env(sp, TETHER_ENV_RUN_ARGV0, "") < 0) {
			slurm_error("tether: cannot put the container launcher in front of the task's command");
			return -1;
		}
		launcher = NULL;
	}
#else
	launcher = strdup(tether_launcher);
	if (launcher == NULL || set_env(sp, TETHER_ENV_RUN_ARGV0, argv[0]) < 0)
		return -1;
#endif
	/* the batch script (--container-batch): the launcher mounts the script into the container */
	if (step.container && step.step_id == SLURM_BATCH_SCRIPT && set_env(sp, TETHER_ENV_RUN_BATCH, "1") < 0)
		return -1;
	/* the batch script of a job with gateway nodes: the launcher starts their daemons first */
	if (gateways >= 0 && set_env_u(sp, TETHER_ENV_RUN_GATEWAYS, (unsigned long)gateways) < 0)
		return -1;
	/* The launcher supervises runtimes that double-fork as a child subreaper; the flag survives
	 * execve, so it is set here, where it costs nothing (the launcher would need ctypes). A batch
	 * script on the host (gateways only) is exec'd as it is: no flag. */
	if (step.container && prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
		slurm_error("tether: prctl(PR_SET_CHILD_SUBREAPER): %s", strerror(errno));
		return -1;
	}
	if (launcher)
		argv[0] = launcher; /* the old string belongs to slurmstepd's copy; this process execs now */
	return 0;
}

/*
 * The batch script of a heterogeneous job with a component in the gateway partition
 * (plugstack.conf gateway_partition=, the config's gateways.partition; job_submit gives that
 * partition only to a component asking --gateways=N): that component's index, else -1. Slurm
 * puts SLURM_HET_SIZE and each component's SLURM_JOB_PARTITION_HET_GROUP_<k> into the batch
 * script's environment (slurmctld, job_scheduler.c).
 */
static int gateway_component(spank_t sp)
{
	char name[64], partition[TETHER_MAX_NAME + 2];
	long size;

	if (tether_gateway_partition == NULL || step.job_id == 0 || step.step_id != SLURM_BATCH_SCRIPT)
		return -1;
	size = env_number(sp, "SLURM_HET_SIZE");
	for (long k = 1; k < size && k < 1024; k++) {
		snprintf(name, sizeof(name), "SLURM_JOB_PARTITION_HET_GROUP_%ld", k);
		if (get_env(sp, name, partition, sizeof(partition)) &&
		    strcmp(partition, tether_gateway_partition) == 0)
			return (int)k;
	}
	return -1;
}

int tether_stepd_task_init(spank_t sp)
{
	struct tether_rank_step rs;
	struct tether_rank_task task = { .procid = -1, .ntasks = -1, .node_index = -1, .nnodes = -1 };
	char gpus[1024];
	int gateways = gateway_component(sp);

	if (!step.tether) /* a batch script without tether options may still have gateway nodes */
		return gateways >= 0 ? hand_to_launcher(sp, gateways) : 0;
	spank_get_item(sp, S_TASK_ID, &task.local_id);
	if (step.failure[0]) {
		if (task.local_id == 0) /* once per node: the task's stderr is the job's output */
			slurm_error("%s", step.failure);
		return -1; /* the task exits 1: the step (or batch job) fails, the node stays */
	}
	spank_get_item(sp, S_TASK_GLOBAL_ID, &task.global_id);
	spank_get_item(sp, S_JOB_NODEID, &task.node_id);
	if ((step.container || gateways >= 0) && hand_to_launcher(sp, gateways) < 0)
		return -1;
	if (step.het) { /* the whole step's numbers, as Slurm gives them to each task */
		task.procid = env_number(sp, "SLURM_PROCID");
		task.ntasks = env_number(sp, "SLURM_NTASKS");
		task.node_index = env_number(sp, "SLURM_NODEID");
		task.nnodes = env_number(sp, "SLURM_STEP_NUM_NODES");
	}
	task.slot_type = tether_opt_value(OPT_SLOT_TYPE);
	task.gpus = get_env(sp, "CUDA_VISIBLE_DEVICES", gpus, sizeof(gpus)) ? gpus : NULL;
	rs = rank_step();
	return tether_rank_task_env(&rs, &task, set_rank_env, sp) ? -1 : 0;
}

/*
 * slurmstepd, as root, once the first task is forked (its cgroups exist by then): a container
 * step's processes are kept in Slurm's own cgroups (cgkeeper.c). Never fails the step.
 */
int tether_stepd_task_post_fork(spank_t sp)
{
	char slurm_step[32];

	(void)sp;
	if (!step.tether || !step.container || step.failure[0])
		return 0;
	snprintf(slurm_step, sizeof(slurm_step), "step_%u", step.step_id); /* Slurm's own name */
	if (tether_cgkeeper_start(step.job_id, slurm_step) < 0)
		slurm_debug("tether: no cgroup v1 step directories to keep the container in");
	return 0;
}

/*
 * slurmstepd, as root, as each task exits: once the last of this node's tasks has, the keeper
 * stops and removes the emptied child cgroups -- now, before Slurm removes the step's own
 * cgroups (it cannot while a child is left: they leaked, one set per container step).
 */
int tether_stepd_task_exit(spank_t sp)
{
	static uint32_t exited;
	uint32_t ntasks = 0;

	if (!step.tether || !step.container)
		return 0;
	if (spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &ntasks) != ESPANK_SUCCESS || ++exited >= ntasks)
		tether_cgkeeper_stop();
	return 0;
}

/* Does a file of /proc hold exactly ``want`` (its first ``len`` bytes, then NUL or its end)? */
static int proc_file_starts(int pid_fd, const char *file, const char *want, size_t len, int whole)
{
	char buf[128];
	ssize_t n;
	int fd = openat(pid_fd, file, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf));
	close(fd);
	if (n < (ssize_t)len || memcmp(buf, want, len) != 0)
		return 0;
	return !whole || n == (ssize_t)len || buf[len] == '\0';
}

/* Is process ``pid_fd`` (a /proc/<pid> directory) root's through and through (real, effective,
 * saved and filesystem uid 0)? Not the directory's owner: a user's process that made itself
 * non-dumpable shows a root-owned /proc/<pid>. */
static int proc_is_root(int pid_fd)
{
	char buf[4096], *uid;
	unsigned r, e, sv, fs;
	ssize_t n;
	int fd = openat(pid_fd, "status", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	uid = strstr(buf, "\nUid:");
	return uid && sscanf(uid + 5, "%u %u %u %u", &r, &e, &sv, &fs) == 4 && (r | e | sv | fs) == 0;
}

/* Is process ``pid_fd`` not told apart from this slurmd's by its SLURM_CONF (both unset, or the
 * same)? Several clusters on one host (developers' sandboxes) number their jobs alike. When in
 * doubt (an environment beyond 64 KiB), it is: that only leaves the job's directory to the epilog. */
static int proc_same_slurm(int pid_fd, const char *conf)
{
	const size_t cap = 64 * 1024;
	char *env = malloc(cap + 1), *p;
	size_t len = 0;
	ssize_t n = 0;
	int fd = openat(pid_fd, "environ", O_RDONLY | O_CLOEXEC), same = conf == NULL;

	if (fd < 0 || env == NULL) {
		if (fd >= 0)
			close(fd);
		free(env);
		return 1;
	}
	while (len < cap && (n = read(fd, env + len, cap - len)) > 0)
		len += (size_t)n;
	close(fd);
	env[len] = '\0';
	if (len == cap)
		same = 1;
	for (p = env; p < env + len; p += strlen(p) + 1)
		if (strncmp(p, "SLURM_CONF=", 11) == 0) {
			same = conf && strcmp(p + 11, conf) == 0;
			break;
		}
	free(env);
	return same;
}

/*
 * Is step directory ``label`` (step-<id>, step-batch, step-extern, step-interactive) one of a step of
 * job ``job_id`` that slurmstepd still runs here? The user owns the node's directory and can make
 * any name in it, and run any process; but not a root process titled "slurmstepd: [<job>.<step>]"
 * (a heterogeneous step's component: "[<job>.<step>+<n>]") of this slurmd's configuration. Several
 * slurmd on one host (the sandbox) see each other's steps: then a step of the job still running on
 * another of them counts too, which only leaves the job's directory to the job epilog.
 */
static int step_still_running(uint32_t job_id, const char *label)
{
	const char *id = label + strlen(TETHER_STEP_PREFIX), *conf = getenv("SLURM_CONF");
	char want[96];
	struct dirent *d;
	size_t n, digits = strspn(id, "0123456789");
	int found = 0;
	DIR *proc;

	if (!(strcmp(id, "batch") == 0 || strcmp(id, "extern") == 0 || strcmp(id, "interactive") == 0 ||
	      (digits > 0 && digits <= 10 && id[digits] == '\0' && (id[0] != '0' || digits == 1))))
		return 0;
	n = (size_t)snprintf(want, sizeof(want), "slurmstepd: [%u.%s", job_id, id);
	if (n >= sizeof(want) || (proc = opendir("/proc")) == NULL)
		return 0;
	while (!found && (d = readdir(proc)) != NULL) {
		int pid_fd;

		if (d->d_name[0] < '1' || d->d_name[0] > '9')
			continue;
		pid_fd = openat(dirfd(proc), d->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (pid_fd < 0)
			continue;
		want[n] = ']';
		found = proc_file_starts(pid_fd, "cmdline", want, n + 1, 1);
		want[n] = '+';
		found = found || proc_file_starts(pid_fd, "cmdline", want, n + 1, 0);
		found = found && proc_is_root(pid_fd) && proc_same_slurm(pid_fd, conf);
		close(pid_fd);
	}
	closedir(proc);
	return found;
}

/* Does another step still end on this node: its directory under this node's part of job directory
 * ``name``, of a step slurmstepd still runs (its own end removes it, after its containers'
 * cleanup)? A directory the job made itself with such a name is not one. Nothing is followed. */
static int other_steps_here(int root_fd, const char *name)
{
	const char *node = step.node[0] ? step.node : getenv("SLURMD_NODENAME");
	int job_fd, node_fd, found = 0;
	struct dirent *d;
	DIR *dir;

	if (node == NULL || !tether_name_ok(node, sizeof(step.node) - 1))
		return 0;
	job_fd = openat(root_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (job_fd < 0)
		return 0;
	node_fd = openat(job_fd, node, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	close(job_fd);
	if (node_fd < 0 || (dir = fdopendir(node_fd)) == NULL) {
		if (node_fd >= 0)
			close(node_fd);
		return 0;
	}
	while (!found && (d = readdir(dir)) != NULL) {
		struct stat st;

		if (strncmp(d->d_name, TETHER_STEP_PREFIX, strlen(TETHER_STEP_PREFIX)) != 0 ||
		    strcmp(d->d_name, step.step_name) == 0)
			continue;
		found = (d->d_type == DT_DIR || (d->d_type == DT_UNKNOWN &&
			 fstatat(dirfd(dir), d->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))) &&
			step_still_running(step.job_id, d->d_name);
	}
	closedir(dir);
	return found;
}

struct other_nodes {
	tether_hostlist_t nodes; /* the job's; NULL: unknown, every configured node counts */
	const char *self;
};

/* Is ``name`` another node of the job's (of the cluster's, when the job's are unknown)? */
static int is_other_node(const char *name, void *arg)
{
	const struct other_nodes *o = arg;
	char *addr;

	if (name[0] == '.' || strcmp(name, o->self) == 0)
		return 0;
	if (o->nodes)
		return slurm_hostlist_find(o->nodes, name) >= 0;
	addr = slurm_conf_get_address(name);
	if (addr == NULL)
		return 0;
	slurm_xfree((void **)&addr);
	return 1;
}

/* Does job directory ``job_fd`` hold a directory of another node of the job? */
static int another_nodes_part(int job_fd, struct other_nodes *o)
{
	struct dirent *d;
	int found = 0, fd = openat(job_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* its own offset */
	DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;

	if (dir == NULL) {
		if (fd >= 0)
			close(fd);
		return 1;
	}
	while (!found && (d = readdir(dir)) != NULL) {
		struct stat st;

		found = is_other_node(d->d_name, o) &&
			(d->d_type == DT_DIR || (d->d_type == DT_UNKNOWN &&
			 fstatat(dirfd(dir), d->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)));
	}
	closedir(dir);
	return found;
}

/* Does job directory ``name`` hold a part of another node of the cluster (one that cannot be opened
 * has none)? The batch step does not know the job's nodes: a directory of the job's own that takes
 * a node's name only leaves the job's directory to the job epilog, which knows them. */
static int other_nodes_at(int root_fd, const char *name)
{
	const char *node = step.node[0] ? step.node : getenv("SLURMD_NODENAME");
	struct other_nodes others = { NULL, node ? node : "" };
	int job_fd = openat(root_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), found;

	if (job_fd < 0)
		return 0;
	found = another_nodes_part(job_fd, &others);
	close(job_fd);
	return found;
}

/*
 * slurmstepd, as root, when the step ends (normally, failed, cancelled or timed out): the step's
 * directories; the job's and the node's stay for the job's next step. The end of the batch step is
 * the end of the job: then the whole job directory goes, whatever the job left in it -- unless
 * another step is still ending on this node (see below), or another node has a part in it (its
 * steps may still be ending): then the job epilog of the job's last node takes the rest.
 */
void tether_stepd_exit(void)
{
	char name[32], what[96];
	int root_fd, job_fd, node_fd;

	tether_cgkeeper_stop();
	unbind_enroot_dir();
	if (!step.tether && step.job_id && step.step_id == SLURM_BATCH_SCRIPT) {
		/* a batch script without tether options whose sruns had some: the job's directory
		 * (a --container-name container kept on a node, say) still goes with the job */
		snprintf(step.job_dir, sizeof(step.job_dir), "%s/%u", tether_job_storage_root, step.job_id);
		step_label(step.step_id, step.step_name, sizeof(step.step_name));
	} else if (!step.tether || !step.step_name[0] || !step.node[0] || !step.job_dir[0])
		return;
	snprintf(what, sizeof(what), "step %u.%.40s", step.job_id, step.step_name + strlen(TETHER_STEP_PREFIX));
	root_fd = open(tether_job_storage_root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (root_fd < 0)
		return;
	snprintf(name, sizeof(name), "%u", step.job_id);
	if (step.step_id == SLURM_BATCH_SCRIPT && !other_steps_here(root_fd, name) && !other_nodes_at(root_fd, name)) {
		/* the job's end, with no other step left here and no other node's part: the job's
		 * directory goes whole */
		if (tether_launcher && tether_has_leftovers(root_fd, name, 2))
			tether_run_leftover_cleanup(tether_launcher, step.job_dir, step.uid, step.gid, what);
		tether_remove_tree_at(root_fd, name);
		close(root_fd);
		return;
	}
	/* A step that is still ending here (at a time limit the batch step can end first) removes its
	 * own directory, after its containers' cleanup: removed with the tree now, its cleanup marker
	 * was lost while its container was still being stopped, and the container stayed in podman's
	 * records. So the batch step then ends as any step; the rest goes with that step's end or,
	 * once every step here has ended, with slurmd's job epilog (tether_job_epilog).
	 * The job's directory and this node's stay for the job's next step: made and removed again by
	 * every step, they cost each node 4 metadata operations more per step. */
	if (!step.node[0]) {
		close(root_fd);
		return;
	}
	job_fd = openat(root_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (job_fd >= 0) {
		node_fd = openat(job_fd, step.node, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (node_fd >= 0) {
			if (step.container && tether_launcher && tether_has_leftovers(node_fd, step.step_name, 0))
				tether_run_leftover_cleanup(tether_launcher, step.step_dir, step.uid, step.gid, what);
			tether_remove_tree_at(node_fd, step.step_name);
			close(node_fd);
		}
		close(job_fd);
	}
	close(root_fd);
}

/* The job's nodes in the epilog: slurmd's own SLURM_NODELIST (set after the job's spank
 * environment, whose entries slurmd prefixes with SPANK_, so not the user's); NULL when absent. */
static tether_hostlist_t epilog_nodes(void)
{
	const char *list = getenv("SLURM_NODELIST");

	return list && list[0] ? slurm_hostlist_create(list) : NULL;
}

/*
 * slurmd's job epilog (`slurmstepd spank epilog`, as root, on each node of the job once its steps
 * there have ended): this node's part of the job's directory goes -- what an allocation without a
 * batch step (salloc) kept across its steps (a --container-name root, enroot's data) had nothing
 * else to remove it, and a batch step's end leaves it when another step still ended here or another
 * node had a part. The last node out then removes everything else the job left in its directory
 * (files, directories, links -- beside the nodes' parts) and the directory itself: the job storage
 * root may be shared between the nodes, so a node removes only its own part while another node of
 * the job still has one (the last to remove its own sees none left, whatever the order). Only the
 * job id, the uid and gid (spank items), slurmd's own node name (SLURMD_NODENAME) and the job's
 * nodes (SLURM_NODELIST), which slurmd sets after merging the job's spank environment, say where;
 * nothing is followed, as at a step's end. Never fails: an epilog error would drain the node.
 */
void tether_job_epilog(spank_t sp)
{
	const char *node = getenv("SLURMD_NODENAME");
	char name[32], where[PATH_MAX], what[64];
	struct other_nodes others = { NULL, NULL };
	uint32_t job_id;
	uid_t uid;
	gid_t gid;
	int root_fd, job_fd;

	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS) {
		tether_error("tether: job epilog: cannot read the job's id, uid or gid");
		return;
	}
	if (node == NULL || !tether_name_ok(node, sizeof(step.node) - 1)) {
		tether_error("tether: job epilog of job %u: no usable SLURMD_NODENAME", job_id);
		return;
	}
	root_fd = open(tether_job_storage_root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (root_fd < 0)
		return;
	snprintf(name, sizeof(name), "%u", job_id);
	job_fd = openat(root_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (job_fd < 0) { /* the common case: no tether step here, or the batch step's end took it */
		close(root_fd);
		return;
	}
	snprintf(where, sizeof(where), "%s/%s/%s", tether_job_storage_root, name, node);
	snprintf(what, sizeof(what), "job %u", job_id);
	if (tether_launcher && tether_has_leftovers(job_fd, node, 1))
		tether_run_leftover_cleanup(tether_launcher, where, uid, gid, what);
	tether_remove_tree_at(job_fd, node);
	others.nodes = epilog_nodes();
	others.self = node;
	if (!another_nodes_part(job_fd, &others)) {
		int fd = dup(job_fd);

		/* the last node out: no node of the job can make its part again now */
		if (fd >= 0 && tether_remove_entries(fd, NULL, NULL) < 0)
			tether_error("tether: job epilog of job %u: %s/%s could not be emptied completely", job_id,
				     tether_job_storage_root, name);
	}
	if (others.nodes)
		slurm_hostlist_destroy(others.nodes);
	close(job_fd);
	unlinkat(root_fd, name, AT_REMOVEDIR); /* only when no other node uses it any more */
	close(root_fd);
}
