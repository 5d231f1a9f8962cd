/*
 * What the job_submit handler reads of a request, read and checked in C before the call: the job's
 * tether option values (handler.py: tether_values, then checked_values).
 */
#ifndef TETHER_REQUEST_H
#define TETHER_REQUEST_H

#include <stdint.h>

#include "bridge.h"

/* ``job``'s tether option values, "name\0value\0" per option given (malloc'd, ``*size`` bytes), or
 * NULL when one is refused or not UTF-8 (the handler then reads them itself, and says why). */
char *tether_request_values(const tether_job_t *job, uint32_t *size);

#endif
