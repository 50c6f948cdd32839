/*
 * mkdir.c - `sbx mkdir PATH [--parents]`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "sbx.h"
#include "files.h"

int cmd_mkdir(int argc, char **argv)
{
	char *pos[1];
	bool parents = false;
	parse_args(argc, argv, "--parents", &parents, pos, 1);
	char *norm = norm_path(pos[0]);
	open_root();
	if (is_root(norm)) {
		if (!parents)
			fail(1, "EEXIST", "mkdir %s: root already exists", norm);
		print_stat(norm, -1, NULL);
		return 0;
	}
	const char *name;
	char *parent = split_parent(norm, &name);
	/* A refused last step takes back the parents made for it. */
	int pfd = parents ? mkdir_parents_noting(parent, true) : open_dir_path(parent, norm);
	if (mkdirat(pfd, name, 0755) < 0) {
		int e = errno;
		struct stat st;
		if (!(e == EEXIST && parents &&
		      fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		      S_ISDIR(st.st_mode)))
			fail_errno(e, "mkdir", norm);
	}
	g_made = 0;
	print_stat(norm, pfd, name);
	return 0;
}
