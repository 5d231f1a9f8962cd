/*
 * tether SPANK plugin, remote side (slurmstepd): per-job and per-rank directories, the rank
 * environment, and their cleanup. Appended to shim.c at build time; C only, so a step costs no
 * Python.
 *
 * Layout under job_storage_root (plugstack.conf argument, written by `tether slurm install` from
 * tether's config; the directory must be root-owned and not writable by others):
 *
 *   <root>/<jobid>/                     created by root for the job user, mode 0700
 *   <root>/<jobid>/<node>/step-<id>/rank-<global rank>/{tmp,work}   created as the job user
 *
 * The directory primitives (no symlink followed, race-free across nodes) are in jobdirs.c, shared
 * with the PBS hooks' helper; a parent removed under us (another step ended) is created again.
 * Removal happens when a step ends (root, fd-relative, never following a symlink); the node's and
 * the job's directories go with the last step that used them.
 */

static int remote_step;                /* this step carries tether options */
static int container_step;             /* ... and its tasks run in a container */
static uid_t job_uid;
static gid_t job_gid;
static uint32_t job_id, step_id;
static char node_name[256];
static char step_name[64];             /* step-0, step-batch, step-extern, ... */
static char job_dir[PATH_MAX];         /* <root>/<jobid> */
static char step_dir[PATH_MAX];        /* <root>/<jobid>/<node>/<step> */
static char remote_failure[1024];      /* why this step cannot run (first reason) */

/*
 * tether_fail(): log why the step cannot run and keep the first reason. Failing in init_post_opt
 * would only reach slurmd's log (the user would read "Plugin initialization failed"), so that part
 * records the reason and user_init -- whose errors reach the user's srun/job output -- fails with it.
 */
static void tether_report(enum tether_level level, const char *msg)
{
	if (level == TETHER_INFO) {
		slurm_info("%s", msg);
		return;
	}
	slurm_error("%s", msg);
	if (level == TETHER_FAIL && !remote_failure[0])
		snprintf(remote_failure, sizeof(remote_failure), "%s", msg);
}

static void step_label(uint32_t id, char *buf, size_t len)
{
	if (id == SLURM_BATCH_SCRIPT)
		snprintf(buf, len, "step-batch");
	else if (id == SLURM_EXTERN_CONT)
		snprintf(buf, len, "step-extern");
	else if (id == SLURM_INTERACTIVE_STEP)
		snprintf(buf, len, "step-interactive");
	else
		snprintf(buf, len, "step-%u", id);
}

/* The effective value of option ``name`` (from the step, or inherited from the job), or NULL. */
static const char *opt_value(const char *name)
{
	for (int i = 0; i < TETHER_NOPTS; i++)
		if (tether_opts[i].value && strcmp(tether_opts[i].name, name) == 0)
			return tether_opts[i].value;
	return NULL;
}

static int get_env(spank_t sp, const char *name, char *buf, int len)
{
	return spank_getenv(sp, name, buf, len) == ESPANK_SUCCESS;
}

