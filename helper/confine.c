/*
 * confine.c - paths confined to the root: openat2(RESOLVE_BENEATH), or the same
 * walk by hand where the kernel has none (gVisor), and the parents of a path.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "sbx.h"

int g_rootfd = -1;

/*
 * openat2 where the kernel has none: gVisor (Debian 12's runsc) answers ENOSYS.
 * The same guarantee by walking one component at a time with
 * openat(O_NOFOLLOW) on directory fds we hold: `..` pops our own stack (never
 * the filesystem's `..`, so a concurrent rename cannot move us out), at the
 * start it is an escape (EXDEV, as RESOLVE_BENEATH says); a symlink is read
 * and its target spliced into the rest of the path (absolute: EXDEV; with
 * RES_NOSYM: ELOOP; more than 40: ELOOP).  A trailing symlink is followed
 * unless the caller asked for O_NOFOLLOW, like openat2.
 */
#define WALK_DEPTH 4096
static int walk_beneath(int dirfd, const char *path, uint64_t flags,
			uint64_t mode, uint64_t resolve)
{
	if (path[0] == '/') {
		errno = EXDEV;
		return -1;
	}
	int *stack = xmalloc(WALK_DEPTH * sizeof *stack);
	int depth = 0, follows = 0, result = -1, err = 0;
	stack[0] = dirfd;
	char *rest = xmalloc(strlen(path) + 1);
	strcpy(rest, path);
	char *p = rest;
	for (;;) {
		while (*p == '/')
			p++;
		char *end = strchr(p, '/');
		char *next = end ? end : p + strlen(p);
		while (*next == '/')
			next++;
		bool last = *next == '\0';
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char comp[NAME_MAX + 1];
		if (len > NAME_MAX) {
			err = ENAMETOOLONG;
			break;
		}
		memcpy(comp, p, len);
		comp[len] = '\0';
		int cur = stack[depth];
		if (!strcmp(comp, "..")) {
			if (depth == 0) {
				err = EXDEV;
				break;
			}
			close(stack[depth--]);
			strcpy(comp, ".");
			cur = stack[depth];
		}
		if (!last && (!len || !strcmp(comp, "."))) {
			p = next;
			continue;
		}
		if (!len)
			strcpy(comp, ".");
		bool link = false;
		if (!last) {
			int fd = openat(cur, comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
			struct stat st;
			if (fd < 0 || fstat(fd, &st) < 0) {
				err = errno;
				if (fd >= 0)
					close(fd);
				break;
			}
			if (S_ISLNK(st.st_mode)) {
				close(fd);
				link = true;
			} else if (!S_ISDIR(st.st_mode)) {
				close(fd);
				err = ENOTDIR;
				break;
			} else if (depth + 1 >= WALK_DEPTH) {
				close(fd);
				err = ENAMETOOLONG;
				break;
			} else {
				stack[++depth] = fd;
				p = next;
				continue;
			}
		} else {
			int fd = openat(cur, comp, (int)(flags | O_NOFOLLOW | O_CLOEXEC),
					(mode_t)mode);
			struct stat st, at;
			if (fd >= 0) {
				/* gVisor follows a trailing symlink despite O_NOFOLLOW
				 * when O_DIRECTORY is set (measured): the fd must be the
				 * very inode the name holds, and that no symlink. */
				if (fstat(fd, &st) < 0 ||
				    fstatat(cur, comp, &at, AT_SYMLINK_NOFOLLOW) < 0) {
					err = errno;
					close(fd);
					break;
				}
				bool same = st.st_dev == at.st_dev && st.st_ino == at.st_ino;
				bool is_link = S_ISLNK(at.st_mode);
				if (same && (!is_link || (flags & O_NOFOLLOW))) {
					result = fd;
					break;
				}
				close(fd);
				if (!is_link) { /* swapped under us: refuse */
					err = EAGAIN;
					break;
				}
				if (flags & O_NOFOLLOW) {
					err = ELOOP;
					break;
				}
				link = true;
			} else if ((flags & O_NOFOLLOW) ||
				   (errno != ELOOP && errno != ENOTDIR) ||
				   fstatat(cur, comp, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
				   !S_ISLNK(st.st_mode)) {
				err = errno;
				break;
			} else {
				link = true;
			}
		}
		/* A symlink: splice its target in front of the rest. */
		if (link) {
			if ((resolve & RESOLVE_NO_SYMLINKS) || ++follows > 40) {
				err = ELOOP;
				break;
			}
			char target[PATH_MAX];
			ssize_t n = readlinkat(cur, comp, target, sizeof target - 1);
			if (n < 0) {
				err = errno;
				break;
			}
			target[n] = '\0';
			if (target[0] == '/') {
				err = EXDEV;
				break;
			}
			char *joined = xmalloc((size_t)n + strlen(next) + 2);
			sprintf(joined, "%s%s%s", target, *next ? "/" : "", next);
			free(rest);
			rest = p = joined;
		}
	}
	while (depth > 0)
		close(stack[depth--]);
	free(stack);
	free(rest);
	if (result < 0)
		errno = err ? err : EIO;
	return result;
}

bool g_no_openat2;

int open_beneath(int dirfd, const char *path, uint64_t flags,
			uint64_t mode, uint64_t resolve)
{
	if (g_no_openat2)
		return walk_beneath(dirfd, path, flags, mode, resolve);
	struct open_how how;
	memset(&how, 0, sizeof how);
	how.flags = flags | O_CLOEXEC;
	how.mode = mode;
	how.resolve = resolve;
	for (int tries = 0;; tries++) {
		long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof how);
		if (fd >= 0)
			return (int)fd;
		/* EAGAIN: the kernel saw a concurrent rename and could not
		 * prove `..` safety; retrying is the documented answer. */
		if ((errno == EINTR || errno == EAGAIN) && tries < 64)
			continue;
		if (errno == ENOSYS) {
			g_no_openat2 = true;
			return walk_beneath(dirfd, path, flags, mode, resolve);
		}
		return -1;
	}
}

void open_root(void)
{
	g_rootfd = open(g_root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (g_rootfd < 0)
		fail_errno(errno, "open root", g_root);
}

/* Normalise a root-relative path: drop empty and "." components, refuse
 * ".." and absolute paths outright (the server already normalises, so these
 * only show up in attacks or bugs).  Returns "." for the root itself. */
char *norm_path(const char *in)
{
	if (!*in)
		fail(1, "EINVAL", "empty path");
	if (in[0] == '/')
		fail(1, "ESCAPE", "absolute path not allowed: %s", in);
	char *out = xmalloc(strlen(in) + 2);
	size_t o = 0;
	const char *p = in;
	while (*p) {
		while (*p == '/')
			p++;
		if (!*p)
			break;
		size_t n = strcspn(p, "/");
		if (n == 2 && p[0] == '.' && p[1] == '.')
			fail(1, "ESCAPE", "'..' not allowed in path: %s", in);
		if (!(n == 1 && p[0] == '.')) {
			if (o)
				out[o++] = '/';
			memcpy(out + o, p, n);
			o += n;
		}
		p += n;
	}
	if (!o)
		out[o++] = '.';
	out[o] = '\0';
	return out;
}

bool is_root(const char *norm)
{
	return !strcmp(norm, ".");
}

/* Split a normalised non-root path into a freshly allocated parent ("." if
 * none) and a pointer to its final component. */
char *split_parent(const char *norm, const char **name)
{
	const char *slash = strrchr(norm, '/');
	if (!slash) {
		*name = norm;
		return xstrdup(".");
	}
	*name = slash + 1;
	char *parent = xmalloc((size_t)(slash - norm) + 1);
	memcpy(parent, norm, (size_t)(slash - norm));
	parent[slash - norm] = '\0';
	return parent;
}

/* Open a directory beneath the root; errors name `shown`, the path the
 * caller asked about, rather than the intermediate directory. */
int open_dir_path(const char *norm, const char *shown)
{
	int fd = open_beneath(g_rootfd, norm, O_PATH | O_DIRECTORY, 0, RES_BENEATH);
	if (fd < 0)
		fail_errno(errno, "open", shown);
	return fd;
}

/* The directory that holds the non-root path `norm`, opened beneath the root
 * (errors name `norm`), and in `*name` its final component. */
int open_parent_dir(const char *norm, const char **name)
{
	char *parent = split_parent(norm, name);
	return open_dir_path(parent, norm);
}

/* mkdir -p beneath the root.  Each prefix is re-resolved from the root fd,
 * so a component swapped for a symlink mid-walk still cannot lead outside. */
/* mkdir -p; with `note`, each directory made is noted for unmake_dirs(). */
int mkdir_parents_noting(const char *norm, bool note)
{
	int cur = open_dir_path(".", ".");
	if (is_root(norm))
		return cur;
	char *prefix = xstrdup(norm);
	for (char *p = prefix;;) {
		char *slash = strchr(p, '/');
		if (slash)
			*slash = '\0';
		if (mkdirat(cur, p, 0755) == 0) {
			if (note && g_made < MADE_MAX) {
				int k = g_made;
				g_made_name[k] = xstrdup(p);
				g_made_fd[k] = dup(cur);
				if (g_made_fd[k] >= 0)
					g_made = k + 1;
			}
		} else if (errno != EEXIST) {
			fail_errno(errno, "mkdir", prefix);
		}
		close(cur);
		cur = open_dir_path(prefix, prefix);
		if (!slash)
			break;
		*slash = '/';
		p = slash + 1;
	}
	free(prefix);
	return cur;
}
