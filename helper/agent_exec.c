/*
 * agent_exec.c - starting the agent's commands (fork, identity, stdio, pty, a
 * report pipe for a failed exec) and their output (DATA frames within the
 * window, or a detached process's ring).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <malloc.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"
#include "sbx.h"

enum { ST_CWD = 1, ST_EXEC, ST_SETUP, ST_IDENTITY };

struct report {
	int stage;
	int err;
};

__attribute__((noreturn))
static void child_fail(int fd, int stage, int err)
{
	struct report r = {stage, err};
	(void)!write(fd, &r, sizeof r);
	_exit(127);
}

/*
 * The child, between vfork and exec: it shares the agent's memory (the agent
 * waits meanwhile), so it changes nothing of it but its own stack, and makes
 * plain system calls (the identity's too: no libc set-id broadcast to other
 * threads, there are none to reach).
 */
__attribute__((noreturn))
static void child_main(int rep, int in, int out, int err, int tty_slave, const char *cwd,
		       char **argv, char **envp, const struct sup *sup)
{
	if (setsid() < 0)
		child_fail(rep, ST_SETUP, errno);
	if (tty_slave >= 0) {
		if (ioctl(tty_slave, TIOCSCTTY, 0) < 0)
			child_fail(rep, ST_SETUP, errno);
		in = out = err = tty_slave;
	}
	if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0)
		child_fail(rep, ST_SETUP, errno);
	(void)reset_signals(); /* run_child.c */
	/* Outside a PID namespace (tests) nothing else ends a command whose
	 * agent died; inside, the namespace ends with its PID 1. */
	if (g_agent.self != 1)
		prctl(PR_SET_PDEATHSIG, SIGKILL);
	/* The memory cgroup's OOM killer takes a command before the agent
	 * (whose death would end the sandbox; see OOM_SCORE_ADJ); raising it
	 * needs no privilege.
	 * Written before the identity switch: the child inherits the agent's
	 * non-dumpable flag, so its /proc/self files belong to root, and only
	 * the --user agent's child is root here (measured: as the command's own
	 * uid the write fails and the command kept 0). */
	int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (oom >= 0) {
		(void)!write(oom, OOM_SCORE_ADJ, sizeof OOM_SCORE_ADJ - 1);
		close(oom);
	}
	/* The command's identity before anything it could name is touched; a
	 * command never runs as the agent when told otherwise. */
	if (g_agent.switch_user &&
	    (syscall(SYS_setgroups, 0, NULL) < 0 ||
	     syscall(SYS_setresgid, g_agent.cmd_gid, g_agent.cmd_gid, g_agent.cmd_gid) < 0 ||
	     syscall(SYS_setresuid, g_agent.cmd_uid, g_agent.cmd_uid, g_agent.cmd_uid) < 0))
		child_fail(rep, ST_IDENTITY, errno);
	if (sup)
		sup_child(sup); /* `sbx run`'s cwd, checks and exec (agent_run.c) */
	if (chdir(g_root) < 0 || (cwd && *cwd && chdir(cwd) < 0))
		child_fail(rep, ST_CWD, errno);
	execve(argv[0], argv, envp);
	child_fail(rep, ST_EXEC, errno);
}

/*
 * A command's process: vfork, not fork.  The child only sets itself up and
 * execs, so copying the agent's page tables (its rings and buffers) for it
 * would be work thrown away at once; the agent's signals are blocked
 * meanwhile, so none of its handlers runs on the child's side.  Under the
 * sanitizers (the test build) a plain fork: their runtime does not expect a
 * child that shares its memory.
 */
static pid_t spawn_child(int rep, int in, int out, int err, int tty_slave, const char *cwd,
			 char **argv, char **envp, const struct sup *sup)
{
	sigset_t all, old;
	sigfillset(&all);
	sigprocmask(SIG_SETMASK, &all, &old);
#if defined(__SANITIZE_ADDRESS__)
	pid_t pid = fork();
#else
	pid_t pid = vfork();
#endif
	if (pid == 0)
		child_main(rep, in, out, err, tty_slave, cwd, argv, envp, sup);
	int e = errno;
	sigprocmask(SIG_SETMASK, &old, NULL);
	errno = e;
	return pid;
}

