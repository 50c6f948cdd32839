/*
 * merge.c - `sbx merge STAGE DEST [--replace]`: the swap half of an archive import.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sbx.h"
#include "tree.h"

/*
 * `sbx merge STAGE DEST [--replace]`: the swap half of an archive import, all
 * or nothing.  The server unpacked a checked archive into the fresh directory
 * STAGE; this moves its entries into DEST with renameat, so nothing is ever
 * written through a symlink: a directory is merged into a real directory only
 * (O_NOFOLLOW), and anything else in the way (a file, a symlink) is replaced,
 * never followed.  --replace takes the place of everything in DEST (sparing
 * STAGE if it lives there).
 *
 * Nothing of DEST is deleted before all of STAGE is in place: an entry that
 * gives way (one a staged entry replaces, or with --replace every entry) is
 * first renamed into TRASH, the directory STAGE.old made beside STAGE, and
 * each rename is written down.  A failure at any step (a rename refused, a
 * directory moved meanwhile) renames everything back, last first, so a
 * refused merge leaves DEST as it was.  Only then are TRASH and STAGE removed;
 * what a failed removal leaves has the import staging prefix, which the
 * server removes at its next start.  Renames need no room: a full workspace
 * cannot stop the swap halfway, and SIGHUP/SIGTERM (a cancelled call) are held
 * until the end, so neither can a cancel.
 */
static int open_sub(int pfd, const char *name)
{
	return open_beneath(pfd, name, O_RDONLY | O_DIRECTORY, 0, RES_NOSYM);
}

/* One rename of the swap, as the undo needs it. */
struct undo {
	char *path;	/* relative to DEST, and to STAGE */
	long trash;	/* DEST's entry that gave way is TRASH/<trash>; -1: none */
	bool staged;	/* DEST/path now holds what was STAGE/path */
	bool chmodded;	/* the entry that gave way had `mode` (u+w added to move it) */
	mode_t mode;
};

static struct {
	struct undo *v;
	size_t n, cap;
	long next;
	int stage, dest, trash;	/* directories, open for the whole merge */
	int parent;		/* STAGE's parent, where TRASH is */
	const char *trash_name;
} g_swap = {.stage = -1, .dest = -1, .trash = -1, .parent = -1};

/* The parent of `path` beneath `base` (a new descriptor), and its last name. */
static int open_parent(int base, const char *path, const char **name)
{
	const char *slash = strrchr(path, '/');
	if (!slash) {
		*name = path;
		return dup(base);
	}
	*name = slash + 1;
	char *parent = xmalloc((size_t)(slash - path) + 1);
	memcpy(parent, path, (size_t)(slash - path));
	parent[slash - path] = '\0';
	int fd = open_sub(base, parent);
	free(parent);
	return fd;
}

static void trash_name(char *out, size_t n, long k)
{
	snprintf(out, n, "%ld", k);
}

/* Rename everything back, last first: staged entries to STAGE, the entries
 * that gave way from TRASH to their place, with their own modes. */
static void swap_undo(void)
{
	for (size_t k = g_swap.n; k-- > 0;) {
		struct undo *u = &g_swap.v[k];
		const char *name, *sname;
		int d = open_parent(g_swap.dest, u->path, &name);
		if (d < 0)
			continue;
		if (u->staged) {
			int s = open_parent(g_swap.stage, u->path, &sname);
			if (s >= 0) {
				(void)renameat(d, name, s, sname);
				close(s);
			}
		}
		if (u->trash >= 0) {
			char t[32];
			trash_name(t, sizeof t, u->trash);
			if (renameat(g_swap.trash, t, d, name) == 0 && u->chmodded)
				(void)chmod_entry(d, name, u->mode, true);
		}
		close(d);
	}
	g_swap.n = 0;
	(void)unlinkat(g_swap.parent, g_swap.trash_name, AT_REMOVEDIR); /* empty again */
}

static struct undo *swap_note(const char *path)
{
	if (g_swap.n == g_swap.cap) {
		g_swap.cap = g_swap.cap ? g_swap.cap * 2 : 64;
		struct undo *nv = realloc(g_swap.v, g_swap.cap * sizeof *nv);
		if (!nv)
			oom();
		g_swap.v = nv;
	}
	struct undo *u = &g_swap.v[g_swap.n++];
	*u = (struct undo){.path = xstrdup(path), .trash = -1};
	return u;
}

/* DEST's entry `name` of `dfd` (DEST/path) gives way: renamed into TRASH.  A
 * directory moving to another parent must be writable (its ".." changes), so
 * one without u+w gets it for the move, and back on an undo. */
