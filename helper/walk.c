/*
 * walk.c - walking trees of any depth with one directory open (list, remove, merge).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sbx.h"
#include "files.h"
#include "tree.h"

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Read all names of a directory (sans . and ..), sorted bytewise.  `budget`
 * bounds the total across the whole walk so memory stays bounded too. */
char **read_names(DIR *d, size_t *count, size_t *budget, const char *rel)
{
	char **names = NULL;
	size_t n = 0, cap = 0;
	for (;;) {
		errno = 0;
		struct dirent *e = readdir(d);
		if (!e) {
			if (errno)
				fail_errno(errno, "read directory", rel);
			break;
		}
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (budget) {
			if (*budget == 0) {
				out_flush();
				fail(1, "TOO_LARGE", "list: more than %d entries", LIST_MAX);
			}
			(*budget)--;
		}
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			char **nn = realloc(names, cap * sizeof *names);
			if (!nn)
				oom();
			names = nn;
		}
		names[n++] = xstrdup(e->d_name);
	}
	if (n)
		qsort(names, n, sizeof *names, cmp_str);
	*count = n;
	return names;
}

/* Make `fd` (an open directory, taken over) the new top frame. */
int walk_push(struct walk *w, int fd, size_t *budget, const char *rel)
{
	struct stat st;
	int rfd = dup(fd);
	DIR *d = rfd < 0 ? NULL : fdopendir(rfd);
	if (fstat(fd, &st) < 0 || !d) {
		int e = errno;
		if (d)
			closedir(d);
		else if (rfd >= 0)
			close(rfd);
		close(fd);
		errno = e;
		return -1;
	}
	if (w->depth == w->cap) {
		w->cap = w->cap ? w->cap * 2 : 16;
		struct frame *nv = realloc(w->v, w->cap * sizeof *nv);
		if (!nv)
			oom();
		w->v = nv;
	}
	struct frame *f = &w->v[w->depth++];
	memset(f, 0, sizeof *f);
	f->names = read_names(d, &f->n, budget, rel);
	f->dev = st.st_dev;
	f->ino = st.st_ino;
	closedir(d);
	if (w->fd >= 0)
		close(w->fd);
	w->fd = fd;
	return 0;
}

/* Drop the top frame and reopen its parent through "..". */
int walk_pop(struct walk *w)
{
	struct frame *f = &w->v[--w->depth];
	for (size_t k = 0; k < f->n; k++)
		free(f->names[k]);
	free(f->names);
	if (w->depth == 0) {
		close(w->fd);
		w->fd = -1;
		return 0;
	}
	struct frame *up = &w->v[w->depth - 1];
	struct stat st;
	int fd = openat(w->fd, "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0 || st.st_dev != up->dev || st.st_ino != up->ino) {
		close(fd);
		errno = ESTALE; /* moved away under us: reported as EIO */
		return -1;
	}
	close(w->fd);
	w->fd = fd;
	return 0;
}

void walk_free(struct walk *w)
{
	while (w->depth > 0) {
		struct frame *f = &w->v[--w->depth];
		for (size_t k = 0; k < f->n; k++)
			free(f->names[k]);
		free(f->names);
	}
	free(w->v);
	if (w->fd >= 0)
		close(w->fd);
}
