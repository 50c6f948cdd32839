/*
 * stat.c - stat records (one JSON line an entry) and `sbx stat PATH`.
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

struct buf g_out;

void out_flush(void)
{
	if (g_out.len && write_all(1, g_out.p, g_out.len) < 0)
		fail_errno(errno, "write", "stdout");
	g_out.len = 0;
}

const char *type_name(mode_t m)
{
	if (S_ISREG(m))
		return "file";
	if (S_ISDIR(m))
		return "dir";
	if (S_ISLNK(m))
		return "symlink";
	return "other";
}

/* Append one record; `dirfd`/`entry` locate the object for readlinkat. */
void stat_record(struct buf *b, const char *rel, const char *name,
			int dirfd, const char *entry, const struct stat *st)
{
	buf_puts(b, "{\"path\":");
	buf_json_str(b, rel, strlen(rel));
	buf_puts(b, ",\"name\":");
	buf_json_str(b, name, strlen(name));
	buf_printf(b, ",\"type\":\"%s\",\"size\":%lld,\"mode\":%u,\"mtime_ns\":%lld",
		   type_name(st->st_mode), (long long)st->st_size,
		   (unsigned)(st->st_mode & 07777),
		   (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec);
	if (S_ISLNK(st->st_mode)) {
		/* Targets can exceed st_size (e.g. /proc-like fs), so grow. */
		size_t cap = 256;
		char *t = NULL;
		ssize_t n;
		for (;;) {
			t = xmalloc(cap);
			n = readlinkat(dirfd, entry, t, cap);
			if (n < 0 || (size_t)n < cap || cap >= (1u << 20))
				break;
			free(t);
			cap *= 2;
		}
		/* A link that vanished under us still gets a well-formed record. */
		buf_puts(b, ",\"target\":");
		buf_json_str(b, t, n < 0 ? 0 : (size_t)n);
		free(t);
	}
	buf_puts(b, "}\n");
}

/* Print the record of a normalised path without following its final
 * component; `dirfd` must be the open parent (ignored for the root). */
void print_stat(const char *norm, int dirfd, const char *name)
{
	struct stat st;
	if (is_root(norm)) {
		if (fstatat(g_rootfd, "", &st, AT_EMPTY_PATH) < 0)
			fail_errno(errno, "stat", norm);
		stat_record(&g_out, ".", ".", g_rootfd, "", &st);
	} else {
		if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			fail_errno(errno, "stat", norm);
		stat_record(&g_out, norm, name, dirfd, name, &st);
	}
	out_flush();
}

int cmd_stat(int argc, char **argv)
{
	char *pos[1];
	parse_args(argc, argv, NULL, NULL, pos, 1);
	char *norm = norm_path(pos[0]);
	open_root();
	if (is_root(norm)) {
		print_stat(norm, -1, NULL);
		return 0;
	}
	const char *name;
	int pfd = open_parent_dir(norm, &name);
	print_stat(norm, pfd, name);
	return 0;
}
