/*
 * args.c - the file subcommands' argument parsing: numbers, positionals and a flag.
 */
#define _GNU_SOURCE
#include <string.h>

#include "sbx.h"

uint64_t parse_uint(const char *s, const char *what)
{
	uint64_t v = 0;
	if (!*s)
		usage("invalid %s: empty", what);
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9')
			usage("invalid %s: %s", what, s);
		if (v > (uint64_t)(INT64_MAX - 9) / 10)
			usage("invalid %s: too large", what);
		v = v * 10 + (uint64_t)(*p - '0');
	}
	return v;
}

/* Collect positional arguments and at most one boolean --flag (which may
 * appear anywhere; "--" ends flag parsing so odd file names stay usable).
 * Returns the number of positionals; usage error if it is not `npos`. */
void parse_args(int argc, char **argv, const char *flag, bool *flag_set,
		       char **pos, int npos)
{
	int n = 0;
	bool opts = true;
	for (int i = 0; i < argc; i++) {
		if (opts && !strcmp(argv[i], "--")) {
			opts = false;
		} else if (opts && flag && !strcmp(argv[i], flag)) {
			*flag_set = true;
		} else if (opts && !strncmp(argv[i], "--", 2)) {
			usage("unknown option %s", argv[i]);
		} else {
			if (n >= npos)
				usage("too many arguments");
			pos[n++] = argv[i];
		}
	}
	if (n != npos)
		usage("expected %d argument(s), got %d", npos, n);
}
