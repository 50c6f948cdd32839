/*
 * remove.c - `sbx remove PATH [--recursive]`, and the removal and chmod of an
 * entry (never through a symlink) that chmod and merge use too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

#include "sbx.h"
#include "tree.h"

#define REMOVE_RETRIES 8

/* Hold the signals a cancelled call or a gone reader sends (SIGHUP, SIGTERM,
 * SIGINT, SIGPIPE) for the rest of the process: what follows runs to its end. */
void hold_ends(void)
{
	sigset_t ends;
	sigemptyset(&ends);
	sigaddset(&ends, SIGHUP);
	sigaddset(&ends, SIGTERM);
	sigaddset(&ends, SIGINT);
	sigaddset(&ends, SIGPIPE);
	sigprocmask(SIG_BLOCK, &ends, NULL);
}

/* chmod the entry `name` of `pfd` itself, never what it links to: opened
 * O_PATH|O_NOFOLLOW and changed through its /proc/self/fd link, so a
 * directory swapped for a symlink meanwhile is refused, not followed.  Only
 * directories and regular files.  Returns -1 with errno set on failure. */
int chmod_entry(int pfd, const char *name, mode_t mode, bool only_dir)
{
	int fd = openat(pfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	struct stat st;
	int rc = fstat(fd, &st);
	if (rc == 0 && !S_ISDIR(st.st_mode) && (only_dir || !S_ISREG(st.st_mode))) {
		errno = only_dir ? ENOTDIR : EINVAL;
		rc = -1;
	}
	if (rc == 0 && (st.st_mode & 07777) != mode) {
		char link[64];
		snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
		rc = chmod(link, mode);
	}
	int e = errno;
	close(fd);
	errno = e;
	return rc;
}

/* A directory about to be emptied is opened up first: its owner may have made
 * it unwritable (555) or unsearchable (000), which would stop the removal
 * halfway.  Its mode no longer matters, it is going away. */
static void open_up(int pfd, const char *name)
{
	struct stat st;
	if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode) &&
	    (st.st_mode & 0700) != 0700)
		(void)chmod_entry(pfd, name, (st.st_mode & 07777) | 0700, true);
}

/* Remove everything inside the directory `name` of `pfd`, depth first, one
 * open directory at a time (see struct walk).  Something inside that keeps
 * creating entries makes a directory be emptied again, REMOVE_RETRIES times
 * at most, then ENOTEMPTY.  Returns -1 with errno set on failure. */
static int empty_dir(int pfd, const char *name)
{
	open_up(pfd, name);
	int dfd = open_beneath(pfd, name, O_RDONLY | O_DIRECTORY, 0, RES_NOSYM);
	if (dfd < 0)
		return -1;
	struct walk w = {.fd = -1};
	if (walk_push(&w, dfd, NULL, name) < 0)
		return -1;
	int rc = 0;
	while (w.depth > 0) {
		struct frame *f = &w.v[w.depth - 1];
		if (f->i == f->n) {
			if (w.depth == 1)
				break;
			if (walk_pop(&w) < 0) {
				rc = -1;
				break;
			}
			/* Back in the parent: its current entry is the
			 * directory just emptied. */
			f = &w.v[w.depth - 1];
			const char *child = f->names[f->i - 1];
			if (unlinkat(w.fd, child, AT_REMOVEDIR) == 0 || errno == ENOENT) {
				f->retries = 0;
				continue;
			}
			if ((errno == ENOTEMPTY || errno == EEXIST) &&
			    ++f->retries < REMOVE_RETRIES) {
				f->i--; /* refilled meanwhile: empty it again */
				continue;
			}
			if (errno == EEXIST)
				errno = ENOTEMPTY;
			rc = -1;
			break;
		}
		const char *entry = f->names[f->i++];
		struct stat st;
		if (fstatat(w.fd, entry, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno == ENOENT) /* a concurrent writer was first */
				continue;
			rc = -1;
			break;
		}
		if (!S_ISDIR(st.st_mode)) {
			if (unlinkat(w.fd, entry, 0) < 0 && errno != ENOENT) {
				rc = -1;
				break;
			}
			continue;
		}
		if (unlinkat(w.fd, entry, AT_REMOVEDIR) == 0 || errno == ENOENT)
			continue; /* was empty already */
		if (errno != ENOTEMPTY && errno != EEXIST) {
			rc = -1;
			break;
		}
		open_up(w.fd, entry);
		int cfd = open_beneath(w.fd, entry, O_RDONLY | O_DIRECTORY, 0, RES_NOSYM);
		if (cfd < 0 || walk_push(&w, cfd, NULL, entry) < 0) {
			if (errno == ENOENT)
				continue;
			rc = -1;
			break;
		}
	}
	int e = errno;
	walk_free(&w);
	errno = e;
	return rc;
}

