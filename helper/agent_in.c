/*
 * agent_in.c - the channel's input: hunting for SYNC, frames read from stdin and
 * dispatched, and epochs (HELLO, HELLO_OK, GOAWAY).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>

#include "agent.h"
#include "sbx.h"

static const char SYNC_MARK[SYNC_LEN] = "\xFF\xFF\xFF\xFFSANDBOXDSYNC";

/* End the epoch: every stream goes (non-detached commands are ended),
 * unsent frames are discarded, input is skipped to the next SYNC. */
void end_epoch(const char *error, const char *msg)
{
	if (g_agent.epoch && error)
		logf_("agent: epoch ended: %s: %s", error, msg);
	out_discard();
	if (g_agent.epoch && error)
		out_error(F_GOAWAY, 0, error, "%s", msg);
	while (g_agent.streams)
		stream_drop(g_agent.streams);
	g_agent.epoch = false;
	g_agent.hunting = true;
}

static uint64_t clamp_u(const struct jval *v, uint64_t def, uint64_t lo, uint64_t hi)
{
	if (!v || v->type != J_NUM || !v->is_int || v->i < 0)
		return def;
	uint64_t x = (uint64_t)v->i;
	return x < lo ? lo : x > hi ? hi : x;
}

static void on_hello(const char *p, size_t n)
{
	struct jdoc doc;
	if (g_agent.epoch)
		end_epoch(NULL, NULL);
	g_agent.hunting = false;
	if (json_parse(&doc, p, n) < 0 || doc.root->type != J_OBJ) {
		g_agent.epoch = true; /* to send the GOAWAY */
		end_epoch("PROTOCOL", "HELLO is not a JSON object");
		return;
	}
	const struct jval *ver = json_get(doc.root, "version"), *nonce = json_get(doc.root, "nonce");
	if (!ver || ver->type != J_NUM || !ver->is_int || ver->i != 1) {
		g_agent.epoch = true;
		end_epoch("VERSION", "this agent speaks version 1");
		json_free(&doc);
		return;
	}
	if (!nonce || nonce->type != J_STR || strlen(nonce->s) > 256) {
		g_agent.epoch = true;
		end_epoch("PROTOCOL", "HELLO needs a nonce string (at most 256 bytes)");
		json_free(&doc);
		return;
	}
	g_agent.window = (uint32_t)clamp_u(json_get(doc.root, "window"), DEFAULT_WINDOW, MIN_WINDOW,
				     MAX_WINDOW);
	g_agent.keepalive = clamp_u(json_get(doc.root, "keepalive_ms"), DEFAULT_KEEPALIVE_MS, 20,
			      3600000);
	/* The server's share of the sandbox's memory for the agent (absent:
	 * the latest one given holds). */
	const struct jval *budget = json_get(doc.root, "budget");
	if (budget && budget->type == J_NUM && budget->is_int && budget->i >= 1 &&
	    (uint64_t)budget->i <= MAX_RING_BUDGET)
		g_agent.budget = (uint64_t)budget->i;
	guard_config(json_get(doc.root, "guard"));
	listen_egress((uint32_t)clamp_u(json_get(doc.root, "egress_port"), 0, 0, 65535));
	g_agent.epoch = true;
	g_agent.max_odd = 0;
	g_agent.next_even = 2;
	g_agent.ping_sent_at = 0;
	struct buf b = {0};
	buf_puts(&b, "{\"version\":1,\"nonce\":");
	buf_json_str(&b, nonce->s, strlen(nonce->s));
	buf_printf(&b, ",\"instance\":\"%s\",\"pid\":%ld,\"egress_port\":%u", g_agent.instance,
		   (long)g_agent.self, (unsigned)g_agent.listen_port);
	if (g_agent.listen_error[0]) {
		buf_puts(&b, ",\"egress_error\":");
		buf_json_str(&b, g_agent.listen_error, strlen(g_agent.listen_error));
	}
	buf_puts(&b, ",\"processes\":");
	processes_json(&b);
	buf_puts(&b, "}");
	json_free(&doc);
	if (b.len > MAX_PAYLOAD) {
		/* cannot happen with MAX_DETACHED records of bounded size */
		free(b.p);
		end_epoch("RESOURCE", "HELLO_OK too large");
		return;
	}
	out_json(F_HELLO_OK, 0, &b);
}

