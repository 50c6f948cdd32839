/*
 * watch.h - what the files of `sbx watch` share: its state (struct watch),
 * and each file's functions.  watch.c reads inotify's events and turns them
 * into lines; watch_tree.c keeps the watches (one a directory), watch_known.c
 * the names known to exist, watch_queue.c the bounded output queue.
 */
#ifndef SBX_WATCH_H
#define SBX_WATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WATCH_MASK                                                              \
	(IN_CREATE | IN_DELETE | IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM |        \
	 IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK)
#define DEFAULT_QUEUE 4096
#define DEFAULT_MAX_WATCHES 8192
/* Past this many known names, new ones are not remembered (see known_*). */
#define KNOWN_MAX 1000000
/* How long a rename's first half waits for its second (ms). */
#define PAIR_WAIT_MS 10

/* One line of output waiting for stdout. */
struct line {
	struct line *next;
	size_t len;
	char text[];
};

/* The watcher's state, all of it in one place: one instance, g_watch (watch.c). */
struct watch {
	int ifd;		/* the inotify descriptor */
	int topwd;		/* PATH's own watch */
	bool recursive;
	bool done;
	uint64_t max_watches;
	uint64_t queue_max;
	/* Watched directories: the path (relative to the root) of each wd. */
	char **wpath;
	size_t wcap, wcount;
	/* The output queue (watch_queue.c). */
	struct line *head, *tail;
	size_t qlen, head_off;
	const char *overflow;	/* reason of an overflow not yet queued */
	bool ready;		/* "ready" queued: events may follow */
	/* Known names (watch_known.c): a tsearch tree of struct known. */
	void *known;
	size_t nknown;
	/* The first half of a rename, waiting for its second. */
	struct {
		bool set, isdir, temp;
		uint32_t cookie;
		char *path;
	} pend;
};

/* A stack of paths still to scan (watch_tree.c; cmd_watch's first scan). */
struct pathstack {
	char **v;
	size_t n, cap;
};

/* ---- watch_queue.c: the output queue, bounded, written without blocking ---- */
void push_line(const char *text, size_t len);
void try_overflow(void);
void overflow(const char *reason);
bool write_some(void);
void emit(const char *kind, const char *path, const char *old, const char *type);

/* ---- watch_known.c: names known to exist, and their types ---- */
void known_add(const char *path, const char *type);
const char *known_del(const char *path);
const char *known_type(const char *path);

/* ---- watch_tree.c: the watches, one a directory, and their paths ---- */
char *join(const char *dir, const char *name);
bool helper_temp(const char *name);
const char *stat_type(const char *rel);
const char *wpath(int wd);
void forget_wd(int wd);
int add_watch(const char *rel);
void scan_dir(const char *rel, bool report, struct pathstack *todo);
void watch_tree(const char *rel, bool report);
void unwatch_tree(const char *rel);
void rename_watches(const char *old, const char *new);

extern struct watch g_watch;

#endif