static void set_aside(int dfd, const char *name, const char *path)
{
	struct stat st;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		fail_errno(errno, "merge", path);
	bool chmodded = false;
	if (S_ISDIR(st.st_mode) && !(st.st_mode & S_IWUSR)) {
		if (chmod_entry(dfd, name, (st.st_mode & 07777) | S_IWUSR, true) < 0)
			fail_errno(errno, "merge", path);
		chmodded = true;
	}
	char t[32];
	long k = g_swap.next++;
	trash_name(t, sizeof t, k);
	if (renameat(dfd, name, g_swap.trash, t) < 0) {
		int e = errno;
		if (chmodded)
			(void)chmod_entry(dfd, name, st.st_mode & 07777, true);
		fail_errno(e, "merge", path);
	}
	struct undo *u = swap_note(path);
	u->trash = k;
	u->chmodded = chmodded;
	u->mode = st.st_mode & 07777;
}

/* STAGE/path (`name` of `sfd`) into its place in DEST (`dfd`), which is free. */
static void bring_in(int sfd, int dfd, const char *name, const char *path)
{
	if (rename_noreplace(sfd, name, dfd, name) < 0)
		fail_errno(errno, "merge", path);
	struct undo *last = g_swap.n ? &g_swap.v[g_swap.n - 1] : NULL;
	if (last && !last->staged && last->trash >= 0 && !strcmp(last->path, path))
		last->staged = true;
	else
		swap_note(path)->staged = true;
}

/* Merge the directory `src` into `dst` (both taken over), with a bounded
 * number of descriptors whatever the depth (see struct walk): the walk goes
 * down both trees in step, and back up through ".." checked on both. */
/* A dry run first: a destination directory the merge may not write (a 555
 * folder of the sandbox user's) is refused before anything moved. */
static bool g_merge_dry;