static void on_open(uint32_t id, const char *p, size_t n)
{
	struct stream *old = stream_find(id);
	if (!(id & 1) || id <= g_agent.max_odd || old) {
		if (old)
			stream_drop(old);
		out_error(F_RESET, id, "PROTOCOL",
			  (id & 1) ? "stream id already used" : "server streams have odd ids");
		return;
	}
	g_agent.max_odd = id;
	if (g_agent.nstreams >= MAX_STREAMS) {
		out_error(F_RESET, id, "RESOURCE", "at most %d open streams", MAX_STREAMS);
		return;
	}
	struct jdoc doc;
	if (json_parse(&doc, p, n) < 0 || doc.root->type != J_OBJ) {
		out_error(F_RESET, id, "INVALID", "OPEN is not a JSON object");
		return;
	}
	const struct jval *kind = json_get(doc.root, "kind");
	const char *k = kind && kind->type == J_STR ? kind->s : "";
	if (!strcmp(k, "exec"))
		open_exec(id, doc.root);
	else if (!strcmp(k, "attach"))
		open_attach(id, doc.root);
	else if (!strcmp(k, "processes"))
		open_processes(id);
	else if (!strcmp(k, "forget"))
		open_forget(id, doc.root);
	else if (!strcmp(k, "dial"))
		open_dial(id, doc.root);
	else
		out_error(F_RESET, id, "INVALID", "unknown OPEN kind");
	json_free(&doc);
}

static void on_stream_frame(uint8_t type, uint32_t id, const unsigned char *p, size_t n)
{
	if (type == F_OPEN) {
		on_open(id, (const char *)p, n);
		return;
	}
	struct stream *s = stream_find(id);
	if (!s) {
		/* A frame for a stream this side already ended may have crossed
		 * the end in flight: ignored.  One for an id never opened is not. */
		bool used = (id & 1) ? id <= g_agent.max_odd : id < g_agent.next_even;
		/* A RESET is never answered with one: two sides that did so
		 * could bounce them forever. */
		if (type != F_RESET && (!used || type > F_CLOSE || type < F_OPEN))
			out_error(F_RESET, id, "PROTOCOL", "frame type 0x%02x on a stream not open",
				  type);
		return;
	}
	bool bytes = s->kind == K_DIAL || s->kind == K_EGRESS;
	switch (type) {
	case F_OPEN_OK:
		if (s->kind != K_EGRESS || s->established)
			break;
		s->established = true;
		return;
	case F_DATA:
		if (n < 1 || p[0] != 0 || s->in_eof)
			break;
		if (n - 1 > s->recv_credit) {
			stream_reset(s, "FLOW_CONTROL", "DATA beyond the window");
			return;
		}
		if (s->ib_len + n - 1 > g_agent.window) {
			stream_reset(s, "FLOW_CONTROL", "DATA beyond the window");
			return;
		}
		s->recv_credit -= (uint32_t)(n - 1);
		{
			/* What the process or socket takes at once needs no buffer. */
			const char *src = (const char *)p + 1;
			size_t m = n - 1;
			int fd = s->connecting || s->ib_len ? -1 : stream_sink(s);
			ssize_t w = fd >= 0 && m ? write(fd, src, m) : -1;
			if (w > 0) {
				src += w;
				m -= (size_t)w;
				stream_consumed(s, (size_t)w);
			}
			if (m && !ib_reserve(s, s->ib_len + m)) {
				stream_reset(s, "MEMORY", "the agent's memory budget has no room "
					     "for this stream's input");
				return;
			}
			if (m) {
				memcpy(s->ib + s->ib_len, src, m);
				s->ib_len += m;
			}
		}
		stream_write_in(s);
		return;
	case F_EOF:
		if (n != 1 || p[0] != 0 || s->in_eof)
			break;
		s->in_eof = true;
		stream_write_in(s);
		return;
	case F_WINDOW:
		if (n != 4)
			break;
		s->send_credit += get32(p);
		if (s->send_credit > (int64_t)UINT32_MAX)
			s->send_credit = UINT32_MAX;
		return;
	case F_RESET:
		stream_drop(s);
		return;
	case F_CLOSE:
		stream_drop(s);
		return;
	case F_SIGNAL:
		if (bytes || n < 1 || n > 2 || p[0] < 1 || p[0] >= NSIG || (n == 2 && p[1] > 1))
			break;
		if (!s->cmd || !s->cmd->started || s->cmd->reaped)
			return;
		if (s->cmd->sup && sup_signal(s->cmd, p[0], n == 2 && p[1] == 1))
			return;
		if (n == 2 && p[1] == 1) {
			/* relayed by the `sbx run` supervisor to its command's group */
			(void)forward_request(s->cmd->pid, p[0]); /* kill.c */
			kill(s->cmd->pid, SIGCONT);
		} else {
			kill(-s->cmd->pid, p[0]);
		}
		return;
	case F_RESIZE:
		if (bytes || n != 4 || !s->cmd || !s->cmd->tty)
			break;
		if (s->cmd->out_fd[1] >= 0) {
			struct winsize ws = {.ws_row = (unsigned short)(p[0] << 8 | p[1]),
					     .ws_col = (unsigned short)(p[2] << 8 | p[3])};
			if (ws.ws_row && ws.ws_col)
				ioctl(s->cmd->out_fd[1], TIOCSWINSZ, &ws);
		}
		return;
	default:
		break;
	}
	char msg[96];
	snprintf(msg, sizeof msg, "frame type 0x%02x not allowed here", type);
	stream_reset(s, "PROTOCOL", msg);
}