static void str_array_free(char **v)
{
	if (!v)
		return;
	for (char **p = v; *p; p++)
		free(*p);
	free(v);
}

static char *xstrdup_(const char *s)
{
	size_t n = strlen(s);
	char *p = xmalloc(n + 1);
	memcpy(p, s, n + 1);
	return p;
}

/* argv and env from the request; NULL with *why set on a bad request. */
static char **request_argv(const struct jval *a, const char **why)
{
	if (!a || a->type != J_ARR || a->n == 0 || a->n > 4096) {
		*why = "argv must be a non-empty list";
		return NULL;
	}
	char **v = xmalloc((a->n + 1) * sizeof *v);
	size_t i = 0;
	for (const struct jval *e = a->child; e; e = e->next) {
		if (e->type != J_STR) {
			v[i] = NULL;
			str_array_free(v);
			*why = "argv must hold strings";
			return NULL;
		}
		v[i++] = xstrdup_(e->s);
	}
	v[i] = NULL;
	if (v[0][0] != '/') {
		str_array_free(v);
		*why = "argv[0] must be an absolute path";
		return NULL;
	}
	return v;
}

static char **request_env(const struct jval *o, const char **why)
{
	size_t n = o && o->type == J_OBJ ? o->n : 0;
	if (o && o->type != J_OBJ && o->type != J_NULL) {
		*why = "env must be an object";
		return NULL;
	}
	char **v = xmalloc((n + 1) * sizeof *v);
	size_t i = 0;
	for (const struct jval *m = o && o->type == J_OBJ ? o->child : NULL; m; m = m->next) {
		if (m->type != J_STR || !m->key[0] || strchr(m->key, '=')) {
			v[i] = NULL;
			str_array_free(v);
			*why = "env must map names without '=' to strings";
			return NULL;
		}
		size_t kl = strlen(m->key), vl = strlen(m->s);
		char *e = xmalloc(kl + vl + 2);
		memcpy(e, m->key, kl);
		e[kl] = '=';
		memcpy(e + kl + 1, m->s, vl + 1);
		v[i++] = e;
	}
	v[i] = NULL;
	return v;
}

static int open_pty(int *master, int *slave, unsigned rows, unsigned cols)
{
	*master = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (*master < 0)
		return -1;
	int unlock = 0;
	if (ioctl(*master, TIOCSPTLCK, &unlock) < 0)
		goto fail;
	*slave = ioctl(*master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (*slave < 0) {
		char name[64];
		if (ptsname_r(*master, name, sizeof name) != 0)
			goto fail;
		*slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (*slave < 0)
			goto fail;
	}
	struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
	ioctl(*master, TIOCSWINSZ, &ws);
	set_nonblock(*master);
	return 0;
fail:
	close_fd(master);
	return -1;
}

/* Process ids are short and plain, so that HELLO_OK with every record
 * always fits one frame (MAX_DETACHED records of a few hundred bytes). */
static bool valid_id(const char *id)
{
	size_t n = strlen(id);
	if (n < 1 || n > MAX_ID)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = id[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == ':' || c == '-'))
			return false;
	}
	return true;
}

int nonneg_u16(const struct jval *v, unsigned *out)
{
	if (!v || v->type != J_NUM || !v->is_int || v->i < 1 || v->i > 65535)
		return -1;
	*out = (unsigned)v->i;
	return 0;
}

