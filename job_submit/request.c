/*
 * The job's tether option values for the handler (request.h), as handler.tether_values and
 * checked_values make them from spank_env: each option's TETHER_<NAME> entry (the SPANK plugin's
 * effective value, from the option or the environment) or else Slurm's
 * _SLURM_SPANK_OPTION_tether_<name>, the last of each; each checked and normalized as the SPANK
 * plugin checks it (option_values.c: surface.normalize's twin, held to it by tests/unit/test_fuzz.py).
 * Reading and checking them in Python was a third of a new shape's call in slurmctld (its code
 * and data out of the CPU's caches by then); tests/unit/test_shape_cache.py holds this to the
 * handler's own reading.
 */
#include <stdlib.h>
#include <string.h>

#include "option_values.h"
#include "request.h"
#include "tether_names.h"

#define SPANK_PREFIX "_SLURM_SPANK_OPTION_tether_"

static const struct tether_opt opts[TETHER_NOPTS] = TETHER_OPTION_TABLE;

/* Is [key, key + len) option ``name`` as Slurm spells it after SPANK_PREFIX ('-' as '_')? */
static int spank_name_is(const char *key, size_t len, const char *name)
{
	size_t i;

	for (i = 0; i < len && name[i]; i++)
		if (key[i] != (name[i] == '-' ? '_' : name[i]))
			return 0;
	return i == len && name[i] == '\0';
}

/* Is ``s`` UTF-8 as Python's strict decoder takes it (no overlong form, no surrogate, at most
 * U+10FFFF)? The handler decodes entries with errors="replace", which would change the value. */
static int utf8_ok(const unsigned char *s)
{
	while (*s) {
		unsigned char c = *s;
		int more;
		unsigned long cp;

		if (c < 0x80) {
			s++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			more = 1, cp = c & 0x1f;
		else if (c >= 0xe0 && c <= 0xef)
			more = 2, cp = c & 0x0f;
		else if (c >= 0xf0 && c <= 0xf4)
			more = 3, cp = c & 0x07;
		else
			return 0;
		for (int i = 1; i <= more; i++) {
			if ((s[i] & 0xc0) != 0x80)
				return 0;
			cp = (cp << 6) | (s[i] & 0x3f);
		}
		if ((more == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
		    (more == 3 && (cp < 0x10000 || cp > 0x10ffff)))
			return 0;
		s += more + 1;
	}
	return 1;
}

/* Is [p, end) an absolute path of letters, digits and "_.-/" only? */
static int plain_path(const char *p, const char *end)
{
	if (p == end || *p != '/')
		return 0;
	for (; p < end; p++)
		if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
		      *p == '_' || *p == '.' || *p == '-' || *p == '/'))
			return 0;
	return 1;
}

/* Is plain path [p, end) a path as it is (os.path.normpath and spec.container_path leave it
 * unchanged: no empty, '.' or '..' component, no '/' at its end, not the root)? */
static int plain_components(const char *p, const char *end)
{
	for (const char *c = p; c < end;) {          /* at a '/': the component after it */
		const char *next = memchr(c + 1, '/', (size_t)(end - c - 1));
		size_t n;

		if (next == NULL)
			next = end;
		n = (size_t)(next - c - 1);
		if (n == 0 || (n == 1 && c[1] == '.') || (n == 2 && c[1] == '.' && c[2] == '.'))
			return 0;
		c = next;
	}
	return 1;
}

/* Is plain path [p, end) a container path as it is (plain_components), neither one of tether's own
 * mount points nor a directory above one (layout.reserved_target; the root is one of them)? */
static int plain_target(const char *p, const char *end)
{
	static const char *const reserved[] = { TETHER_RESERVED_MOUNT_TARGETS };
	size_t len = (size_t)(end - p);

	if (!plain_components(p, end))
		return 0;
	for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++) {
		size_t n = strlen(reserved[i]);

		if (n == len && memcmp(reserved[i], p, len) == 0)
			return 0;
		if (n > len && memcmp(reserved[i], p, len) == 0 && reserved[i][len] == '/')
			return 0; /* /run, /run/tether: the user's mounts go over tether's */
	}
	return 1;
}

/* --container-mounts' value when it is plain bind mounts, which the handler accepts whichever paths
 * they are (spec.parse_mounts): at most TETHER_MAX_TEXT bytes of SRC[:DST[:ro|rw]] items separated by
 * single commas, each path a plain_path, the target (DST, or SRC alone) a plain_target. Anything else
 * -- tmpfs, umount, relative paths, other flags, spaces, empty items -- is the handler's to answer. */
