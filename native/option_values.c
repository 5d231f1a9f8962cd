/*
 * An option's value as tether accepts it (option_values.h): the SPANK plugin's check in
 * srun/sbatch/salloc and slurmstepd (spank/options.c), and the job_submit plugin's of the values it
 * hands the handler (job_submit/request.c). tests/unit/test_fuzz.py holds it to surface.normalize.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "imageref.h"
#include "option_values.h"
#include "values.h"

/* Printable text of at most TETHER_MAX_TEXT bytes: no control characters (UTF-8 letters pass). */
static int text_ok(const char *value)
{
	size_t n = strlen(value);

	if (n == 0 || n > TETHER_MAX_TEXT)
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)value[i] < 0x20 || value[i] == 0x7f)
			return 0;
	return 1;
}

/* A whole number of ASCII digits within [min, max]. */
static int count_ok(const char *value, long min, long max)
{
	char *end = NULL;
	long n;

	for (const char *p = value; *p; p++)
		if (*p < '0' || *p > '9')
			return 0;
	if (value[0] == '\0' || strlen(value) > 18)
		return 0;
	errno = 0;
	n = strtol(value, &end, 10);
	return errno == 0 && *end == '\0' && n >= min && n <= max;
}

/* Normalize a flag value (1/0, true/false, yes/no, on/off); returns "1", "0" or NULL. */
static const char *flag_value(const char *value)
{
	static const char *const yes[] = { "1", "true", "yes", "on", NULL };
	static const char *const no[] = { "0", "false", "no", "off", NULL };

	if (value[0] == '\0') /* slurmstepd hands a set flag over as "" */
		return "1";
	if (tether_one_of(value, yes))
		return "1";
	if (tether_one_of(value, no))
		return "0";
	return NULL;
}

const char *tether_unknown_namespace(const char *value, size_t *len)
{
	static const char *const known[] = { TETHER_UNSHARE_NAMESPACES, NULL };
	const char *word = value;

	for (;;) {
		size_t n = strcspn(word, ",");
		int found = 0;

		for (const char *const *k = known; *k; k++)
			if (strlen(*k) == n && strncmp(*k, word, n) == 0)
				found = 1;
		if (!found) {
			*len = n;
			return word;
		}
		if (word[n] == '\0')
			return NULL;
		word += n + 1;
	}
}

const char *tether_value_check(enum tether_kind kind, long minimum, long maximum, const char *value)
{
	static const char *const slot_types[] = { TETHER_SLOT_TYPES, NULL };
	static const char *const runtimes[] = { TETHER_RUNTIMES, NULL };

	switch (kind) {
	case K_FLAG:
		return flag_value(value);
	case K_COUNT:
		return count_ok(value, minimum, maximum) ? value : NULL;
	case K_SLOT_TYPE:
		return tether_one_of(value, slot_types) ? value : NULL;
	case K_RUNTIME:
		return tether_one_of(value, runtimes) ? value : NULL;
	case K_NAME: /* maximum: a shorter limit for this name (0: TETHER_MAX_NAME) */
		return tether_name_ok(value, maximum > 0 ? (size_t)maximum : TETHER_MAX_NAME) ? value : NULL;
	case K_ENV_NAMES:
		return tether_env_names_ok(value) ? value : NULL;
	case K_TEXT:
		return text_ok(value) ? value : NULL;
	case K_CONTAINER_NAME: /* NAME[:FLAG], pyxis's spelling */
		return tether_container_name_ok(value, maximum > 0 ? (size_t)maximum : TETHER_MAX_NAME) ? value : NULL;
	case K_IMAGE: /* empty: no container for this step (--container-image= in a container job) */
		return value[0] == '\0' || tether_image_ok(value) ? value : NULL;
	case K_NAMESPACES: {
		size_t n;

		return strlen(value) <= TETHER_MAX_TEXT && tether_unknown_namespace(value, &n) == NULL ? value : NULL;
	}
	default:
		return NULL;
	}
}
