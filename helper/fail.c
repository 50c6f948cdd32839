/*
 * fail.c - the one error line on stderr, its exit status, and what a failure
 * undoes on its way out (a merge's swap, write's temp file and folders, stdin).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sbx.h"

/*
 * The shape of every error the helper reports, {"error":NAME,"message":MSG}:
 * the line on stderr here and the agent's RESET and GOAWAY frames
 * (out_error), so the two cannot come to spell an error differently.
 */
void buf_error(struct buf *b, const char *name, const char *msg)
{
	buf_puts(b, "{\"error\":");
	buf_json_str(b, name, strlen(name));
	buf_puts(b, ",\"message\":");
	buf_json_str(b, msg, strlen(msg));
	buf_puts(b, "}");
}

static void emit_error(const char *name, const char *fmt, va_list ap)
{
	char msg[1024];
	vsnprintf(msg, sizeof msg, fmt, ap);
	struct buf b = {0};
	buf_error(&b, name, msg);
	buf_puts(&b, "\n");
	(void)write_all(2, b.p, b.len);
	free(b.p);
}

/* Set while a merge swaps: fail() first undoes what it did (cmd_merge). */
void (*g_undo)(void);

/* `write`'s temp file, removed on any failure so errors never leave debris. */
int g_tmp_dirfd = -1;
char g_tmp_name[64];

/*
 * The directories `write --parents` made, each as its parent's descriptor and
 * its name, removed again (deepest first) if the write fails or is ended: a
 * refused write changes nothing, not even the folders on its way.  Plain
 * arrays, so the signal handler may walk them.  Past MADE_MAX new levels the
 * deeper ones are not noted (their removal then stops at the first non-empty).
 */
int g_made_fd[MADE_MAX];
char *g_made_name[MADE_MAX];
volatile int g_made;

void unmake_dirs(void)
{
	while (g_made > 0) {
		int k = --g_made;
		(void)unlinkat(g_made_fd[k], g_made_name[k], AT_REMOVEDIR);
	}
}

/*
 * Set by subcommands that take data on stdin.  On failure they still read it
 * to the end: the engine keeps an exec's output open until its stdin has been
 * delivered (the shim holds the pipe), so an unread stdin would make the
 * caller wait for an error that was already printed.  The server bounds what
 * it sends, so this is bounded too.
 */
bool g_drain_stdin;

/*
 * `write --idle-ms N`: the longest wait for the next byte on stdin.  An engine
 * need not deliver EOF when the server's connection drops (a cancelled
 * upload), and a writer waiting forever would keep its temp file and a
 * process of the session's.  0: no bound.
 */
int g_idle_ms;

/* read(2) on stdin bounded by g_idle_ms: -1 with ETIMEDOUT when nothing came. */
ssize_t read_stdin(void *p, size_t n)
{
	if (g_idle_ms > 0) {
		struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
		int r;
		do
			r = poll(&pfd, 1, g_idle_ms);
		while (r < 0 && errno == EINTR);
		if (r == 0) {
			errno = ETIMEDOUT;
			return -1;
		}
	}
	return read_retry(STDIN_FILENO, p, n);
}

static void drain_stdin(void)
{
	char buf[65536];
	while (read_stdin(buf, sizeof buf) > 0)
		;
}

/* The error line, then the exit: after what a failure undoes, or, for a child
 * between fork and exec, at once by _exit, with nothing of its parent's undone,
 * drained or flushed. */
__attribute__((noreturn, format(printf, 4, 5)))
void fail_exit(bool child, int code, const char *name, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	emit_error(name, fmt, ap);
	va_end(ap);
	if (child)
		_exit(code);
	if (g_undo) {
		void (*undo)(void) = g_undo;
		g_undo = NULL;
		undo();
	}
	if (g_tmp_name[0])
		unlinkat(g_tmp_dirfd, g_tmp_name, 0);
	unmake_dirs();
	if (g_drain_stdin)
		drain_stdin();
	exit(code);
}

const char *errno_name(int e)
{
	switch (e) {
	case ENOENT: return "ENOENT";
	case ENOTDIR: return "ENOTDIR";
	case EISDIR: return "EISDIR";
	case EEXIST: return "EEXIST";
	case ENOTEMPTY: return "ENOTEMPTY";
	case ENOSPC: case EDQUOT: return "ENOSPC";
	case EACCES: case EPERM: case EROFS: return "EACCES";
	case EINVAL: case ENAMETOOLONG: return "EINVAL";
	/* openat2(RESOLVE_BENEATH) reports an escape attempt as EXDEV; ELOOP
	 * comes from magic links or symlink loops, treated the same way. */
	case EXDEV: case ELOOP: return "ESCAPE";
	default: return "EIO";
	}
}

/* Report errno `e` for an operation on `path`, exit with `code` (fail_exit's `child`). */
__attribute__((noreturn))
void fail_errno_exit(bool child, int code, int e, const char *what, const char *path)
{
	const char *name = errno_name(e);
	if (!strcmp(name, "ESCAPE"))
		fail_exit(child, code, name, "%s %s: path resolves outside the root", what, path);
	fail_exit(child, code, name, "%s %s: %s", what, path, strerror(e));
}
