/*
 * watch.c - `sbx watch PATH [--recursive] [--max-watches N] [--queue N]`.
 * This file: its state (struct watch, watch.h), inotify's events turned into
 * lines, and the subcommand; watch.h says which file holds the rest.
 *
 * Reports changes beneath PATH (inside the root) as JSON lines on stdout, one
 * per event, until stdin reaches EOF (the server closed it, or the exec's
 * connection went away), SIGHUP/SIGTERM, stdout closes, or PATH itself goes
 * away.  See helper/README.md ("watch") for the event format.
 *
 * Confinement: every directory is opened with openat2(RESOLVE_BENEATH) and
 * the inotify watch is added through that descriptor (/proc/self/fd/N), so a
 * symlink planted anywhere on the way never puts a watch outside the root.
 *
 * Nothing is lost silently: the kernel's queue overflowing (IN_Q_OVERFLOW),
 * a directory that could not be watched (--max-watches or the kernel's limit)
 * and our own bounded output queue filling up (a reader slower than the
 * changes) each produce an "overflow" event: the caller must list again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sbx.h"
#include "watch.h"

struct watch g_watch = {
	.ifd = -1,
	.topwd = -1,
	.max_watches = DEFAULT_MAX_WATCHES,
	.queue_max = DEFAULT_QUEUE,
};

/* A first half with no second: moved out of the watched tree. */
static void flush_pending(void)
{
	if (!g_watch.pend.set)
		return;
	g_watch.pend.set = false;
	if (!g_watch.pend.temp) {
		const char *type = known_del(g_watch.pend.path);
		emit("removed", g_watch.pend.path, NULL, g_watch.pend.isdir ? "dir" : type);
		if (g_watch.pend.isdir)
			unwatch_tree(g_watch.pend.path);
	}
	free(g_watch.pend.path);
	g_watch.pend.path = NULL;
}

/* A new entry; its type stays unknown when it is gone before we look. */
static void appeared(const char *path, bool isdir)
{
	const char *type = isdir ? "dir" : stat_type(path);
	known_add(path, type);
	emit("created", path, NULL, type);
	if (isdir && g_watch.recursive)
		watch_tree(path, true);
}

static void moved_to(const struct inotify_event *ev, const char *path, bool isdir)
{
	bool paired = g_watch.pend.set && g_watch.pend.cookie == ev->cookie;
	if (helper_temp(ev->name)) {
		if (paired)
			flush_pending();
		return;
	}
	if (!paired) {
		appeared(path, isdir); /* moved in from outside */
		return;
	}
	char *old = g_watch.pend.path;
	bool temp = g_watch.pend.temp;
	g_watch.pend.set = false;
	g_watch.pend.path = NULL;
	if (temp) {
		/* `sbx write` replacing or creating `path` through its temp file:
		 * always a regular file (made O_EXCL), whatever is there now. */
		bool existed = known_type(path) != NULL;
		const char *type = "file";
		known_add(path, type);
		emit(existed ? "modified" : "created", path, NULL, type);
	} else {
		const char *type = known_del(old);
		if (isdir)
			type = "dir";
		else if (!type)
			type = stat_type(path);
		known_add(path, type);
		emit("renamed", path, old, type);
		if (isdir && g_watch.recursive)
			rename_watches(old, path);
	}
	free(old);
}

static void handle(const struct inotify_event *ev)
{
	if (ev->mask & IN_Q_OVERFLOW) {
		flush_pending();
		overflow("kernel");
		return;
	}
	/* A move's first half with no second is settled first: it may drop the
	 * watches (and the paths) of the tree that moved out. */
	if (g_watch.pend.set && !((ev->mask & IN_MOVED_TO) && ev->cookie == g_watch.pend.cookie))
		flush_pending();
	/* The watched directory is gone (removed, or moved aside and then
	 * deleted): what happens to its contents now is not under its name. */
	if (g_watch.done)
		return;
	const char *dir = wpath(ev->wd);
	if (!dir)
		return; /* a watch already dropped */
	if (ev->mask & IN_IGNORED) {
		if (ev->wd == g_watch.topwd)
			g_watch.done = true;
		forget_wd(ev->wd);
		return;
	}
	if (!ev->len) {
		/* About the watched directory itself: reported by its parent's
		 * watch, except for the top one. */
		if (ev->wd != g_watch.topwd)
			return;
		if (ev->mask & IN_ATTRIB)
			emit("attributes", dir, NULL, "dir");
		if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
			emit("removed", dir, NULL, "dir");
			g_watch.done = true;
		}
		return;
	}
	bool isdir = ev->mask & IN_ISDIR;
	bool temp = helper_temp(ev->name);
	char *path = join(dir, ev->name);
	if (ev->mask & IN_MOVED_FROM) {
		g_watch.pend.set = true;
		g_watch.pend.isdir = isdir;
		g_watch.pend.temp = temp;
		g_watch.pend.cookie = ev->cookie;
		g_watch.pend.path = path;
		return;
	}
	if (ev->mask & IN_MOVED_TO) {
		moved_to(ev, path, isdir);
	} else if (temp) {
		/* created, written, chmod'ed or removed by `sbx write` */
	} else if (ev->mask & IN_CREATE) {
		appeared(path, isdir);
	} else if (ev->mask & IN_DELETE) {
		const char *type = known_del(path);
		emit("removed", path, NULL, isdir ? "dir" : type);
	} else if (ev->mask & IN_MODIFY) {
		/* Only a file's content is modified: what a create left unknown. */
		const char *type = known_type(path);
		if (!type)
			known_add(path, type = "file");
		emit("modified", path, NULL, type);
	} else if (ev->mask & IN_ATTRIB) {
		const char *type = isdir ? "dir" : known_type(path);
		emit("attributes", path, NULL, type ? type : stat_type(path));
	}
	free(path);
}

