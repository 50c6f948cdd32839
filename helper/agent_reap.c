/*
 * agent_reap.c - the agent's children and orphans: reaping on SIGCHLD and the
 * sweep that kills processes it did not start.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "agent.h"
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

struct pinfo {
	pid_t pid, ppid, sid;
	char state;
};

static bool read_pinfo(pid_t pid, struct pinfo *pi)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	long ppid, pgrp, sid;
	if (!p || sscanf(p + 1, " %c %ld %ld %ld", &pi->state, &ppid, &pgrp, &sid) != 4)
		return false;
	pi->pid = pid;
	pi->ppid = (pid_t)ppid;
	pi->sid = (pid_t)sid;
	return true;
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
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n < 0 || n == (ssize_t)sizeof buf - 1)
		return false; /* unread, or maybe cut short: look at every process */
	buf[n] = '\0';
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
	size_t n = 0, cap = 256, killed = 0;
	struct pinfo *v = xmalloc(cap * sizeof *v);
	DIR *d = opendir("/proc");
	struct dirent *e;
	while (d && (e = readdir(d))) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end || pid <= 0 || pid == g_agent.self)
			continue;
		if (n == cap) {
			cap *= 2;
			struct pinfo *nv = realloc(v, cap * sizeof *v);
			if (!nv)
				oom();
			v = nv;
		}
		if (read_pinfo((pid_t)pid, &v[n]))
			n++;
	}
	if (d)
		closedir(d);
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