static void merge_tree(int src, int dst)
{
	struct walk w = {.fd = -1};
	struct buf rel = {0};
	buf_puts(&rel, "");
	/* ids[k]: the destination directory that goes with the walk's frame k */
	struct stat *ids = NULL;
	size_t ncap = 0;
	int dfd = dst;
	if (walk_push(&w, src, NULL, ".") < 0)
		fail_errno(errno, "merge", ".");
	ncap = 16;
	ids = xmalloc(ncap * sizeof *ids);
	if (fstat(dfd, &ids[0]) < 0)
		fail_errno(errno, "merge", ".");
	for (;;) {
		struct frame *f = &w.v[w.depth - 1];
		if (f->i == f->n) {
			if (w.depth == 1)
				break;
			if (walk_pop(&w) < 0)
				fail_errno(errno, "merge", rel.p);
			struct stat up_st;
			int up = openat(dfd, "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (up < 0 || fstat(up, &up_st) < 0)
				fail_errno(errno, "merge", rel.p);
			if (up_st.st_dev != ids[w.depth - 1].st_dev ||
			    up_st.st_ino != ids[w.depth - 1].st_ino)
				fail(1, "EIO", "merge %s: directory moved during the merge", rel.p);
			close(dfd);
			dfd = up;
			rel.len = w.v[w.depth - 1].rel_len;
			rel.p[rel.len] = '\0';
			continue;
		}
		const char *name = f->names[f->i++];
		rel.len = f->rel_len;
		rel.p[rel.len] = '\0';
		if (rel.len)
			buf_add(&rel, "/", 1);
		buf_puts(&rel, name);
		const char *sub = rel.p;
		struct stat ss, ds;
		if (fstatat(w.fd, name, &ss, AT_SYMLINK_NOFOLLOW) < 0)
			fail_errno(errno, "merge", sub);
		bool exists = fstatat(dfd, name, &ds, AT_SYMLINK_NOFOLLOW) == 0;
		if (!exists && errno != ENOENT)
			fail_errno(errno, "merge", sub);
		if (S_ISDIR(ss.st_mode) && exists && S_ISDIR(ds.st_mode)) {
			struct stat dst_st;
			int s2 = open_sub(w.fd, name);
			int d2 = s2 < 0 ? -1 : open_sub(dfd, name);
			if (s2 < 0 || d2 < 0 || fstat(d2, &dst_st) < 0)
				fail_errno(errno, "merge", sub);
			size_t len = rel.len;
			if (walk_push(&w, s2, NULL, sub) < 0)
				fail_errno(errno, "merge", sub);
			w.v[w.depth - 1].rel_len = len;
			if (w.depth > ncap) {
				ncap = w.depth * 2;
				struct stat *n2 = realloc(ids, ncap * sizeof *ids);
				if (!n2)
					oom();
				ids = n2;
			}
			ids[w.depth - 1] = dst_st;
			close(dfd);
			dfd = d2;
			continue;
		}
		if (g_merge_dry) {
			/* Only look: every directory that would change must let us. */
			if (faccessat(dfd, ".", W_OK | X_OK, AT_EACCESS) < 0)
				fail_errno(errno, "merge", sub);
			continue;
		}
		if (exists)
			set_aside(dfd, name, sub);
		bring_in(w.fd, dfd, name, sub);
	}
	walk_free(&w);
	close(dfd);
	free(ids);
	free(rel.p);
}

static bool same_entry(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* --replace: every entry of DEST but STAGE, TRASH and mount points into TRASH,
 * then every entry of STAGE into DEST.  A mount point (an entry on another file
 * system than DEST: a volume the sandbox mounts below /workspace) stays where
 * it is with its content: the kernel would refuse to rename it, and it is no
 * part of the workspace a snapshot restores. */
static void replace_all(int sfd, int dfd, const struct stat *stage_st,
			const struct stat *trash_st)
{
	struct stat dest_st;
	if (fstat(dfd, &dest_st) < 0)
		fail_errno(errno, "replace", ".");
	int fd = dup(dfd);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	if (!d)
		fail_errno(errno, "replace", ".");
	size_t n;
	char **names = read_names(d, &n, NULL, ".");
	closedir(d);
	for (size_t i = 0; i < n; i++) {
		struct stat st;
		if (fstatat(dfd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno == ENOENT)
				continue;
			fail_errno(errno, "replace", names[i]);
		}
		if (st.st_dev != dest_st.st_dev)
			continue; /* a mount point */
		if (!same_entry(&st, stage_st) && !same_entry(&st, trash_st))
			set_aside(dfd, names[i], names[i]);
	}
	fd = dup(sfd);
	d = fd < 0 ? NULL : fdopendir(fd);
	if (!d)
		fail_errno(errno, "replace", ".");
	size_t m;
	char **staged = read_names(d, &m, NULL, ".");
	closedir(d);
	for (size_t i = 0; i < m; i++)
		bring_in(sfd, dfd, staged[i], staged[i]);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	for (size_t i = 0; i < m; i++)
		free(staged[i]);
	free(names);
	free(staged);
}

/* Best effort once the swap is done: a leftover is removed at the server's next start. */
static void remove_quietly(int pfd, const char *name)
{
	(void)remove_dir(pfd, name, true);
}

int cmd_merge(int argc, char **argv)
{
	char *pos[2];
	bool replace = false;
	parse_args(argc, argv, "--replace", &replace, pos, 2);
	char *stage = norm_path(pos[0]);
	char *dest = norm_path(pos[1]);
	open_root();
	if (is_root(stage))
		fail(1, "EINVAL", "merge: the stage cannot be the root");
	int sfd = open_beneath(g_rootfd, stage, O_RDONLY | O_DIRECTORY, 0, RES_NOSYM);
	if (sfd < 0)
		fail_errno(errno, "open stage", stage);
	int dfd = open_beneath(g_rootfd, dest, O_RDONLY | O_DIRECTORY, 0, RES_BENEATH);
	if (dfd < 0)
		fail_errno(errno, "open", dest);
	struct stat st, tst;
	if (fstat(sfd, &st) < 0)
		fail_errno(errno, "stat stage", stage);
	if (replace) {
		if (faccessat(dfd, ".", W_OK | X_OK, AT_EACCESS) < 0)
			fail_errno(errno, "merge", dest);
	} else {
		/* Fresh descriptors: the walk reads and closes what it is given. */
		int s2 = openat(sfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		int d2 = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (s2 < 0 || d2 < 0)
			fail_errno(errno, "merge", dest);
		g_merge_dry = true;
		merge_tree(s2, d2);
		g_merge_dry = false;
	}
	const char *name;
	char *parent = split_parent(stage, &name);
	int pfd = open_beneath(g_rootfd, parent, O_RDONLY | O_DIRECTORY, 0, RES_BENEATH);
	if (pfd < 0)
		fail_errno(errno, "open", parent);
	char *trash = xmalloc(strlen(name) + 5);
	snprintf(trash, strlen(name) + 5, "%s.old", name);
	if (mkdirat(pfd, trash, 0700) < 0)
		fail_errno(errno, "make the trash of", stage);
	g_swap.trash = open_sub(pfd, trash);
	if (g_swap.trash < 0 || fstat(g_swap.trash, &tst) < 0) {
		int e = errno;
		(void)unlinkat(pfd, trash, AT_REMOVEDIR);
		fail_errno(e, "open the trash of", stage);
	}
	hold_ends();
	g_swap.stage = dup(sfd);
	g_swap.dest = dup(dfd);
	g_swap.parent = pfd;
	g_swap.trash_name = trash;
	if (g_swap.stage < 0 || g_swap.dest < 0)
		fail_errno(errno, "merge", dest);
	g_undo = swap_undo;
	if (replace)
		replace_all(sfd, dfd, &st, &tst);
	else
		merge_tree(sfd, dfd);
	g_undo = NULL; /* in place: from here on nothing is taken back */
	remove_quietly(pfd, trash);
	remove_quietly(pfd, name);
	return 0;
}
