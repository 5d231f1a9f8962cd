/*
 * What the job_submit handler reads of a request, read and checked in C before the call: the job's
 * tether option values (handler.py: tether_values, then checked_values) and whether its mounts are
 * plain (the shape cache's classes too).
 */
#ifndef TETHER_REQUEST_H
#define TETHER_REQUEST_H

#include <stdint.h>

#include "bridge.h"

/* ``job``'s tether option values into job->values, "name\0value\0" per option given (malloc'd,
 * values_size bytes), and whether its --container-mounts are plain bind mounts (plain_mounts):
 * 1; or 0 when a value is refused or not UTF-8 (the handler then reads them itself, and says
 * why), or out of memory. */
int tether_request_values(tether_job_t *job);

/* --container-mounts' value when it is plain bind mounts, which the handler accepts whichever paths
 * they are and no runtime refuses (spec.parse_mounts, mount_refusal): at most TETHER_MAX_TEXT bytes
 * of SRC[:DST[:ro|rw]] items separated by single commas, each path absolute, of letters, digits and
 * "_.-/", the target (DST, or SRC alone) a container path as it is and none of tether's own mount
 * points nor a directory above one. Anything else is the handler's to parse. */
int tether_mounts_plain(const char *value);

/* --container-save's value when it is a plain absolute file path, which the handler accepts whichever
 * file it names (spec.save_path: it is its own normal form, not the root, no '/' at its end):
 * letters, digits and "_.-/", no empty, '.' or '..' component. A relative one is the handler's (its
 * check depends on the working directory). */
int tether_save_plain(const char *value);

/* --container-workdir's value when the handler accepts it, whatever directory it names: printable
 * ASCII, 1 to TETHER_MAX_TEXT bytes (surface.normalize's text; spec.container_path takes any path). */
int tether_workdir_plain(const char *value);

#endif