int remove_dir(int pfd, const char *name, bool recursive)
{
	/* Retry a few times in case something inside keeps creating files;
	 * give up with ENOTEMPTY rather than loop forever. */
	for (int attempt = 0;; attempt++) {
		if (unlinkat(pfd, name, AT_REMOVEDIR) == 0)
			return 0;
		if (errno == EEXIST) /* some filesystems say EEXIST */
			errno = ENOTEMPTY;
		if (errno != ENOTEMPTY || !recursive || attempt >= REMOVE_RETRIES)
			return -1;
		if (empty_dir(pfd, name) < 0)
			return -1;
	}
}

/*
 * A tree is taken out of its place in one rename before it is deleted: a
 * removal that fails midway (something inside keeps making entries, an entry
 * its user cannot remove) must not leave half a tree where the whole one was.
 * The tree goes to the root under the import staging prefix, where the
 * server's start-up tidy finds whatever a failed deletion leaves; the remove
 * has taken effect once the rename is done.  A directory moving to another
 * parent must be writable (its ".." changes): one without u+w gets it first
 * (it is going away), and its mode back if the rename is refused, so a
 * refused remove changes nothing.  An empty directory is simply removed.
 */
static int remove_tree(int pfd, const char *name, const struct stat *st)
{
	if (unlinkat(pfd, name, AT_REMOVEDIR) == 0)
		return 0;
	if (errno != ENOTEMPTY && errno != EEXIST)
		return -1;
	char aside[64];
	uint32_t rnd;
	if (getrandom(&rnd, sizeof rnd, 0) != sizeof rnd)
		rnd = (uint32_t)clock();
	snprintf(aside, sizeof aside, ".sbx-import-rm-%ld-%08x", (long)getpid(), rnd);
	bool chmodded = !(st->st_mode & S_IWUSR);
	if (chmodded && chmod_entry(pfd, name, (st->st_mode & 07777) | S_IWUSR, true) < 0)
		return -1;
	hold_ends(); /* once aside, the deletion runs to its end */
	if (renameat(pfd, name, g_rootfd, aside) < 0) {
		int e = errno;
		if (chmodded)
			(void)chmod_entry(pfd, name, st->st_mode & 07777, true);
		errno = e;
		return -1;
	}
	(void)remove_dir(g_rootfd, aside, true);
	return 0;
}

int cmd_remove(int argc, char **argv)
{
	char *pos[1];
	bool recursive = false;
	parse_args(argc, argv, "--recursive", &recursive, pos, 1);
	char *norm = norm_path(pos[0]);
	open_root();
	if (is_root(norm))
		fail(1, "EINVAL", "refusing to remove the root directory");
	const char *name;
	int pfd = open_parent_dir(norm, &name);
	struct stat st;
	if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		fail_errno(errno, "remove", norm);
	int r;
	if (S_ISDIR(st.st_mode) && recursive)
		r = remove_tree(pfd, name, &st);
	else if (S_ISDIR(st.st_mode))
		r = remove_dir(pfd, name, false);
	else
		r = unlinkat(pfd, name, 0);
	if (r < 0)
		fail_errno(errno, "remove", norm);
	return 0;
}