static int set_env(spank_t sp, const char *name, const char *value)
{
	spank_err_t rc = spank_setenv(sp, name, value, 1);

	if (rc != ESPANK_SUCCESS) {
		slurm_error("tether: cannot set %s: %s", name, spank_strerror(rc));
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

/* slurmstepd, as root, before the user's part: is this a tether step; the job's directory.
 * Never fails itself: a reason to stop the step is kept for user_init (see tether_fail). */
static int remote_post_opt(spank_t sp)
{
	char shown[PATH_MAX], name[32];
	int root_fd, fd;

	for (int i = 0; i < TETHER_NOPTS; i++)
		if (tether_opts[i].value)
			remote_step = 1;
	if (!remote_step)
		return 0; /* not a tether step: nothing at all */
	if (spank_get_item(sp, S_JOB_UID, &job_uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &job_gid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS) {
		tether_fail("tether: cannot read the job's uid, gid, id or step id");
		return 0;
	}
	/* The tasks of an ordinary step run in the container; the batch script, salloc's interactive
	 * step and the extern step stay on the host (so srun works inside a batch script). */
	container_step = opt_value("container-image") != NULL && step_id < SLURM_MAX_NORMAL_STEP_ID;
	if (container_step && tether_launcher == NULL) {
		tether_fail("tether: --container-image: containers are not set up on this cluster "
			    "(plugstack.conf has no launcher=; an admin runs `tether slurm install --write`)");
		return 0;
	}
	/* Keep everything a container step starts inside the step: a runtime that double-forks
	 * (podman's conmon) is caught by the launcher, itself a child subreaper; should the launcher
	 * die (SIGKILL, the OOM killer), its orphans re-parent to this slurmstepd instead of init, so
	 * process tracking still signals and kills them with the step (slurmstepd's wait3() loop
	 * reaps pids that are not tasks without complaint). */
	if (container_step && prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
		slurm_error("tether: prctl(PR_SET_CHILD_SUBREAPER): %m");
	root_fd = open_storage_root(tether_job_storage_root);
	if (root_fd < 0)
		return 0;
	snprintf(name, sizeof(name), "%u", job_id);
	snprintf(job_dir, sizeof(job_dir), "%s/%s", tether_job_storage_root, name);
	snprintf(shown, sizeof(shown), "%s", job_dir);
	fd = claim_job_dir(root_fd, name, job_uid, job_gid, shown);
	close(root_fd);
	if (fd >= 0) /* -2 (removed under us) cannot happen here: only root removes it */
		close(fd);
	return 0;
}

/* The n-th node of the step's (or, for the batch step, the job's) node list. */
static char *nth_node(spank_t sp, uint32_t n)
{
	char nodelist[8192] = "";
	hostlist_t hl;
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

/* This node's Slurm name (several slurmd may share one host, so not gethostname()). */
static int this_node_name(spank_t sp)
{
	uint32_t nodeid = 0;
	char *name;

	spank_get_item(sp, S_JOB_NODEID, &nodeid);
	name = nth_node(sp, nodeid);
	if (name == NULL)
		return -1;
	snprintf(node_name, sizeof(node_name), "%s", name);
	free(name);
	return name_ok(node_name, sizeof(node_name) - 1) ? 0 : -1;
}

/* MASTER_ADDR: the address (NodeAddr) of the step's first node, or its name. */
static int set_master_addr(spank_t sp)
{
	char *first = nth_node(sp, 0), *addr;
	int rc;

	if (first == NULL)
		return 0;
	addr = slurm_conf_get_nodeaddr(first);
	rc = set_env(sp, "MASTER_ADDR", addr ? addr : first);
	slurm_xfree((void **)&addr);
	free(first);
	return rc;
}

/* slurmstepd, as the job user, before the tasks fork: the step's and every local rank's
 * directories, and the step-wide environment. */
static int remote_user_init(spank_t sp)
{
	uint32_t ntasks = 0, nlocal = 0, nnodes = 0;
	char buf[PATH_MAX], shown[PATH_MAX];
	int job_fd, node_fd = -1, step_fd = -1, rc = -1;

	if (!remote_step)
		return 0;
	if (remote_failure[0]) {
		slurm_error("%s", remote_failure);   /* found as root, told to the user here */
		return -1;
	}
	if (this_node_name(sp) < 0) {
		slurm_error("tether: cannot tell this node's name (or it cannot be a directory name)");
		node_name[0] = '\0';
		return -1;
	}
	step_label(step_id, step_name, sizeof(step_name));
	spank_get_item(sp, S_JOB_TOTAL_TASK_COUNT, &ntasks);
	spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &nlocal);
	spank_get_item(sp, S_JOB_NNODES, &nnodes);

	job_fd = open(job_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (job_fd < 0) {
		slurm_error("tether: cannot open %s: %m", job_dir);
		return -1;
	}
	if (path_join(shown, sizeof(shown), job_dir, node_name) < 0 ||
	    path_join(step_dir, sizeof(step_dir), shown, step_name) < 0)
		goto out;
	for (int attempt = 0; attempt < 3 && step_fd < 0; attempt++) {
		if (node_fd >= 0)
			close(node_fd);
		node_fd = ensure_dir_at(job_fd, node_name, 0700, job_uid, job_gid, shown);
		if (node_fd == -1)
			goto out;
		if (node_fd == -2)
			continue;
		step_fd = ensure_dir_at(node_fd, step_name, 0700, job_uid, job_gid, step_dir);
		if (step_fd == -1)
			goto out;
	}
	if (step_fd < 0) {
		slurm_error("tether: %s kept disappearing while this step created it", step_dir);
		goto out;
	}
	for (uint32_t local = 0; local < nlocal; local++) {
		uint32_t global = 0;

		if (spank_get_item(sp, S_JOB_LOCAL_TO_GLOBAL_ID, local, &global) != ESPANK_SUCCESS)
			global = local;
		if (make_rank_dirs(step_fd, step_dir, global, job_uid, job_gid) < 0)
			goto out;
	}

	/* The step-wide part of the rank environment. */
	if (set_env(sp, "TETHER_JOB_DIR", job_dir) || set_env(sp, "TETHER_STEP_DIR", step_dir) ||
	    set_env_u(sp, "WORLD_SIZE", ntasks) || set_env_u(sp, "LOCAL_WORLD_SIZE", nlocal) ||
	    set_env_u(sp, "TETHER_NNODES", nnodes) || set_master_addr(sp) < 0)
		goto out;
	/* Every rank of a step derives the same port; concurrent steps of a job (and jobs with
	 * neighbouring ids) get different ones: 20000 + (job id mod 2000) * 16 + (step id mod 16). */
	rc = set_env_u(sp, "MASTER_PORT", 20000 + (job_id % 2000) * 16 +
		       (step_id < SLURM_MAX_NORMAL_STEP_ID ? step_id % 16 : 15));
	for (int i = 0; i < TETHER_NOPTS && rc == 0; i++) {
		static const char *const described[] = { "slots", "slots-per-node", "slot-type",
							 "gpu-type", "resource-pool", NULL };
		if (tether_opts[i].value && one_of(tether_opts[i].name, described)) {
			snprintf(buf, sizeof(buf), "TETHER_JOB_%s", tether_opts[i].env + strlen("TETHER_"));
			rc = set_env(sp, buf, tether_opts[i].value);
		} else if (tether_opts[i].value && strncmp(tether_opts[i].name, "container-", 10) == 0) {
			/* The launcher reads the container options from TETHER_CONTAINER_*; in a batch
			 * script they are the defaults srun picks up for the job's steps. */
			rc = set_env(sp, tether_opts[i].env, tether_opts[i].value);
		}
	}
out:
	if (step_fd >= 0)
		close(step_fd);
	if (node_fd >= 0)
		close(node_fd);
	close(job_fd);
	return rc;
}

/*
 * Make the task exec tether's container launcher instead of its command. Slurm 22.05 has no
 * spank_prepend_task_argv(), but S_JOB_ARGV gives the array the task is about to exec (this is the
 * forked task process, so only the task sees the change): argv[0] becomes the launcher and the
 * original argv[0] travels in TETHER_RUN_ARGV0; argv[1..] stay. The launcher execs (or, for runtimes
 * that fork daemons, supervises) the container runtime, so the rank stays slurmstepd's child.
 */
static int hand_to_launcher(spank_t sp)
{
	int argc = 0;
	char **argv = NULL;
	char *launcher;

	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1 ||
	    argv == NULL || argv[0] == NULL) {
		slurm_error("tether: cannot read the task's command to run it in the container");
		return -1;
	}
	launcher = strdup(tether_launcher);
	if (launcher == NULL || set_env(sp, "TETHER_RUN_ARGV0", argv[0]) < 0)
		return -1;
	/* The launcher supervises runtimes that double-fork as a child subreaper; the flag survives
	 * execve, so it is set here, where it costs nothing (the launcher would need ctypes). */
	if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
		slurm_error("tether: prctl(PR_SET_CHILD_SUBREAPER): %m");
		return -1;
	}
	argv[0] = launcher; /* the old string belongs to slurmstepd's copy; this process execs now */
	return 0;
}

/* In each task, as the job user, just before exec: the per-rank part of the environment. */
static int remote_task_init(spank_t sp)
{
	uint32_t global = 0, node = 0;
	int local = 0;
	char rank_dir[PATH_MAX + 32], path[PATH_MAX + 40], gpus[1024] = "";
	const char *slot_type = opt_value("slot-type");

	if (!remote_step)
		return 0;
	spank_get_item(sp, S_TASK_GLOBAL_ID, &global);
	spank_get_item(sp, S_TASK_ID, &local);
	spank_get_item(sp, S_JOB_NODEID, &node);
	snprintf(rank_dir, sizeof(rank_dir), "%s/rank-%u", step_dir, global);
	if (container_step && hand_to_launcher(sp) < 0)
		return -1;
	if (set_env_u(sp, "RANK", global) || set_env_u(sp, "LOCAL_RANK", local) ||
	    set_env_u(sp, "NODE_RANK", node) || set_env(sp, "TETHER_RANK_DIR", rank_dir))
		return -1;
	snprintf(path, sizeof(path), "%s/tmp", rank_dir);
	if (set_env(sp, "TMPDIR", path))
		return -1;
	snprintf(path, sizeof(path), "%s/work", rank_dir);
	if (set_env(sp, "TETHER_WORK_DIR", path))
		return -1;
	/* The slots this rank got: its GPUs as Slurm bound them (--slot-type=cpu: none here). */
	if ((slot_type == NULL || strcmp(slot_type, "cpu") != 0) &&
	    get_env(sp, "CUDA_VISIBLE_DEVICES", gpus, sizeof(gpus))) {
		if (set_env(sp, "TETHER_SLOT_IDS", gpus))
			return -1;
		if (slot_type && strcmp(slot_type, "rocm") == 0 && set_env(sp, "ROCR_VISIBLE_DEVICES", gpus))
			return -1;
	}
	return 0;
}

/* slurmstepd, as root, when the step ends (normally, failed, cancelled or timed out): the step's
 * directories, then the node's and the job's when no other step uses them. The end of the batch
 * step is the end of the job: then the whole job directory goes, whatever the job left in it. */
static void remote_exit(void)
{
	char name[32], what[96];
	int root_fd, job_fd, node_fd;

	if (!remote_step || !step_name[0] || !node_name[0])
		return;
	snprintf(what, sizeof(what), "step %u.%s", job_id, step_name + 5);
	root_fd = open(tether_job_storage_root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (root_fd < 0)
		return;
	snprintf(name, sizeof(name), "%u", job_id);
	if (step_id == SLURM_BATCH_SCRIPT) {
		/* the job's end: other steps may still be ending, their markers go with the tree */
		if (tether_launcher && has_leftovers(root_fd, name, 2))
			run_leftover_cleanup(tether_launcher, job_dir, job_uid, job_gid, what);
		remove_tree_at(root_fd, name, 0);
		close(root_fd);
		return;
	}
	job_fd = openat(root_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (job_fd >= 0) {
		node_fd = openat(job_fd, node_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (node_fd >= 0) {
			if (container_step && tether_launcher && has_leftovers(node_fd, step_name, 0))
				run_leftover_cleanup(tether_launcher, step_dir, job_uid, job_gid, what);
			remove_tree_at(node_fd, step_name, 0);
			close(node_fd);
		}
		unlinkat(job_fd, node_name, AT_REMOVEDIR); /* only when empty: no other step here */
		close(job_fd);
	}
	unlinkat(root_fd, name, AT_REMOVEDIR);            /* only when no node uses it any more */
	close(root_fd);
}
