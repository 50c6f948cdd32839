/*
 * list.c - `sbx list PATH DEPTH`: the entries under PATH, depth-first, sorted.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "sbx.h"
#include "files.h"
#include "tree.h"

/* Depth-first pre-order listing of the directory `dfd` (taken over).
 * `prefix` is NULL at the root so that paths come out as bare names rather
 * than "./name".  A directory whose children's paths could reach PATH_MAX
 * is listed but not descended: no request could name what lies below. */
static void list_tree(int dfd, const char *prefix, uint64_t depth, size_t *budget)
{
	struct buf rel = {0};
	if (prefix)
		buf_puts(&rel, prefix);
	struct walk w = {.fd = -1};
	if (walk_push(&w, dfd, budget, prefix ? prefix : ".") < 0)
		fail_errno(errno, "list", prefix ? prefix : ".");
	w.v[0].rel_len = rel.len;
	while (w.depth > 0) {
		struct frame *f = &w.v[w.depth - 1];
		if (f->i == f->n) {
			if (walk_pop(&w) < 0)
				fail_errno(errno, "list", rel.len ? rel.p : ".");
			if (w.depth > 0) {
				rel.len = w.v[w.depth - 1].rel_len;
				if (rel.p)
					rel.p[rel.len] = '\0';
			}
			continue;
		}
		const char *name = f->names[f->i++];
		rel.len = f->rel_len;
		if (rel.p)
			rel.p[rel.len] = '\0';
		struct stat st;
		if (fstatat(w.fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			/* Vanished or unsearchable entries are skipped: a
			 * listing is a snapshot, not a transaction. */
			if (errno == ENOENT || errno == EACCES)
				continue;
			fail_errno(errno, "stat", name);
		}
		if (rel.len)
			buf_add(&rel, "/", 1);
		buf_puts(&rel, name);
		stat_record(&g_out, rel.p, name, w.fd, name, &st);
		if (g_out.len > 65536)
			out_flush();
		if (!S_ISDIR(st.st_mode) || w.depth >= depth || rel.len + 1 + NAME_MAX >= PATH_MAX)
			continue;
		/* NO_SYMLINKS: if the entry was swapped for a symlink since
		 * fstatat, we refuse rather than descend. */
		int cfd = open_beneath(w.fd, name, O_RDONLY | O_DIRECTORY, 0, RES_NOSYM);
		if (cfd < 0) {
			if (errno != ENOENT && errno != EACCES && errno != ENOTDIR &&
			    errno != ELOOP)
				fail_errno(errno, "list", rel.p);
			continue;
		}
		size_t len = rel.len;
		if (walk_push(&w, cfd, budget, rel.p) < 0) {
			if (errno != EACCES)
				fail_errno(errno, "list", rel.p);
			continue;
		}
		w.v[w.depth - 1].rel_len = len;
	}
	walk_free(&w);
	free(rel.p);
}

int cmd_list(int argc, char **argv)
{
	char *pos[2];
	parse_args(argc, argv, NULL, NULL, pos, 2);
	char *norm = norm_path(pos[0]);
	uint64_t depth = parse_uint(pos[1], "DEPTH");
	if (depth == 0)
		depth = 1;
	open_root();
	int fd = open_beneath(g_rootfd, norm, O_RDONLY | O_DIRECTORY, 0, RES_BENEATH);
	if (fd < 0)
		fail_errno(errno, "list", norm);
	size_t budget = LIST_MAX;
	list_tree(fd, is_root(norm) ? NULL : norm, depth, &budget);
	out_flush();
	return 0;
}
