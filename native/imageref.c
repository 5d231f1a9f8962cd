/*
 * Container image references, as tether/hooks/imageref.py parses them (the same steps in the same
 * order; tests/unit/test_fuzz.py holds the two together):
 *   /absolute/path, ./relative, ../relative     printable
 *   oras:// library:// shub:// docker-archive: oci-archive:  printable ASCII without spaces
 *   [docker://][USER@][REGISTRY#]IMAGE[:TAG][@DIGEST]
 *   [docker://]REGISTRY/IMAGE[:TAG][@DIGEST]    REGISTRY has a '.' or a ':port', or is localhost
 */
#include <string.h>

#include "imageref.h"
#include "tether_names.h"

#define LOWER "abcdefghijklmnopqrstuvwxyz0123456789"
#define ALNUM "ABCDEFGHIJKLMNOPQRSTUVWXYZ" LOWER

static int in_set(char c, const char *set)
{
	return c != '\0' && strchr(set, c) != NULL;
}

static int all_in(const char *s, size_t n, const char *set)
{
	for (size_t i = 0; i < n; i++)
		if (!in_set(s[i], set))
			return 0;
	return 1;
}

static const char *find(const char *s, size_t n, char c)
{
	return memchr(s, c, n);
}

/* lowercase letters and digits, separated by '.', '_' or '-' */
static int component_ok(const char *s, size_t n)
{
	return n > 0 && in_set(s[0], LOWER) && in_set(s[n - 1], LOWER) && all_in(s, n, LOWER "._-");
}

static int repository_ok(const char *s, size_t n)
{
	const char *end = s + n;

	for (;;) {
		const char *slash = find(s, (size_t)(end - s), '/');
		size_t len = slash ? (size_t)(slash - s) : (size_t)(end - s);

		if (!component_ok(s, len))
			return 0;
		if (!slash)
			return 1;
		s = slash + 1;
	}
}

/* host[:port] */
static int registry_ok(const char *s, size_t n)
{
	const char *colon = find(s, n, ':');
	size_t host = colon ? (size_t)(colon - s) : n;

	if (host == 0 || !in_set(s[0], ALNUM) || !all_in(s, host, ALNUM ".-"))
		return 0;
	if (!colon)
		return 1;
	n -= host + 1;
	return n > 0 && n <= 5 && all_in(colon + 1, n, "0123456789");
}

static int tag_ok(const char *s, size_t n)
{
	return n > 0 && n <= 128 && in_set(s[0], ALNUM "_") && all_in(s, n, ALNUM "_.-");
}

/* algorithm:hex (at least 32 hex digits) */
static int digest_ok(const char *s, size_t n)
{
	const char *colon = find(s, n, ':');
	size_t algo = colon ? (size_t)(colon - s) : 0;

	return colon && algo > 0 && all_in(s, algo, LOWER) && n - algo - 1 >= 32 &&
	       all_in(colon + 1, n - algo - 1, "0123456789abcdef");
}

static int looks_like_registry(const char *s, size_t n)
{
	return find(s, n, '.') || find(s, n, ':') || (n == 9 && strncmp(s, "localhost", 9) == 0);
}

static const char *rfind(const char *s, size_t n, char c)
{
	for (size_t i = n; i > 0; i--)
		if (s[i - 1] == c)
			return s + i - 1;
	return NULL;
}

static int ends_with(const char *s, size_t n, const char *suffix)
{
	size_t k = strlen(suffix);

	return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

static int name_ok(const char *s, size_t n)
{
	const char *at = rfind(s, n, '@'), *hash, *colon;
	int user = 0;

	if (at && digest_ok(at + 1, n - (size_t)(at - s) - 1))
		n = (size_t)(at - s);                  /* ...@DIGEST */
	at = find(s, n, '@');
	if (at) {                                      /* USER@... */
		size_t len = (size_t)(at - s);

		if (len == 0 || !all_in(s, len, ALNUM "._-"))
			return 0;
		user = 1;
		n -= len + 1;
		s = at + 1;
	}
	hash = find(s, n, '#');
	if (hash) {                                    /* REGISTRY#... */
		if (!registry_ok(s, (size_t)(hash - s)))
			return 0;
		n -= (size_t)(hash - s) + 1;
		s = hash + 1;
	} else {
		const char *slash = find(s, n, '/');

		if (slash && looks_like_registry(s, (size_t)(slash - s))) {   /* REGISTRY/... */
			if (!registry_ok(s, (size_t)(slash - s)) || user)
				return 0;
			n -= (size_t)(slash - s) + 1;
			s = slash + 1;
		}
	}
	colon = find(s, n, ':');
	if (colon && !tag_ok(colon + 1, n - (size_t)(colon - s) - 1))
		return 0;
	if (colon)
		n = (size_t)(colon - s);
	/* img.sif is a file meant, not a registry image */
	return repository_ok(s, n) && !ends_with(s, n, ".sif") && !ends_with(s, n, ".sqsh") &&
	       !ends_with(s, n, ".squashfs");
}

int tether_image_ok(const char *value)
{
	static const char *const schemes[] = { "oras://", "library://", "shub://", "docker-archive:",
					       "oci-archive:", NULL };
	size_t n = value ? strlen(value) : 0;

	if (n == 0 || n > TETHER_MAX_TEXT)
		return 0;
	if (value[0] == '/' || strncmp(value, "./", 2) == 0 || strncmp(value, "../", 3) == 0) {
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)value[i] < 0x20 || value[i] == 0x7f)
				return 0;
		return 1;
	}
	for (int i = 0; schemes[i]; i++) {
		if (strncmp(value, schemes[i], strlen(schemes[i])) == 0) {
			for (size_t j = 0; j < n; j++)
				if ((unsigned char)value[j] < 0x21 || (unsigned char)value[j] > 0x7e)
					return 0;
			return value[n - 1] != ':' && !(n >= 2 && strcmp(value + n - 2, "//") == 0);
		}
	}
	if (strncmp(value, "docker://", 9) == 0)
		return name_ok(value + 9, n - 9);
	return name_ok(value, n);
}

int tether_image_looks_local(const char *value)
{
	size_t n = strlen(value);

	return ends_with(value, n, ".sif") || ends_with(value, n, ".sqsh") || ends_with(value, n, ".squashfs") ||
	       ends_with(value, n, ".img");
}
