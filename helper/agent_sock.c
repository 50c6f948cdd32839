/*
 * agent_sock.c - the channel over a Unix socket (`--channel-socket PATH`,
 * docs/agent.md "The socket channel"): beside a local engine the server
 * connects straight to the agent instead of relaying every frame through
 * the engine's attach (dockerd and the shim, both ways).
 *
 * The agent listens at PATH, in a directory of the server's that is
 * bind-mounted into the sandbox; commands (another uid) cannot enter it.
 * Whoever reaches the socket anyway is checked by its credentials: uid 0,
 * and, as PID 1, a pid of 0 (the peer is outside the sandbox's pid
 * namespace: every process inside has a pid there).  Anything else is
 * closed at once.  An accepted connection is the channel: the epoch on the
 * old one ends as a closed input does and the server sends HELLO as on a
 * new attach; a newer one replaces it; at its end the channel is stdin and
 * stdout again (the engine's attach stays usable throughout).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "agent.h"
#include "sbx.h"

int chan_in_fd(void)
{
	return g_agent.chan >= 0 ? g_agent.chan : 0;
}

int chan_out_fd(void)
{
	return g_agent.chan >= 0 ? g_agent.chan : 1;
}

bool chan_readable(void)
{
	return g_agent.chan >= 0 || g_agent.stdin_open;
}

bool chan_out_dead(void)
{
	return g_agent.chan < 0 && g_agent.out_broken;
}

/* The channel is `fd` from now on (-1: stdin and stdout).  What was
 * buffered either way belongs to the old one and is dropped, except the
 * rest of a frame stdout was in the middle of: a reader of the attach that
 * sees stdout again must find whole frames. */
static void chan_switch(int fd)
{
	if (g_agent.chan < 0 && !g_agent.out_broken && !g_agent.stdout_rest_len &&
	    g_agent.out_frame_end > g_agent.out_head && g_agent.out_frame_end <= g_agent.out_len) {
		size_t n = g_agent.out_frame_end - g_agent.out_head;
		g_agent.stdout_rest = xmalloc(n);
		memcpy(g_agent.stdout_rest, g_agent.out + g_agent.out_head, n);
		g_agent.stdout_rest_len = n;
	}
	close_fd(&g_agent.chan);
	if (g_agent.epoch)
		end_epoch(NULL, NULL);
	g_agent.out_head = g_agent.out_len = g_agent.out_frame_end = 0;
	g_agent.in_off = g_agent.in_len = 0;
	g_agent.hunting = true;
	g_agent.chan = fd;
	if (fd < 0 && g_agent.stdout_rest_len) {
		/* kept whole by out_discard: the frame the head is in */
		memcpy(g_agent.out, g_agent.stdout_rest, g_agent.stdout_rest_len);
		g_agent.out_len = g_agent.out_frame_end = g_agent.stdout_rest_len;
		free(g_agent.stdout_rest);
		g_agent.stdout_rest = NULL;
		g_agent.stdout_rest_len = 0;
	}
	g_agent.last_rx = now_ms();
	g_agent.ping_sent_at = 0;
}

void chan_ended(const char *why)
{
	logf_("agent: the socket channel ended (%s); the channel is stdin again", why);
	chan_switch(-1);
}

void chan_listen(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof sa.sun_path) {
		logf_("agent: channel socket %s: path too long", path);
		return;
	}
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		logf_("agent: channel socket: %s", strerror(errno));
		return;
	}
	unlink(path);
	mode_t old = umask(077);
	int r = bind(fd, (struct sockaddr *)&sa, sizeof sa);
	umask(old);
	if (r < 0 || chmod(path, 0600) < 0 || listen(fd, 8) < 0) {
		logf_("agent: channel socket %s: %s", path, strerror(errno));
		close(fd);
		return;
	}
	g_agent.chan_listen = fd;
}

/* The server, and only it: root, from outside the sandbox's pid namespace
 * when the agent is that namespace's PID 1 (the unit tests run it as a
 * child: there every pid is seen). */
static bool chan_trusted(int fd, char *why, size_t len)
{
	struct ucred cr;
	socklen_t n = sizeof cr;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &n) < 0) {
		snprintf(why, len, "no credentials: %s", strerror(errno));
		return false;
	}
	if (cr.uid != 0) {
		snprintf(why, len, "uid %u, not 0", (unsigned)cr.uid);
		return false;
	}
	if (g_agent.self == 1 && cr.pid != 0) {
		snprintf(why, len, "pid %ld inside the sandbox", (long)cr.pid);
		return false;
	}
	return true;
}

void chan_accept(void)
{
	for (int k = 0; k < 16; k++) {
		int fd = accept4(g_agent.chan_listen, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				logf_("agent: channel socket: accept: %s", strerror(errno));
			return;
		}
		char why[96];
		if (!chan_trusted(fd, why, sizeof why)) {
			logf_("agent: channel socket: refused a peer (%s)", why);
			close(fd);
			continue;
		}
		logf_("agent: a server connected to the channel socket%s",
		      g_agent.chan >= 0 ? " (replacing the previous one)" : "");
		chan_switch(fd);
	}
}
