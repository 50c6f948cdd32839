/*
 * agent_reap.c - the agent's children and orphans: reaping on SIGCHLD and the
 * sweep that kills processes it did not start.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "agent.h"
#include "proc.h"
#include "sbx.h"

void on_sigchld(int sig)
{
	(void)sig;
	int e = errno;
	(void)!write(g_agent.sigpipe[1], "c", 1);
	errno = e;
}

void reap(void)
{
	char drain[64];
	while (read(g_agent.sigpipe[0], drain, sizeof drain) > 0)
		;
	for (;;) {
		int st;
		pid_t pid = waitpid(-1, &st, WNOHANG);
		if (pid <= 0)
			break;
		struct cmd *c = cmd_by_pid(pid);
		if (!c)
			continue;
		c->reaped = true;
		c->ended_ms = now_ms();
		c->status = st;
		if (c->tty)
			c->tty_done_at = now_ms() + TTY_DONE_MS;
		/* What is left in its process group has no command any more. */
		kill(-pid, SIGKILL);
		if (c->sup)
			sup_reaped(c);
		/* its orphans soon, but a burst of short commands scans /proc
		 * at most ten times a second */
		if (g_agent.next_sweep > g_agent.last_sweep + 100)
			g_agent.next_sweep = g_agent.last_sweep + 100;
		if (!c->owner && !c->detached && c->rep_fd < 0)
			cmd_free(c);
	}
}

/*
 * Whether every child of the agent is a command it started and has not
 * reaped, from the kernel's list of its children (one read, where a sweep
 * reads every process's stat): then there is no orphan.  False when there may
 * be one, or the list cannot be read (a kernel without it).
 */
static bool only_commands(void)
{
	char path[64], buf[4096];
	snprintf(path, sizeof path, "/proc/self/task/%ld/children", (long)g_agent.self);
	ssize_t n = read_small(path, buf, sizeof buf);
	if (n < 0 || n == (ssize_t)sizeof buf - 1)
		return false; /* unread, or maybe cut short: look at every process */
	for (char *p = buf, *end; *p; p = end) {
		long pid = strtol(p, &end, 10);
		if (end == p)
			break;
		if (!cmd_by_pid((pid_t)pid))
			return false;
	}
	return true;
}

/*
 * Orphans: processes whose parent is the agent (reparented to PID 1, or to
 * the subreaper in tests) that it did not start, and that belong to no live
 * command, i.e. share no session with any live command's process tree.  A
 * tree whose `sbx run` supervisor and monitor were killed together, or what
 * `kill -9 -1` left, dies here; their children come next round.  Returns
 * how many it killed.
 */
size_t sweep_orphans(void)
{
	if (only_commands())
		return 0;
	size_t all, n = 0, killed = 0;
	struct pstat *v = scan_pstats(&all);
	for (size_t i = 0; i < all; i++)
		if (v[i].pid != g_agent.self)
			v[n++] = v[i];
	bool any = false;
	for (size_t i = 0; i < n && !any; i++)
		any = v[i].ppid == g_agent.self && !cmd_by_pid(v[i].pid) && v[i].state != 'Z';
	if (!any) {
		free(v);
		return 0;
	}
	/* Live command trees: each started, unreaped command and its
	 * descendants (fixpoint over the parent relation). */
	bool *live = xmalloc((n ? n : 1) * sizeof *live);
	for (size_t i = 0; i < n; i++) {
		struct cmd *c = cmd_by_pid(v[i].pid);
		live[i] = c && v[i].ppid == g_agent.self;
	}
	for (bool changed = true; changed;) {
		changed = false;
		for (size_t i = 0; i < n; i++) {
			if (live[i])
				continue;
			for (size_t j = 0; j < n; j++) {
				if (live[j] && v[j].pid == v[i].ppid) {
					live[i] = changed = true;
					break;
				}
			}
		}
	}
	for (size_t i = 0; i < n; i++) {
		if (v[i].ppid != g_agent.self || live[i] || v[i].state == 'Z')
			continue;
		bool shared = false;
		for (size_t j = 0; j < n && !shared; j++)
			shared = live[j] && v[j].sid == v[i].sid;
		if (!shared) {
			kill(v[i].pid, SIGKILL);
			killed++;
		}
	}
	free(live);
	free(v);
	return killed;
}
