/*
 * agent_net.c - TCP streams: dial (to a port in the sandbox) and egress (the
 * listener whose connections go out through the server).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <string.h>

#include "agent.h"
#include "sbx.h"

void open_dial(uint32_t id, const struct jval *req)
{
	unsigned port;
	if (nonneg_u16(json_get(req, "port"), &port) < 0) {
		out_error(F_RESET, id, "INVALID", "port must be 1..65535");
		return;
	}
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		out_error(F_RESET, id, "RESOURCE", "socket: %s", strerror(errno));
		return;
	}
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int r = connect(fd, (struct sockaddr *)&sa, sizeof sa);
	if (r < 0 && errno != EINPROGRESS) {
		out_error(F_RESET, id, "REFUSED", "connect 127.0.0.1:%u: %s", port, strerror(errno));
		close(fd);
		return;
	}
	struct stream *s = stream_new(id, K_DIAL);
	s->sock = fd;
	s->connecting = r < 0;
	if (!s->connecting) {
		s->established = true;
		out_frame(F_OPEN_OK, id, "{}", 2);
	}
}

void dial_connected(struct stream *s)
{
	int err = 0;
	socklen_t len = sizeof err;
	if (getsockopt(s->sock, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		err = errno;
	if (err == EINPROGRESS)
		return;
	if (err) {
		out_error(F_RESET, s->id, "REFUSED", "connect: %s", strerror(err));
		stream_drop(s);
		return;
	}
	s->connecting = false;
	s->established = true;
	out_frame(F_OPEN_OK, s->id, "{}", 2);
	stream_write_in(s); /* what came (DATA, EOF) while it connected */
}

void sock_read(struct stream *s)
{
	char tmp[CHUNK];
	while (s->sock >= 0 && !s->sock_eof && s->send_credit > 0 && out_room()) {
		size_t want = (int64_t)CHUNK > s->send_credit ? (size_t)s->send_credit : CHUNK;
		ssize_t n = read(s->sock, tmp, want);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n < 0) {
			stream_reset(s, "IO", strerror(errno));
			return;
		}
		if (n == 0) {
			s->sock_eof = true;
			unsigned char fd = 0;
			out_frame(F_EOF, s->id, &fd, 1);
			return;
		}
		unsigned char fd = 0;
		out_frame2(F_DATA, s->id, &fd, 1, tmp, (size_t)n);
		s->send_credit -= n;
	}
}

void listen_egress(uint32_t port)
{
	g_agent.listen_error[0] = '\0';
	if (g_agent.listen >= 0 && g_agent.listen_port == port)
		return;
	close_fd(&g_agent.listen);
	g_agent.listen_port = 0;
	if (!port)
		return;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int one = 1;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
	    bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 128) < 0) {
		snprintf(g_agent.listen_error, sizeof g_agent.listen_error, "listen 127.0.0.1:%u: %s",
			 (unsigned)port, strerror(errno));
		logf_("agent: %s", g_agent.listen_error);
		if (fd >= 0)
			close(fd);
		return;
	}
	g_agent.listen = fd;
	g_agent.listen_port = (uint16_t)port;
}

void egress_accept(void)
{
	for (int k = 0; k < 16; k++) {
		struct sockaddr_in peer;
		socklen_t plen = sizeof peer;
		int fd = accept4(g_agent.listen, (struct sockaddr *)&peer, &plen,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		if (!g_agent.epoch || g_agent.nstreams >= MAX_STREAMS || g_agent.next_even > UINT32_MAX - 2) {
			close(fd);
			continue;
		}
		struct stream *s = stream_new(g_agent.next_even, K_EGRESS);
		g_agent.next_even += 2;
		s->sock = fd;
		struct buf b = {0};
		char addr[INET_ADDRSTRLEN] = "?";
		inet_ntop(AF_INET, &peer.sin_addr, addr, sizeof addr);
		buf_puts(&b, "{\"kind\":\"egress\",\"peer\":");
		char p[64];
		snprintf(p, sizeof p, "%s:%u", addr, (unsigned)ntohs(peer.sin_port));
		buf_json_str(&b, p, strlen(p));
		buf_puts(&b, "}");
		out_json(F_OPEN, s->id, &b);
	}
}
