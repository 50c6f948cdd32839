/*
 * agent.c - `sbx agent`: the sandbox's main process (docs/agent.md).
 * This file: its state (struct agent, agent.h), the loop and its timers;
 * agent.h says which file holds the rest.
 *
 * One single-threaded poll loop over non-blocking descriptors: the channel
 * (frames in on stdin, out on stdout), the commands' pipes or pseudo
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
#include <sys/ioctl.h>
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
	if (now >= g_agent.next_sweep) {
		sweep_orphans();
		g_agent.last_sweep = now;
		g_agent.next_sweep = now + SWEEP_MS;
	}
	if (g_agent.epoch && g_agent.stdin_open) {
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

enum ptag { P_IN, P_OUT, P_SIG, P_LISTEN, P_REPORT, P_CMDOUT, P_SINK, P_SOCK };

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
	if (g_agent.stdin_open && out_room())
		pset(0, POLLIN, P_IN, NULL, 0);
	if (out_pending() && !g_agent.out_broken)
		pset(1, POLLOUT, P_OUT, NULL, 0);
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
	if (g_agent.epoch && g_agent.stdin_open) {
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
	if (argc == 2 && !strcmp(argv[0], "--user") &&
	    sscanf(argv[1], "%lu:%lu%c", &uid, &gid, &extra) == 2 && uid > 0 && gid > 0 &&
	    uid < 0xFFFFFFFFul && gid < 0xFFFFFFFFul) {
		g_agent.switch_user = true;
		g_agent.cmd_uid = (uid_t)uid;
		g_agent.cmd_gid = (gid_t)gid;
	} else if (argc > 0) {
		static const char msg[] = "usage: sbx [--root DIR] agent [--user UID:GID]\n";
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
	/* Diagnostics are dropped rather than ever blocking the loop. */
	set_nonblock(2);
	g_agent.last_rx = now_ms();
	for (;;) {
		out_write();
		pump_streams();
		out_write();
		uint64_t now = now_ms();
		timers(now);
		if (!g_agent.stdin_open && g_agent.self != 1) {
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
		int r = ppoll(g_agent.pfd, g_agent.pn, &wait, NULL);
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
		if (n == 2 && p[1] == 1) {
			/* relayed by the `sbx run` supervisor to its command's group */
			union sigval v = {.sival_int = p[0]};
			sigqueue(s->cmd->pid, SIGUSR2, v);
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
	ssize_t n = read(0, g_agent.in + g_agent.in_len, IN_CAP - g_agent.in_len);
	if (n >= (ssize_t)SYNC_LEN && partial && paused >= 100 &&
	    !memcmp(g_agent.in + had, SYNC_MARK, SYNC_LEN)) {
		logf_("agent: a half-written frame dropped before a SYNC");
		g_agent.in_off = had;
	}
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return;
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
