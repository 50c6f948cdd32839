/*
 * agent_run.c - the agent as the `sbx run` supervisor.  An exec request for
 * `<this helper> run [--id T] [--timeout-ms N] [--cwd DIR] [--tty RxC]
 * [--clean-env] -- CMD...` is not a second process: the agent starts CMD
 * itself and does what the supervisor would (helper/README.md, "run"): the
 * lookup on the fixed PATH, the loader variables left out, the cwd checked to
 * be at or below the root, the whole tree killed when the command ends, on
 * the timeout or on request, the same exit statuses and error lines; `sbx
 * kill`, `signal` and `status` by the token of such a command are answered by
 * the agent too.  A supervisor and its monitor are an exec and two processes
 * more per command, which cost more CPU than the command itself (`true`:
 * docs/performance.md, "Load"); the agent, PID 1 and the holder of every
 * orphan, needs neither to keep the tree together.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "agent.h"
#include "sbx.h"
#include "proc.h"

static bool plain_token(const char *id)
{
	size_t n = strlen(id);
	return n > 0 && n <= MAX_ID &&
	       strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") == n;
}

/*
 * `argv` as an `sbx run` of the agent's own helper, the options as `run`
 * parses them (run.c).  False for anything else, or anything `run` itself
 * would refuse or treat otherwise (another `--root`, a bad option, a token `status`
 * could not name): the request then starts the real helper, which answers
 * as it always did.
 */
bool sup_parse(char **argv, struct sup *out)
{
	int i = 1;
	/* `--root` the agent's own root is the default spelled out */
	if (argv[1] && !strcmp(argv[1], "--root") && argv[2] && !strcmp(argv[2], g_root))
		i = 3;
	if (!argv[i] || strcmp(argv[i], "run") || !own_executable(argv[0]))
		return false;
	memset(out, 0, sizeof *out);
	i++;
	for (; argv[i]; i++) {
		char extra;
		if (!strcmp(argv[i], "--")) {
			i++;
			break;
		} else if (!strcmp(argv[i], "--clean-env")) {
			out->clean = true;
		} else if (!strcmp(argv[i], "--tty") && argv[i + 1]) {
			unsigned rows, cols;
			if (sscanf(argv[++i], "%ux%u%c", &rows, &cols, &extra) != 2 || !rows ||
			    !cols || rows > 65535 || cols > 65535)
				return false;
			out->tty = true;
			out->rows = (unsigned short)rows;
			out->cols = (unsigned short)cols;
		} else if (!strcmp(argv[i], "--id") && argv[i + 1]) {
			out->token = argv[++i];
			if (!plain_token(out->token))
				return false;
		} else if (!strcmp(argv[i], "--timeout-ms") && argv[i + 1]) {
			unsigned long long v;
			const char *t = argv[++i];
			if (!*t || strspn(t, "0123456789") != strlen(t) || strlen(t) > 12 ||
			    sscanf(t, "%llu", &v) != 1)
				return false;
			out->timeout_ms = v;
		} else if (!strcmp(argv[i], "--cwd") && argv[i + 1]) {
			out->cwd = argv[++i];
		} else {
			return false;
		}
	}
	if (!argv[i] || (i > 0 && strcmp(argv[i - 1], "--")))
		return false;
	out->argv = argv + i;
	return true;
}

/*
 * The command's last steps in the child the agent started (agent_exec.c has
 * done its session, stdio, signals, identity): `sbx run`'s cwd, its check
 * against the root, the terminal's size and the exec on the fixed PATH.
 */
void sup_child(const struct sup *sup)
{
	const char *c = sup->cwd ? sup->cwd : g_root;
	if (!g_agent.realroot)
		fail_errno_child(126, sup->root_err, "resolve root", g_root);
	if (chdir(g_root) < 0)
		fail_errno_child(126, errno, "chdir", c);
	if (sup->cwd && chdir(sup->cwd) < 0)
		fail_errno_child(126, errno, "chdir", c);
	char here[PATH_MAX];
	if (!getcwd(here, sizeof here))
		fail_errno_child(126, errno, "chdir", c);
	if (!path_within(here, g_agent.realroot))
		fail_child(126, "ESCAPE", "working directory %s is outside the root", c);
	if (sup->tty) {
		/* The engine's exec could be resized only once it ran: the
		 * first size is set before the command can ask for it. */
		struct winsize ws = {.ws_row = sup->rows, .ws_col = sup->cols};
		if (ioctl(0, TIOCSWINSZ, &ws) < 0)
			fail_errno_child(126, errno, "setup", "child");
	}
	char **cmd = sup->argv;
	int err = exec_command(cmd, sup->envp);
	if (err == ENOENT)
		fail_child(127, "ENOENT", "command not found: %s", cmd[0]);
	fail_errno_child(126, err, "cannot execute", cmd[0]);
}

/* A live supervised command by its token. */
static struct cmd *sup_by_token(const char *token)
{
	for (struct cmd *c = g_agent.cmds; c; c = c->next)
		if (c->sup && !c->reaped && c->started && !strcmp(c->token, token))
			return c;
	return NULL;
}

/* The whole tree, now: its process group at once, the rest (other sessions,
 * double forks) as orphans of the agent before its EXIT (sup_settle). */
void sup_kill_tree(struct cmd *c)
{
	c->killed = true;
	if (!c->reaped) {
		kill(-c->pid, SIGKILL);
		kill(c->pid, SIGKILL);
	}
}

