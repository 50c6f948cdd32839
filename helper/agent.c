/*
 * agent.c - `sbx agent`: the sandbox's main process (docs/agent.md).
 * This file: its state (struct agent, agent.h), the loop and its timers;
 * agent.h says which file holds the rest.
 *
 * One single-threaded poll loop over non-blocking descriptors: the channel
 * (frames in on stdin, out on stdout, or a Unix socket: agent_sock.c),
 * its listener, the commands' pipes or pseudo
 * terminals, TCP sockets of dial and egress streams, the egress listener and
 * a self-pipe woken by SIGCHLD.  Every buffer is bounded: input by the frame
 * limit, output by a high-water mark past which nothing more is read (from
 * the channel or from a command), each stream's inbound bytes by the window
 * the server was given, and detached output by its ring.
 *
 * PID 1 of the container: the kernel drops any signal from inside the
 * namespace that has no handler, so the agent handles only SIGCHLD (a forged
 * one finds nothing to reap) and ignores SIGPIPE.  Outside a PID namespace
 * (the unit tests) it is a child subreaper instead, so orphans still come to
 * it; nothing a sandbox can set changes which of the two it is.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <time.h>

#include "agent.h"
#include "sbx.h"

struct agent g_agent = {
	.hunting = true,
	.stdin_open = true,
	.window = DEFAULT_WINDOW,
	.keepalive = DEFAULT_KEEPALIVE_MS,
	.next_even = 2,
	.budget = DEFAULT_RING_BUDGET,
	.listen = -1,
	.chan_listen = -1,
	.chan = -1,
	.sigpipe = {-1, -1},
	.devnull = -1,
};

uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

__attribute__((format(printf, 1, 2)))
void logf_(const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(msg, sizeof msg - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n > sizeof msg - 2)
		n = sizeof msg - 2;
	msg[n++] = '\n';
	(void)!write(2, msg, (size_t)n);
}

void set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

void put32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24);
	p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8);
	p[3] = (unsigned char)v;
}

uint32_t get32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

static void timers(uint64_t now)
{
	for (struct cmd *c = g_agent.cmds; c; c = c->next) {
		if (c->kill_at && now >= c->kill_at && !c->reaped) {
			kill(c->pid, SIGKILL);
			kill(-c->pid, SIGKILL);
			c->kill_at = now + KILL_GRACE_MS;
		}
		/* A reaped tty command whose terminal gives no EIO (gVisor): its
		 * output is over at the first empty read (cmd_read). */
		if (c->tty_done_at && now >= c->tty_done_at && c->out_fd[1] >= 0)
			cmd_read_out(c, 1);
	}
	sup_timers(now);
	guard_tick(now);
	if (now >= g_agent.next_sweep) {
		sweep_orphans();
		g_agent.last_sweep = now;
		g_agent.next_sweep = now + SWEEP_MS;
	}
	if (g_agent.epoch && chan_readable()) {
		uint64_t quiet = now > g_agent.last_rx ? now - g_agent.last_rx : 0;
		if (quiet >= 2 * g_agent.keepalive) {
			end_epoch("KEEPALIVE", "nothing received for two keepalive periods");
		} else if (quiet >= g_agent.keepalive && !g_agent.ping_sent_at) {
			unsigned char ping[8];
			put32(ping, (uint32_t)(now >> 32));
			put32(ping + 4, (uint32_t)now);
			out_frame(F_PING, 0, ping, 8);
			g_agent.ping_sent_at = now;
		}
	}
}

enum ptag { P_IN, P_OUT, P_SIG, P_LISTEN, P_REPORT, P_CMDOUT, P_SINK, P_SOCK, P_CHAN };

struct pref {
	enum ptag tag;
	void *ptr;
	int k;
};

static void pset(int fd, short ev, enum ptag tag, void *ptr, int k)
{
	if (g_agent.pn == g_agent.pcap) {
		g_agent.pcap = g_agent.pcap ? g_agent.pcap * 2 : 64;
		struct pollfd *np = realloc(g_agent.pfd, g_agent.pcap * sizeof *np);
		struct pref *nr = np ? realloc(g_agent.pref, g_agent.pcap * sizeof *nr) : NULL;
		if (!np || !nr)
			oom();
		g_agent.pfd = np;
		g_agent.pref = nr;
	}
	g_agent.pfd[g_agent.pn] = (struct pollfd){.fd = fd, .events = ev};
	g_agent.pref[g_agent.pn] = (struct pref){tag, ptr, k};
	g_agent.pn++;
}