static void read_events(void)
{
	char buf[65536] __attribute__((aligned(__alignof__(struct inotify_event))));
	for (;;) {
		ssize_t n = read(g_watch.ifd, buf, sizeof buf);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return;
			fail(1, "EIO", "inotify read: %s", strerror(errno));
		}
		for (char *p = buf; p < buf + n;) {
			const struct inotify_event *ev = (const void *)p;
			handle(ev);
			p += sizeof *ev + ev->len;
		}
	}
}

int cmd_watch(int argc, char **argv)
{
	const char *target = NULL;
	bool opts = true;
	for (int i = 0; i < argc; i++) {
		if (opts && !strcmp(argv[i], "--")) {
			opts = false;
		} else if (opts && !strcmp(argv[i], "--recursive")) {
			g_watch.recursive = true;
		} else if (opts && (!strcmp(argv[i], "--max-watches") || !strcmp(argv[i], "--queue"))) {
			if (i + 1 >= argc)
				fail(2, "EINVAL", "%s requires a number", argv[i]);
			uint64_t v = parse_uint(argv[i + 1], argv[i] + 2);
			if (v < 1)
				fail(2, "EINVAL", "%s must be at least 1", argv[i]);
			if (argv[i][2] == 'q')
				g_watch.queue_max = v;
			else
				g_watch.max_watches = v;
			i++;
		} else if (opts && !strncmp(argv[i], "--", 2)) {
			fail(2, "EINVAL", "unknown option %s", argv[i]);
		} else if (target) {
			fail(2, "EINVAL", "too many arguments");
		} else {
			target = argv[i];
		}
	}
	if (!target)
		fail(2, "EINVAL", "usage: sbx watch PATH [--recursive] [--max-watches N] [--queue N]");
	char *norm = norm_path(target);
	open_root();
	int fd = open_beneath(g_rootfd, norm, O_PATH | O_DIRECTORY, 0, RES_BENEATH);
	if (fd < 0)
		fail_errno(errno, "watch", norm);
	close(fd);
	/* EMFILE here is the kernel's count of inotify instances per uid
	 * (fs.inotify.max_user_instances; this process holds a handful of
	 * descriptors), ENFILE the host's file table, ENOSPC below its count of
	 * watches per uid (max_user_watches): limits, not a full workspace. */
	g_watch.ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (g_watch.ifd < 0) {
		int e = errno;
		if (e == EMFILE || e == ENFILE)
			fail(1, "KERNEL_LIMIT", "inotify: the kernel's limit of inotify instances "
			     "is reached (%s)", strerror(e));
		fail(1, "EIO", "inotify: %s", strerror(e));
	}
	g_watch.topwd = add_watch(norm);
	if (g_watch.topwd < 0) {
		if (errno == ENOSPC)
			fail(1, "KERNEL_LIMIT", "watch %s: the kernel's limit of inotify watches is "
			     "reached", norm);
		fail_errno(errno, "watch", norm);
	}
	/* The top directory's contents are remembered, not reported. */
	struct pathstack todo = {0};
	scan_dir(norm, false, &todo);
	while (todo.n) {
		char *cur = todo.v[--todo.n];
		watch_tree(cur, false);
		free(cur);
	}
	free(todo.v);

	struct stat st;
	bool watch_stdin = fstat(STDIN_FILENO, &st) == 0 &&
			   (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode));
	if (fcntl(STDOUT_FILENO, F_SETFL, fcntl(STDOUT_FILENO, F_GETFL) | O_NONBLOCK) < 0)
		fail(1, "EIO", "stdout: %s", strerror(errno));
	push_line("{\"kind\":\"ready\"}\n", 17);
	g_watch.ready = true;
	try_overflow(); /* a limit met while adding the first watches */

	for (;;) {
		if (!write_some())
			return 0; /* the reader is gone */
		if (g_watch.done && !g_watch.head && !g_watch.pend.set)
			return 0;
		struct pollfd p[3] = {
			{.fd = g_watch.ifd, .events = POLLIN},
			{.fd = STDOUT_FILENO, .events = g_watch.head ? POLLOUT : 0},
			{.fd = watch_stdin ? STDIN_FILENO : -1, .events = POLLIN},
		};
		int n = poll(p, 3, g_watch.pend.set ? PAIR_WAIT_MS : -1);
		if (n < 0 && errno != EINTR)
			fail(1, "EIO", "poll: %s", strerror(errno));
		if (n == 0)
			flush_pending();
		if (p[2].revents) {
			char sink[4096];
			ssize_t r = read(STDIN_FILENO, sink, sizeof sink);
			if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN))
				return 0; /* the caller ended the watch */
		}
		if (p[1].revents & (POLLERR | POLLHUP))
			return 0;
		if (p[0].revents & POLLIN)
			read_events();
	}
}