static void on_frame(uint8_t type, uint32_t id, const unsigned char *p, size_t n)
{
	if (id == 0 && type == F_HELLO) {
		on_hello((const char *)p, n);
		return;
	}
	if (!g_agent.epoch)
		return;
	if (id != 0) {
		on_stream_frame(type, id, p, n);
		return;
	}
	switch (type) {
	case F_PING:
		out_frame(F_PONG, 0, p, n > 8 ? 8 : n);
		return;
	case F_PONG:
	case F_RESET: /* a notice; never answered with a RESET */
		return;
	case F_GOAWAY:
		end_epoch(NULL, NULL);
		return;
	default:
		out_error(F_RESET, 0, "PROTOCOL", "frame type 0x%02x not allowed on stream 0", type);
	}
}

void process_input(void)
{
	while (g_agent.in_len > g_agent.in_off && out_room()) {
		unsigned char *b = (unsigned char *)g_agent.in + g_agent.in_off;
		size_t avail = g_agent.in_len - g_agent.in_off;
		if (g_agent.hunting) {
			unsigned char *m = memmem(b, avail, SYNC_MARK, SYNC_LEN);
			if (!m) {
				/* keep what could be the start of a marker */
				g_agent.in_off += avail > SYNC_LEN - 1 ? avail - (SYNC_LEN - 1) : 0;
				break;
			}
			g_agent.in_off += (size_t)(m - b) + SYNC_LEN;
			if (g_agent.epoch)
				end_epoch(NULL, NULL);
			g_agent.hunting = false;
			continue;
		}
		if (avail < HDR_LEN)
			break;
		uint32_t len = get32(b);
		if (len == 0xFFFFFFFFu) {
			if (avail < SYNC_LEN)
				break;
			if (!memcmp(b, SYNC_MARK, SYNC_LEN)) {
				g_agent.in_off += SYNC_LEN;
				if (g_agent.epoch)
					end_epoch(NULL, NULL);
				g_agent.hunting = false;
				continue;
			}
		}
		if (len > MAX_PAYLOAD) {
			char msg[64];
			snprintf(msg, sizeof msg, "frame length %u out of range", len);
			end_epoch("PROTOCOL", msg);
			g_agent.in_off += 1;
			continue;
		}
		if (avail < HDR_LEN + len)
			break;
		g_agent.in_off += HDR_LEN + len;
		on_frame(b[4], get32(b + 5), b + HDR_LEN, len);
	}
	if (g_agent.in_off == g_agent.in_len) {
		g_agent.in_off = g_agent.in_len = 0;
	} else if (g_agent.in_off > 0 && g_agent.in_len > IN_CAP / 2) {
		memmove(g_agent.in, g_agent.in + g_agent.in_off, g_agent.in_len - g_agent.in_off);
		g_agent.in_len -= g_agent.in_off;
		g_agent.in_off = 0;
	}
}

void read_channel(void)
{
	if (g_agent.in_len == IN_CAP && g_agent.in_off > 0) {
		memmove(g_agent.in, g_agent.in + g_agent.in_off, g_agent.in_len - g_agent.in_off);
		g_agent.in_len -= g_agent.in_off;
		g_agent.in_off = 0;
	}
	if (g_agent.in_len == IN_CAP)
		return;
	/* A frame left half-written by a server that died: when the next
	 * bytes, after a pause, begin with a SYNC marker, they are a new
	 * server's, not the rest of that frame (which would swallow them). */
	size_t had = g_agent.in_len;
	bool partial = !g_agent.hunting && g_agent.in_len > g_agent.in_off;
	uint64_t paused = now_ms() - g_agent.last_rx;
	ssize_t n = read(chan_in_fd(), g_agent.in + g_agent.in_len, IN_CAP - g_agent.in_len);
	if (n >= (ssize_t)SYNC_LEN && partial && paused >= 100 &&
	    !memcmp(g_agent.in + had, SYNC_MARK, SYNC_LEN)) {
		logf_("agent: a half-written frame dropped before a SYNC");
		g_agent.in_off = had;
	}
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (n <= 0 && g_agent.chan >= 0) {
		chan_ended(n < 0 ? strerror(errno) : "closed by the server");
		return;
	}
	if (n <= 0) {
		/* No channel any more (docker keeps stdin open; a test closes it). */
		g_agent.stdin_open = false;
		end_epoch("CLOSED", "the channel's input ended");
		return;
	}
	g_agent.in_len += (size_t)n;
	g_agent.last_rx = now_ms();
	g_agent.ping_sent_at = 0;
	process_input();
}
