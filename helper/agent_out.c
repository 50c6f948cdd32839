/*
 * agent_out.c - the channel's output: frames queued whole, bounded by OUT_HIGH,
 * written to stdout without blocking, and discarded at the end of an epoch.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>

#include "agent.h"
#include "sbx.h"

size_t out_pending(void)
{
	return g_agent.out_len - g_agent.out_head;
}

bool out_room(void)
{
	return out_pending() < OUT_HIGH;
}

/* Queue one frame of `n1 + n2` payload bytes.  Frames are queued whole;
 * outside an epoch (or with the channel gone) they are dropped. */
void out_frame2(uint8_t type, uint32_t stream, const void *p1, size_t n1, const void *p2,
		       size_t n2)
{
	if ((!g_agent.epoch && type != F_GOAWAY) || chan_out_dead())
		return;
	size_t n = n1 + n2;
	if (n > MAX_PAYLOAD) {
		logf_("agent: frame of %zu bytes not sent", n);
		return;
	}
	if (g_agent.out_head == g_agent.out_len) {
		g_agent.out_head = g_agent.out_len = g_agent.out_frame_end = 0;
	} else if (g_agent.out_len + HDR_LEN + n > OUT_CAP && g_agent.out_head > 0) {
		memmove(g_agent.out, g_agent.out + g_agent.out_head, g_agent.out_len - g_agent.out_head);
		g_agent.out_len -= g_agent.out_head;
		g_agent.out_frame_end -= g_agent.out_head;
		g_agent.out_head = 0;
	}
	if (g_agent.out_len + HDR_LEN + n > OUT_CAP) {
		/* Cannot happen: the agent stops producing at OUT_HIGH. */
		logf_("agent: output queue full, frame dropped");
		return;
	}
	unsigned char *h = (unsigned char *)g_agent.out + g_agent.out_len;
	put32(h, (uint32_t)n);
	h[4] = type;
	put32(h + 5, stream);
	if (n1)
		memcpy(h + HDR_LEN, p1, n1);
	if (n2)
		memcpy(h + HDR_LEN + n1, p2, n2);
	g_agent.out_len += HDR_LEN + n;
}

void out_frame(uint8_t type, uint32_t stream, const void *p, size_t n)
{
	out_frame2(type, stream, p, n, NULL, 0);
}

void out_json(uint8_t type, uint32_t stream, struct buf *b)
{
	out_frame(type, stream, b->p, b->len);
	free(b->p);
	memset(b, 0, sizeof *b);
}

void out_error(uint8_t type, uint32_t stream, const char *error, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

void out_error(uint8_t type, uint32_t stream, const char *error, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	struct buf b = {0};
	buf_error(&b, error, msg);
	out_json(type, stream, &b);
}

void out_u32(uint8_t type, uint32_t stream, uint32_t v)
{
	unsigned char p[4];
	put32(p, v);
	out_frame(type, stream, p, 4);
}

/* The frame the head is in (partly written) is kept whole: the server skips
 * to its nonce's HELLO_OK, but a frame cut short would swallow its start. */
void out_discard(void)
{
	while (g_agent.out_frame_end < g_agent.out_head && g_agent.out_frame_end < g_agent.out_len)
		g_agent.out_frame_end += HDR_LEN + get32((unsigned char *)g_agent.out + g_agent.out_frame_end);
	g_agent.out_len = g_agent.out_frame_end > g_agent.out_head ? g_agent.out_frame_end : g_agent.out_head;
}

void out_write(void)
{
	while (out_pending() > 0 && !chan_out_dead()) {
		ssize_t w = write(chan_out_fd(), g_agent.out + g_agent.out_head, out_pending());
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return;
			if (g_agent.chan >= 0) {
				chan_ended(strerror(errno));
				return;
			}
			/* The engine discards writes nobody reads; an error means
			 * no channel at all.  Keep serving what runs. */
			logf_("agent: channel output: %s", strerror(errno));
			g_agent.out_broken = true;
			g_agent.out_head = g_agent.out_len = g_agent.out_frame_end = 0;
			return;
		}
		g_agent.out_head += (size_t)w;
	}
	while (g_agent.out_frame_end < g_agent.out_head && g_agent.out_frame_end < g_agent.out_len)
		g_agent.out_frame_end += HDR_LEN + get32((unsigned char *)g_agent.out + g_agent.out_frame_end);
	if (g_agent.out_head == g_agent.out_len)
		g_agent.out_head = g_agent.out_len = g_agent.out_frame_end = 0;
}