void build_poll(void)
{
	uint64_t now = now_us();
	g_agent.hold_wake_us = 0;
	g_agent.pn = 0;
	pset(g_agent.sigpipe[0], POLLIN, P_SIG, NULL, 0);
	if (chan_readable() && out_room())
		pset(chan_in_fd(), POLLIN, P_IN, NULL, 0);
	if (out_pending() && !chan_out_dead())
		pset(chan_out_fd(), POLLOUT, P_OUT, NULL, 0);
	if (g_agent.chan_listen >= 0)
		pset(g_agent.chan_listen, POLLIN, P_CHAN, NULL, 0);
	if (g_agent.listen >= 0)
		pset(g_agent.listen, POLLIN, P_LISTEN, NULL, 0);
	for (struct cmd *c = g_agent.cmds; c; c = c->next) {
		if (c->rep_fd >= 0) {
			pset(c->rep_fd, POLLIN, P_REPORT, c, 0);
			continue;
		}
		if (!c->started)
			continue;
		for (int k = 1; k <= 2; k++) {
			if (c->out_fd[k] < 0)
				continue;
			if (!c->detached &&
			    (!c->owner || !out_room() || c->owner->send_credit <= 0))
				continue;
			if (c->hold_until_us[k] > now) {
				if (!g_agent.hold_wake_us || c->hold_until_us[k] < g_agent.hold_wake_us)
					g_agent.hold_wake_us = c->hold_until_us[k];
				continue;
			}
			pset(c->out_fd[k], POLLIN, P_CMDOUT, c, k);
		}
	}
	for (struct stream *s = g_agent.streams; s; s = s->next) {
		int fd = stream_sink(s);
		if (fd >= 0 && s->ib_len > 0)
			pset(fd, POLLOUT, P_SINK, s, 0);
		if ((s->kind == K_DIAL || s->kind == K_EGRESS) && s->sock >= 0) {
			if (s->connecting)
				pset(s->sock, POLLOUT, P_SOCK, s, 0);
			else if (s->established && !s->sock_eof && s->send_credit > 0 && out_room())
				pset(s->sock, POLLIN, P_SOCK, s, 0);
		}
	}
}

static bool stream_alive(const struct stream *p)
{
	for (struct stream *s = g_agent.streams; s; s = s->next)
		if (s == p)
			return true;
	return false;
}

static bool cmd_alive(const struct cmd *p)
{
	for (struct cmd *c = g_agent.cmds; c; c = c->next)
		if (c == p)
			return true;
	return false;
}

static void dispatch(size_t i)
{
	short re = g_agent.pfd[i].revents;
	struct pref r = g_agent.pref[i];
	if (!re)
		return;
	switch (r.tag) {
	case P_SIG:
		reap();
		break;
	case P_IN:
		read_channel();
		break;
	case P_OUT:
		out_write();
		break;
	case P_LISTEN:
		egress_accept();
		break;
	case P_CHAN:
		chan_accept();
		break;
	case P_REPORT:
		if (cmd_alive(r.ptr) && ((struct cmd *)r.ptr)->rep_fd == g_agent.pfd[i].fd)
			cmd_report(r.ptr);
		break;
	case P_CMDOUT:
		if (cmd_alive(r.ptr) && ((struct cmd *)r.ptr)->out_fd[r.k] == g_agent.pfd[i].fd)
			cmd_read_out(r.ptr, r.k);
		break;
	case P_SINK:
		if (stream_alive(r.ptr) && stream_sink(r.ptr) == g_agent.pfd[i].fd)
			stream_write_in(r.ptr);
		break;
	case P_SOCK: {
		struct stream *s = r.ptr;
		if (!stream_alive(s) || s->sock != g_agent.pfd[i].fd)
			break;
		if (s->connecting)
			dial_connected(s);
		else
			sock_read(s);
		break;
	}
	}
}

static int poll_timeout(uint64_t now)
{
	uint64_t next = g_agent.next_sweep;
	for (struct cmd *c = g_agent.cmds; c; c = c->next) {
		if (c->kill_at && c->kill_at < next)
			next = c->kill_at;
		/* once past, the terminal's data or the stream's window wakes us */
		if (c->tty_done_at > now && c->out_fd[1] >= 0 && c->tty_done_at < next)
			next = c->tty_done_at;
	}
	next = sup_next_timer(next);
	next = guard_next(next);
	if (g_agent.epoch && chan_readable()) {
		uint64_t k = g_agent.last_rx + (g_agent.ping_sent_at ? 2 * g_agent.keepalive : g_agent.keepalive);
		if (k < next)
			next = k;
	}
	return next <= now ? 0 : next - now > 60000 ? 60000 : (int)(next - now);
}