int tether_mounts_plain(const char *s)
{
	size_t total = strlen(s);

	if (total == 0 || total > TETHER_MAX_TEXT)
		return 0;
	for (const char *item = s;;) {
		const char *end = strchr(item, ','), *field[3], *stop[3];
		int n = 0;

		if (end == NULL)
			end = item + strlen(item);
		for (const char *f = item; n < 3;) {
			const char *colon = memchr(f, ':', (size_t)(end - f));

			field[n] = f;
			stop[n++] = colon ? colon : end;
			if (colon == NULL)
				break;
			f = colon + 1;
			if (n == 3)
				return 0;            /* a third ':' */
		}
		if (!plain_path(field[0], stop[0]))
			return 0;
		if (n == 1 ? !plain_target(field[0], stop[0])
			   : !plain_path(field[1], stop[1]) || !plain_target(field[1], stop[1]))
			return 0;
		if (n == 3 && !(stop[2] - field[2] == 2 &&
				(memcmp(field[2], "ro", 2) == 0 || memcmp(field[2], "rw", 2) == 0)))
			return 0;
		if (*end == '\0')
			return 1;
		item = end + 1;
	}
}

int tether_save_plain(const char *s)
{
	const char *end = s + strlen(s);

	return (size_t)(end - s) <= TETHER_MAX_TEXT && plain_path(s, end) && plain_components(s, end);
}

/* --container-workdir's value when the handler accepts it, whatever directory it names: printable
 * ASCII, 1 to TETHER_MAX_TEXT bytes (surface.normalize's text; spec.container_path takes any path). */
int tether_workdir_plain(const char *s)
{
	size_t n = 0;

	for (; s[n]; n++)
		if ((unsigned char)s[n] < 0x20 || (unsigned char)s[n] > 0x7e)
			return 0;
	return n > 0 && n <= TETHER_MAX_TEXT;
}

int tether_request_values(tether_job_t *job)
{
	const char *control[TETHER_NOPTS] = { 0 }, *spank[TETHER_NOPTS] = { 0 };
	const char *checked[TETHER_NOPTS] = { 0 };
	size_t prefix = strlen(SPANK_PREFIX), total = 0;
	char *out, *p;

	for (uint32_t e = 0; e < job->spank_env_size; e++) {
		const char *entry = job->spank_env[e], *eq;
		size_t len;
		int slurms;

		if (entry == NULL)
			continue;
		eq = strchr(entry, '=');
		len = eq ? (size_t)(eq - entry) : strlen(entry);
		slurms = len > prefix && strncmp(entry, SPANK_PREFIX, prefix) == 0;
		for (int i = 0; i < TETHER_NOPTS; i++) {
			if (slurms ? spank_name_is(entry + prefix, len - prefix, opts[i].name)
				   : strlen(opts[i].env) == len && strncmp(entry, opts[i].env, len) == 0)
				(slurms ? spank : control)[i] = eq ? eq + 1 : "";
		}
	}
	for (int i = 0; i < TETHER_NOPTS; i++) {
		const char *value = control[i] ? control[i] : spank[i];

		if (value == NULL)
			continue;
		if (!utf8_ok((const unsigned char *)value))
			return 0;
		checked[i] = tether_value_check(opts[i].kind, opts[i].minimum, opts[i].maximum, value);
		if (checked[i] == NULL)
			return 0;
		total += strlen(opts[i].name) + strlen(checked[i]) + 2;
	}
	if (total > UINT32_MAX || (out = malloc(total + 1)) == NULL)
		return 0;
	p = out;
	for (int i = 0; i < TETHER_NOPTS; i++) {
		size_t n, v;

		if (checked[i] == NULL)
			continue;
		n = strlen(opts[i].name) + 1;
		v = strlen(checked[i]) + 1;
		memcpy(p, opts[i].name, n);
		memcpy(p + n, checked[i], v);
		p += n + v;
	}
	*p = '\0';
	job->values = out;
	job->values_size = (uint32_t)total;
	job->plain_mounts = checked[OPT_CONTAINER_MOUNTS] != NULL && tether_mounts_plain(checked[OPT_CONTAINER_MOUNTS]);
	return 1;
}
