/*
 * agent_stream.c - streams: their ids, windows and the server's bytes on their
 * way to a process or socket; what became sendable (EXIT, attach replays).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <string.h>

#include "agent.h"
#include "sbx.h"

struct stream *stream_find(uint32_t id)
{
	for (struct stream *s = g_agent.streams; s; s = s->next)
		if (s->id == id)
			return s;
	return NULL;
}

struct stream *stream_new(uint32_t id, enum kind kind)
{
	struct stream *s = xmalloc(sizeof *s);
	memset(s, 0, sizeof *s);
	s->id = id;
	s->kind = kind;
	s->sock = -1;
	s->recv_credit = g_agent.window;
	s->send_credit = g_agent.window;
	s->next = g_agent.streams;
	g_agent.streams = s;
	g_agent.nstreams++;
	return s;
}

/* A stream's input buffer: mapped when bytes must first wait (the process
 * or socket does not take them at once), its pages reserved against the
 * budget before they are touched, all of it given back once it drains. */
static void ib_release(struct stream *s)
{
	mem_unmap(s->ib, s->ib_size);
	g_agent.held -= s->ib_held;
	s->ib = NULL;
	s->ib_size = s->ib_held = 0;
}

bool ib_reserve(struct stream *s, size_t len)
{
	if (!s->ib) {
		s->ib = mem_map(g_agent.window);
		if (!s->ib)
			return false;
		s->ib_size = g_agent.window;
	}
	size_t need = (len + 4095) & ~(size_t)4095;
	if (need <= s->ib_held)
		return true;
	if (g_agent.held + (need - s->ib_held) > g_agent.budget)
		return false;
	g_agent.held += need - s->ib_held;
	s->ib_held = need;
	return true;
}

/* Forget a stream (no frame sent).  A non-detached command loses its
 * only reader and is ended. */
void stream_drop(struct stream *s)
{
	for (struct stream **pp = &g_agent.streams; *pp; pp = &(*pp)->next) {
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	}
	g_agent.nstreams--;
	if (s->kind == K_EXEC && s->cmd && !s->cmd->detached && s->cmd->owner == s)
		cmd_abandon(s->cmd);
	close_fd(&s->sock);
	ib_release(s);
	free(s);
}

void stream_reset(struct stream *s, const char *error, const char *msg)
{
	out_error(F_RESET, s->id, error, "%s", msg);
	stream_drop(s);
}

/* Bytes of the server's DATA were written (or discarded): give the window
 * back in steps of half of it. */
void stream_consumed(struct stream *s, size_t n)
{
	s->consumed += (uint32_t)n;
	if (s->consumed >= g_agent.window / 2) {
		out_u32(F_WINDOW, s->id, s->consumed);
		s->recv_credit += s->consumed;
		s->consumed = 0;
	}
}

/* Where a stream's inbound bytes go: the process's stdin, or the socket. */
int stream_sink(const struct stream *s)
{
	if (s->kind == K_DIAL || s->kind == K_EGRESS)
		return s->connecting ? -1 : s->sock;
	return s->cmd ? s->cmd->in_fd : -1;
}

static void stream_eof_done(struct stream *s)
{
	s->in_eof_done = true;
	if (s->kind == K_DIAL || s->kind == K_EGRESS) {
		if (s->sock >= 0)
			shutdown(s->sock, SHUT_WR);
		return;
	}
	struct cmd *c = s->cmd;
	if (!c || c->in_fd < 0)
		return;
	if (c->tty) {
		/* A terminal has no half-close: its EOF character ends a read. */
		char eof = 4;
		(void)!write(c->in_fd, &eof, 1);
		return;
	}
	close_fd(&c->in_fd);
}

void stream_write_in(struct stream *s)
{
	if (s->connecting)
		return; /* kept until the connection is made */
	int fd = stream_sink(s);
	while (s->ib_len > 0) {
		if (fd < 0) {
			/* stdin closed or never open: the bytes go nowhere */
			size_t n = s->ib_len;
			s->ib_len = 0;
			stream_consumed(s, n);
			break;
		}
		ssize_t w = write(fd, s->ib, s->ib_len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN)
			return;
		if (w <= 0) {
			/* the reader is gone (EPIPE) */
			if (s->kind == K_DIAL || s->kind == K_EGRESS) {
				stream_reset(s, "IO", "the connection failed while writing");
				return;
			}
			if (s->cmd && s->cmd->in_fd == fd)
				close_fd(&s->cmd->in_fd);
			fd = -1;
			continue;
		}
		memmove(s->ib, s->ib + w, s->ib_len - (size_t)w);
		s->ib_len -= (size_t)w;
		stream_consumed(s, (size_t)w);
	}
	if (s->ib_len == 0 && s->ib)
		ib_release(s);
	if (s->in_eof && !s->in_eof_done)
		stream_eof_done(s);
}

/* Exit codes, EXITs and attach replays: what became sendable. */
void pump_streams(void)
{
	for (struct stream *s = g_agent.streams, *n; s; s = n) {
		n = s->next;
		if (!out_room())
			return;
		if (!s->established)
			continue;
		if (s->kind == K_ATTACH || (s->kind == K_EXEC && s->cmd && s->cmd->detached)) {
			if (!attach_pump(s))
				continue;
			struct cmd *c = s->cmd;
			if (cmd_output_done(c) && s->cursor[1] == c->ring[1].end &&
			    s->cursor[2] == c->ring[2].end) {
				struct buf b = {0};
				buf_puts(&b, "{");
				exit_json(&b, c);
				buf_puts(&b, "}");
				out_json(F_EXIT, s->id, &b);
				stream_drop(s);
			}
		} else if (s->kind == K_EXEC && s->cmd && cmd_output_done(s->cmd)) {
			struct buf b = {0};
			buf_puts(&b, "{");
			exit_json(&b, s->cmd);
			buf_puts(&b, "}");
			out_json(F_EXIT, s->id, &b);
			struct cmd *c = s->cmd;
			c->owner = NULL;
			stream_drop(s);
			cmd_free(c);
		} else if ((s->kind == K_DIAL || s->kind == K_EGRESS) && s->sock_eof &&
			   s->in_eof_done) {
			out_frame(F_CLOSE, s->id, NULL, 0);
			stream_drop(s);
		}
	}
}