void open_exec(uint32_t id, const struct jval *req)
{
	const char *why = NULL;
	const struct jval *cwdv = json_get(req, "cwd"), *stdinv = json_get(req, "stdin");
	const struct jval *ttyv = json_get(req, "tty"), *detv = json_get(req, "detach");
	char **argv = request_argv(json_get(req, "argv"), &why);
	char **envp = argv ? request_env(json_get(req, "env"), &why) : NULL;
	unsigned rows = 24, cols = 80;
	size_t ring = DEFAULT_RING;
	uint64_t budget = 0;
	int64_t timeout_ms = -1;
	const char *did = NULL;
	if (argv && envp) {
		if (cwdv && cwdv->type != J_STR && cwdv->type != J_NULL)
			why = "cwd must be a string";
		else if (stdinv && stdinv->type != J_BOOL && stdinv->type != J_NULL)
			why = "stdin must be a boolean";
		else if (ttyv && ttyv->type != J_NULL &&
			 (ttyv->type != J_OBJ || nonneg_u16(json_get(ttyv, "rows"), &rows) < 0 ||
			  nonneg_u16(json_get(ttyv, "cols"), &cols) < 0))
			why = "tty must be null or {\"rows\",\"cols\"} in 1..65535";
		else if (detv && detv->type != J_NULL) {
			const struct jval *idv = json_get(detv, "id"), *bv = json_get(detv, "buffer");
			const struct jval *budv = json_get(detv, "budget");
			const struct jval *tv = json_get(detv, "timeout_ms");
			if (detv->type != J_OBJ || !idv || idv->type != J_STR || !valid_id(idv->s))
				why = "detach.id must be 1..64 of A-Z a-z 0-9 . _ : -";
			else if (bv && (bv->type != J_NUM || !bv->is_int || bv->i < 1 ||
					bv->i > (int64_t)MAX_RING))
				why = "detach.buffer must be 1..67108864";
			else if (budv && (budv->type != J_NUM || !budv->is_int || budv->i < 1 ||
					  budv->i > (int64_t)MAX_RING_BUDGET))
				why = "detach.budget must be 1..2^40";
			else if (tv && (tv->type != J_NUM || !tv->is_int || tv->i < 0))
				why = "detach.timeout_ms must be a non-negative integer";
			else {
				if (tv)
					timeout_ms = tv->i;
				did = idv->s;
				if (bv)
					ring = (size_t)bv->i;
				if (budv)
					budget = (uint64_t)budv->i;
			}
		}
	}
	if (why || !argv || !envp) {
		out_error(F_RESET, id, "INVALID", "%s", why ? why : "bad exec request");
		goto out;
	}
	if (did && cmd_by_id(did)) {
		out_error(F_RESET, id, "EXISTS", "a detached process with id %s exists", did);
		goto out;
	}
	if (did && g_agent.ndetached >= MAX_DETACHED) {
		out_error(F_RESET, id, "RESOURCE", "at most %d detached processes (forget ended ones)",
			  MAX_DETACHED);
		goto out;
	}
	if (did && budget)
		g_agent.budget = budget; /* the server's latest word on the sandbox's share */
	/* A detached process's rings, mapped before it starts (touched only as
	 * they fill, within the budget: ring_room). */
	char *rings[3] = {NULL, NULL, NULL};
	if (did && (!(rings[1] = mem_map(ring)) || !(rings[2] = mem_map(ring)))) {
		mem_unmap(rings[1], ring);
		out_error(F_RESET, id, "RESOURCE", "cannot map the output rings: %s", strerror(errno));
		goto out;
	}
	bool want_stdin = stdinv && stdinv->type == J_BOOL && stdinv->b;
	bool tty = ttyv && ttyv->type == J_OBJ;
	const char *cwd = cwdv && cwdv->type == J_STR ? cwdv->s : NULL;
	/* `sbx run` of the agent's own helper: the agent is the supervisor
	 * (agent_run.c), one process and one exec instead of three and two. */
	struct sup sup;
	bool supervise = !did && sup_parse(argv, &sup) && sup.tty == tty;
	if (!supervise && !did && sup_helper_call(id, argv)) {
		mem_unmap(rings[1], ring);
		mem_unmap(rings[2], ring);
		goto out;
	}
	char limit[200];
	if (!guard_admit(limit, sizeof limit)) {
		mem_unmap(rings[1], ring);
		mem_unmap(rings[2], ring);
		out_error(F_RESET, id, "LIMIT", "%s", limit);
		goto out;
	}
	if (supervise) {
		sup.envp = command_env(envp, sup.clean);
		if (!g_agent.realroot && !(g_agent.realroot = realpath(g_root, NULL)))
			sup.root_err = errno;
	}

	int rep[2] = {-1, -1}, inp[2] = {-1, -1}, o1[2] = {-1, -1}, o2[2] = {-1, -1};
	int master = -1, slave = -1;
	bool ok = pipe2(rep, O_CLOEXEC) == 0;
	if (ok && tty)
		ok = open_pty(&master, &slave, rows, cols) == 0;
	else if (ok)
		ok = (!want_stdin || pipe2(inp, O_CLOEXEC) == 0) && pipe2(o1, O_CLOEXEC) == 0 &&
		     pipe2(o2, O_CLOEXEC) == 0;
	if (ok && !tty)
		(void)fcntl(o1[0], F_SETPIPE_SZ, (int)CMD_PIPE); /* best effort */
	pid_t pid = ok ? spawn_child(rep[1], want_stdin ? inp[0] : g_agent.devnull, o1[1], o2[1],
				     slave, cwd, argv, envp, supervise ? &sup : NULL)
		       : -1;
	int e = errno;
	if (supervise)
		str_array_free(sup.envp);
	close_fd(&rep[1]);
	close_fd(&inp[0]);
	close_fd(&o1[1]);
	close_fd(&o2[1]);
	close_fd(&slave);
	if (pid < 0) {
		close_fd(&rep[0]);
		close_fd(&inp[1]);
		close_fd(&o1[0]);
		close_fd(&o2[0]);
		close_fd(&master);
		mem_unmap(rings[1], ring);
		mem_unmap(rings[2], ring);
		out_error(F_RESET, id, "RESOURCE", "cannot start the command: %s", strerror(e));
		goto out;
	}
	struct cmd *c = xmalloc(sizeof *c);
	memset(c, 0, sizeof *c);
	c->pid = pid;
	c->started_ms = now_ms();
	c->timeout_ms = timeout_ms;
	c->rep_fd = rep[0];
	c->tty = tty;
	if (supervise) {
		c->sup = true;
		if (sup.token)
			snprintf(c->token, sizeof c->token, "%s", sup.token);
		if (sup.timeout_ms)
			c->deadline_ms = c->started_ms + sup.timeout_ms;
	}
	c->in_fd = -1;
	c->out_fd[0] = c->out_fd[1] = c->out_fd[2] = -1;
	if (tty) {
		c->out_fd[1] = master;
		if (want_stdin) {
			c->in_fd = fcntl(master, F_DUPFD_CLOEXEC, 3);
		}
	} else {
		c->in_fd = inp[1];
		c->out_fd[1] = o1[0];
		c->out_fd[2] = o2[0];
	}
	for (int k = 0; k < 3; k++)
		if (c->out_fd[k] >= 0)
			set_nonblock(c->out_fd[k]);
	if (c->in_fd >= 0)
		set_nonblock(c->in_fd);
	if (did) {
		c->detached = true;
		snprintf(c->id, sizeof c->id, "%s", did);
		for (int k = 1; k <= 2; k++) {
			c->ring[k].cap = c->ring[k].size = ring;
			c->ring[k].buf = rings[k];
		}
		g_agent.ndetached++;
	}
	c->next = g_agent.cmds;
	g_agent.cmds = c;
	struct stream *s = stream_new(id, K_EXEC);
	s->cmd = c;
	if (!did)
		c->owner = s;
out:
	str_array_free(argv);
	str_array_free(envp);
}

