/*
 * tree.h - walking trees of any depth (walk.c) and the removals and renames
 * (remove.c, move.c) that list, remove, chmod, move and merge share.
 */
#ifndef SBX_TREE_H
#define SBX_TREE_H

#include <dirent.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The most entries one list (or a walk's names) may hold: past it TOO_LARGE. */
#define LIST_MAX 100000

/*
 * Walking trees of any depth with a bounded number of descriptors: only the
 * directory being read is open.  Going back up opens ".." and checks it is
 * the very directory we came down from (device and inode), so a directory
 * moved away mid-walk ends the walk (EIO) instead of leading elsewhere.  A
 * 60,000-deep tree costs one descriptor, not 60,000.
 */
struct frame {
	char **names;
	size_t n, i;
	dev_t dev;
	ino_t ino;
	size_t rel_len;	/* list: length of this directory's path in `rel` */
	int retries;	/* remove: times the current entry was emptied again */
};

struct walk {
	struct frame *v;
	size_t depth, cap;
	int fd;		/* the directory of the top frame */
};

/* Read all names of a directory (sans . and ..), sorted bytewise.  `budget`
 * bounds the total across the whole walk so memory stays bounded too. */
char **read_names(DIR *d, size_t *count, size_t *budget, const char *rel);
/* Make `fd` (an open directory, taken over) the new top frame. */
int walk_push(struct walk *w, int fd, size_t *budget, const char *rel);
int walk_pop(struct walk *w);
void walk_free(struct walk *w);

/* remove.c */
void hold_ends(void);
int chmod_entry(int pfd, const char *name, mode_t mode, bool only_dir);
int remove_dir(int pfd, const char *name, bool recursive);
/* move.c */
int rename_noreplace(int sfd, const char *sname, int dfd, const char *dname);

#endif
