/*
 * tether's per-job and per-rank directories under job_storage_root (layout: tether/hooks/layout.py),
 * one implementation for the SPANK plugin (inside slurmstepd) and for tether-jobdirs (the PBS MoM
 * hooks' helper): jobdirs.c, compiled once and linked into both.
 *
 * Every path is created and opened relative to a directory fd with O_NOFOLLOW: no symlink is ever
 * followed, by root or by the user; a symlink (or a foreign or non-directory entry) where tether
 * expects its own directory is refused with a message naming the path.
 */
#ifndef TETHER_JOBDIRS_H
#define TETHER_JOBDIRS_H

#include <stddef.h>
#include <sys/types.h>

#include "values.h" /* tether_name_ok */

enum tether_level { TETHER_FAIL, TETHER_ERROR, TETHER_INFO };

/*
 * Where messages go; defined by the program jobdirs.c is linked into (slurmstepd's plugin: the
 * job's output and slurmd's log; tether-jobdirs: stderr and syslog). TETHER_FAIL: a reason the job
 * cannot run (shown to the user); TETHER_ERROR, TETHER_INFO: the daemon's log.
 */
void tether_report(enum tether_level level, const char *msg);

__attribute__((format(printf, 1, 2))) void tether_fail(const char *fmt, ...);
__attribute__((format(printf, 1, 2))) void tether_error(const char *fmt, ...);
__attribute__((format(printf, 1, 2))) void tether_info(const char *fmt, ...);

/* ``a``/``b`` into ``out``; -1 (and a message) when it does not fit. */
int tether_path_join(char *out, size_t len, const char *a, const char *b);

/* An fd on the job storage root, which must be a root-owned directory others cannot write to;
 * -1 (reported) otherwise. */
int tether_open_storage_root(const char *root);

/* An fd on directory ``name`` under ``dirfd``, owned by ``uid`` (created with ``mode`` when missing;
 * as root, created already owned by uid:gid). -1: refused or failed (reported); -2: it was removed
 * under us (another step ended): try again. ``shown`` is the full path, for messages. */
int tether_ensure_dir_at(int dirfd, const char *name, mode_t mode, uid_t uid, gid_t gid, const char *shown);

/* tether_ensure_dir_at for ``name`` below ``dirfd`` (shown as ``parent_shown``), mode 0700; the
 * path in ``shown`` (``len`` bytes). -1 also when the path does not fit (reported). */
int tether_ensure_child(int dirfd, const char *parent_shown, const char *name, uid_t uid, gid_t gid,
			char *shown, size_t len);

/* The job's directory ``name`` under the storage root for uid:gid (a leftover of an earlier job with
 * this id, owned by another uid, is removed first); its fd, or -1 (reported). */
int tether_claim_job_dir(int root_fd, const char *name, uid_t uid, gid_t gid, const char *shown);

/* The user's own directory ``<base>/<uid>`` (uid:gid, 0700) on this node, made as root: ``base`` and
 * each directory above it must be root's and not writable by group or others (missing ones are made,
 * 0755), so no user can make another's first or swap it. 0, or -1 (reported). */
int tether_ensure_user_dir(const char *base, uid_t uid, gid_t gid);

/* tether_ensure_user_dir for each of the ':'-separated absolute paths in ``bases``. */
int tether_ensure_user_dirs(const char *bases, uid_t uid, gid_t gid);

/* One rank's directories rank-<rank>/{tmp,work} below ``step_fd``; 0 or -1 (reported). */
int tether_make_rank_dirs(int step_fd, const char *step_shown, unsigned rank, uid_t uid, gid_t gid);

/* Remove ``name`` under ``parent`` and everything below it, never following a symlink. 0 when it is
 * gone; -1 when something stayed (reported): a tree too deep to walk, an entry that cannot go. */
int tether_remove_tree_at(int parent, const char *name);

/* Remove the entries of directory ``fd`` (closed here) that ``keep`` (when given) does not keep. */
int tether_remove_entries(int fd, int (*keep)(const char *name, void *arg), void *arg);

/* Does ``name`` under ``parent`` hold cleanup markers a launcher left, directly or -- with
 * ``depth`` 1 or 2 -- in the directories below it? Never follows symlinks. */
int tether_has_leftovers(int parent, const char *name, int depth);

/* Run the container launcher in cleanup mode as uid:gid for the markers under ``where``, detached
 * from the step, its signals and limits reset, killed after a bound; waits until it has read the
 * markers. ``what`` names the step or job for messages. */
void tether_run_leftover_cleanup(const char *launcher, const char *where, uid_t uid, gid_t gid,
				 const char *what);

#endif