/* The exec report pipe: EOF means exec happened, a report means it failed. */
void cmd_report(struct cmd *c)
{
	struct report r;
	ssize_t n;
	do
		n = read(c->rep_fd, &r, sizeof r);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == EAGAIN)
		return;
	close_fd(&c->rep_fd);
	struct stream *s = NULL;
	for (struct stream *t = g_agent.streams; t; t = t->next)
		if (t->kind == K_EXEC && t->cmd == c)
			s = t;
	if (n == (ssize_t)sizeof r) {
		const char *err = "INVALID";
		if (r.stage == ST_CWD)
			err = "CWD";
		else if (r.stage == ST_IDENTITY)
			err = "IDENTITY";
		else if (r.stage == ST_SETUP)
			err = "RESOURCE";
		else if (r.err == ENOENT || r.err == ENOTDIR)
			err = "NOT_FOUND";
		else if (r.err == EACCES || r.err == EPERM)
			err = "PERMISSION_DENIED";
		if (s) {
			out_error(F_RESET, s->id, err, "%s: %s",
				  r.stage == ST_CWD ? "cwd" : "exec", strerror(r.err));
			s->cmd = NULL;
			stream_drop(s);
		}
		/* the child exits at once; reaped as any other */
		c->owner = NULL;
		cmd_close_fds(c);
		if (c->detached) {
			c->detached = false;
			g_agent.ndetached--;
		}
		if (c->reaped)
			cmd_free(c);
		return;
	}
	c->started = true;
	if (s) {
		s->established = true;
		struct buf b = {0};
		buf_printf(&b, "{\"pid\":%ld}", (long)c->pid);
		out_json(F_OPEN_OK, s->id, &b);
	}
}

