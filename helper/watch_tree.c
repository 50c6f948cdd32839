/*
 * watch_tree.c - `sbx watch`'s watches: one a directory, each added through a
 * descriptor opened beneath the root, with the path of each wd; new directories
 * scanned as they appear, renamed ones followed, removed ones dropped.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sbx.h"
#include "watch.h"

char *join(const char *dir, const char *name)
{
	if (!strcmp(dir, "."))
		return xstrdup(name);
	size_t a = strlen(dir), b = strlen(name);
	char *p = xmalloc(a + b + 2);
	memcpy(p, dir, a);
	p[a] = '/';
	memcpy(p + a + 1, name, b + 1);
	return p;
}

/* `sbx write`'s temporary file: an implementation detail, never reported. */
bool helper_temp(const char *name)
{
	size_t n = strlen(name);
	return n > 9 && !strncmp(name, ".sbx-", 5) && !strcmp(name + n - 4, ".tmp");
}

/* The type of an entry now, looked up without following anything out of the
 * root; NULL when it is gone. */
const char *stat_type(const char *rel)
{
	const char *slash = strrchr(rel, '/');
	char *parent = slash ? strndup(rel, (size_t)(slash - rel)) : xstrdup(".");
	if (!parent)
		return NULL;
	int pfd = open_beneath(g_rootfd, parent, O_PATH | O_DIRECTORY, 0, RES_BENEATH);
	free(parent);
	if (pfd < 0)
		return NULL;
	struct stat st;
	int r = fstatat(pfd, slash ? slash + 1 : rel, &st, AT_SYMLINK_NOFOLLOW);
	close(pfd);
	return r < 0 ? NULL : type_name(st.st_mode);
}

static void set_wpath(int wd, const char *rel)
{
	if ((size_t)wd >= g_watch.wcap) {
		size_t nc = g_watch.wcap ? g_watch.wcap : 64;
		while (nc <= (size_t)wd)
			nc *= 2;
		char **np = realloc(g_watch.wpath, nc * sizeof *np);
		if (!np)
			fail(1, "EIO", "out of memory");
		memset(np + g_watch.wcap, 0, (nc - g_watch.wcap) * sizeof *np);
		g_watch.wpath = np;
		g_watch.wcap = nc;
	}
	if (g_watch.wpath[wd])
		free(g_watch.wpath[wd]); /* the same directory under a new name */
	else
		g_watch.wcount++;
	g_watch.wpath[wd] = xstrdup(rel);
}

const char *wpath(int wd)
{
	return wd >= 0 && (size_t)wd < g_watch.wcap ? g_watch.wpath[wd] : NULL;
}

void forget_wd(int wd)
{
	free(g_watch.wpath[wd]);
	g_watch.wpath[wd] = NULL;
	g_watch.wcount--;
}

/* Watch the directory `rel`: its wd, or -1 (an overflow already reported
 * when a limit was the reason; a directory gone meanwhile is no event). */
int add_watch(const char *rel)
{
	if (g_watch.wcount >= g_watch.max_watches) {
		overflow("watches");
		return -1;
	}
	int fd = open_beneath(g_rootfd, rel, O_PATH | O_DIRECTORY, 0, RES_BENEATH);
	if (fd < 0)
		return -1;
	char proc[64];
	snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
	int wd = inotify_add_watch(g_watch.ifd, proc, WATCH_MASK);
	int err = errno;
	close(fd);
	if (wd < 0) {
		if (err == ENOSPC)
			overflow("watches");
		errno = err;
		return -1;
	}
	set_wpath(wd, rel);
	return wd;
}

static void stack_push(struct pathstack *s, char *p)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 16;
		s->v = realloc(s->v, s->cap * sizeof *s->v);
		if (!s->v)
			fail(1, "EIO", "out of memory");
	}
	s->v[s->n++] = p;
}

/* Remember (and with `report`, report as created) what `rel` holds; its
 * subdirectories go on `todo` when the watch is recursive. */
void scan_dir(const char *rel, bool report, struct pathstack *todo)
{
	int fd = open_beneath(g_rootfd, rel, O_RDONLY | O_DIRECTORY, 0, RES_BENEATH);
	if (fd < 0)
		return;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		struct stat st;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		char *path = join(rel, e->d_name);
		const char *type = type_name(st.st_mode);
		known_add(path, type);
		if (report && !helper_temp(e->d_name))
			emit("created", path, NULL, type);
		if (S_ISDIR(st.st_mode) && g_watch.recursive)
			stack_push(todo, path);
		else
			free(path);
	}
	closedir(d);
}

/* Watch `rel` and, when recursive, every directory beneath it (one
 * directory open at a time, whatever the depth).  `report`: the tree is
 * new, so what it already holds is reported as created. */
void watch_tree(const char *rel, bool report)
{
	struct pathstack todo = {0};
	stack_push(&todo, xstrdup(rel));
	while (todo.n) {
		char *cur = todo.v[--todo.n];
		if (add_watch(cur) >= 0)
			scan_dir(cur, report, &todo);
		free(cur);
	}
	free(todo.v);
}

static bool under(const char *path, const char *dir)
{
	size_t n = strlen(dir);
	return !strncmp(path, dir, n) && (path[n] == '\0' || path[n] == '/');
}

/* A directory moved out of the watched tree: its watches go with it. */
void unwatch_tree(const char *rel)
{
	for (size_t wd = 0; wd < g_watch.wcap; wd++) {
		if (g_watch.wpath[wd] && (int)wd != g_watch.topwd && under(g_watch.wpath[wd], rel)) {
			inotify_rm_watch(g_watch.ifd, (int)wd);
			forget_wd((int)wd);
		}
	}
}

/* A directory renamed within the tree: its watches get the new paths. */
void rename_watches(const char *old, const char *new)
{
	size_t n = strlen(old);
	for (size_t wd = 0; wd < g_watch.wcap; wd++) {
		if (!g_watch.wpath[wd] || (int)wd == g_watch.topwd || !under(g_watch.wpath[wd], old))
			continue;
		size_t nl = strlen(new), rl = strlen(g_watch.wpath[wd] + n);
		char *p = xmalloc(nl + rl + 1);
		memcpy(p, new, nl);
		memcpy(p + nl, g_watch.wpath[wd] + n, rl + 1);
		free(g_watch.wpath[wd]);
		g_watch.wpath[wd] = p;
	}
}
