/*
 * move.c - `sbx move`, and the rename that never replaces (merge uses it too).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "sbx.h"
#include "files.h"
#include "tree.h"

/*
 * renameat2(RENAME_NOREPLACE), or where the file system refuses the flag (EINVAL: gVisor's
 * gofer mounts, e.g. a disk workspace under runsc) the same without it: a non-directory by
 * link then unlink (the link fails EEXIST, as the flag would), a directory by a plain rename
 * after a look (one created in between is replaced only if empty: rename refuses others).
 */
int rename_noreplace(int sfd, const char *sname, int dfd, const char *dname)
{
	if (syscall(SYS_renameat2, sfd, sname, dfd, dname, 1 /* RENAME_NOREPLACE */) == 0)
		return 0;
	if (errno != EINVAL)
		return -1;
	struct stat st;
	if (fstatat(sfd, sname, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -1;
	if (!S_ISDIR(st.st_mode)) {
		if (linkat(sfd, sname, dfd, dname, 0) < 0)
			return -1;
		if (unlinkat(sfd, sname, 0) < 0) {
			int e = errno;
			(void)unlinkat(dfd, dname, 0);
			errno = e;
			return -1;
		}
		return 0;
	}
	if (fstatat(dfd, dname, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		errno = EEXIST;
		return -1;
	}
	if (errno != ENOENT)
		return -1;
	return renameat(sfd, sname, dfd, dname);
}

/*
 * `sbx move SRC DST [--overwrite]`: rename within the root (Move, and the commit of a
 * streamed write).  Both parents are resolved beneath the root, so neither path leads
 * through a symlink out of it; SRC and DST themselves are names in those directories (a
 * symlink is moved as itself).  Without --overwrite an existing DST is EEXIST, atomically
 * (RENAME_NOREPLACE).
 */
int cmd_move(int argc, char **argv)
{
	char *pos[2];
	bool overwrite = false;
	parse_args(argc, argv, "--overwrite", &overwrite, pos, 2);
	char *src = norm_path(pos[0]);
	char *dst = norm_path(pos[1]);
	open_root();
	if (is_root(src) || is_root(dst))
		fail(1, "EINVAL", "move %s to %s: the workspace root cannot move", src, dst);
	const char *sname, *dname;
	int sfd = open_parent_dir(src, &sname);
	int dfd = open_parent_dir(dst, &dname);
	int moved = overwrite ? renameat(sfd, sname, dfd, dname)
			      : rename_noreplace(sfd, sname, dfd, dname);
	if (moved < 0)
		fail_errno(errno, "move", errno == EEXIST || errno == ENOTEMPTY ? dst : src);
	print_stat(dst, dfd, dname);
	return 0;
}
