/*
 * watch_queue.c - `sbx watch`'s output: a bounded queue of lines, written to
 * stdout without blocking so inotify is always drained; identical consecutive
 * events are one, and a full queue is an overflow event, never a silent loss.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sbx.h"
#include "watch.h"

void push_line(const char *text, size_t len)
{
	/* The same event twice in a row (a file written in many pieces) is
	 * one event, unless the first is already half written. */
	if (g_watch.tail && (g_watch.tail != g_watch.head || g_watch.head_off == 0) &&
	    g_watch.tail->len == len && !memcmp(g_watch.tail->text, text, len))
		return;
	struct line *l = xmalloc(sizeof *l + len);
	l->next = NULL;
	l->len = len;
	memcpy(l->text, text, len);
	if (g_watch.tail)
		g_watch.tail->next = l;
	else
		g_watch.head = l;
	g_watch.tail = l;
	g_watch.qlen++;
}

/* Queue the pending overflow event once there is room for it. */
void try_overflow(void)
{
	if (!g_watch.overflow || !g_watch.ready || g_watch.qlen >= g_watch.queue_max)
		return;
	struct buf b = {0};
	buf_puts(&b, "{\"kind\":\"overflow\",\"path\":\"\",\"reason\":\"");
	buf_puts(&b, g_watch.overflow);
	buf_puts(&b, "\"}\n");
	push_line(b.p, b.len);
	free(b.p);
	g_watch.overflow = NULL;
}

void overflow(const char *reason)
{
	if (!g_watch.overflow)
		g_watch.overflow = reason;
	try_overflow();
}

static void enqueue(const struct buf *b)
{
	try_overflow();
	if (g_watch.overflow || g_watch.qlen >= g_watch.queue_max) {
		overflow("queue");
		return;
	}
	push_line(b->p, b->len);
}

/* Write what stdout takes now; false when the reader has gone. */
bool write_some(void)
{
	while (g_watch.head) {
		ssize_t n = write(STDOUT_FILENO, g_watch.head->text + g_watch.head_off,
				  g_watch.head->len - g_watch.head_off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN;
		}
		g_watch.head_off += (size_t)n;
		if (g_watch.head_off < g_watch.head->len)
			return true;
		struct line *done = g_watch.head;
		g_watch.head = done->next;
		if (!g_watch.head)
			g_watch.tail = NULL;
		free(done);
		g_watch.head_off = 0;
		g_watch.qlen--;
		try_overflow();
	}
	return true;
}

void emit(const char *kind, const char *path, const char *old,
		 const char *type)
{
	struct buf b = {0};
	buf_puts(&b, "{\"kind\":\"");
	buf_puts(&b, kind);
	buf_puts(&b, "\",\"path\":");
	buf_json_str(&b, path, strlen(path));
	if (old) {
		buf_puts(&b, ",\"old_path\":");
		buf_json_str(&b, old, strlen(old));
	}
	if (type) {
		buf_puts(&b, ",\"type\":\"");
		buf_puts(&b, type);
		buf_puts(&b, "\"");
	}
	buf_puts(&b, "}\n");
	enqueue(&b);
	free(b.p);
}

/* Known names: what exists, for the type of a removed entry and for   */
/* telling a file `sbx write` created from one it replaced              */
