/*
 * The grammars of option values shared by the SPANK plugin, the job_submit plugin's shape cache
 * and the job directories (values.h). tests/unit/test_fuzz.py holds them to surface.normalize.
 */
#include <string.h>

#include "tether_names.h"
#include "values.h"

static int is_ascii_alnum(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

int tether_one_of(const char *value, const char *const *choices)
{
	for (; *choices; choices++)
		if (strcmp(value, *choices) == 0)
			return 1;
	return 0;
}

int tether_name_ok(const char *value, size_t max)
{
	size_t n = strlen(value);

	if (n == 0 || n > max || !is_ascii_alnum((unsigned char)value[0]))
		return 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = value[i];

		if (!is_ascii_alnum(c) && c != '.' && c != '_' && c != '-')
			return 0;
	}
	return 1;
}

int tether_env_names_ok(const char *value)
{
	const char *p = value;

	if (strlen(value) > TETHER_MAX_TEXT)
		return 0;
	for (;;) {
		if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || *p == '_'))
			return 0;     /* empty (",", "A,,B", "", "A,"), or a leading digit or other */
		while (is_ascii_alnum((unsigned char)*p) || *p == '_')
			p++;
		if (*p == '\0')
			return 1;
		if (*p != ',')
			return 0;
		p++;
	}
}

int tether_container_name_ok(const char *value, size_t max)
{
	static const char *const flags[] = { TETHER_CONTAINER_NAME_FLAGS, NULL };
	const char *colon = strchr(value, ':');
	char name[TETHER_MAX_NAME + 1];
	size_t n = colon ? (size_t)(colon - value) : strlen(value);

	if (n == 0 || n > max || n > TETHER_MAX_NAME)
		return 0;
	memcpy(name, value, n);
	name[n] = '\0';
	return tether_name_ok(name, max) && (colon == NULL || tether_one_of(colon + 1, flags));
}