/* Read a non-detached command's output into DATA frames (within the
 * stream's window), a detached one's into its ring (always). */
void cmd_read_out(struct cmd *c, int k)
{
	char tmp[CHUNK];
	for (int rounds = 0; rounds < 4 && c->out_fd[k] >= 0; rounds++) {
		size_t want = CHUNK;
		char *dst = tmp;
		struct stream *s = c->owner;
		if (!c->detached) {
			if (!s || !out_room() || s->send_credit <= 0)
				return;
			if ((int64_t)want > s->send_credit)
				want = (size_t)s->send_credit;
		} else {
			struct ring *r = &c->ring[k];
			uint64_t room = ring_room(r);
			size_t pos = (size_t)(r->end % r->cap);
			dst = r->buf + pos;
			want = r->cap - pos < CHUNK ? r->cap - pos : CHUNK;
			if (room < want)
				want = (size_t)room;
		}
		ssize_t n = read(c->out_fd[k], dst, want);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			if (c->tty_done_at && now_ms() >= c->tty_done_at)
				close_fd(&c->out_fd[k]); /* see TTY_DONE_MS */
			return;
		}
		if (n <= 0) {
			/* EOF; a terminal says EIO once no process holds it */
			close_fd(&c->out_fd[k]);
			return;
		}
		if (c->detached) {
			uint64_t before = ring_held(&c->ring[k]);
			c->ring[k].end += (uint64_t)n;
			g_agent.held += ring_held(&c->ring[k]) - before;
		} else {
			unsigned char fd = (unsigned char)k;
			out_frame2(F_DATA, s->id, &fd, 1, tmp, (size_t)n);
			s->send_credit -= n;
		}
		uint64_t now = now_us();
		bool flowing = now - c->last_read_us[k] < FLOW_US || n >= (ssize_t)FLOW_BYTES;
		c->last_read_us[k] = now;
		if ((size_t)n < want) {
			/* Drained: while output flows, let the next writes gather (HOLD_US). */
			if (flowing)
				c->hold_until_us[k] = now + HOLD_US;
			return;
		}
	}
}

bool cmd_output_done(const struct cmd *c)
{
	return c->reaped && !c->tree_wait && c->out_fd[1] < 0 && c->out_fd[2] < 0;
}
