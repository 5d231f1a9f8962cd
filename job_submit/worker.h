/*
 * The job_submit plugin's Python side, run on one worker thread: an isolated interpreter started
 * once per slurmctld, calls handed over and waited for with a time limit, and tether's health as
 * the handler last reported it.
 */
#ifndef TETHER_WORKER_H
#define TETHER_WORKER_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "bridge.h"

#define TETHER_TIMEOUT (-3) /* the call did not finish in time (the worker frees it later) */
#define TETHER_BUSY (-4)    /* an earlier call is still running */

enum tether_op { TETHER_OP_INIT, TETHER_OP_SUBMIT, TETHER_OP_MODIFY };

struct tether_call {
	enum tether_op op;
	tether_job_t *job;
	tether_job_t *current;
	uint32_t uid;
	int wanted;
	int rc;
	int done;
	int abandoned; /* the caller gave up waiting: the worker frees the call */
	int direct;    /* answered on the calling thread, not the worker's */
	struct timespec t_signal, t_start, t_end; /* handed over; the worker started, ended (CLOCK_MONOTONIC) */
	unsigned long generation; /* the answers cache's when the handler answered (tether_cache_generation) */
};

/* Start Python (isolated: explicit search paths, no site, no signal handlers) and the worker
 * thread; 0, or -1 with the reason in ``why``. Never exits the process. */
int tether_worker_start(char *why, size_t why_len);
int tether_worker_started(void);

/* Run ``call``: on the calling thread when the handler needs nothing that may block and no other
 * call is in it (``direct`` set), else on the worker, waiting at most ``seconds`` in all (for an
 * earlier call's end too: calls are serialized): the handler's answer, TETHER_TIMEOUT, or
 * TETHER_BUSY when the worker never became free. The caller frees the call (tether_call_free) unless the answer is
 * TETHER_TIMEOUT. */
int tether_run(struct tether_call *call, int seconds);
void tether_call_free(struct tether_call *call);
void tether_job_free(tether_job_t *job);

/* tether's health (set by tether_set_health, bridge.h). */
int tether_is_broken(void);
int tether_rejects_all(void);
void tether_reason(char *buf, size_t len);

#endif
