/*
 * dial.c - `sbx dial PORT`: a byte stream to 127.0.0.1:PORT inside the sandbox.
 *
 * Previews reach a sandbox's port through this: the server starts `sbx dial`
 * (over `docker exec` today, the agent's channel later) and relays an HTTP
 * connection through its stdin and stdout, so the sandbox needs no network
 * interface of its own.
 *
 * stdin -> socket and socket -> stdout, each with its own buffer and with
 * half-close both ways: EOF on stdin shuts the socket's write side, EOF from
 * the socket closes stdout; the command ends when both directions are done
 * (or one fails).  Every descriptor is non-blocking and polled, so a peer that
 * stops reading in one direction never stops the other (an echo server whose
 * replies wait for us while we wait for it cannot deadlock us).  Memory is
 * two fixed buffers; a slow reader on either side stalls only its direction,
 * which is the backpressure the server relies on.
 *
 * Errors: one JSON line on stderr {"error":NAME,"message":...}, exit 1
 * (ECONNREFUSED when nothing listens, EINVAL for a bad port).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sbx.h"

#define DIAL_BUF (256 * 1024)

struct dir {
	int in, out;
	char buf[DIAL_BUF];
	size_t off, len;
	bool eof;   /* `in` ended: nothing more to read */
	bool done;  /* everything read was written and `out` was half-closed */
};

__attribute__((noreturn, format(printf, 2, 3)))
static void dial_fail(const char *name, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	/* The message holds no quote or backslash (numbers and strerror text). */
	dprintf(2, "{\"error\":\"%s\",\"message\":\"%s\"}\n", name, msg);
	exit(1);
}

static void nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		(void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Half-close the direction's output once everything read was written. */
static void finish(struct dir *d, int sock)
{
	if (!d->eof || d->len > 0 || d->done)
		return;
	if (d->out == sock)
		(void)shutdown(sock, SHUT_WR);
	else
		(void)close(d->out);
	d->done = true;
}

/* One step of a direction; false on a hard error (the stream is over). */
static bool step(struct dir *d, short in_ev, short out_ev, int sock)
{
	if (d->len == 0 && !d->eof && (in_ev & (POLLIN | POLLHUP | POLLERR))) {
		ssize_t n = read(d->in, d->buf, sizeof d->buf);
		if (n > 0) {
			d->off = 0;
			d->len = (size_t)n;
		} else if (n == 0) {
			d->eof = true;
		} else if (errno != EAGAIN && errno != EINTR) {
			if (d->in != sock)
				return false;
			d->eof = true; /* a reset connection: pass what we have, then end */
		}
	}
	if (d->len > 0 && (out_ev & (POLLOUT | POLLERR | POLLHUP))) {
		ssize_t w = write(d->out, d->buf + d->off, d->len);
		if (w > 0) {
			d->off += (size_t)w;
			d->len -= (size_t)w;
		} else if (w < 0 && errno != EAGAIN && errno != EINTR) {
			return false;
		}
	}
	finish(d, sock);
	return true;
}

int cmd_dial(int argc, char **argv)
{
	if (argc != 1)
		dial_fail("EINVAL", "usage: sbx dial PORT");
	char *end = NULL;
	long port = strtol(argv[0], &end, 10);
	if (!argv[0][0] || *end || port < 1 || port > 65535)
		dial_fail("EINVAL", "port must be 1-65535");
	signal(SIGPIPE, SIG_IGN);

	int sock = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (sock < 0)
		dial_fail("EIO", "socket: %s", strerror(errno));
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(sock, (struct sockaddr *)&sa, sizeof sa) < 0) {
		int e = errno;
		dial_fail(e == ECONNREFUSED ? "ECONNREFUSED" : "EIO", "connect 127.0.0.1:%ld: %s",
			  port, strerror(e));
	}
	int one = 1;
	(void)setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	nonblock(sock);
	nonblock(STDIN_FILENO);
	nonblock(STDOUT_FILENO);

	static struct dir up = {.in = STDIN_FILENO}, down = {.out = STDOUT_FILENO};
	up.out = sock;
	down.in = sock;
	while (!(up.done && down.done)) {
		/* fds[0]: stdin, fds[1]: socket, fds[2]: stdout */
		struct pollfd fds[3] = {{.fd = -1}, {.fd = sock}, {.fd = -1}};
		if (!up.eof && up.len == 0)
			fds[0] = (struct pollfd){.fd = STDIN_FILENO, .events = POLLIN};
		if (!down.eof && down.len == 0)
			fds[1].events |= POLLIN;
		if (up.len > 0)
			fds[1].events |= POLLOUT;
		if (down.len > 0)
			fds[2] = (struct pollfd){.fd = STDOUT_FILENO, .events = POLLOUT};
		if (fds[1].events == 0)
			fds[1].fd = -1; /* else its HUP would wake us for nothing, forever */
		if (poll(fds, 3, -1) < 0) {
			if (errno == EINTR)
				continue;
			dial_fail("EIO", "poll: %s", strerror(errno));
		}
		if (!step(&up, fds[0].revents, fds[1].revents, sock))
			break;
		if (!step(&down, fds[1].revents, fds[2].revents, sock))
			break;
	}
	close(sock);
	return 0;
}