/* SIGNAL to a supervised command's stream: what the supervisor did with it.
 * True when handled. */
bool sup_signal(struct cmd *c, int sig, bool relay)
{
	if (relay) {
		if (signal_forwardable(sig))
			kill(-c->pid, sig);
		return true;
	}
	/* To the supervisor itself: these ended its tree (exit 137). */
	if (sig == SIGHUP || sig == SIGINT || sig == SIGTERM || sig == SIGQUIT ||
	    sig == SIGUSR1 || sig == SIGKILL) {
		sup_kill_tree(c);
		return true;
	}
	return false;
}

/*
 * The command was reaped: its exit as the supervisor's (the command's status,
 * 128+N for signal N with N kept for `sbx status`, 137 when the agent killed
 * the tree), and its EXIT held until nothing of its tree is left.
 */
void sup_reaped(struct cmd *c)
{
	int st = c->status;
	if (c->killed) {
		c->status = W_EXITCODE(EXIT_KILLED, 0);
	} else if (WIFSIGNALED(st)) {
		int sig = WTERMSIG(st);
		if (c->token[0]) {
			unsigned k = g_agent.sigrec_next++ % SIGREC;
			snprintf(g_agent.sigrec[k].token, sizeof g_agent.sigrec[k].token, "%s", c->token);
			g_agent.sigrec[k].sig = sig;
		}
		c->status = W_EXITCODE(128 + sig, 0);
	}
	c->tree_wait = true;
}

/*
 * EXITs held for their trees: once a look at the agent's children finds no
 * orphan left to kill (what a supervised command left behind comes to the
 * agent as its parents die), every held EXIT may go.  Cheap when nothing is
 * left: one read of the agent's list of children.
 */
void sup_settle(void)
{
	bool waiting = false;
	for (struct cmd *c = g_agent.cmds; c && !waiting; c = c->next)
		waiting = c->tree_wait;
	if (!waiting)
		return;
	reap();
	if (sweep_orphans() > 0)
		return; /* their deaths wake the loop (SIGCHLD); looked at again then */
	for (struct cmd *c = g_agent.cmds; c; c = c->next)
		c->tree_wait = false;
}

void sup_timers(uint64_t now)
{
	for (struct cmd *c = g_agent.cmds; c; c = c->next)
		if (c->sup && c->deadline_ms && now >= c->deadline_ms && !c->reaped && !c->killed)
			sup_kill_tree(c);
}

/* A wait that overran by `by` ms (a suspended sandbox): deadlines move on by it. */
void sup_shift_deadlines(uint64_t by)
{
	for (struct cmd *c = g_agent.cmds; c; c = c->next)
		if (c->sup && c->deadline_ms)
			c->deadline_ms += by;
}

uint64_t sup_next_timer(uint64_t next)
{
	for (struct cmd *c = g_agent.cmds; c; c = c->next) {
		if (c->sup && c->deadline_ms && !c->reaped && !c->killed && c->deadline_ms < next)
			next = c->deadline_ms;
		/* a tree that does not die at once (a process in the kernel) */
		if (c->tree_wait && now_ms() + 10 < next)
			next = now_ms() + 10;
	}
	return next;
}

/* The answer to a helper call the agent gave itself: OPEN_OK, what it printed, EXIT. */
static void answer(uint32_t id, const char *out, int code)
{
	struct buf b = {0};
	buf_printf(&b, "{\"pid\":%ld}", (long)g_agent.self);
	out_json(F_OPEN_OK, id, &b);
	if (out && *out) {
		unsigned char fd = 1;
		out_frame2(F_DATA, id, &fd, 1, out, strlen(out));
	}
	struct buf e = {0};
	buf_printf(&e, "{\"exit_code\":%d,\"signal\":null}", code);
	out_json(F_EXIT, id, &e);
}

/*
 * `sbx kill TOKEN`, `sbx signal TOKEN SIGNAME`, `sbx status TOKEN` for a
 * command the agent supervises (or, for status, one that died of a signal
 * lately): answered here, as those subcommands would for its supervisor.
 * False for anything else, which then runs the real helper.
 */
bool sup_helper_call(uint32_t id, char **argv)
{
	if (!argv[1] || !argv[2])
		return false;
	bool kill_ = !strcmp(argv[1], "kill") && !argv[3];
	bool signal_ = !strcmp(argv[1], "signal") && argv[3] && !argv[4];
	bool status_ = !strcmp(argv[1], "status") && !argv[3];
	if ((!kill_ && !signal_ && !status_) || !own_executable(argv[0]))
		return false;
	const char *token = argv[2];
	if (status_) {
		for (unsigned k = 0; k < SIGREC; k++) {
			if (g_agent.sigrec[k].sig && !strcmp(g_agent.sigrec[k].token, token)) {
				char text[32];
				snprintf(text, sizeof text, "signal %d\n", g_agent.sigrec[k].sig);
				g_agent.sigrec[k].sig = 0;
				g_agent.sigrec[k].token[0] = '\0';
				answer(id, text, 0);
				return true;
			}
		}
		return false;
	}
	struct cmd *c = sup_by_token(token);
	if (!c)
		return false;
	if (kill_) {
		sup_kill_tree(c);
		answer(id, NULL, 0);
		return true;
	}
	int sig = signal_by_name(argv[3]);
	if (sig) {
		kill(-c->pid, sig);
		answer(id, NULL, 0);
		return true;
	}
	return false; /* the helper's own usage error */
}
