/*
 * watch_known.c - the names `sbx watch` knows to exist: the type of an entry
 * removed before it could be looked at, and telling a file `sbx write` created
 * from one it replaced.
 */
#define _GNU_SOURCE
#include <search.h>
#include <stdlib.h>
#include <string.h>

#include "sbx.h"
#include "watch.h"

struct known {
	char type;
	char path[];
};

static int known_cmp(const void *a, const void *b)
{
	return strcmp(((const struct known *)a)->path, ((const struct known *)b)->path);
}

static struct known *known_key(const char *path)
{
	size_t n = strlen(path) + 1;
	struct known *k = xmalloc(sizeof *k + n);
	k->type = 0;
	memcpy(k->path, path, n);
	return k;
}

static const char *type_of_code(char c)
{
	switch (c) {
	case 'f': return "file";
	case 'd': return "dir";
	case 'l': return "symlink";
	case 'o': return "other";
	default: return NULL;
	}
}

void known_add(const char *path, const char *type)
{
	struct known *k = known_key(path);
	k->type = type ? type[0] : 0;
	struct known **found = tfind(k, &g_watch.known, known_cmp);
	if (found) {
		(*found)->type = k->type;
		free(k);
		return;
	}
	if (g_watch.nknown >= KNOWN_MAX || !tsearch(k, &g_watch.known, known_cmp)) {
		free(k);
		return;
	}
	g_watch.nknown++;
}

/* Forget `path`; its type when it was known. */
const char *known_del(const char *path)
{
	struct known *k = known_key(path);
	struct known **found = tfind(k, &g_watch.known, known_cmp);
	const char *type = NULL;
	if (found) {
		struct known *old = *found;
		type = type_of_code(old->type);
		tdelete(k, &g_watch.known, known_cmp);
		free(old);
		g_watch.nknown--;
	}
	free(k);
	return type;
}

const char *known_type(const char *path)
{
	struct known *k = known_key(path);
	struct known **found = tfind(k, &g_watch.known, known_cmp);
	free(k);
	return found ? type_of_code((*found)->type) : NULL;
}