int cmd_agent(int argc, char **argv)
{
	unsigned long uid, gid;
	char extra;
	const char *socket_path = NULL;
	if (argc >= 2 && !strcmp(argv[argc - 2], "--channel-socket") && argv[argc - 1][0] == '/') {
		socket_path = argv[argc - 1];
		argc -= 2;
	}
	if (argc == 2 && !strcmp(argv[0], "--user") &&
	    sscanf(argv[1], "%lu:%lu%c", &uid, &gid, &extra) == 2 && uid > 0 && gid > 0 &&
	    uid < 0xFFFFFFFFul && gid < 0xFFFFFFFFul) {
		g_agent.switch_user = true;
		g_agent.cmd_uid = (uid_t)uid;
		g_agent.cmd_gid = (gid_t)gid;
	} else if (argc > 0) {
		static const char msg[] = "usage: sbx [--root DIR] agent [--user UID:GID] [--channel-socket PATH]\n";
		(void)!write(2, msg, sizeof msg - 1);
		return 2;
	}
	g_agent.self = getpid();
	/* Nothing of the container's environment is the commands' business
	 * (they get exactly the env of their request), and gVisor lets
	 * /proc/1/environ be read whatever the dumpable flag says: the strings
	 * are wiped where the kernel shows them from. */
	for (char **e = environ; e && *e; e++)
		memset(*e, 0, strlen(*e));
	/* Same uid as the commands: without this they could ptrace the agent
	 * or read its memory through /proc. */
	prctl(PR_SET_DUMPABLE, 0);
	if (g_agent.self != 1)
		prctl(PR_SET_CHILD_SUBREAPER, 1);
	signal(SIGPIPE, SIG_IGN);
	if (pipe2(g_agent.sigpipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		logf_("agent: pipe: %s", strerror(errno));
		return 1;
	}
	struct sigaction sa = {.sa_handler = on_sigchld, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGCHLD, &sa, NULL);
	g_agent.devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (g_agent.devnull < 0) {
		logf_("agent: /dev/null: %s", strerror(errno));
		return 1;
	}
	unsigned char rnd[16];
	if (getrandom(rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd) {
		uint64_t t = now_ms() ^ ((uint64_t)g_agent.self << 32);
		memcpy(rnd, &t, sizeof t);
		memcpy(rnd + 8, &t, sizeof t);
	}
	for (size_t k = 0; k < sizeof rnd; k++)
		snprintf(g_agent.instance + 2 * k, 3, "%02x", rnd[k]);
	/* A fixed threshold: glibc's own grows it to the largest block freed,
	 * and the heap then keeps freed memory resident that nothing counts. */
	mallopt(M_MMAP_THRESHOLD, 128 * 1024);
	g_agent.out = xmalloc(OUT_CAP);
	set_nonblock(0);
	set_nonblock(1);
	if (socket_path)
		chan_listen(socket_path);
	/* Diagnostics are dropped rather than ever blocking the loop. */
	set_nonblock(2);
	g_agent.last_rx = now_ms();
	for (;;) {
		sup_settle();
		out_write();
		pump_streams();
		out_write();
		uint64_t now = now_ms();
		timers(now);
		if (!chan_readable() && g_agent.self != 1) {
			/* Tests: the channel is gone, nobody can ask for anything
			 * any more.  As PID 1 the agent stays (docker keeps stdin
			 * open; should it close, detached processes go on). */
			bool left = false;
			for (struct cmd *c = g_agent.cmds; c; c = c->next) {
				if (!c->reaped) {
					kill(-c->pid, SIGKILL);
					kill(c->pid, SIGKILL);
					left = true;
				}
			}
			if (!left)
				return 0;
		}
		build_poll();
		int ms = poll_timeout(now_ms());
		struct timespec wait = {ms / 1000, (long)(ms % 1000) * 1000000L};
		if (g_agent.hold_wake_us) {
			uint64_t now = now_us();
			uint64_t us = g_agent.hold_wake_us > now ? g_agent.hold_wake_us - now : 0;
			if (us < (uint64_t)ms * 1000u)
				wait = (struct timespec){0, (long)us * 1000L};
		}
		uint64_t before = now_ms();
		int r = ppoll(g_agent.pfd, g_agent.pn, &wait, NULL);
		/* Longer than asked by far: the sandbox was suspended (a memory
		 * checkpoint restored), which supervised deadlines do not count. */
		uint64_t took = now_ms() - before, asked = (uint64_t)wait.tv_sec * 1000u +
							     (uint64_t)wait.tv_nsec / 1000000u;
		if (took > asked + SUSPEND_JUMP_MS)
			sup_shift_deadlines(took - asked);
		if (r < 0 && errno != EINTR) {
			logf_("agent: poll: %s", strerror(errno));
			struct timespec ts = {0, 10000000};
			nanosleep(&ts, NULL);
			continue;
		}
		for (size_t i = 0; r > 0 && i < g_agent.pn; i++)
			dispatch(i);
		/* Input held back by a full output queue continues here. */
		if (g_agent.epoch || !g_agent.hunting || g_agent.in_len > g_agent.in_off)
			process_input();
	}
}
