/*
 * chmod.c - `sbx chmod PATH MODE`: the mode of a directory or regular file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sbx.h"
#include "tree.h"

/* `sbx chmod PATH MODE`: set the mode of a directory or regular file (never
 * through a symlink).  An import unpacks directories open (u+rwx) so that tar
 * can fill them, then gives each its own mode back with this, deepest first. */
int cmd_chmod(int argc, char **argv)
{
	char *pos[2];
	parse_args(argc, argv, NULL, NULL, pos, 2);
	char *norm = norm_path(pos[0]);
	const char *ms = pos[1];
	if (!*ms || strlen(ms) > 4 || strspn(ms, "01234567") != strlen(ms))
		usage("invalid MODE %s: expected octal like 755", ms);
	mode_t mode = (mode_t)strtoul(ms, NULL, 8) & 0777; /* no suid/sgid/sticky */
	open_root();
	if (is_root(norm))
		fail(1, "EINVAL", "refusing to change the mode of the root directory");
	const char *name;
	int pfd = open_parent_dir(norm, &name);
	if (chmod_entry(pfd, name, mode, false) < 0)
		fail_errno(errno, "chmod", norm);
	return 0;
}
